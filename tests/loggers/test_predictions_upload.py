"""StreamingMetrics(log_predictions=True): each evaluation's predictions file reaches the MLflow run
(read back with MlflowClient), and a tracker that keeps no files (JSONL) is left alone."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("mlflow")
pytest.importorskip("torchmetrics")

from hf_callbacks_plus import JsonlLogger, MLflowLogger  # noqa: E402
from hf_callbacks_plus.callbacks.streaming_metrics import StreamingMetrics  # noqa: E402
from tests.callbacks.test_streaming_metrics import build  # noqa: E402

pytestmark = [pytest.mark.transformers, pytest.mark.mlflow]


def test_predictions_files_reach_the_mlflow_run(tmp_path, sqlite_uri):
    from mlflow.tracking import MlflowClient

    metrics = StreamingMetrics(num_classes=3, save_predictions=10, log_predictions=True, train_metrics=None)
    logger = MLflowLogger(tracking_uri=sqlite_uri, experiment_name="predictions")
    trainer = build(
        "classification",
        tmp_path,
        callbacks=[metrics, logger, JsonlLogger(str(tmp_path / "m.jsonl"))],
        eval_strategy="steps",
        eval_steps=5,
        max_steps=10,
    )
    trainer.train()

    client = MlflowClient(sqlite_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("predictions").experiment_id])
    folders = sorted(item.path for item in client.list_artifacts(run.info.run_id))
    assert folders == ["predictions_eval-step-10", "predictions_eval-step-5"]
    local = client.download_artifacts(
        run.info.run_id, "predictions_eval-step-10/eval-step-10.jsonl", str(tmp_path / "download")
    )
    uploaded = [json.loads(line) for line in open(local, encoding="utf-8")]
    assert uploaded == [json.loads(line) for line in (tmp_path / "predictions" / "eval-step-10.jsonl").open()]
    assert len(uploaded) == 10
    assert not (tmp_path / ".tracker_artifacts" / "predictions_eval-step-10").exists()  # staged copy removed


def test_log_predictions_needs_saved_predictions():
    with pytest.raises(ValueError, match="log_predictions=True needs save_predictions"):
        StreamingMetrics(task="causal_lm", log_predictions=True)
