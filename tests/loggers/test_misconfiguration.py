"""Misconfigurations are refused at construction (or at train begin) with a clear error naming the
argument, never retried as an outage."""

from __future__ import annotations

import sys

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


def test_two_loggers_of_one_class_are_refused_at_train_begin(tmp_path):
    """They would share one checkpoint entry and one run."""
    pytest.importorskip("transformers")
    from hf_callbacks_plus.loggers.jsonl import JsonlLogger
    from tests.tiny_models import make_trainer

    trainer = make_trainer(tmp_path, callbacks=[JsonlLogger(str(tmp_path / "a.jsonl")),
                                                JsonlLogger(str(tmp_path / "b.jsonl"))], max_steps=2)
    with pytest.raises(ValueError, match="JsonlLogger: 2 instances share state_key.*one JsonlLogger per"):
        trainer.train()
    assert trainer.state.global_step == 0


@pytest.mark.wandb
@pytest.mark.parametrize("runner", ["Trainer", "TrainerPlus"])
def test_refusing_two_wandb_loggers_leaves_no_open_run(tmp_path, monkeypatch, runner):
    """The first logger had opened its W&B run when the second was refused: the run stayed open
    (``wandb.run``) with no exit. A bound trainer (TrainerPlus) refuses before any run opens; in a
    stock Trainer the first logger's run is closed before the error."""
    pytest.importorskip("wandb")
    pytest.importorskip("transformers")
    import wandb

    from hf_callbacks_plus import TrainerPlus
    from tests.loggers.wandb_helpers import fast_logger, offline_env, runs
    from tests.tiny_models import make_trainer

    root = offline_env(monkeypatch, tmp_path / "wb")
    twins = [fast_logger(project="two"), fast_logger(project="two")]
    trainer = make_trainer(tmp_path / "out", callbacks=twins, max_steps=2,
                           trainer_class=TrainerPlus if runner == "TrainerPlus" else None)
    with pytest.raises(ValueError, match="WandbLogger: 2 instances share state_key"):
        trainer.train()
    assert wandb.run is None
    opened = runs(root)
    assert opened == [] if runner == "TrainerPlus" else [run.exit_code for run in opened] == [1]


def test_the_stock_callback_for_the_same_tracker_is_named_at_train_begin(tmp_path, caplog):
    """report_to='tensorboard' + TensorBoardLogger wrote two values per step into one directory
    (report_to='mlflow' + MLflowLogger: two runs) without a word."""
    import logging

    pytest.importorskip("transformers")
    pytest.importorskip("tensorboard")
    from hf_callbacks_plus import run_before_integrations
    from hf_callbacks_plus.loggers.tensorboard import TensorBoardLogger
    from tests.tiny_models import make_trainer

    trainer = make_trainer(tmp_path, callbacks=[TensorBoardLogger()], max_steps=2, report_to="tensorboard")
    run_before_integrations(trainer)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer.train()
    assert "TensorBoardCallback (report_to) runs in this trainer too" in caplog.text
    assert "replace_report_to_callbacks" in caplog.text


def test_mlflow_sqlite_database_that_cannot_be_created_is_refused_at_construction(tmp_path):
    """A sqlite database that cannot be created is a ``ValueError`` naming ``tracking_uri`` at
    construction. A folder that does not exist yet is fine: MLflow creates it."""
    pytest.importorskip("mlflow")
    from hf_callbacks_plus.loggers.mlflow import MLflowLogger

    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    with pytest.raises(ValueError, match=r"cannot be created: .*notes.txt' is a file, not a folder.*sqlite:///"):
        MLflowLogger(tracking_uri=f"sqlite:///{a_file}/mlflow.db")
    with pytest.raises(ValueError, match=r"is a directory"):
        MLflowLogger(tracking_uri=f"sqlite:///{tmp_path}")
    fine = f"sqlite:///{tmp_path}/new/folder/mlflow.db"
    assert MLflowLogger(tracking_uri=fine).tracking_uri == fine


def test_mlflow_sqlite_store_without_sqlalchemy_names_the_extra(monkeypatch, tmp_path):
    """The [mlflow] extra is mlflow-skinny (a tracking server's client), which lacks what a local
    sqlite store needs: said at construction, naming [mlflow-local]."""
    pytest.importorskip("mlflow")
    from hf_callbacks_plus.loggers.mlflow import MLflowLogger

    monkeypatch.setitem(sys.modules, "sqlalchemy", None)  # as if not installed
    expected = r"local sqlite store\) needs `sqlalchemy`.*\[mlflow-local\]"
    with pytest.raises(ModuleNotFoundError, match=expected):
        MLflowLogger(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    MLflowLogger(tracking_uri="http://127.0.0.1:5000")  # a server's client needs neither
