"""``key_names="stock"``: the names the stock transformers callbacks write, for dashboards and
queries built on them; read back from a real MLflow store and W&B offline files."""

from __future__ import annotations

import pytest

from hf_callbacks_plus.loggers.base import stock_names
from hf_callbacks_plus.loggers.jsonl import JsonlLogger
from tests.tiny_models import make_trainer

pytestmark = pytest.mark.transformers


def test_stock_names_styles():
    logs = {"loss": 1.0, "eval_loss": 2.0, "test_mse": 3.0, "train_subset_loss": 4.0, "note": "x"}
    assert stock_names(logs, "raw") == ({"loss": 1.0, "eval_loss": 2.0, "test_mse": 3.0,
                                         "train_subset_loss": 4.0}, {"note": "x"})
    assert stock_names(logs, "rewrite_logs") == ({"train/loss": 1.0, "eval/loss": 2.0, "test/mse": 3.0,
                                                  "train/train_subset_loss": 4.0}, {"train/note": "x"})
    totals = frozenset({"train_loss"})
    assert stock_names({"train_loss": 1.0}, "rewrite_logs", totals) == ({}, {"train_loss": 1.0})


def test_invalid_key_names():
    with pytest.raises(ValueError, match="key_names must be one of"):
        JsonlLogger(key_names="raw")


@pytest.mark.mlflow
def test_mlflow_keeps_the_stock_mlflowcallback_names(tmp_path, sqlite_uri, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from hf_callbacks_plus.loggers.mlflow import MLflowLogger

    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    logger = MLflowLogger(tracking_uri=sqlite_uri, key_names="stock")
    trainer = make_trainer(tmp_path, callbacks=[logger], max_steps=4, logging_steps=1, eval_strategy="steps",
                           eval_steps=2)
    trainer.train()
    client = MlflowClient(sqlite_uri)
    metrics = set(client.get_run(logger.run_id).data.metrics)
    stock = {"loss", "learning_rate", "grad_norm", "eval_loss", "eval_mse", "train_loss", "train_runtime"}
    assert stock <= metrics
    assert not [name for name in metrics if "/" in name]
    assert [m.step for m in client.get_metric_history(logger.run_id, "eval_loss")] == [2, 4]


@pytest.mark.wandb
def test_wandb_keeps_the_stock_wandbcallback_names(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from tests.loggers.wandb_helpers import fast_logger, offline_env, runs

    root = offline_env(monkeypatch, tmp_path / "wandb")
    logger = fast_logger(project="stock-names", dir=str(root), key_names="stock")
    make_trainer(tmp_path / "out", callbacks=[logger], max_steps=4, logging_steps=1, eval_strategy="steps",
                 eval_steps=2).train()
    (run,) = runs(root)
    history = {key for row in run.history for key in row if not key.startswith("_")}
    assert {"train/loss", "train/learning_rate", "eval/loss", "train/global_step"} <= history
    assert "train_loss" in run.summary and "train_runtime" in run.summary  # raw, like WandbCallback
