"""The checkpoint names the run however slow the store is.

The run's identity is fixed on the training thread when the run is opened: a client-made run
key for every logger (MLflow tags the run with it and finds it again by it), and the run id
itself for the trackers whose ids the client chooses (W&B, TensorBoard, JSONL). A checkpoint
never waits for the store. Real stores (MLflow sqlite and the session's server, W&B offline read
back with the test kit's reader, TensorBoard folders, JSONL files) and a real ``transformers.Trainer``.

Fault injection, named as such: ``FaultInjectingBackend(gated=("start",))`` holds the run's
creation until the test releases it (a loaded store), ``SlowInitWandb`` holds ``wandb.init``;
everything else is the real thing.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from hf_callbacks_plus.core.callback import TrainerCallback
from tests.loggers.faults import FaultInjectingBackend, SlowInitWandb
from tests.tiny_models import make_trainer

pytestmark = pytest.mark.transformers


def saved_state(checkpoint: Path, name: str) -> dict[str, Any]:
    """The attributes of the logger ``name`` saved in a checkpoint's trainer_state.json (the last entry)."""
    data = json.loads((checkpoint / "trainer_state.json").read_text())
    entries = data["stateful_callbacks"][name]
    entries = entries if isinstance(entries, list) else [entries]
    return entries[-1]["attributes"]


def crash_at(step: int, delivered_by=None):
    class FakeCrash(TrainerCallback):
        """Raises in the training loop at ``step`` (the stock Trainer has no exception event); with
        ``delivered_by`` (a logger), once the store has what it logged (its run is open): a gate, so a
        loaded machine cannot leave the run unopened at the crash, its sender thread still creating
        it in this process while the resumed logger looks for it (a crashed process has no thread)."""

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == step:
                if delivered_by is not None:
                    assert delivered_by.flush(timeout=120), "the store did not take the records in 120 s"
                raise RuntimeError("injected crash")

    return FakeCrash()


class ReleaseAtSave(TrainerCallback):
    """Listed after the logger: once the checkpoint of ``step`` is written (its state taken before
    ``on_save``), the store may answer: ``gate`` is released."""

    def __init__(self, step: int, gate) -> None:
        self.step, self.gate = step, gate

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.gate.set()


@pytest.mark.mlflow
def test_a_slow_mlflow_store_keeps_one_run_across_a_crash_and_resume(tmp_path, sqlite_uri, caplog):
    """The store creates the run after the first checkpoint: that checkpoint holds no run id, only
    the run key; after a crash the resumed training finds the run by the key's tag and continues it."""
    from mlflow.tracking import MlflowClient

    from hf_callbacks_plus.loggers.mlflow import RUN_KEY_TAG, MLflowLogger

    args = dict(max_steps=8, logging_steps=1, save_strategy="steps", save_steps=4, n_train=32)
    first = MLflowLogger(tracking_uri=sqlite_uri, experiment_name="identity")
    slow = first.backend = FaultInjectingBackend(first.backend, gated=("start",))
    with pytest.raises(RuntimeError, match="injected crash"):
        make_trainer(tmp_path, callbacks=[first, ReleaseAtSave(4, slow.gate), crash_at(6)], **args).train()
    state = saved_state(tmp_path / "checkpoint-4", "MLflowLogger")
    assert state["run_id"] is None and state["run_key"], state  # the store had not answered yet

    resumed = MLflowLogger(tracking_uri=sqlite_uri, experiment_name="identity")
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        make_trainer(tmp_path, callbacks=[resumed], **args).train(
            resume_from_checkpoint=str(tmp_path / "checkpoint-4"))

    client = MlflowClient(sqlite_uri)
    experiment = client.get_experiment_by_name("identity")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, [run.info.run_id for run in runs]
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags[RUN_KEY_TAG] == state["run_key"] == resumed.run_key
    assert resumed.run_id == run.info.run_id
    points = Counter((key, m.step) for key in run.data.metrics
                     for m in client.get_metric_history(run.info.run_id, key))
    assert not {point: n for point, n in points.items() if n > 1}, "a (key, step) twice"
    assert sorted(step for key, step in points if key == "train/loss") == list(range(1, 9))


