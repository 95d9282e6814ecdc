"""``TrackioLogger`` against a real trackio store (sqlite under a temporary ``TRACKIO_DIR``, no network,
no Space), read back through trackio's own API: sections, run totals, config without secrets, the
run reattached across a crash and resume, the user's own trackio run left alone, training never
waiting for trackio's writer, and ``report_to="trackio"`` (transformers' ``TrackioCallback``) swapped
or run side by side. The lifecycle matrix (test_lifecycle_matrix.py) runs it through every lifecycle.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

import pytest

from tests.loggers.trackio_helpers import points, project_name, records, series, store_bytes, trackio_runs
from tests.tiny_models import RegressionDataset, make_trainer

pytest.importorskip("trackio")
transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.trackio, pytest.mark.transformers]

SECRETS = ("hf_abcdefghijklmnopqrstuvwxyz0123", "sekrit-password-1", "my-api-key-value")


class LogExtras(transformers.TrainerCallback):
    """Logs a test metric, a custom-prefix metric, a pre-rendered key and a text at step 5."""

    def __init__(self) -> None:
        self.trainer = None

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 5:
            self.trainer.log({"test_f1": 0.5, "val_acc": 0.75, "custom/score": 3.0, "note": "hello"})


def test_sections_totals_config_and_no_secrets(tmp_path):
    from hf_callbacks_plus.loggers.trackio import TrackioLogger
    from hf_callbacks_plus.metrics.keys import KeyGrammar

    project = project_name(tmp_path)
    logger = TrackioLogger(project=project, grammar=KeyGrammar(prefixes=["val"]))
    extras = LogExtras()
    trainer = make_trainer(tmp_path / "out", callbacks=[logger, extras], logging_steps=2,
                           eval_strategy="steps", eval_steps=4, max_steps=8, hub_token=SECRETS[0])
    extras.trainer = trainer
    trainer.eval_dataset = {"alpha": RegressionDataset(8, seed=3), "beta": RegressionDataset(8, seed=4)}
    logger.attach_trainer(trainer)
    trainer.model.config = {"hidden_size": 4, "db_password": SECRETS[1], "wandb_api_key": SECRETS[2]}
    trainer.train()

    (run,) = trackio_runs(project)
    assert run.name == logger.run_id
    steps = lambda key: [step for step, _ in series(project, run, key)]  # noqa: E731
    assert steps("train/loss") == [2, 4, 6, 8]
    assert steps("eval/alpha/loss") == [4, 8] and steps("eval/beta/mse") == [4, 8]
    assert steps("test/f1") == [5] and steps("val/acc") == [5] and steps("custom/score") == [5]
    assert series(project, run, "train/note") == [(5, "hello")]  # no run summary in trackio: a value
    assert steps("train_summary/runtime") == [8]  # the run totals, once, at the last step
    keys = {key for row in records(project, run) for key in row}
    assert not [key for key in keys if key.startswith("eval_") or key.startswith("train/train_")], keys
    assert run.config["learning_rate"] == 0.1 and run.config["max_steps"] == 8
    assert run.config["model.hidden_size"] == 4 and run.config["model/num_parameters"] == 2
    for key in ("hub_token", "model.db_password", "model.wandb_api_key"):
        assert run.config[key] == "<redacted>", key
    raw = store_bytes(project)
    for secret in SECRETS:
        assert secret.encode() not in raw


def test_evaluate_and_predict_after_train_go_to_the_same_run_at_the_last_step(tmp_path):
    from hf_callbacks_plus.loggers.trackio import TrackioLogger

    project = project_name(tmp_path)
    logger = TrackioLogger(project=project)
    trainer = make_trainer(tmp_path, callbacks=[logger], logging_steps=4, eval_strategy="steps", eval_steps=4,
                           max_steps=8)
    trainer.train()
    other = trainer.evaluate(RegressionDataset(16, seed=9))["eval_loss"]
    trainer.predict(RegressionDataset(16, seed=3))
    assert logger.close()
    (run,) = trackio_runs(project)
    in_training = [entry["eval_loss"] for entry in trainer.state.log_history if "eval_loss" in entry][:2]
    expected = [(4, in_training[0]), (8, in_training[1]), (8, other)]
    assert series(project, run, "eval/loss") == [(step, pytest.approx(value)) for step, value in expected]
    assert [step for step, _ in series(project, run, "test/loss")] == [8]


class CrashAt6(transformers.TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 6:
            raise RuntimeError("injected crash")


def test_a_crash_then_resume_reattaches_to_the_run_with_its_config_and_each_step_once(tmp_path, caplog):
    """A stock Trainer raises at step 6 after checkpoint 4; the resumed training continues the same run
    (found by its name), does not log again the steps the run holds (step 5 was written before the
    crash), keeps the config of the first session (trackio's resumed run would have replaced it with an
    empty one) and the crash is an ERROR alert of the run."""
    from hf_callbacks_plus.loggers.trackio import TrackioLogger

    project = project_name(tmp_path)
    args = dict(max_steps=8, logging_steps=1, save_strategy="steps", save_steps=4)
    first = TrackioLogger(project=project)
    with pytest.raises(RuntimeError, match="injected crash"):
        make_trainer(tmp_path, callbacks=[first, CrashAt6()], **args).train()
    resumed = TrackioLogger(project=project)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        make_trainer(tmp_path, callbacks=[resumed], **args).train(
            resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert any("still open in this process" in r.getMessage() for r in caplog.records)
    assert resumed.close()
    (run,) = trackio_runs(project)
    assert run.name == first.run_id == resumed.run_id
    counted = points(project)
    assert sorted(step for key, step in counted if key == "train/loss") == list(range(1, 9))
    assert max(counted.values()) == 1, counted
    assert run.config["learning_rate"] == 0.1 and run.config["max_steps"] == 8
    assert [(alert["level"], alert["step"]) for alert in run.alerts()] == [("error", 5)]


def test_the_users_own_trackio_run_is_left_alone_and_trackio_log_is_never_called(tmp_path, monkeypatch):
    """``trackio.init`` finishes the module's current run and makes its run current, and the
    module-level ``trackio.log`` is not thread-safe: the logger opens its run in a context of its own
    and calls only the run's methods. The user's run stays current, open, and gets only its values."""
    import trackio

    from hf_callbacks_plus.loggers.trackio import TrackioLogger

    project = project_name(tmp_path)
    mine = trackio.init(project=project, name="mine", embed=False, auto_log_cpu=False, auto_log_gpu=False)
    trackio.log({"my/value": 1.0})

    def forbidden(*args, **kwargs):  # FakeModuleLog: fails the test if the logger calls trackio.log
        raise AssertionError("trackio.log (module level) was called")

    monkeypatch.setattr(trackio, "log", forbidden)
    logger = TrackioLogger(project=project)
    make_trainer(tmp_path, callbacks=[logger], max_steps=4, logging_steps=1).train()
    assert trackio.context_vars.current_run.get() is mine and not mine._stop_flag.is_set()
    monkeypatch.undo()
    trackio.log({"my/value": 2.0})
    trackio.finish()
    by_name = {run.name: run for run in trackio_runs(project)}
    assert [value for _, value in series(project, by_name["mine"], "my/value")] == [1.0, 2.0]
    assert not [row for row in records(project, by_name["mine"]) if "train/loss" in row]
    assert [step for step, _ in series(project, by_name[logger.run_id], "train/loss")] == [1, 2, 3, 4]


def test_training_never_waits_for_trackios_writer(tmp_path, monkeypatch):
    """trackio's store write is held (``GatedStore``, fault injection: a store that stops answering)
    until the last step: every step ran meanwhile, then every record arrives once, in order."""
    from trackio.sqlite_storage import SQLiteStorage

    from hf_callbacks_plus.loggers.trackio import TrackioLogger

    gate, blocked = threading.Event(), threading.Event()
    real = SQLiteStorage.bulk_log

    def gated_bulk_log(*args, **kwargs):  # GatedStore
        blocked.set()
        gate.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(SQLiteStorage, "bulk_log", staticmethod(gated_bulk_log))

    class ReleaseAtTheEnd(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 12:
                assert blocked.wait(10)  # trackio's writer is stuck in the store by now
                gate.set()

    project = project_name(tmp_path)
    logger = TrackioLogger(project=project)
    started = time.monotonic()
    make_trainer(tmp_path, callbacks=[logger, ReleaseAtTheEnd()], max_steps=12, logging_steps=1).train()
    assert time.monotonic() - started < 30
    assert logger.close()
    (run,) = trackio_runs(project)
    assert [step for step, _ in series(project, run, "train/loss")] == list(range(1, 13))


def test_report_to_trackio_is_swapped_in_place_and_the_stock_callback_gives_the_same_points(tmp_path):
    """``report_to="trackio"`` adds transformers' ``TrackioCallback``; ``replace_report_to_callbacks``
    puts a ``TrackioLogger`` at its position (project from ``TrainingArguments.project``, as the stock
    one). Side by side, the stock callback's run holds the same values at the same training steps as
    ours with ``key_names="stock"`` (it logs at trackio's own step, with ``train/global_step``)."""
    from transformers.integrations.integration_utils import TrackioCallback

    from hf_callbacks_plus.loggers.swap import replace_report_to_callbacks
    from hf_callbacks_plus.loggers.trackio import TrackioLogger

    args = dict(max_steps=6, logging_steps=2, eval_strategy="steps", eval_steps=3, report_to="trackio")
    stock_project, ours_project = project_name(tmp_path) + "-stock", project_name(tmp_path) + "-ours"
    stock = make_trainer(tmp_path / "stock", project=stock_project, **args)
    assert any(isinstance(callback, TrackioCallback) for callback in stock.callback_handler.callbacks)
    stock.train()

    trainer = make_trainer(tmp_path / "ours", project=ours_project, **args)
    before = [type(callback).__name__ for callback in trainer.callback_handler.callbacks]
    ((old, new),) = replace_report_to_callbacks(trainer, trackio=TrackioLogger(key_names="stock"))
    assert isinstance(old, TrackioCallback) and isinstance(new, TrackioLogger)
    assert trainer.callback_handler.callbacks[before.index("TrackioCallback")] is new
    trainer.train()
    assert new.close()

    (stock_run,) = trackio_runs(stock_project)
    (our_run,) = trackio_runs(ours_project)
    stock_points = {(key, row["train/global_step"]): value for row in records(stock_project, stock_run)
                    for key, value in row.items() if key not in ("step", "timestamp", "train/global_step")}
    our_points = {(key, row["step"]): value for row in records(ours_project, our_run)
                  for key, value in row.items() if key not in ("step", "timestamp")}
    # the stock callback leaves the run totals out; ours keeps them under their raw names
    totals = {point for point in our_points if point[0] in TrackioLogger.stock_summary_keys}
    assert totals and {("train/loss", 2), ("eval/loss", 3), ("eval/mse", 6)} <= set(stock_points)
    assert set(our_points) - totals == set(stock_points)
    for point, value in stock_points.items():
        if not point[0].endswith("runtime") and not point[0].endswith("per_second") and point in our_points:
            assert our_points[point] == pytest.approx(value), point


def test_not_installed_bad_arguments_and_a_project_trackio_refuses(monkeypatch):
    from hf_callbacks_plus.loggers.trackio import TrackioLogger

    with pytest.raises(TypeError, match="project must be a string"):
        TrackioLogger(project=3)
    with pytest.raises(ValueError, match="registry-"):
        TrackioLogger(project="registry-models")  # trackio keeps the prefix for its registries
    monkeypatch.setitem(sys.modules, "trackio", None)  # FakeMissingTrackio: as if not installed
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'hf-callbacks-plus\[trackio\]'"):
        TrackioLogger()


def test_a_resumed_run_that_opens_late_logs_no_point_its_store_held(tmp_path):
    # trackio cannot rewind: a resumed run leaves out the points its store holds. When the run opens
    # after the training logged on (a slow trackio.init), the records after it are handed on the
    # training thread: they too must leave out what the store held (step 8 was logged twice).
    from transformers import TrainerCallback

    from hf_callbacks_plus.loggers.trackio import TrackioLogger
    from tests.loggers.faults import FaultInjectingBackend

    project = project_name(tmp_path)
    arguments = dict(max_steps=8, logging_steps=1, save_strategy="steps", save_steps=4, n_train=32)
    make_trainer(tmp_path, callbacks=[TrackioLogger(project=project)], **arguments).train()
    time.sleep(1.1)  # trackio's runs are told apart by the second they start
    resumed = TrackioLogger(project=project)
    opening = resumed.backend = FaultInjectingBackend(resumed.backend, gated=("start",))

    class OpenAtStep7(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.global_step == 7 and not opening.gate.is_set():
                opening.gate.set()
                deadline = time.monotonic() + 30
                while resumed._sender.handed < resumed._sender.wal.size and time.monotonic() < deadline:
                    time.sleep(0.01)  # the backlog sent: step 8 is handed on the training thread

    make_trainer(tmp_path, callbacks=[OpenAtStep7(), resumed], **arguments).train(
        resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    counted = points(project)
    assert not [point for point, count in counted.items() if count > 1]
    assert sorted({step for (key, step) in counted if key == "train/loss"}) == list(range(1, 9))
