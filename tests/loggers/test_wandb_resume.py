"""``WandbLogger`` around ``train()``: evaluation after training, a crash and its resume, and bad
settings. Real stock ``transformers.Trainer`` runs, W&B offline run files read back.

* After ``train()`` the run stays open, as with transformers' ``WandbCallback``: ``evaluate()`` and
  ``predict()`` log into the same run (one offline folder), each value a point at its training step
  (``train/global_step``), without a warning. The stock callback runs the same way beside it.
* A training that crashes after checkpoint N at step M and is resumed from checkpoint N: the
  resumed run's folder rewinds the run to the checkpoint's last row (``wandb.init(resume_from=...)``,
  recorded as the run's branch point), so syncing the crashed folder and then the resumed one
  leaves every (metric, step) once, the resumed training's values after N.
* A ``WANDB_*`` value or a ``settings`` entry W&B refuses: ``ValueError`` naming it, its value and what
  to set, at construction, or at train begin before any step when it was set after construction.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

import pytest

from tests.loggers.wandb_helpers import (
    fast_logger,
    global_steps,
    offline_env,
    points,
    runs,
    synced_history,
)
from tests.tiny_models import RegressionDataset, make_trainer

pytest.importorskip("wandb")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.wandb, pytest.mark.transformers]


def _train_then_evaluate_and_predict(output_dir: Path, callbacks: list, **overrides):
    trainer = make_trainer(output_dir, callbacks=callbacks, logging_steps=4, eval_strategy="steps",
                           eval_steps=4, max_steps=8, **overrides)
    trainer.train()
    other = trainer.evaluate(RegressionDataset(16, seed=9))["eval_loss"]
    trainer.predict(RegressionDataset(16, seed=3))
    in_training = [entry["eval_loss"] for entry in trainer.state.log_history if "eval_loss" in entry]
    return trainer, in_training, other


def test_evaluate_and_predict_after_train_log_into_the_same_run_like_the_stock_callback(
        tmp_path, monkeypatch, caplog):
    """Ours: one folder, the after-training evaluation a second point at step 8 (it printed one
    "'eval/loss' has a value at step 8 already" line per key and opened a second folder with the same
    run id); no warning at all. The stock ``WandbCallback`` gives the same points (its names differ)."""
    import wandb

    root = offline_env(monkeypatch, tmp_path / "wb")
    logger = fast_logger(project="after-training")
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        _, in_training, other = _train_then_evaluate_and_predict(tmp_path / "ours", [logger])
        assert logger._is_open  # still open after train(), as WandbCallback leaves it
        (run,) = runs(root)
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("hf_callbacks_plus")]
    assert not ours, ours
    assert run.exit_code == 0 and run.run_id == logger.run_id
    assert run.series("eval/loss") and global_steps(run, "eval/loss") == [4, 8, 8]
    assert [value for _, value in run.series("eval/loss")] == pytest.approx([*in_training[:2], other])
    assert global_steps(run, "test/loss") == [8] and global_steps(run, "train/loss") == [4, 8]
    steps = [row["_step"] for row in run.history]
    assert steps == sorted(set(steps))  # W&B's own history step only increases

    # the stock callback, the same way (it writes where W&B's process-wide settings put it)
    stock_trainer, stock_in_training, stock_other = _train_then_evaluate_and_predict(
        tmp_path / "stock", [], report_to="wandb")
    callback = next(cb for cb in stock_trainer.callback_handler.callbacks
                    if type(cb).__name__ == "WandbCallback")
    folder = Path(callback._wandb.run.dir).parent
    wandb.finish()
    (stock,) = runs(folder)
    stock_eval = [(row["train/global_step"], row["eval/loss"]) for row in stock.history if "eval/loss" in row]
    assert [step for step, _ in stock_eval] == [4, 8, 8]
    assert [value for _, value in stock_eval] == pytest.approx([*stock_in_training[:2], stock_other])
    ours = [value for _, value in run.series("eval/loss")]
    assert ours == pytest.approx([value for _, value in stock_eval])  # same seed, same values


class CrashAt(transformers.TrainerCallback):
    """Raises at ``step``: in ``on_step_end`` (before that step is logged) or, ``after_save``, right
    after the checkpoint of that step is written (a stock Trainer has no exception event)."""

    def __init__(self, step: int, after_save: bool = False) -> None:
        self.step, self.after_save = step, after_save

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and not self.after_save:
            raise RuntimeError("injected crash")

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step and self.after_save:
            raise RuntimeError("injected crash")


class EvaluateOtherDataAt(transformers.TrainerCallback):
    """A second evaluation at ``step`` (two values of each eval key at one training step)."""

    def __init__(self, step: int) -> None:
        self.step, self.trainer = step, None

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if state.global_step == self.step and self.trainer is not None:
            trainer, self.trainer = self.trainer, None
            trainer.evaluate(RegressionDataset(16, seed=9))


CASES = {
    # name: (checkpoint every, crash at, crash right after the save, second evaluation at)
    "crash_between_checkpoints": (4, 6, False, None),
    "crash_right_after_the_save": (4, 4, True, None),
    "crash_after_an_evaluation": (3, 5, False, None),
    "two_evaluations_before_the_checkpoint": (4, 7, False, 4),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_resumed_run_rewinds_to_its_checkpoint_so_every_step_is_synced_once(tmp_path, monkeypatch, case):
    save_steps, crash, after_save, second_eval = CASES[case]
    root = offline_env(monkeypatch, tmp_path / "wb")
    args = dict(max_steps=8, logging_steps=1, eval_strategy="steps", eval_steps=save_steps,
                save_strategy="steps", save_steps=save_steps)
    extra = EvaluateOtherDataAt(second_eval) if second_eval else None
    crashing = make_trainer(tmp_path, callbacks=[fast_logger(project="rewind"), CrashAt(crash, after_save),
                                                 *([extra] if extra else [])], **args)
    if extra:
        extra.trainer = crashing
    with pytest.raises(RuntimeError, match="injected crash"):
        crashing.train()
    checkpoint = max(step for step in range(save_steps, crash + 1, save_steps))
    resumed_logger = fast_logger(project="rewind")
    resumed_trainer = make_trainer(tmp_path, callbacks=[resumed_logger], **args)
    resumed_trainer.train(resume_from_checkpoint=str(tmp_path / f"checkpoint-{checkpoint}"))
    history = resumed_trainer.state.log_history  # the ground truth: the checkpoint's and the resumed
    crashed, resumed = runs(root)
    assert crashed.run_id == resumed.run_id == resumed_logger.run_id and resumed.exit_code == 0

    # the resumed folder names where it continues the run: the checkpoint's last row
    point = resumed.branch_point
    assert point is not None and point["run"] == crashed.run_id and point["metric"] == "_step"
    kept = [row for row in crashed.history if row["_step"] <= point["value"]]
    assert max(row["train/global_step"] for row in kept) == checkpoint
    assert min(row["_step"] for row in resumed.history) > point["value"]
    assert global_steps(resumed, "train/loss")[0] == checkpoint + 1
    # the steps between the checkpoint and the crash are in both folders; synced in order, once
    between = set(range(checkpoint + 1, crash + (0 if after_save else 1)))
    assert {step for _, step in points(crashed.history)} >= between - {crash}
    counts = Counter(points(synced_history([crashed, resumed])))
    for key, raw in (("train/loss", "loss"), ("eval/loss", "eval_loss")):
        assert Counter(step for (name, step), n in counts.items() for _ in range(n) if name == key) == \
            Counter(entry["step"] for entry in history if raw in entry), key
    assert counts[("train/loss", 8)] == 1 and (not second_eval or counts[("eval/loss", second_eval)] == 2)
    # the resumed training's own values after the checkpoint
    synced = {(row["train/global_step"]): row["train/loss"] for row in synced_history([crashed, resumed])
              if "train/loss" in row}
    assert [synced[step] for step in range(checkpoint + 1, 9)] == [
        value for _, value in resumed.series("train/loss")]


BAD_ENVIRONMENT = {
    "WANDB_SILENT": ("", "true or false"),
    "WANDB_CONSOLE": ("loud", "'auto', 'off'"),
    "WANDB_INIT_TIMEOUT": ("soon", "valid number"),
    "WANDB_MODE": ("cloud", "'online', 'offline'"),
}


@pytest.mark.parametrize("name", list(BAD_ENVIRONMENT))
def test_a_setting_wandb_refuses_is_named_with_what_to_set(tmp_path, monkeypatch, name):
    """At construction: a ValueError naming the variable, its value and what to set (it was a raw
    pydantic ``ValidationError`` out of ``train()``)."""
    value, expected = BAD_ENVIRONMENT[name]
    offline_env(monkeypatch, tmp_path / "wb")
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match="W&B refuses") as info:
        fast_logger()
    message = str(info.value)
    assert f"{name}={value!r}" in message and expected in message and "unset it" in message
    assert "validation error" not in message.lower()


def test_a_setting_refused_after_construction_stops_train_before_its_first_step(tmp_path, monkeypatch):
    """Set after the logger was built: ``train()`` raises the same ValueError at train begin, before any
    step, with no run opened; the package's rule: a configuration error stops before training (nothing
    is lost), a tracker fault during training never does."""
    root = offline_env(monkeypatch, tmp_path / "wb")
    logger = fast_logger()
    trainer = make_trainer(tmp_path / "out", callbacks=[logger], max_steps=4, logging_steps=1)
    monkeypatch.setenv("WANDB_SILENT", "")
    with pytest.raises(ValueError, match=r"WANDB_SILENT=''.*true or false"):
        trainer.train()
    assert trainer.state.global_step == 0 and logger.run is None
    assert not list(root.rglob("*.wandb"))


def test_a_settings_entry_wandb_refuses_is_named(tmp_path, monkeypatch):
    offline_env(monkeypatch, tmp_path / "wb")
    with pytest.raises(ValueError, match=r"settings=\{'console': 'loud'\}.*console"):
        fast_logger(settings={"console": "loud"})


def test_a_refused_rewind_falls_back_with_the_users_settings_untouched(tmp_path, monkeypatch):
    """W&B writes ``wandb.init``'s arguments into the ``Settings`` object it is given, so the fallback after
    a refused rewind (``resume_from``: a killed training's service still holding the run) failed with
    "`resume` or `resume_from` are mutually exclusive". Each ``wandb.init`` now gets a copy. Fault
    injection: a ``wandb`` whose ``init`` does what W&B does with its settings, then refuses a rewind."""
    import wandb

    from hf_callbacks_plus.loggers.base import WarnOnce
    from hf_callbacks_plus.loggers.wandb import WandbBackend

    offline_env(monkeypatch, tmp_path / "wb")
    settings = wandb.Settings(mode="offline")
    calls: list[dict] = []

    class RefusingRewindWandb:
        """Fault injection: the real module, whose ``init`` copies its arguments into the settings given
        (as W&B does) and refuses ``resume_from``."""

        run = None

        def __getattr__(self, name):
            return getattr(wandb, name)

        def init(self, **kwargs):
            given = kwargs["settings"]
            calls.append({"resume_from": given.resume_from, "resume": given.resume})
            if kwargs.get("resume_from"):
                given.resume_from = kwargs["resume_from"]
                raise RuntimeError("run ID abc is in use")
            if given.resume_from and kwargs.get("resume"):
                raise ValueError("`fork_from`, `resume`, or `resume_from` are mutually exclusive")
            return type("Run", (), {"id": kwargs["id"], "define_metric": lambda *a, **k: None,
                                    "starting_step": 0})()

    monkeypatch.setattr("hf_callbacks_plus.loggers.wandb.time.sleep", lambda seconds: None)
    backend = WandbBackend(RefusingRewindWandb(), {"resume": "allow", "mode": "offline"}, settings, "false",
                           WarnOnce())
    backend.rewind(10)
    assert backend.start("abc", "key", resume=True) == "abc"
    assert len(calls) == 4 and all(call["resume_from"] is None for call in calls)  # 3 rewinds, 1 fallback
    assert settings.resume_from is None