@pytest.mark.mlflow
def test_a_resume_creates_the_run_with_its_key_when_the_first_process_never_did(sqlite_uri):
    """The first process died before the store created its run: the resume creates it, tagged with
    the checkpoint's key, and a later resume finds that same run."""
    from mlflow.tracking import MlflowClient

    from hf_callbacks_plus.loggers.mlflow import RUN_KEY_TAG, MLflowLogger

    backend = MLflowLogger(tracking_uri=sqlite_uri, experiment_name="never-created").backend
    key = "0f" * 16
    created = backend.start(None, key, True)
    backend.finish("FAILED", created)
    again = backend.start(None, key, True)
    backend.finish("FINISHED", again)
    other = backend.start(None, "1e" * 16, False)  # a new run: created at once, with its key
    backend.finish("FINISHED", other)
    client = MlflowClient(sqlite_uri)
    assert again == created != other
    assert client.get_run(created).data.tags[RUN_KEY_TAG] == key
    assert client.get_run(created).info.status == "FINISHED"
    experiment = client.get_experiment_by_name("never-created")
    assert len(client.search_runs([experiment.experiment_id])) == 2


def _jsonl(tmp_path, monkeypatch):
    from hf_callbacks_plus.loggers.jsonl import JsonlLogger

    return JsonlLogger()  # a local file: the run opens at train begin, on the training thread


