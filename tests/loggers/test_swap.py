"""replace_report_to_callbacks swaps the stock MLflowCallback added by report_to, in place."""

from __future__ import annotations

import pytest

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402
from transformers.integrations.integration_utils import MLflowCallback  # noqa: E402

from hf_callbacks_plus.loggers.mlflow import MLflowLogger  # noqa: E402
from hf_callbacks_plus.loggers.swap import replace_report_to_callbacks  # noqa: E402
from tests.tiny_models import make_trainer  # noqa: E402

pytestmark = [pytest.mark.mlflow, pytest.mark.transformers]


def test_swaps_at_the_same_position_and_logs(tmp_path, sqlite_uri, monkeypatch):
    monkeypatch.delenv("DISABLE_MLFLOW_INTEGRATION", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_uri)
    trainer = make_trainer(tmp_path, report_to=["mlflow"], logging_steps=2, max_steps=4)
    before = [type(cb).__name__ for cb in trainer.callback_handler.callbacks]
    index = before.index("MLflowCallback")
    swapped = replace_report_to_callbacks(trainer)
    after = trainer.callback_handler.callbacks
    assert len(swapped) == 1 and isinstance(swapped[0][0], MLflowCallback)
    assert isinstance(after[index], MLflowLogger) and len(after) == len(before)
    assert not any(isinstance(cb, MLflowCallback) for cb in after)
    trainer.train()
    logger = after[index]
    client = MlflowClient(sqlite_uri)
    assert [run.info.run_id for run in client.search_runs(["0"])] == [logger.run_id]
    assert [m.step for m in client.get_metric_history(logger.run_id, "train/loss")] == [2, 4]


def test_keeps_stock_callback_when_asked_and_rejects_bad_choices(tmp_path, sqlite_uri, monkeypatch):
    monkeypatch.delenv("DISABLE_MLFLOW_INTEGRATION", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_uri)
    trainer = make_trainer(tmp_path, report_to=["mlflow"])
    assert replace_report_to_callbacks(trainer, mlflow=False) == []
    with pytest.raises(TypeError, match="mlflow must be"):
        replace_report_to_callbacks(trainer, mlflow="yes")
    with pytest.raises(TypeError, match="callback_handler"):
        replace_report_to_callbacks(object())


@pytest.mark.wandb
def test_swaps_the_stock_wandb_callback(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    import wandb
    from transformers.integrations.integration_utils import WandbCallback

    from hf_callbacks_plus.loggers.wandb import WandbLogger
    from tests.loggers.wandb_helpers import FAST_SETTINGS, offline_env, runs

    root = offline_env(monkeypatch, tmp_path / "wb")
    monkeypatch.setenv("WANDB_PROJECT", "swapped")
    trainer = make_trainer(tmp_path / "out", report_to="wandb", logging_steps=2, max_steps=4)
    before = [type(cb).__name__ for cb in trainer.callback_handler.callbacks]
    index = before.index("WandbCallback")
    swapped = replace_report_to_callbacks(trainer)
    after = trainer.callback_handler.callbacks
    assert len(swapped) == 1 and isinstance(swapped[0][0], WandbCallback)
    logger = after[index]
    assert isinstance(logger, WandbLogger) and len(after) == len(before)
    assert not any(isinstance(cb, WandbCallback) for cb in after)
    # W&B reads WANDB_DIR once per process: point this test's logger at its own directory
    logger.dir, logger.settings = str(root), wandb.Settings(**FAST_SETTINGS)
    trainer.train()
    (run,) = runs(root)
    assert run.run_id == logger.run_id and run.project == "swapped" and run.exit_code == 0
    assert run.steps("train/loss") == [2, 4]
