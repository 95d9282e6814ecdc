"""Under DDP only the main process logs: ``torchrun --nproc_per_node 2`` on CPU, one MLflow run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

pytestmark = [pytest.mark.mlflow, pytest.mark.transformers, pytest.mark.distributed, pytest.mark.slow]

ROOT = Path(__file__).parents[2]


def test_torchrun_two_processes_make_one_run(tmp_path, sqlite_uri):
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI"):
        env.pop(name, None)
    process = subprocess.Popen(
        [str(torchrun), "--standalone", "--nproc_per_node", "2", str(ROOT / "tests/loggers/ddp_train.py"),
         str(tmp_path / "out"), sqlite_uri],
        cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # torchrun and both workers
        output, _ = process.communicate()
        pytest.fail(f"torchrun timed out: {output[-3000:]}")
    assert process.returncode == 0, output[-3000:]
    client = MlflowClient(sqlite_uri)
    experiment = client.get_experiment_by_name("ddp")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    assert runs[0].info.status == "FINISHED"
    history = client.get_metric_history(runs[0].info.run_id, "train/loss")
    assert [m.step for m in history] == [1, 2, 3, 4]
