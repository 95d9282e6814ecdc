"""A stock ``transformers.Trainer`` raises (it has no exception event): every logger's exit hook
ends its run FAILED, quickly (W&B's own exit hook runs after ours); the resumed training continues
each run from the checkpoint. One subprocess (tests/loggers/crash_script.py) with JSONL,
TensorBoard, MLflow (sqlite) and W&B (offline), each read back with its own reader.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("mlflow")
pytest.importorskip("wandb")
pytest.importorskip("tensorboard")

pytest.importorskip("trackio")

pytestmark = [pytest.mark.transformers, pytest.mark.mlflow, pytest.mark.wandb, pytest.mark.trackio]

ARGS = dict(max_steps=10, logging_steps=2, save_strategy="steps", save_steps=4)


def loggers(uri: str) -> list:
    from hf_callbacks_plus.loggers.jsonl import JsonlLogger
    from hf_callbacks_plus.loggers.mlflow import MLflowLogger
    from hf_callbacks_plus.loggers.tensorboard import TensorBoardLogger
    from hf_callbacks_plus.loggers.trackio import TrackioLogger
    from tests.loggers.wandb_helpers import fast_logger

    return [JsonlLogger(), TensorBoardLogger(), MLflowLogger(tracking_uri=uri, experiment_name="exit"),
            fast_logger(project="exit"), TrackioLogger(project=trackio_project(uri))]


def trackio_project(uri: str) -> str:
    """The test's trackio project (the store under TRACKIO_DIR is this process's and its children's)."""
    return "exit-" + Path(uri.split(":///")[-1]).parent.name


def read_all(out: Path, uri: str, wandb_root: Path) -> dict[str, tuple[Counter, list]]:
    """``{tracker: (Counter of (key, step), statuses)}``."""
    from mlflow.tracking import MlflowClient

    from tests.loggers.test_lifecycle_matrix import _tensorboard_points
    from tests.loggers.wandb_helpers import points, runs, synced_history

    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logs = [line for line in lines if line["event"] == "log"]
    jsonl = (Counter((key, line["step"]) for line in logs for key in line["curves"]),
             [line["status"] for line in lines if line["event"] == "finish"])
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("exit").experiment_id])
    mlflow = (Counter((key, m.step) for key in run.data.metrics
                      for m in client.get_metric_history(run.info.run_id, key)), [run.info.status])
    folders = runs(wandb_root)  # synced in order: a resumed folder rewinds the run to its checkpoint
    wandb = (Counter(points(synced_history(folders))),
             [{0: "FINISHED", None: "RUNNING"}.get(folder.exit_code, "FAILED") for folder in folders])
    from tests.loggers.trackio_helpers import points_and_statuses

    return {"jsonl": jsonl, "tensorboard": _tensorboard_points(out, uri), "mlflow": mlflow, "wandb": wandb,
            "trackio": points_and_statuses(trackio_project(uri))}


def test_a_stock_trainer_that_raises_ends_every_run_failed_at_exit_and_a_resume_continues_them(
        tmp_path, sqlite_uri, monkeypatch):
    from tests.loggers.wandb_helpers import offline_env
    from tests.tiny_models import make_trainer

    wandb_root = offline_env(monkeypatch, tmp_path / "wb")
    out = tmp_path / "out"
    # its own W&B service, as a real training has (WANDB_SERVICE would point at this process's)
    env = {name: value for name, value in os.environ.items() if name != "WANDB_SERVICE"}
    script = str(Path(__file__).with_name("crash_script.py"))
    done = subprocess.run([sys.executable, script, str(out), sqlite_uri], capture_output=True, text=True,
                          timeout=300, env=env)
    ended = time.time()
    assert done.returncode != 0 and "boom at step 6" in done.stderr, done.stderr[-3000:]
    crashed_at = float(next(line for line in done.stdout.splitlines() if line.startswith("CRASH")).split()[1])
    # the exit waits for what the stores take, never for flush_timeout (60 s); 40 s leaves room for
    # a loaded machine (a quiet one: about 5 s)
    assert ended - crashed_at < 40.0, (ended - crashed_at, done.stderr[-2000:])
    for tracker, (points, statuses) in read_all(out, sqlite_uri, wandb_root).items():
        assert statuses == ["FAILED"], (tracker, statuses)
        assert sorted(step for key, step in points if key == "train/loss") == [2, 4, 6], tracker
        assert max(points.values()) == 1, (tracker, points)

    resumed = make_trainer(out, callbacks=loggers(sqlite_uri), **ARGS)
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    for tracker, (points, statuses) in read_all(out, sqlite_uri, wandb_root).items():
        assert statuses[-1] == "FINISHED", (tracker, statuses)
        losses = sorted(points.elements())
        losses = [step for key, step in losses if key == "train/loss"]
        assert losses == [2, 4, 6, 8, 10] and max(points.values()) == 1, (tracker, points)
