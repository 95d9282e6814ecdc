"""MLflowLogger parity with the stock MLflowCallback: checkpoint/model artifacts
(``HF_MLFLOW_LOG_ARTIFACTS``), uploaded off the training thread, and MLflow's own system
metrics monitor (``MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING``). Real sqlite store, read back with
``MlflowClient``."""

from __future__ import annotations

import threading
import time

import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hf_callbacks_plus.core.callback import TrainerCallback  # noqa: E402
from hf_callbacks_plus.loggers.mlflow import MLflowLogger  # noqa: E402
from tests.tiny_models import make_trainer  # noqa: E402

pytestmark = [pytest.mark.mlflow, pytest.mark.transformers]


@pytest.fixture
def experiment(tmp_path, sqlite_uri, monkeypatch):
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_TRACKING_URI", "HF_MLFLOW_LOG_ARTIFACTS",
                 "MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING"):
        monkeypatch.delenv(name, raising=False)
    MlflowClient(sqlite_uri).create_experiment("parity", artifact_location=str(tmp_path / "artifacts"))
    return "parity"


def test_checkpoints_and_final_model_uploaded_off_the_training_thread(tmp_path, sqlite_uri, experiment,
                                                                      monkeypatch):
    uploads = []
    original = MlflowClient.log_artifacts

    def recording(self, run_id, local_dir, artifact_path=None):  # the real upload, plus who called it
        uploads.append((artifact_path, threading.current_thread() is threading.main_thread()))
        return original(self, run_id, local_dir, artifact_path)

    monkeypatch.setattr(MlflowClient, "log_artifacts", recording)
    monkeypatch.setenv("HF_MLFLOW_LOG_ARTIFACTS", "true")
    logger = MLflowLogger(tracking_uri=sqlite_uri, experiment_name=experiment)
    assert logger.log_artifacts == "all"
    out = tmp_path / "out"
    make_trainer(out, callbacks=[logger], max_steps=4, logging_steps=1, save_strategy="steps", save_steps=2,
                 save_total_limit=1).train()
    assert sorted(uploads) == [("checkpoint-2", False), ("checkpoint-4", False), ("model", False)]
    client = MlflowClient(sqlite_uri)
    listed = {item.path for item in client.list_artifacts(logger.run_id)}
    assert listed == {"checkpoint-2", "checkpoint-4", "model"}
    assert "trainer_state.json" in {item.path.split("/")[-1]
                                    for item in client.list_artifacts(logger.run_id, "checkpoint-2")}
    assert not (out / "checkpoint-2").exists()  # rotated away by the Trainer, uploaded from the staged copy
    assert not list((out / ".tracker_artifacts").iterdir())  # staged copies removed after upload


def test_log_artifacts_choices(sqlite_uri, experiment, monkeypatch):
    assert MLflowLogger(tracking_uri=sqlite_uri).log_artifacts == "false"
    with pytest.raises(ValueError, match="log_artifacts must be one of"):
        MLflowLogger(tracking_uri=sqlite_uri, log_artifacts="yes")
    monkeypatch.setenv("HF_MLFLOW_LOG_ARTIFACTS", "false")
    assert MLflowLogger(tracking_uri=sqlite_uri, log_artifacts="checkpoint").log_artifacts == "checkpoint"


class Slow(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.5)


def test_system_metrics_through_mlflows_monitor(tmp_path, sqlite_uri, experiment, monkeypatch):
    monkeypatch.setenv("MLFLOW_ENABLE_SYSTEM_METRICS_LOGGING", "true")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "1")
    logger = MLflowLogger(tracking_uri=sqlite_uri, experiment_name=experiment)
    assert logger.system_metrics
    make_trainer(tmp_path, callbacks=[logger, Slow()], max_steps=6, logging_steps=1).train()
    run = MlflowClient(sqlite_uri).get_run(logger.run_id)
    system = [key for key in run.data.metrics if key.startswith("system/")]
    assert "system/cpu_utilization_percentage" in system and "system/system_memory_usage_megabytes" in system
    assert run.info.status == "FINISHED"
    assert not [thread for thread in threading.enumerate() if "SystemMetricsMonitor" in thread.name]


def test_uploaded_checkpoints_hold_no_secret(tmp_path, sqlite_uri, experiment, monkeypatch):
    """``training_args.bin`` (the pickled TrainingArguments, ``hub_token`` in clear) is not uploaded,
    and the uploaded ``trainer_state.json`` is a redacted copy: its ``log_history`` held the raw texts
    logged (a token, a field naming a credential) that the loggers redact everywhere else."""
    token, logged = "hf_" + "Z" * 34, "hf_" + "L" * 34

    class LogSecrets(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                trainer.log({"note": f"pushed with {logged}", "db_password": "Plain-Passw0rd"})

    monkeypatch.setenv("HF_MLFLOW_LOG_ARTIFACTS", "true")
    logger = MLflowLogger(tracking_uri=sqlite_uri, experiment_name=experiment)
    trainer = make_trainer(tmp_path / "out", callbacks=[LogSecrets(), logger], max_steps=2, logging_steps=1,
                           save_strategy="steps", save_steps=2, hub_token=token)
    trainer.train()
    checkpoint = tmp_path / "out" / "checkpoint-2"
    assert (checkpoint / "training_args.bin").is_file()  # the trainer's own copies keep what they hold
    assert logged.encode() in (checkpoint / "trainer_state.json").read_bytes()
    stored = [path for path in (tmp_path / "artifacts").rglob("*") if path.is_file()]
    assert stored and not any(path.name == "training_args.bin" for path in stored)
    (state,) = [path for path in stored if path.name == "trainer_state.json"]
    assert '"db_password": "<redacted>"' in state.read_text() and "pushed with ***" in state.read_text()
    assert not [path for path in stored for secret in (token, logged, "Plain-Passw0rd")
                if secret.encode() in path.read_bytes()]
