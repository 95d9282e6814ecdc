"""MLflowLogger against a real MLflow sqlite store, read back with MlflowClient."""

from __future__ import annotations

import sys
from collections import Counter

import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hf_callbacks_plus.core.callback import TrainerCallback  # noqa: E402
from hf_callbacks_plus.core.stateful import SelfRestoringState  # noqa: E402
from hf_callbacks_plus.loggers.mlflow import MLflowLogger  # noqa: E402
from hf_callbacks_plus.loggers.secrets import REDACTED  # noqa: E402
from tests.tiny_models import make_trainer  # noqa: E402

pytestmark = [pytest.mark.mlflow, pytest.mark.transformers]

SECRET = "hf_" + "S" * 34

def histories(client, run_id):
    run = client.get_run(run_id)
    return {key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
            for key in run.data.metrics}


class AddText(TrainerCallback):
    """A user callback placed before the logger: adds a string value to every log."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "eval_loss" in logs:
            logs["early_stopping/reason"] = "patience"


def test_full_run_metrics_params_tags_status(tmp_path, sqlite_uri):
    logger = MLflowLogger(tracking_uri=sqlite_uri, experiment_name="exp", tags={"team": "nlp"})
    trainer = make_trainer(tmp_path, callbacks=[AddText(), logger], logging_steps=2, eval_strategy="steps",
                           eval_steps=4, max_steps=8, hub_token=SECRET)
    trainer.model.config = {"width": 4, "description": "x" * 7000, "api_key": SECRET}
    trainer.train()
    client = MlflowClient(sqlite_uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "exp"
    got = histories(client, logger.run_id)
    assert [step for step, _ in got["train/loss"]] == [2, 4, 6, 8]
    assert [step for step, _ in got["eval/mse"]] == [4, 8]
    assert "train_summary/runtime" in got and "train/train_runtime" not in got
    assert run.data.tags["team"] == "nlp" and run.data.tags["early_stopping/reason"] == "patience"
    params = run.data.params
    assert len(params) > 100  # several log_batch calls of <= 100 params
    assert params["hub_token"] == REDACTED and params["model.api_key"] == REDACTED
    assert len(params["model.description"]) == 6000 and params["model.description"].endswith("...")
    everything = [*params.values(), *run.data.tags.values()]
    assert not any(SECRET in value for value in everything)


def test_resume_continues_the_same_run_without_duplicate_steps(tmp_path, sqlite_uri):
    def trainer():
        return make_trainer(tmp_path, callbacks=[MLflowLogger(tracking_uri=sqlite_uri)], logging_steps=2,
                            eval_strategy="steps", eval_steps=4, save_strategy="steps", save_steps=4,
                            max_steps=12)

    first = trainer()
    first.train()
    run_id = next(cb for cb in first.callback_handler.callbacks if isinstance(cb, MLflowLogger)).run_id
    second = trainer()  # a new process would do the same: the run id comes from the checkpoint
    second.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    logger = next(cb for cb in second.callback_handler.callbacks if isinstance(cb, MLflowLogger))
    assert isinstance(logger, SelfRestoringState) and logger.run_id == run_id
    client = MlflowClient(sqlite_uri)
    assert len(client.search_runs(["0"])) == 1
    for key, points in histories(client, run_id).items():
        steps = Counter(step for step, _ in points)
        assert max(steps.values()) == 1, (key, points)
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == [2, 4, 6, 8, 10, 12]
    assert client.get_run(run_id).info.status == "FINISHED"


def test_env_vars_run_id_tags_experiment(tmp_path, sqlite_uri, monkeypatch):
    client = MlflowClient(sqlite_uri)
    run_id = client.create_run("0").info.run_id
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_uri)
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    monkeypatch.setenv("MLFLOW_TAGS", '{"release": "rc1"}')
    logger = MLflowLogger(log_params=False)
    make_trainer(tmp_path, callbacks=[logger], logging_steps=4, max_steps=8).train()
    run = client.get_run(run_id)
    assert logger.run_id == run_id and run.data.tags["release"] == "rc1" and not run.data.params
    assert [s for s, _ in histories(client, run_id)["train/loss"]] == [4, 8]


def test_nested_run_has_the_active_run_as_parent(tmp_path, sqlite_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_NESTED_RUN", "true")
    mlflow.set_tracking_uri(sqlite_uri)
    try:
        with mlflow.start_run() as parent:
            logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
            make_trainer(tmp_path, callbacks=[logger], max_steps=2).train()
            assert mlflow.active_run().info.run_id == parent.info.run_id  # fluent run untouched
    finally:
        mlflow.set_tracking_uri(None)
    run = MlflowClient(sqlite_uri).get_run(logger.run_id)
    assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id


def test_nan_is_logged(tmp_path, sqlite_uri):
    class NaNLoss(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if "loss" in logs:
                logs["loss"] = float("nan")

    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    make_trainer(tmp_path, callbacks=[NaNLoss(), logger], logging_steps=2, max_steps=2).train()
    values = [m.value for m in MlflowClient(sqlite_uri).get_metric_history(logger.run_id, "train/loss")]
    assert len(values) == 1 and values[0] != values[0]


def test_trainer_plus_exception_marks_the_run_failed(tmp_path, sqlite_uri):
    from hf_callbacks_plus.integrations.transformers import TrainerPlus

    class Boom(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise RuntimeError("boom")

    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    trainer = make_trainer(tmp_path, callbacks=[logger, Boom()], trainer_class=TrainerPlus, logging_steps=1)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.train()
    client = MlflowClient(sqlite_uri)
    assert client.get_run(logger.run_id).info.status == "FAILED"
    # step 3 raised in on_step_end, before its log
    assert [s for s, _ in histories(client, logger.run_id)["train/loss"]] == [1, 2]


def test_bad_configuration(monkeypatch):
    with pytest.raises(ValueError, match="unknown scheme 'ftp'.*sqlite"):
        MLflowLogger(tracking_uri="ftp://host/x")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "gopher://x")
    with pytest.raises(ValueError, match="MLFLOW_TRACKING_URI"):
        MLflowLogger()
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.setenv("MLFLOW_TAGS", "{not json")
    with pytest.raises(ValueError, match="MLFLOW_TAGS must be a JSON object"):
        MLflowLogger()
    monkeypatch.setenv("MLFLOW_TAGS", "[1, 2]")
    with pytest.raises(ValueError, match="MLFLOW_TAGS must be a JSON object"):
        MLflowLogger()
    monkeypatch.delenv("MLFLOW_TAGS")
    monkeypatch.setenv("MLFLOW_MAX_LOG_PARAMS", "many")
    with pytest.raises(ValueError, match="MLFLOW_MAX_LOG_PARAMS"):
        MLflowLogger()


def test_mlflow_not_installed_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ModuleNotFoundError, match=r"hf-callbacks-plus\[mlflow\]"):
        MLflowLogger()


def test_only_rank_zero_logs(tmp_path, sqlite_uri, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    logger = MLflowLogger(tracking_uri=sqlite_uri)
    make_trainer(tmp_path, callbacks=[logger], max_steps=2, logging_steps=1).train()
    assert logger.run_id is None and not (tmp_path / ".mlflow_wal").exists()
    assert not MlflowClient(sqlite_uri).search_runs(["0"])


def test_experiment_from_env_then_explicit_run_id_continues_the_run(tmp_path, sqlite_uri, monkeypatch):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    first = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    make_trainer(tmp_path / "a", callbacks=[first], logging_steps=2, max_steps=4).train()
    client = MlflowClient(sqlite_uri)
    experiment = client.get_experiment_by_name("from-env")
    assert experiment is not None
    assert client.get_run(first.run_id).info.experiment_id == experiment.experiment_id
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME")
    second = MLflowLogger(tracking_uri=sqlite_uri, run_id=first.run_id, log_params=False)
    make_trainer(tmp_path / "b", callbacks=[second], logging_steps=2, max_steps=6).train()
    assert second.run_id == first.run_id
    assert len(client.search_runs([experiment.experiment_id, "0"])) == 1
    # a new training (not a resume) into the given run: steps 2 and 4 are already held, 6 is new
    assert [m.step for m in client.get_metric_history(first.run_id, "train/loss")] == [2, 4, 6]
    assert client.get_run(first.run_id).info.status == "FINISHED"


def test_lightweight_trainer(tmp_path, sqlite_uri):
    from hf_callbacks_plus.loop.arguments import LoopArguments
    from hf_callbacks_plus.loop.trainer import LightweightTrainer

    logger = MLflowLogger(tracking_uri=sqlite_uri)
    args = LoopArguments(output_dir=str(tmp_path), max_steps=6, logging_steps=2, eval_strategy="steps",
                         eval_steps=3, disable_tqdm=True)
    LightweightTrainer(args, train_step=lambda batch: {"loss": 0.5}, train_data=[[1.0]] * 6,
                       eval_data=[[1.0]], eval_fn=lambda data: {"score": 0.25}, callbacks=[logger],
                       learning_rate_fn=lambda: 0.1).train()
    client = MlflowClient(sqlite_uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.data.params["max_steps"] == "6"
    got = histories(client, logger.run_id)
    assert [step for step, _ in got["train/loss"]] == [2, 4, 6]
    assert got["eval/score"] == [(3, 0.25), (6, 0.25)]
