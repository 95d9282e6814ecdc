"""Under DDP only the main process logs: 2 ranks on CPU (gloo), one MLflow run."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("mlflow")

pytestmark = [pytest.mark.mlflow, pytest.mark.transformers]


def two_ranks_log_to_mlflow(out: Path) -> None:
    """A tiny Trainer with MLflowLogger on a sqlite store in ``out``, on both ranks."""
    from hf_callbacks_plus.loggers.mlflow import MLflowLogger
    from tests.tiny_models import make_trainer

    logger = MLflowLogger(tracking_uri=f"sqlite:///{out / 'mlflow.db'}", experiment_name="ddp")
    trainer = make_trainer(str(out / "run"), callbacks=[logger], logging_steps=1, max_steps=4,
                           ddp_backend="gloo")
    trainer.train()


@pytest.mark.distributed(scenario=two_ranks_log_to_mlflow)
def test_torchrun_two_processes_make_one_run(distributed_outcome):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{distributed_outcome.dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("ddp")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    assert runs[0].info.status == "FINISHED"
    history = client.get_metric_history(runs[0].info.run_id, "train/loss")
    assert [m.step for m in history] == [1, 2, 3, 4]
