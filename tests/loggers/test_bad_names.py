"""Bad names and values cost nothing but themselves: each is dropped (or renamed) alone with one
warning when the record is rendered, checked against the real validation of MLflow (sqlite store)
and W&B (offline run file). (A record the store still refuses is dropped alone: test_wal.py.)
"""

from __future__ import annotations

import logging

import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hf_callbacks_plus.core.callback import TrainerCallback  # noqa: E402
from hf_callbacks_plus.loggers.mlflow import MLflowLogger  # noqa: E402
from hf_callbacks_plus.loop.arguments import LoopArguments  # noqa: E402
from hf_callbacks_plus.loop.trainer import LightweightTrainer  # noqa: E402

pytestmark = pytest.mark.mlflow

PREFIX = "eval/" + "very_long_metric_name_" * 13  # 291 characters
LONG_A, LONG_B = PREFIX + "alpha", PREFIX + "beta"


class AddBadKeys(TrainerCallback):
    """Listed before the logger: two long keys sharing 250+ characters and a value of 10**400."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "loss" in logs:
            logs.update({LONG_A: 1.0, LONG_B: 2.0, "huge": 10**400, "fine": 3.0})


def train(out, callbacks, steps=3, config=None):
    args = LoopArguments(output_dir=str(out), max_steps=steps, logging_steps=1, disable_tqdm=True)

    class Model:
        pass

    model = Model()
    model.config = config or {}
    return LightweightTrainer(args, train_step=lambda batch: 0.5, train_data=[[1.0]] * steps,
                              callbacks=callbacks, model=model, learning_rate_fn=lambda: 0.1).train()


def test_long_colliding_names_and_a_huge_value_cost_no_other_metric(tmp_path, sqlite_uri, caplog):
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train(tmp_path, [AddBadKeys(), logger])
    client = MlflowClient(sqlite_uri)
    metrics = client.get_run(logger.run_id).data.metrics
    assert [m.step for m in client.get_metric_history(logger.run_id, "train/loss")] == [1, 2, 3]
    assert [m.step for m in client.get_metric_history(logger.run_id, "train/fine")] == [1, 2, 3]
    long_names = [name for name in metrics if name.startswith(PREFIX[:50])]
    assert len(long_names) == 2 and all(len(name) <= 250 for name in long_names), long_names
    assert sorted(metrics[name] for name in long_names) == [1.0, 2.0]
    assert "train/huge" not in metrics
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "'train/huge'" in m and "too large" in m]) == 1, messages
    assert len([m for m in messages if "both become" in m]) == 1, messages


def test_long_config_keys_are_dropped_alone(tmp_path, sqlite_uri, caplog):
    logger = MLflowLogger(tracking_uri=sqlite_uri)
    config = {"k" * 260 + "_one": 1, "k" * 260 + "_two": 2, "hidden_size": 4}
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train(tmp_path, [logger], config=config)
    params = MlflowClient(sqlite_uri).get_run(logger.run_id).data.params
    assert params["model.hidden_size"] == "4" and params["max_steps"] == "3"
    assert "output_dir" in params and "learning_rate" in params  # the chunk of params they were in
    assert not [key for key in params if key.startswith("model.kkk")]
    assert len([r for r in caplog.records if "longer than MLflow's 250" in r.getMessage()]) == 2


@pytest.mark.wandb
def test_wandb_accepts_what_the_logger_sends_for_bad_names(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from tests.loggers.wandb_helpers import fast_logger, offline_env, runs

    root = offline_env(monkeypatch, tmp_path / "wb")
    logger = fast_logger(project="names", log_config=False)
    train(tmp_path / "out", [AddBadKeys(), logger])
    (run,) = runs(root)
    assert run.steps("train/loss") == [1, 2, 3] and run.steps("train/fine") == [1, 2, 3]
    assert run.steps(LONG_A) == [1, 2, 3] and run.steps(LONG_B) == [1, 2, 3]
    assert "train/huge" not in run.keys() and run.exit_code == 0
