"""Every metric in its section in every tracker, read back from the files each one wrote.

A run logs the training loop's metrics, evaluations, a train subset with gap metrics, early
stopping diagnostics, the run totals and ``trainer.predict()`` metrics. Wired the three
documented ways (``TrainerPlus``, the mixin on a ``Trainer`` subclass, a stock ``Trainer`` with
``run_before_integrations``), with ``report_to=["tensorboard", "wandb", "mlflow"]`` swapped for
our loggers by ``replace_report_to_callbacks``: TensorBoard event files, the W&B offline run, the
MLflow sqlite store and the trackio store hold each metric in its section.

The stock integrations, read back the same way, show why the swap exists: every key that does
not start with ``eval_``/``test_`` lands under ``train/`` (TensorBoard, W&B, trackio) or in the ``train``
title (ClearML offline); MLflow keeps the raw keys. (Comet offline writes the same ``train/...``
names, checked by hand: with no network it retries its server for 30 s and more per run, too
slow for the suite; see docs/integrations.md.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
from hf_callbacks_plus.callbacks.train_subset import TrainSubsetEvaluation
from hf_callbacks_plus.loggers.swap import replace_report_to_callbacks
from tests.integrations.tensorboard_events import read_scalars
from tests.tiny_models import RegressionDataset, TinyRegressionModel, regression_metrics, training_args

pytestmark = [pytest.mark.transformers, pytest.mark.mlflow, pytest.mark.wandb, pytest.mark.trackio]

#: What the training loop measures on its batches: the only names allowed under ``train/``.
TRAIN_LOOP = {"loss", "grad_norm", "learning_rate", "epoch", "global_step"}
SECTIONS = {"train", "eval", "train_subset", "gap", "early_stopping", "train_summary", "test"}
REQUIRED = {
    "train/loss", "train/grad_norm", "train/learning_rate", "eval/loss", "eval/mse",
    "train_subset/loss", "train_subset/mse", "gap/loss", "gap/mse", "early_stopping/wait",
    "early_stopping/best_value", "train_summary/loss", "train_summary/runtime", "test/loss", "test/mse",
}
WIRINGS = ["trainer_plus", "mixin", "run_before_integrations"]


def build(wiring: str, output_dir: Path, report_to: list[str]):
    from transformers import Trainer

    from hf_callbacks_plus.integrations.transformers import (
        TrainerPlus,
        TrainerPlusMixin,
        run_before_integrations,
    )

    ours = [TrainSubsetEvaluation(size=16, gap_metrics=True), EarlyStopping("eval_loss", patience=50)]
    args = training_args(output_dir, max_steps=6, logging_steps=1, eval_strategy="steps", eval_steps=3,
                         report_to=report_to, project=trackio_project(output_dir))
    common = {"model": TinyRegressionModel(), "args": args, "train_dataset": RegressionDataset(64, seed=1),
              "eval_dataset": RegressionDataset(16, seed=2), "compute_metrics": regression_metrics}
    if wiring == "trainer_plus":
        return TrainerPlus(**common, callbacks=ours)
    if wiring == "mixin":
        class MyTrainer(TrainerPlusMixin, Trainer):
            pass

        return MyTrainer(**common, callbacks=ours)
    return run_before_integrations(Trainer(**common), *ours)


def trackio_project(output_dir: Path) -> str:
    """The trackio project of a test (``TrainingArguments.project``; the store is the process's)."""
    return f"sections-{output_dir.parent.name}"


def trackio_names(project: str) -> set[str]:
    from tests.loggers.trackio_helpers import records, trackio_runs

    (run,) = trackio_runs(project)
    return {key for row in records(project, run) for key, value in row.items()
            if key not in ("step", "timestamp") and not isinstance(value, str)}


def check_sections(names: set[str], where: str) -> None:
    missing = REQUIRED - names
    assert not missing, f"{where}: missing {sorted(missing)} in {sorted(names)}"
    wrong = sorted(name for name in names
                   if name.split("/")[0] not in SECTIONS
                   or (name.startswith("train/") and name.split("/", 1)[1] not in TRAIN_LOOP))
    assert not wrong, f"{where}: metrics in the wrong section: {wrong}"


@pytest.fixture
def trackers_env(tmp_path, monkeypatch, sqlite_uri):
    from tests.loggers.wandb_helpers import offline_env

    root = offline_env(monkeypatch, tmp_path / "wandb")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", sqlite_uri)
    monkeypatch.delenv("DISABLE_MLFLOW_INTEGRATION", raising=False)  # tests/conftest.py sets it
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "TENSORBOARD_LOGGING_DIR"):
        monkeypatch.delenv(name, raising=False)
    return root


