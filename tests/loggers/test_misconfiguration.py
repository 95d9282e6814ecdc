"""Misconfigurations are refused at construction with a clear error, never retried as an
outage (issue 16 finding 9)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("project", ["team/project", "a:b", "what?"])
def test_wandb_project_with_a_forbidden_character(project, monkeypatch):
    pytest.importorskip("wandb")
    from hf_callbacks_plus.loggers.wandb import WandbLogger

    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    with pytest.raises(ValueError, match="not a valid W&B project name.*entity="):
        WandbLogger(project=project, mode="offline")
    monkeypatch.setenv("WANDB_PROJECT", project)
    with pytest.raises(ValueError, match="from WANDB_PROJECT"):
        WandbLogger(mode="offline")


@pytest.mark.parametrize("uri", ["file:///tmp/mlruns", "./mlruns"])
def test_mlflow_file_store_the_installed_mlflow_refuses(uri, monkeypatch):
    pytest.importorskip("mlflow")
    from hf_callbacks_plus.loggers.mlflow import MLflowLogger

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(ValueError, match=r"file store.*sqlite:///mlflow\.db.*MLFLOW_ALLOW_FILE_STORE"):
        MLflowLogger(tracking_uri=uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert MLflowLogger(tracking_uri=uri).tracking_uri == uri
