"""Plant secrets everywhere a user can put one, train with every logger, search every file.

Planted: a password in the MLflow tracking URI (of a live sqlite-backed logger's run name and
of a logger whose server is down, so its state goes into checkpoints and its records stay in its
write-ahead log), a token inside a metric name, tokens in secret environment variables
(``HF_TOKEN``, a 40-hex ``WANDB_API_KEY``,
``MLFLOW_TRACKING_PASSWORD``), in ``TrainingArguments`` (``hub_token``, URL passwords in
``run_name`` and ``hub_model_id``), on the command line (``--hub_token``, a tracking URI with a
password). Searched: every file under the run's temp dir (output_dir with its checkpoints,
``metrics.jsonl`` and the TensorBoard event files, the MLflow sqlite store, the W&B folder,
the write-ahead logs) and everything printed or logged. A token logged as a text value or inside a
metric name is searched in the trackers' files (the Trainer's own ``log_history`` and printer keep
what the user logs).

Not searched: ``training_args.bin``, transformers' own pickle of the ``TrainingArguments``,
which the Trainer writes into every checkpoint to resume from it; it holds the arguments as
given (the user's own disk, no tracker).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from hf_callbacks_plus.core.callback import TrainerCallback
from hf_callbacks_plus.loggers.jsonl import JsonlLogger
from hf_callbacks_plus.loggers.tensorboard import TensorBoardLogger
from tests.tiny_models import make_trainer

pytestmark = [pytest.mark.transformers, pytest.mark.mlflow, pytest.mark.wandb]

HF_ENV = "hf_" + "E" * 34
WANDB_KEY = "fedcba9876543210fedcba9876543210fedcba98"
MLFLOW_ENV_PASSWORD = "mlflow-env-password-7"
HF_ARG = "hf_" + "R" * 34
HF_CLI = "hf_" + "C" * 34
HF_LOGGED = "hf_" + "L" * 34
HF_NAME = "hf_" + "M" * 34
SECRETS = [HF_ENV, WANDB_KEY, MLFLOW_ENV_PASSWORD, HF_ARG, HF_CLI,
           "UriPassw0rd", "RunNamePassw0rd", "HubIdPassw0rd", "CliPassw0rd"]


class LogText(TrainerCallback):
    def __init__(self) -> None:
        self.trainer = None

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 1:
            self.trainer.log({"note": f"pushed with {HF_LOGGED}", f"score_{HF_NAME}": 1.0})


def test_no_planted_secret_in_any_file_or_console_line(tmp_path: Path, monkeypatch, caplog, capfd,
                                                       sqlite_uri):
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    from mlflow.tracking import MlflowClient

    from hf_callbacks_plus.loggers.mlflow import MLflowLogger
    from tests.loggers.conftest import free_port
    from tests.loggers.wandb_helpers import fast_logger, offline_env, runs

    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("HF_TOKEN", HF_ENV)
    monkeypatch.setenv("WANDB_API_KEY", WANDB_KEY)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", MLFLOW_ENV_PASSWORD)
    dead_uri = f"http://mluser:UriPassw0rd@127.0.0.1:{free_port()}"
    # the dead server's outage must reach the logger's (masked) warning within the 1 s deadline:
    # MLflow's own retries, no longer turned off by the logger, would ride it out for minutes
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setattr(sys, "argv", ["train.py", "--hub_token", HF_CLI,
                                      "--tracking_uri", "http://cli:CliPassw0rd@127.0.0.1:1"])
    wandb_root = offline_env(monkeypatch, tmp_path / "wandb")
    out = tmp_path / "out"
    live = MLflowLogger(tracking_uri=sqlite_uri, experiment_name="secrets")
    dead = MLflowLogger(tracking_uri=dead_uri, experiment_name="secrets-dead", flush_timeout=1.0,
                        backoff=(0.05, 0.1), wal_dir=str(tmp_path / "wal"))
    wandb_logger = fast_logger(project="secrets")
    text = LogText()
    tensorboard = TensorBoardLogger()
    callbacks = [JsonlLogger(), tensorboard, live, dead, wandb_logger, text]
    trainer = make_trainer(out, callbacks=callbacks, max_steps=4,
                           logging_steps=1, save_strategy="steps", save_steps=2, eval_strategy="steps",
                           eval_steps=2, hub_token=HF_ARG, run_name="exp http://ru:RunNamePassw0rd@host/x",
                           hub_model_id="https://hu:HubIdPassw0rd@hub.example/org/model")
    text.trainer = trainer
    with caplog.at_level(logging.DEBUG, logger="hf_callbacks_plus"):
        trainer.train()
    console = capfd.readouterr()

    # the values did arrive, masked
    run = MlflowClient(sqlite_uri).get_run(live.run_id)
    assert run.data.params["run_name"] == "exp http://ru:***@host/x"
    assert run.data.params["hub_model_id"] == "https://hu:***@hub.example/org/model"
    assert run.data.params["hub_token"] == "<redacted>"
    assert run.data.tags["train/note"] == "pushed with ***"
    assert run.info.run_name == "exp http://ru:***@host/x"
    (wandb_run,) = runs(wandb_root)
    assert wandb_run.config["run_name"] == "exp http://ru:***@host/x"
    assert [key for key in run.data.metrics if key.startswith("train/score_")] == ["train/score____"]
    (kept,) = (tmp_path / "wal").glob("*.jsonl")  # the dead store's records wait in its log
    assert "mluser:***@127.0.0.1" in kept.read_text()
    assert list((out / "runs" / tensorboard.run_id).glob("events.out.tfevents.*"))
    checkpoints = sorted(out.glob("checkpoint-*/trainer_state.json"))
    assert len(checkpoints) == 2 and all("mluser:***@127.0.0.1" in p.read_text() for p in checkpoints)

    files = [path for path in tmp_path.rglob("*") if path.is_file() and path.name != "training_args.bin"]
    assert len(files) > 15
    leaks = [(str(path.relative_to(tmp_path)), secret) for path in files for secret in SECRETS
             if secret.encode() in path.read_bytes() or secret in str(path)]
    printed = console.out + console.err + caplog.text
    leaks += [("console", secret) for secret in SECRETS if secret in printed]
    assert not leaks
    # a token the user logs as text: masked in every tracker (the Trainer's own log_history and
    # printer keep what the user logged)
    tracker_files = [path for path in files if "checkpoint-" not in str(path)]
    assert not [(str(path), secret) for path in tracker_files for secret in (HF_LOGGED, HF_NAME)
                if secret.encode() in path.read_bytes()]
    assert "mluser:***@127.0.0.1" in caplog.text  # the outage warning names the server, masked
