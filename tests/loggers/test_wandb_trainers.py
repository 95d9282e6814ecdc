"""``WandbLogger`` in ``TrainerPlus`` and ``LightweightTrainer``: exceptions close the run with exit
code 1 in-process (``on_exception``), and a resumed training continues the same run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.loggers.wandb_helpers import fast_logger, offline_env, runs, steps_per_key, synced_history

pytest.importorskip("wandb")

pytestmark = pytest.mark.wandb


def _lightweight(output_dir: Path, callbacks, fail_at: int = -1):
    from hf_callbacks_plus.loop.arguments import LoopArguments
    from hf_callbacks_plus.loop.trainer import LightweightTrainer

    calls = {"n": 0}

    def train_step(batch):
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise RuntimeError(f"train_step failed at call {fail_at}")
        return {"loss": 1.0 / calls["n"], "grad_norm": 0.5}

    args = LoopArguments(output_dir=str(output_dir), max_steps=10, logging_steps=2, save_strategy="steps",
                         save_steps=4, eval_strategy="steps", eval_steps=4, disable_tqdm=True)
    return LightweightTrainer(args, train_step=train_step, train_data=[[1.0]] * 5, eval_data=[[1.0]],
                              eval_fn=lambda data: {"score": 0.5}, learning_rate_fn=lambda: 0.1,
                              callbacks=callbacks)


def test_lightweight_trainer_failure_then_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = offline_env(monkeypatch, tmp_path / "wb")
    out = tmp_path / "out"
    failing = fast_logger(project="lightweight")
    with pytest.raises(RuntimeError, match="failed at call 7"):
        _lightweight(out, [failing], fail_at=7).train()
    (crashed,) = runs(root)
    assert crashed.exit_code == 1  # on_exception closed it, no interpreter exit needed
    assert crashed.steps("train/loss") == [2, 4, 6] and crashed.steps("eval/score") == [4]

    resumed_logger = fast_logger(project="lightweight")
    _lightweight(out, [resumed_logger]).train(resume_from_checkpoint=str(out / "checkpoint-4"))
    first, resumed = runs(root)
    assert resumed.run_id == crashed.run_id == resumed_logger.run_id
    assert resumed.exit_code == 0
    # every step after the checkpoint (4); step 6 is in the failed run's folder too, and the resumed
    # folder rewinds the run to the checkpoint's row: synced in order, every step once
    assert resumed.steps("train/loss") == [6, 8, 10] and resumed.steps("eval/score") == [8, 10]
    assert resumed.branch_point == {"run": crashed.run_id, "metric": "_step", "value": 4}
    assert steps_per_key([first, resumed])["train/loss"] == [2, 4, 6, 6, 8, 10]
    synced = synced_history([first, resumed])
    assert [row["train/global_step"] for row in synced if "train/loss" in row] == [2, 4, 6, 8, 10]
    assert "train_summary/runtime" in resumed.summary


def test_trainer_plus_failure_exit_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    transformers = pytest.importorskip("transformers")
    from hf_callbacks_plus.integrations.transformers import TrainerPlus
    from tests.tiny_models import make_trainer

    class FailingAtStep4(transformers.TrainerCallback):
        """Raises in ``on_log`` of step 4, after the logger (listed first) queued it."""

        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.global_step == 4:
                raise RuntimeError("boom at step 4")

    root = offline_env(monkeypatch, tmp_path / "wb")
    wandb_logger = fast_logger(project="plus")
    trainer = make_trainer(tmp_path / "out", callbacks=[wandb_logger, FailingAtStep4()],
                           trainer_class=TrainerPlus, max_steps=8, logging_steps=2)
    with pytest.raises(RuntimeError, match="boom at step 4"):
        trainer.train()
    (run,) = runs(root)
    assert run.exit_code == 1 and run.run_id == wandb_logger.run_id
    assert run.steps("train/loss") == [2, 4]
    assert wandb_logger.run is None  # closed right away, not at interpreter exit
