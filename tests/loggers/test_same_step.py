"""Never lose a metric: a second value at one step (``trainer.evaluate()`` on other data right
after training, at the step of the last evaluation) reaches every backend.

Only steps the run held from a *previous* session are skipped (the resume boundary); the resume
tests in test_mlflow.py / test_jsonl.py / test_wandb.py check that boundary.
"""

from __future__ import annotations

import json
import logging

import pytest

from hf_callbacks_plus.loggers.jsonl import JsonlLogger
from tests.tiny_models import RegressionDataset, make_trainer

pytestmark = pytest.mark.transformers


def train_then_evaluate_other_data(tmp_path, logger):
    """Train 8 steps (evaluation at 4 and 8), then evaluate other data at step 8."""
    trainer = make_trainer(tmp_path, callbacks=[logger], logging_steps=4, eval_strategy="steps",
                           eval_steps=4, max_steps=8)
    trainer.train()
    in_training = trainer.state.log_history[-2]["eval_loss"]
    other = trainer.evaluate(RegressionDataset(16, seed=9))["eval_loss"]
    assert trainer.state.global_step == 8 and other != in_training
    assert logger.close()
    return in_training, other


@pytest.mark.mlflow
def test_mlflow_keeps_both_values_at_one_step(tmp_path, sqlite_uri, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from hf_callbacks_plus.loggers.mlflow import MLflowLogger

    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    in_training, other = train_then_evaluate_other_data(tmp_path, logger)
    client = MlflowClient(sqlite_uri)
    points = [(m.step, m.value) for m in client.get_metric_history(logger.run_id, "eval/loss")]
    assert sorted(value for step, value in points if step == 8) == sorted([in_training, other])
    assert [step for step, _ in points].count(4) == 1 and len(points) == 3
    assert client.get_run(logger.run_id).info.status == "FINISHED"


def test_jsonl_writes_every_record(tmp_path):
    logger = JsonlLogger()
    in_training, other = train_then_evaluate_other_data(tmp_path, logger)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    values = [(line["step"], line["curves"]["eval/loss"]) for line in lines
              if line["event"] == "log" and "eval/loss" in line["curves"]]
    assert values == [(4, values[0][1]), (8, in_training), (8, other)]


@pytest.mark.wandb
def test_wandb_keeps_both_values_at_one_step_in_rows_of_that_step_without_a_warning(tmp_path, monkeypatch,
                                                                                   caplog):
    """W&B keeps one value per key and history row: a second value of a key at one training step goes
    to the next row, whose ``train/global_step`` (every chart's x axis) is still that step, as the
    stock ``WandbCallback``'s rows are (it went to the run summary as ``eval/loss@4``, with a warning
    per key: 37 lines for an evaluation of 37 metrics)."""
    pytest.importorskip("wandb")
    from transformers import TrainerCallback

    from tests.loggers.wandb_helpers import fast_logger, global_steps, offline_env, runs

    root = offline_env(monkeypatch, tmp_path / "wb")
    logger = fast_logger(project="same-step")
    seen = {}

    class EvaluateOtherDataAt4(TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            if state.global_step == 4 and "other" not in seen:
                seen["other"] = None
                seen["other"] = trainer.evaluate(RegressionDataset(16, seed=9))["eval_loss"]

    trainer = make_trainer(tmp_path / "out", callbacks=[logger, EvaluateOtherDataAt4()], logging_steps=4,
                           eval_strategy="steps", eval_steps=4, max_steps=8)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer.train()
        (run,) = runs(root)
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("hf_callbacks_plus")]
    assert not ours, ours
    values = [entry["eval_loss"] for entry in trainer.state.log_history if "eval_loss" in entry]
    assert global_steps(run, "eval/loss") == [4, 4, 8]
    assert [value for _, value in run.series("eval/loss")] == pytest.approx(values)
    assert seen["other"] == pytest.approx(values[1])
    assert [row["_step"] for row in run.history] == [4, 5, 8]  # W&B's own step only increases
    assert global_steps(run, "train/loss") == [4, 8]
