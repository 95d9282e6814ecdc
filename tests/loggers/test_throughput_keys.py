"""The names the ThroughputMonitor's figures arrive under, read back from the trackers (issue 32,
item 6).

docs/throughput.md says: ``throughput/...`` for our loggers and for transformers' stock
``MLflowCallback`` (which logs the keys as they are), ``train/throughput/...`` for the stock
integrations that pass a training record through ``rewrite_logs`` (TensorBoard here; W&B, Trackio,
Comet, Neptune and SwanLab alike). Both MLflow runs are read back from a real sqlite store.
"""

from __future__ import annotations

import pytest

from hf_callbacks_plus import run_before_integrations
from hf_callbacks_plus.callbacks.throughput import ThroughputMonitor
from tests.callbacks.throughput_helpers import RecordingCollator, lm_rows, throughput_records, tiny_llama
from tests.tiny_models import training_args

pytestmark = [pytest.mark.transformers, pytest.mark.mlflow]

FIGURES = ("sequences_per_second", "tokens_per_second", "loss_tokens_per_second", "tflops_per_second",
           "window_seconds", "logging_seconds", "left_out_seconds")


def test_mlflow_stock_and_ours_get_throughput_keys_as_documented(tmp_path, sqlite_uri, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient
    from transformers import Trainer

    from hf_callbacks_plus.loggers.mlflow import MLflowLogger
    from tests.integrations.tensorboard_events import read_scalars

    uri = sqlite_uri
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_NESTED_RUN", "MLFLOW_TAGS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("DISABLE_MLFLOW_INTEGRATION", "FALSE")  # the suite turns the stock callback off
    ours = MLflowLogger(tracking_uri=uri, experiment_name="ours")
    trainer = Trainer(model=tiny_llama(), args=training_args(tmp_path / "out", max_steps=6, logging_steps=2,
                                                             per_device_train_batch_size=4,
                                                             remove_unused_columns=False,
                                                             report_to=["mlflow", "tensorboard"]),
                      train_dataset=lm_rows(24, seed=1), data_collator=RecordingCollator(),
                      callbacks=[ThroughputMonitor(peak_flops=1e12), ours])
    run_before_integrations(trainer)  # the figures reach the stock integrations too
    trainer.train()
    records = throughput_records(trainer.state.log_history)
    assert [r["step"] for r in records] == [2, 4, 6]

    client = MlflowClient(uri)
    (stock_run,) = client.search_runs([client.get_experiment_by_name("Default").experiment_id])
    assert stock_run.info.run_id != ours.run_id
    for run_id in (stock_run.info.run_id, ours.run_id):
        metrics = set(client.get_run(run_id).data.metrics)
        for name in (*FIGURES, "mfu", "device/tokens_per_second"):
            assert f"throughput/{name}" in metrics, (run_id, name, sorted(metrics))
            assert f"train/throughput/{name}" not in metrics
        history = client.get_metric_history(run_id, "throughput/tokens_per_second")
        assert {m.step: m.value for m in history} == {
            r["step"]: pytest.approx(r["throughput/tokens_per_second"]) for r in records}
    scalars = read_scalars(tmp_path / "out")
    assert {f"train/throughput/{name}" for name in FIGURES} <= set(scalars)
