"""Shared set-up of the W&B logger tests: offline W&B in a temp dir, fast settings, read-back."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from hf_callbacks_plus.testing.wandb_reader import WandbRun, find_wandb_runs, read_wandb_run

WANDB_ENV = ("WANDB_DISABLED", "WANDB_RUN_ID", "WANDB_PROJECT", "WANDB_LOG_MODEL", "WANDB_WATCH",
             "WANDB_MODE", "WANDB_DIR", "WANDB_ENTITY", "WANDB_TAGS", "WANDB_RESUME", "RANK")

#: Settings that skip what the tests do not read (system stats, git, requirements, console).
FAST_SETTINGS = {"console": "off", "x_disable_stats": True, "x_disable_machine_info": True,
                 "x_save_requirements": False, "disable_git": True, "save_code": False}


def offline_env(monkeypatch: pytest.MonkeyPatch, root: Path) -> Path:
    """Point W&B at ``root`` in offline mode, with none of the W&B variables of the caller."""
    for name in WANDB_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(root))
    monkeypatch.setenv("WANDB_SILENT", "true")
    return root


def fast_logger(**kwargs: Any):
    """A ``WandbLogger`` with the fast settings, writing under ``WANDB_DIR``.

    ``dir`` is passed explicitly because W&B reads ``WANDB_DIR`` once per process (its
    settings singleton), and every test has its own directory.
    """
    import wandb

    from hf_callbacks_plus.loggers.wandb import WandbLogger

    kwargs.setdefault("settings", wandb.Settings(**FAST_SETTINGS))
    kwargs.setdefault("flush_timeout", 60.0)
    kwargs.setdefault("dir", os.environ.get("WANDB_DIR"))
    return WandbLogger(**kwargs)


def close_finished_loggers() -> None:
    """Close every W&B run a ``WandbLogger`` keeps open after its ``train()`` ended (for ``evaluate()``
    afterwards), as the exit hook would at the end of the process."""
    from hf_callbacks_plus.loggers.base import _OPEN_LOGGERS
    from hf_callbacks_plus.loggers.wandb import WandbLogger

    for logger in list(_OPEN_LOGGERS.values()):
        if isinstance(logger, WandbLogger) and not logger.training:
            logger.close()


def runs(root: Path) -> list[WandbRun]:
    """Every run under ``root``, oldest first, waited for until complete (closing the runs kept open
    after training first)."""
    close_finished_loggers()
    return [read_wandb_run(path, wait=20) for path in find_wandb_runs(root)]


def steps_per_key(all_runs: list[WandbRun]) -> dict[str, list[int]]:
    """``{key: [steps...]}`` across runs, in logging order (excluding ``train/global_step``)."""
    out: dict[str, list[int]] = {}
    for run in all_runs:
        for row in run.history:
            for key in row:
                if not key.startswith("_") and key != "train/global_step":
                    out.setdefault(key, []).append(row["_step"])
    return out


def synced_history(all_runs: list[WandbRun]) -> list[dict[str, Any]]:
    """The history W&B's server holds after ``wandb sync`` of ``all_runs`` in this order (one run id):
    a run with a branch point (``resume_from``, a rewind) first drops the rows after its step; a row
    at a step the run is already past is ignored (W&B warns); every other row is appended."""
    history: list[dict[str, Any]] = []
    for run in all_runs:
        if run.branch_point is not None:
            history = [row for row in history if row["_step"] <= run.branch_point["value"]]
        for row in run.history:
            if not history or row["_step"] > history[-1]["_step"]:
                history.append(row)
            elif row["_step"] == history[-1]["_step"]:
                history[-1] = {**history[-1], **row}
    return history


def points(history: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """``(key, train/global_step)`` of every value in ``history``, in order (W&B's keys left out)."""
    return [(key, row["train/global_step"]) for row in history for key in row
            if not key.startswith("_") and key != "train/global_step"]


def global_steps(run: WandbRun, key: str) -> list[int]:
    """The training step (``train/global_step``, every chart's x axis) of each row holding ``key``."""
    return [row["train/global_step"] for row in run.history if key in row]