def _tensorboard(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from hf_callbacks_plus.loggers.tensorboard import TensorBoardLogger

    return TensorBoardLogger()  # a local folder: the run opens at train begin, on the training thread


def _wandb(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from tests.loggers.wandb_helpers import fast_logger, offline_env

    (tmp_path / "wandb_root").mkdir()
    offline_env(monkeypatch, tmp_path / "wandb_root")
    logger = fast_logger(flush_timeout=1.0)  # train begin waits for wandb.init 1 s, then goes on
    logger.backend._wandb = SlowInitWandb(logger.backend._wandb)
    logger.gate = logger.backend._wandb.gate
    return logger


def _mlflow(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from hf_callbacks_plus.loggers.mlflow import MLflowLogger

    logger = MLflowLogger(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    logger.backend = FaultInjectingBackend(logger.backend, gated=("start",))
    logger.gate = logger.backend.gate
    return logger


@pytest.mark.parametrize("make", [_jsonl, _tensorboard, _wandb, _mlflow], ids=["jsonl", "tensorboard",
                                                                             "wandb_offline", "mlflow"])
def test_every_checkpoint_names_the_run_without_waiting_for_a_slow_start(tmp_path, monkeypatch, make, caplog):
    """A remote run (W&B, MLflow) opens only after the saves of steps 1 and 2 (the store is held until
    then). Each checkpoint names the run at once: its run key, and the run id where the client
    chooses it (W&B's ``wandb.init(id=...)``, TensorBoard's folder, JSONL); that is the id the run
    gets. (JSONL and TensorBoard open their local file at train begin; W&B's train begin waits for
    ``wandb.init`` at most ``flush_timeout``, 1 s here.)"""
    logger = make(tmp_path, monkeypatch)
    if make is _mlflow:
        from mlflow.tracking import MlflowClient

        MlflowClient(logger.backend.store.uri).search_experiments()  # the schema, before timing
    name = type(logger).__name__
    seen = []

    class TimeSaves(TrainerCallback):
        """Listed after the logger: how long the logger's state takes; the store answers after step 2."""

        def on_save(self, args, state, control, **kwargs):
            start = time.monotonic()
            seen.append((logger.state_attributes(), time.monotonic() - start))
            if state.global_step == 2 and hasattr(logger, "gate"):
                logger.gate.set()

    trainer = make_trainer(tmp_path, callbacks=[logger, TimeSaves()], max_steps=2, logging_steps=1,
                           save_strategy="steps", save_steps=1, n_train=16)
    trainer.train()
    logger.flush_timeout = 60.0  # W&B's: 1 s of waiting at train begin; closing may wait for the slow store
    assert len(seen) == 2
    for attributes, seconds in seen:
        assert seconds < 0.5, seconds  # the logger's state never waits for the run to open
        assert attributes["run_key"] == logger.run_key
    states = [saved_state(tmp_path / f"checkpoint-{step}", name) for step in (1, 2)]
    assert all(state["run_key"] == logger.run_key for state in states), states
    if make is _mlflow:
        assert all(state["run_id"] is None for state in states)  # the store assigns it: found by the key
        from mlflow.tracking import MlflowClient

        from hf_callbacks_plus.loggers.mlflow import RUN_KEY_TAG

        assert MlflowClient(logger.backend.store.uri).get_run(logger.run_id).data.tags[RUN_KEY_TAG] == (
            logger.run_key)
        return
    assert all(state["run_id"] == logger.run_id for state in states), (states, logger.run_id)
    if make is _wandb:
        from tests.loggers.wandb_helpers import fast_logger, runs

        (run,) = runs(tmp_path / "wandb_root")
        assert run.run_id == logger.run_id and run.steps("train/loss") == [1, 2]
        # every record reached W&B: a resume from the first checkpoint (saved while they waited for
        # wandb.init) says nothing is missing (it used to warn that they might be)
        with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
            resumed = make_trainer(tmp_path, callbacks=[fast_logger()], max_steps=2, logging_steps=1,
                                   save_strategy="no", n_train=16)
            resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
        assert not [r.getMessage() for r in caplog.records if "missing" in r.getMessage()
                    or "not yet delivered" in r.getMessage()]
    elif make is _tensorboard:
        assert Path(logger.backend.directory).name == logger.run_id
    else:
        lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert [line["run_id"] for line in lines if line["event"] == "start"] == [logger.run_id]


@pytest.mark.mlflow
@pytest.mark.parametrize(("store", "how"), [("sqlite", "resumed_training"), ("sqlite", "replay_command"),
                                            ("server", "replay_command")])
def test_records_logged_before_the_run_opened_go_to_the_run_of_their_key(tmp_path, request, how, store):
    """The store was down for the whole first process: its log holds no run id, only the run key, so
    the resumed training (or ``hf-callbacks-plus replay``, then the resumed training) puts everything
    into the one run of that key, in a sqlite store and through a real ``mlflow server`` (the tag
    search goes over its REST API)."""
    import uuid

    from mlflow.tracking import MlflowClient

    sqlite_uri = (request.getfixturevalue("sqlite_uri") if store == "sqlite"
                  else request.getfixturevalue("mlflow_server").uri)
    experiment_name = f"identity-{uuid.uuid4().hex[:8]}"  # the server is shared by the session

    from hf_callbacks_plus.cli import main as cli
    from hf_callbacks_plus.loggers.mlflow import RUN_KEY_TAG, MLflowLogger

    args = dict(max_steps=8, logging_steps=1, save_strategy="steps", save_steps=4, n_train=32)
    first = MLflowLogger(tracking_uri=sqlite_uri, experiment_name=experiment_name, flush_timeout=1.0,
                         backoff=(0.05, 0.1))
    first.backend = FaultInjectingBackend(first.backend, failing=("start",))
    with pytest.raises(RuntimeError, match="injected crash"):
        make_trainer(tmp_path, callbacks=[first, crash_at(6)], **args).train()
    first.close_after_exception()
    key = saved_state(tmp_path / "checkpoint-4", "MLflowLogger")["run_key"]
    assert key and first.wal_path.is_file()
    if how == "replay_command":
        assert cli(["replay", str(first.wal_path.parent)]) == 0
    resumed = MLflowLogger(tracking_uri=sqlite_uri, experiment_name=experiment_name)
    make_trainer(tmp_path, callbacks=[resumed], **args).train(
        resume_from_checkpoint=str(tmp_path / "checkpoint-4"))

    client = MlflowClient(sqlite_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    runs = client.search_runs([experiment.experiment_id])
    assert [run.data.tags.get(RUN_KEY_TAG) for run in runs] == [key], "a second run was opened"
    steps = Counter(m.step for m in client.get_metric_history(runs[0].info.run_id, "train/loss"))
    assert sorted(steps) == list(range(1, 9)) and set(steps.values()) == {1}, steps


@pytest.mark.mlflow
def test_the_same_store_spelled_differently_on_resume_continues_the_one_run(tmp_path, monkeypatch,
                                                                            _template_db):
    """A relative sqlite path in the first process, the absolute one in the resumed process: one run,
    every step once, FINISHED (the checkpoint entry was keyed by the URI: two runs, one FAILED)."""
    import shutil

    from mlflow.tracking import MlflowClient

    from hf_callbacks_plus.loggers.mlflow import MLflowLogger

    shutil.copy(_template_db, tmp_path / "mlflow.db")
    monkeypatch.chdir(tmp_path)
    args = dict(max_steps=8, logging_steps=1, save_strategy="steps", save_steps=4, n_train=32)
    first = MLflowLogger(tracking_uri="sqlite:///mlflow.db", experiment_name="spelling")
    with pytest.raises(RuntimeError, match="injected crash"):
        make_trainer(tmp_path / "out", callbacks=[first, crash_at(6, delivered_by=first)], **args).train()
    first.close_after_exception()
    resumed = MLflowLogger(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment_name="spelling")
    make_trainer(tmp_path / "out", callbacks=[resumed], **args).train(
        resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-4"))
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("spelling").experiment_id])
    assert [run.info.run_id for run in runs] == [first.run_id] == [resumed.run_id]
    assert runs[0].info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(first.run_id, "train/loss")]
    assert sorted(steps) == list(range(1, 9)), steps
