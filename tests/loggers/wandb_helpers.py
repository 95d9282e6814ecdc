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


def runs(root: Path) -> list[WandbRun]:
    """Every run under ``root``, oldest first, waited for until complete."""
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
