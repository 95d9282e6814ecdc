"""No secret reaches a backend: not through the command line W&B records in its metadata, and
not through string values logged under a key naming a token, secret, password or api key."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hf_callbacks_plus.core.callback import TrainerCallback
from hf_callbacks_plus.loggers.jsonl import JsonlLogger
from hf_callbacks_plus.loggers.secrets import REDACTED, command_line_has_secret, looks_like_secret
from tests.tiny_models import make_trainer

pytestmark = pytest.mark.transformers

ARGV_SECRET = "hf_" + "A" * 34
LOGGED = {"hub_token": "plain-secret-one", "wandb_api_key": "plain-secret-two", "db_password": "pw-three",
          "note": "hf_" + "B" * 34, "comment": "hello"}
SECRET_STRINGS = [ARGV_SECRET, "plain-secret-one", "plain-secret-two", "pw-three", "B" * 34]


class LogStrings(TrainerCallback):
    """Logs string values (secrets under secret-naming keys, a token-looking value, a harmless text)."""

    def __init__(self) -> None:
        self.trainer = None

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 1:
            self.trainer.log(dict(LOGGED))


def train(tmp_path, logger, printer: bool = True, **overrides):
    strings = LogStrings()
    trainer = make_trainer(tmp_path, callbacks=[logger, strings], max_steps=2, logging_steps=1, **overrides)
    strings.trainer = trainer
    if not printer:  # transformers' printer shows every text as logged (docs/secrets.md)
        from transformers import PrinterCallback, ProgressCallback

        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
    trainer.train()
    return trainer


def expected_texts(prefix: str = "train/") -> dict[str, str]:
    return {f"{prefix}{key}": (value if key == "comment" else REDACTED) for key, value in LOGGED.items()}


def test_secret_detection():
    assert command_line_has_secret(["--hub_token", "x"]) and command_line_has_secret(["--api-key=x"])
    assert command_line_has_secret(["run", ARGV_SECRET]) and command_line_has_secret(["--db_password", "p"])
    assert not command_line_has_secret(["--hub_token", "--lr", "0.1"])
    assert not command_line_has_secret(["--pad_token_id", "0", "--output_dir", "out"])
    assert looks_like_secret("train/hub_token", "x") and not looks_like_secret("train/comment", "hello")


def test_jsonl_redacts_secret_strings(tmp_path):
    train(tmp_path, JsonlLogger())
    text = (tmp_path / "metrics.jsonl").read_text()
    summary = {}
    for line in map(json.loads, text.splitlines()):
        summary.update(line.get("summary", {}))
    assert {key: summary[key] for key in expected_texts()} == expected_texts()
    assert not [secret for secret in SECRET_STRINGS if secret in text]


@pytest.mark.mlflow
def test_mlflow_redacts_secret_strings(tmp_path, sqlite_uri, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from hf_callbacks_plus.loggers.mlflow import MLflowLogger

    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    logger = MLflowLogger(tracking_uri=sqlite_uri)
    train(tmp_path, logger, hub_token=ARGV_SECRET)
    run = MlflowClient(sqlite_uri).get_run(logger.run_id)
    assert {key: run.data.tags[key] for key in expected_texts()} == expected_texts()
    everything = [*run.data.tags.values(), *run.data.params.values()]
    assert not [secret for secret in SECRET_STRINGS if any(secret in value for value in everything)]


@pytest.mark.wandb
def test_wandb_default_settings_keep_secrets_out_of_every_run_file(tmp_path: Path, monkeypatch):
    """Default ``WandbLogger`` settings (W&B collects its metadata, command line included) and a
    command line passing ``--hub_token``: no secret in any file W&B writes. transformers' printer is
    removed: W&B's console capture (``output.log``) records what it prints, every text as logged, as
    with ``WandbCallback`` (docs/secrets.md)."""
    pytest.importorskip("wandb")
    from hf_callbacks_plus.loggers.wandb import WandbLogger
    from tests.loggers.wandb_helpers import offline_env, runs

    root = offline_env(monkeypatch, tmp_path / "wb")
    monkeypatch.setattr(sys, "argv", ["train.py", "--hub_token", ARGV_SECRET, "--output_dir", "out"])
    logger = WandbLogger(project="secrets", dir=str(root), flush_timeout=60)
    train(tmp_path / "out", logger, printer=False, hub_token=ARGV_SECRET)
    (run,) = runs(root)
    assert {key: run.summary[key] for key in expected_texts()} == expected_texts()
    files = [path for path in root.rglob("*") if path.is_file()]
    assert any(path.suffix == ".wandb" for path in files)
    leaks = [(str(path), secret) for path in files for secret in SECRET_STRINGS
             if secret.encode() in path.read_bytes()]
    assert not leaks
