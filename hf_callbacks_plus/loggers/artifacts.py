"""Folders staged for upload (a checkpoint copied, never linked: the trainer rewrites its files in
place; a saved model), holding no secret in clear."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Optional

from ..runtime.file_copies import copy_file
from .secrets import mask_secrets, redact_value

__all__ = ["NEVER_UPLOADED", "redacted", "save_model_to_temp", "stage_folder"]

#: Checkpoint files never staged: they hold credentials in clear.
NEVER_UPLOADED = ("training_args.bin",)
#: Checkpoint files staged as a redacted copy (JSON holding logged texts).
REDACTED_COPIES = ("trainer_state.json",)

logger = logging.getLogger("hf_callbacks_plus")


def redacted(value: Any, key: str = "") -> Any:
    """``value`` with every string (and key) under the secrets policy (redacted or masked)."""
    if isinstance(value, dict):
        return {mask_secrets(str(k)): redacted(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted(item, key) for item in value]
    if isinstance(value, str):
        return redact_value(key, value)
    return value


def _copy(source: str, target: str) -> None:
    if Path(source).name in REDACTED_COPIES:
        data = json.loads(Path(source).read_text(encoding="utf-8"))
        Path(target).write_text(json.dumps(redacted(data), indent=2), encoding="utf-8")
        return
    copy_file(source, target)


def stage_folder(source: os.PathLike | str, staging_root: os.PathLike | str,
                 name: Optional[str] = None) -> Optional[Path]:
    """Copy of the folder ``source`` (a file: a folder holding it) as ``staging_root/name`` (default: its
    name; replaced; copy-on-write where the file system can); None, with a warning, on failure."""
    source = Path(source)
    target = Path(staging_root) / (name or source.name)
    try:
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        if not source.is_dir():
            target.mkdir()
            _copy(str(source), str(target / source.name))
            return target
        shutil.copytree(source, target, copy_function=_copy,
                        ignore=shutil.ignore_patterns(*NEVER_UPLOADED))
    except (OSError, ValueError) as error:
        logger.warning("Could not stage %s for upload (%s); it is not uploaded.", source, error)
        shutil.rmtree(target, ignore_errors=True)
        return None
    return target


def save_model_to_temp(model: Any, prefix: str) -> str:
    """Save ``model`` into a new temporary folder (``save_pretrained``, else ``model.pt``); return it."""
    folder = tempfile.mkdtemp(prefix=prefix)
    save = getattr(model, "save_pretrained", None)
    if callable(save):
        save(folder)
    else:
        import torch

        torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
    return folder