@pytest.mark.parametrize("wiring", WIRINGS)
def test_swapped_integrations_put_every_metric_in_its_section(wiring, tmp_path, trackers_env, sqlite_uri):
    import wandb
    from mlflow.tracking import MlflowClient

    from hf_callbacks_plus.loggers.tensorboard import TensorBoardLogger
    from hf_callbacks_plus.loggers.wandb import WandbLogger
    from tests.loggers.wandb_helpers import FAST_SETTINGS, runs

    out = tmp_path / "out"
    trainer = build(wiring, out, ["tensorboard", "wandb", "mlflow", "trackio"])
    swapped = replace_report_to_callbacks(
        trainer, wandb=WandbLogger(dir=str(trackers_env), settings=wandb.Settings(**FAST_SETTINGS)))
    loggers = [new for _, new in swapped]
    assert {type(stock).__name__ for stock, _ in swapped} == {"TensorBoardCallback", "WandbCallback",
                                                               "MLflowCallback", "TrackioCallback"}
    trainer.train()
    trainer.predict(RegressionDataset(16, seed=3))
    for logger in loggers:  # as at exit: predict() logged into (W&B) or reopened (the others) the runs
        assert logger.close()

    tensorboard = next(logger for logger in loggers if isinstance(logger, TensorBoardLogger))
    assert Path(tensorboard.backend.directory).parent == out / "runs"
    check_sections(set(read_scalars(out)), "TensorBoard")

    # the run stays open after train(): predict() logs into it (one folder, not a second one)
    wandb_runs = runs(trackers_env)
    assert len(wandb_runs) == 1
    history = {key for run in wandb_runs for row in run.history for key in row if not key.startswith("_")}
    summary = {key for run in wandb_runs for key, value in run.summary.items()
               if not key.startswith("_") and not isinstance(value, (str, dict))}
    check_sections(history | summary, "W&B")
    assert "train/global_step" in history

    mlflow_logger = next(logger for logger in loggers if type(logger).__name__ == "MLflowLogger")
    metrics = MlflowClient(sqlite_uri).get_run(mlflow_logger.run_id).data.metrics
    check_sections(set(metrics), "MLflow")
    check_sections(trackio_names(trackio_project(out)), "trackio")


def test_swap_keeps_the_stock_tensorboard_logging_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    trainer = build("run_before_integrations", tmp_path / "out", ["tensorboard"])
    ((stock, ours),) = replace_report_to_callbacks(trainer)
    assert type(stock).__name__ == "TensorBoardCallback" and type(ours).__name__ == "TensorBoardLogger"
    trainer.train()
    assert set(read_scalars(tmp_path / "tb")) >= {"train/loss", "train_subset/loss", "gap/loss"}


def _clearml_metrics(cache: Path) -> set[str]:
    names = set()
    for path in cache.rglob("metrics.jsonl"):
        for line in path.read_text().splitlines():
            for event in json.loads(line):
                if event.get("type") == "training_stats_scalar":
                    names.add(f"{event['metric']}/{event['variant']}")
    return names


def test_what_the_stock_integrations_write(tmp_path, trackers_env, sqlite_uri, monkeypatch):
    """The stock callbacks, read back from disk: what `docs/integrations.md` says each gives."""
    clearml = pytest.importorskip("clearml")
    from mlflow.tracking import MlflowClient

    from tests.loggers.wandb_helpers import runs

    monkeypatch.setenv("CLEARML_OFFLINE_MODE", "1")
    monkeypatch.setenv("CLEARML_CACHE_DIR", str(tmp_path / "clearml"))
    monkeypatch.setenv("WANDB_DIR", str(trackers_env))
    # ClearML reads CLEARML_OFFLINE_MODE once, at import; it stays offline in this process (going
    # back online would need a configured server)
    clearml.Task.set_offline(True)
    # ClearML forks its reporting process (os.fork of this multi-threaded process) while its
    # repository detection thread reads a `git` pipe: the child inherits the pipe's write end, the
    # read never ends and `Task.close` waits for it forever (seen here: a hung test). Report from
    # threads instead; what it writes to disk is the same.
    monkeypatch.setattr(clearml.Task, "_report_subprocess_enabled", False)
    out = tmp_path / "out"
    trainer = build("trainer_plus", out, ["tensorboard", "wandb", "mlflow", "clearml", "trackio"])
    trainer.train()
    trainer.predict(RegressionDataset(16, seed=3))
    by_name = {type(callback).__name__: callback for callback in trainer.callback_handler.callbacks}
    by_name["ClearMLCallback"]._clearml_task.close()
    # W&B reads WANDB_DIR once per process: find the run where the stock callback put it
    wandb_run_dir = Path(by_name["WandbCallback"]._wandb.run.dir).parent
    by_name["WandbCallback"]._wandb.finish()

    wrong = {"train/train_subset_loss", "train/gap_loss", "train/early_stopping/wait", "train/train_loss"}
    tensorboard = set(read_scalars(out))
    assert wrong <= tensorboard and "train_subset/loss" not in tensorboard
    (run,) = runs(wandb_run_dir)
    assert wrong - {"train/train_loss"} <= {key for row in run.history for key in row}
    assert "train_loss" in run.summary  # WandbCallback puts the run totals in the summary, raw
    trackio = trackio_names(trackio_project(out))  # TrackioCallback: rewrite_logs too, no run totals
    assert wrong - {"train/train_loss"} <= trackio and not {"train_loss", "train/train_loss"} & trackio
    clearml = _clearml_metrics(tmp_path / "clearml")
    assert {"train/train_subset_loss", "train/gap_loss", "eval/loss"} <= clearml
    assert not {name for name in clearml if name.startswith("test/")}  # ClearMLCallback has no on_predict
    (mlflow_run,) = MlflowClient(sqlite_uri).search_runs(["0"])
    assert {"loss", "eval_loss", "train_subset_loss", "gap_loss", "early_stopping/wait",
            "train_loss"} <= set(mlflow_run.data.metrics)
