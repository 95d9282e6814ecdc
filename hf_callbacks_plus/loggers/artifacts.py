"""Stage a checkpoint folder for a background upload: a hard-linked copy the Trainer cannot rotate away.

Transformers deletes old ``checkpoint-*`` folders (``save_total_limit``) right after a save,
possibly before a background worker uploaded them. `stage_folder` makes, on the training
thread, a copy made of hard links (no data copied; a real copy only where links fail), which
the worker uploads and removes. Files that hold secrets in clear are left out (`NEVER_UPLOADED`:
``training_args.bin`` is the pickled ``TrainingArguments``, ``hub_token`` included).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Optional

__all__ = ["NEVER_UPLOADED", "stage_folder"]

#: Checkpoint files never staged for upload: they hold credentials in clear.
NEVER_UPLOADED = ("training_args.bin",)

logger = logging.getLogger("hf_callbacks_plus")


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system, or links not supported
        shutil.copy2(source, target)


def stage_folder(source: os.PathLike | str, staging_root: os.PathLike | str) -> Optional[Path]:
    """Hard-link copy of ``source`` under ``staging_root``; None (with a warning) when it fails.

    Args:
        source: The folder to stage (a checkpoint).
        staging_root: Where staged folders go (created when missing).

    Returns:
        The staged folder ``staging_root/<source name>``, replaced when it exists.
    """
    source = Path(source)
    target = Path(staging_root) / source.name
    try:
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, target, copy_function=_link_or_copy,
                        ignore=shutil.ignore_patterns(*NEVER_UPLOADED))
    except OSError as error:
        logger.warning("Could not stage %s for upload (%s); it is not uploaded.", source, error)
        shutil.rmtree(target, ignore_errors=True)
        return None
    return target
