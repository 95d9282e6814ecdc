"""A training killed with SIGKILL while records are in flight loses nothing: every (key, step)
exactly once after ``hf-callbacks-plus replay`` and after the resumed training.

A stock ``transformers.Trainer`` with ``MLflowLogger`` (tests/loggers/mlflow_kill_script.py) kills
itself right after logging step 45 (checkpoint-40 is the last one); fault injection makes the
store hang after its first ``log`` call, so most records are written to the log but never
acknowledged at the kill. Real MLflow: a sqlite store, and the session's ``mlflow server``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("transformers")
from mlflow.tracking import MlflowClient  # noqa: E402

from hf_callbacks_plus.cli import main as cli  # noqa: E402
from hf_callbacks_plus.loggers.mlflow import MLflowLogger  # noqa: E402
from hf_callbacks_plus.loggers.wal import WriteAheadLog  # noqa: E402
from tests.loggers.mlflow_kill_script import ARGS  # noqa: E402
from tests.tiny_models import make_trainer  # noqa: E402

pytestmark = [pytest.mark.mlflow, pytest.mark.transformers]

REPO = Path(__file__).resolve().parents[2]
EVERY_STEP = ("train/loss", "train/grad_norm", "train/learning_rate", "train/epoch")
EVAL = ("eval/loss", "eval/mse", "eval/mae", "eval/runtime", "eval/samples_per_second",
        "eval/steps_per_second")


def kill_at_45(out: Path, uri: str, experiment: str) -> Path:
    """Run the script to its SIGKILL; return its write-ahead log."""
    script = str(Path(__file__).with_name("mlflow_kill_script.py"))
    done = subprocess.run([sys.executable, script, str(out), uri, experiment, "45", "1"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    (wal,) = (out / ".mlflow_wal").glob("*.jsonl")
    log = WriteAheadLog(wal)
    log.inspect()
    pending = log.pending(log.recover()[0])["log"]
    log.close()
    assert 0 < pending < 45, f"{pending} records in flight at the kill: the test proves nothing"
    return wal


def the_run(client: MlflowClient, experiment: str):
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    points = Counter((key, m.step) for key in run.data.metrics
                     for m in client.get_metric_history(run.info.run_id, key))
    return run, points


def expected(last: int) -> Counter:
    steps = {key: range(1, last + 1) for key in EVERY_STEP}
    steps.update({key: range(10, last + 1, 10) for key in EVAL})
    return Counter((key, step) for key, values in steps.items() for step in values)


def resume(out: Path, uri: str, experiment: str) -> MLflowLogger:
    logger = MLflowLogger(tracking_uri=uri, experiment_name=experiment)
    make_trainer(out, callbacks=[logger], **ARGS).train(resume_from_checkpoint=str(out / "checkpoint-40"))
    return logger


def test_after_a_sigkill_replay_then_the_resumed_training_log_every_step_once(tmp_path, sqlite_uri):
    experiment = "killed"
    wal = kill_at_45(tmp_path, sqlite_uri, experiment)
    client = MlflowClient(sqlite_uri)
    assert cli(["replay", str(wal.parent)]) == 0
    run, points = the_run(client, experiment)
    assert points == expected(45), "replay: a (key, step) missing or twice"
    assert run.info.status == "RUNNING"  # a killed process never ended its run

    resume(tmp_path, sqlite_uri, experiment)
    run, points = the_run(client, experiment)
    totals = {key for key, _ in points if key.startswith("train_summary/")}
    assert +points - Counter({(key, 60): 1 for key in totals}) == expected(60)
    assert run.info.status == "FINISHED"


@pytest.mark.second_tier  # the sqlite case above is the first tier's; this one adds MLflow's REST API
def test_after_a_sigkill_the_resumed_training_logs_every_step_once_through_a_server(tmp_path, mlflow_server):
    experiment = f"killed-{uuid.uuid4().hex[:8]}"  # the server is shared by the session
    kill_at_45(tmp_path, mlflow_server.uri, experiment)
    logger = resume(tmp_path, mlflow_server.uri, experiment)
    run, points = the_run(MlflowClient(mlflow_server.uri), experiment)
    assert run.info.run_id == logger.run_id
    totals = {key for key, _ in points if key.startswith("train_summary/")}
    assert +points - Counter({(key, 60): 1 for key in totals}) == expected(60)
    assert max(points.values()) == 1 and run.info.status == "FINISHED"
    assert not (tmp_path / ".mlflow_wal").exists() or not list((tmp_path / ".mlflow_wal").iterdir())
