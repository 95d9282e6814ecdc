"""Every backend x lifecycle, read back with each tracker's own reader.

Each case ends with the right statuses (no successful run closed FAILED), every (key, step) exactly
once and nothing erased. Backends: JSONL, MLflow on a sqlite store (and, for the crash and resume,
on the session's real ``mlflow server``: the run found by its key over the REST API), TensorBoard
(EventAccumulator), trackio (its sqlite store), W&B offline (its run files, synced in order: a
resumed run's folder rewinds the run to its checkpoint, so the steps between the checkpoint and a
crash, in both folders, count once).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from hf_callbacks_plus.loggers.jsonl import JsonlLogger
from tests.tiny_models import make_trainer

pytestmark = pytest.mark.transformers

ARGS = dict(max_steps=8, logging_steps=1, save_strategy="steps", save_steps=4, n_train=32)


def _jsonl(tmp_path: Path, uri: str):
    return JsonlLogger()


def _jsonl_points(tmp_path: Path, uri: str) -> tuple[Counter, list[str]]:
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if line]
    logs = [line for line in lines if line["event"] == "log"]
    points = Counter((key, line["step"]) for line in logs for key in line["curves"])
    return points, [line["status"] for line in lines if line["event"] == "finish"]


def _experiment(tmp_path: Path) -> str:
    return f"lifecycle-{tmp_path.name}"  # one per test: the server's store is shared


def _mlflow(tmp_path: Path, uri: str):
    from hf_callbacks_plus.loggers.mlflow import MLflowLogger

    return MLflowLogger(tracking_uri=uri, experiment_name=_experiment(tmp_path))


def _mlflow_points(tmp_path: Path, uri: str) -> tuple[Counter, list[str]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(_experiment(tmp_path))
    points: Counter = Counter()
    statuses = []
    for run in client.search_runs([experiment.experiment_id]):
        statuses.append(run.info.status)
        for key in run.data.metrics:
            points.update((key, m.step) for m in client.get_metric_history(run.info.run_id, key))
    return points, statuses


def _tensorboard(tmp_path: Path, uri: str):
    from hf_callbacks_plus.loggers.tensorboard import TensorBoardLogger

    return TensorBoardLogger()


def _tensorboard_points(tmp_path: Path, uri: str) -> tuple[Counter, list[str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points: Counter = Counter()
    statuses = []
    for run_dir in sorted({path.parent for path in tmp_path.rglob("events.out.tfevents.*")}):
        accumulator = EventAccumulator(str(run_dir), size_guidance={"tensors": 0, "scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags()["scalars"]:
            points.update((tag, event.step) for event in accumulator.Scalars(tag))
        if "status/text_summary" in accumulator.Tags()["tensors"]:
            statuses += [value.decode() for event in accumulator.Tensors("status/text_summary")
                         for value in event.tensor_proto.string_val]
    return points, statuses


def _wandb(tmp_path: Path, uri: str):
    from tests.loggers.wandb_helpers import fast_logger

    return fast_logger(project="lifecycle", flush_timeout=30.0)


def _wandb_points(tmp_path: Path, uri: str) -> tuple[Counter, list[str]]:
    from tests.loggers.wandb_helpers import points, runs, synced_history

    folders = runs(tmp_path / "wandb_root")
    statuses = [{0: "FINISHED", None: "RUNNING"}.get(run.exit_code, "FAILED") for run in folders]
    by_id: dict[str, list] = {}
    for run in folders:
        by_id.setdefault(run.run_id, []).append(run)
    return Counter(point for same in by_id.values() for point in points(synced_history(same))), statuses


def _trackio(tmp_path: Path, uri: str):
    from hf_callbacks_plus.loggers.trackio import TrackioLogger

    return TrackioLogger(project=_experiment(tmp_path))


def _trackio_points(tmp_path: Path, uri: str) -> tuple[Counter, list[str]]:
    from tests.loggers.trackio_helpers import points_and_statuses

    return points_and_statuses(_experiment(tmp_path))


BACKENDS = {
    "jsonl": (_jsonl, _jsonl_points),
    "mlflow_sqlite": (_mlflow, _mlflow_points),
    "mlflow_server": (_mlflow, _mlflow_points),
    "tensorboard": (_tensorboard, _tensorboard_points),
    "wandb_offline": (_wandb, _wandb_points),
    "trackio": (_trackio, _trackio_points),
}


#: The server shows only what goes over MLflow's REST API (finding the run by its key): one case.
MATRIX_BACKENDS = [name for name in BACKENDS if name != "mlflow_server"]


def _backend(request, tmp_path, _template_db, monkeypatch):
    import shutil

    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    if request.param == "wandb_offline":
        pytest.importorskip("wandb")
        from tests.loggers.wandb_helpers import offline_env

        (tmp_path / "wandb_root").mkdir()
        offline_env(monkeypatch, tmp_path / "wandb_root")

    if request.param.startswith("mlflow"):
        pytest.importorskip("mlflow")
    if request.param == "trackio":
        pytest.importorskip("trackio")
    if request.param == "tensorboard":
        pytest.importorskip("tensorboard")
    shutil.copy(_template_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    if request.param == "mlflow_server":
        uri = request.getfixturevalue("mlflow_server").uri
    make, read = BACKENDS[request.param]
    made = []

    def make_logger():
        made.append(make(tmp_path, uri))
        return made[-1]

    yield request.param, make_logger, (lambda: read(tmp_path, uri))
    for logger in made:  # runs reopened by evaluate()/predict() stay open until exit: end them here,
        logger.close()  # as the exit hook would, so no W&B run stays the process's current run


@pytest.fixture(params=MATRIX_BACKENDS)
def backend(request, tmp_path, _template_db, monkeypatch):
    yield from _backend(request, tmp_path, _template_db, monkeypatch)


@pytest.fixture(params=[*MATRIX_BACKENDS, pytest.param("mlflow_server", marks=pytest.mark.second_tier)])
def backend_or_server(request, tmp_path, _template_db, monkeypatch):
    yield from _backend(request, tmp_path, _template_db, monkeypatch)


def next_second(name: str) -> None:
    """For TensorBoard, wait for the next wall-clock second: it names event files
    ``...<seconds>.<host>.<pid>.<writer counter>`` and reads them in text order, so in one process
    and one second writer 10 is read before writer 9 and a resumed writer's purge of the steps
    after its checkpoint misses the crashed writer's events. A real resume is a later process.
    The other backends do not depend on the clock."""
    import time

    if name == "tensorboard":
        time.sleep(1.0 - time.time() % 1.0 + 0.01)


def duplicates(points: Counter) -> dict:
    """``(key, step)`` points logged more than once."""
    return {point: count for point, count in points.items() if count > 1}


def train_steps(points: Counter) -> list[int]:
    return sorted(step for key, step in points if key == "train/loss")


def test_evaluate_before_train(tmp_path, backend):
    name, make, read = backend
    trainer = make_trainer(tmp_path, callbacks=[make()], **ARGS)
    trainer.evaluate()
    trainer.train()
    points, statuses = read()
    assert not duplicates(points)
    assert train_steps(points) == list(range(1, 9))
    assert ("eval/loss", 0) in points, "the step-0 evaluation is erased"
    assert "FAILED" not in statuses, statuses


def test_train_evaluate_train(tmp_path, backend):
    name, make, read = backend
    trainer = make_trainer(tmp_path, callbacks=[make()], **{**ARGS, "save_strategy": "no"})
    trainer.train()
    trainer.evaluate()
    trainer.train()
    points, statuses = read()
    assert "FAILED" not in statuses, statuses
    assert points[("eval/loss", 8)] >= 1


@pytest.mark.parametrize("after", ["evaluate", "predict"])
def test_resume_then_evaluate_or_predict(tmp_path, backend, after):
    name, make, read = backend
    make_trainer(tmp_path, callbacks=[make()], **ARGS).train()
    next_second(name)
    resumed = make_trainer(tmp_path, callbacks=[make()], **ARGS)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    getattr(resumed, after)(*([resumed.eval_dataset] if after == "predict" else []))
    points, statuses = read()
    assert not duplicates(points), duplicates(points)
    assert sorted(set(train_steps(points))) == list(range(1, 9)), "resumed steps erased or missing"
    assert "FAILED" not in statuses, statuses


def test_crash_then_resume(tmp_path, backend_or_server, caplog):
    """A stock train() raises (no exception event: its logger keeps the run open), then a resumed
    train() in the same process: the earlier holder is closed first (W&B said "run ID in use";
    MLflow's crashed logger closed the resumed, finished run FAILED at interpreter exit)."""
    import logging

    name, make, read = backend_or_server
    with pytest.raises(RuntimeError, match="injected crash"):
        make_trainer(tmp_path, callbacks=[make(), FakeCrashAtStep6()], **ARGS).train()
    next_second(name)
    resumed = make_trainer(tmp_path, callbacks=[make()], **ARGS)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert any("still open in this process" in r.getMessage() for r in caplog.records)
    points, statuses = read()
    assert not duplicates(points), duplicates(points)
    assert train_steps(points) == list(range(1, 9))
    if name.startswith("mlflow"):
        assert statuses == ["FINISHED"], statuses
    else:
        assert statuses and statuses[-1] == "FINISHED", statuses


STOCK = {"tensorboard": ("TensorBoardCallback", _tensorboard, _tensorboard_points),
         "mlflow": ("MLflowCallback", _mlflow, _mlflow_points),
         "wandb": ("WandbCallback", _wandb, _wandb_points),
         "trackio": ("TrackioCallback", _trackio, _trackio_points)}


@pytest.mark.parametrize("stock", list(STOCK))
def test_stock_integration_beside_ours_warns(tmp_path, _template_db, monkeypatch, caplog, stock):
    """report_to=<the same tracker> beside our logger in a stock Trainer (not bound by
    run_before_integrations): a warning naming transformers' callback and how to fix it (it said
    nothing: TensorBoard got two values per (tag, step) in one directory, MLflow two runs)."""
    import logging
    import shutil

    pytest.importorskip(stock)
    shutil.copy(_template_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", _experiment(tmp_path))
    monkeypatch.delenv("DISABLE_MLFLOW_INTEGRATION", raising=False)  # tests/conftest.py sets it
    if stock == "wandb":
        from tests.loggers.wandb_helpers import offline_env

        (tmp_path / "wandb_root").mkdir()
        offline_env(monkeypatch, tmp_path / "wandb_root")
    callback_name, make, _ = STOCK[stock]
    ours = make(tmp_path, uri)
    args = {**ARGS, "save_strategy": "no", "report_to": [stock], "project": _experiment(tmp_path) + "-stock"}
    try:
        with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
            make_trainer(tmp_path, callbacks=[ours], **args).train()
    finally:
        ours.close()
        if stock == "wandb":
            import wandb

            wandb.finish()
        if stock == "mlflow":  # MLflowCallback leaves mlflow's fluent experiment set, in the environment too
            import mlflow

            mlflow.end_run()
            mlflow.tracking.fluent._active_experiment_id = None
            os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
    told = [r.getMessage() for r in caplog.records if f"transformers' {callback_name}" in r.getMessage()]
    assert len(told) == 1, [r.getMessage() for r in caplog.records]
    assert "report_to='none'" in told[0] and "replace_report_to_callbacks" in told[0]


class FakeCrashAtStep6:
    """Raises at step 6: a crash after the checkpoint of step 4 (a stock Trainer has no exception event)."""

    def __new__(cls):
        from transformers import TrainerCallback

        class _Crash(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == 6:
                    raise RuntimeError("injected crash")

        return _Crash()


def test_resume_into_another_output_dir(tmp_path, backend, caplog):
    """A checkpoint copied into another output_dir and resumed there continues the same run: one
    MLflow/W&B run, and the JSONL file / TensorBoard folder named by the checkpoint (they were split
    in two, the steps between checkpoint and crash written in both), with a warning saying where."""
    import logging
    import shutil

    name, make, read = backend
    with pytest.raises(RuntimeError, match="injected crash"):
        make_trainer(tmp_path, callbacks=[make(), FakeCrashAtStep6()], **ARGS).train()
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "checkpoint-4", moved / "checkpoint-4")
    next_second(name)
    resumed = make_trainer(moved, callbacks=[make()], **ARGS)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        resumed.train(resume_from_checkpoint=str(moved / "checkpoint-4"))
    points, statuses = read()
    assert not duplicates(points), duplicates(points)
    assert train_steps(points) == list(range(1, 9))
    assert statuses and statuses[0 if name.startswith("mlflow") else -1] == "FINISHED", statuses
    if name in ("jsonl", "tensorboard"):
        assert any("continues there" in r.getMessage() and str(tmp_path) in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_resume_where_the_run_is_gone_says_so(tmp_path, caplog):
    """The checkpoint's JSONL file does not exist on this machine: the resumed run writes under its
    own output_dir and says that what came before the checkpoint is not there."""
    import logging
    import shutil

    make_trainer(tmp_path / "a", callbacks=[JsonlLogger()], **ARGS).train()
    shutil.copytree(tmp_path / "a" / "checkpoint-4", tmp_path / "b" / "checkpoint-4")
    shutil.rmtree(tmp_path / "a")
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        make_trainer(tmp_path / "b", callbacks=[JsonlLogger()], **ARGS).train(
            resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-4"))
    told = [r.getMessage() for r in caplog.records if "does not exist here" in r.getMessage()]
    assert len(told) == 1 and str(tmp_path / "b" / "metrics.jsonl") in told[0], told
    assert (tmp_path / "b" / "metrics.jsonl").is_file()
