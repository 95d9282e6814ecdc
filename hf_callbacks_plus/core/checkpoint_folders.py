"""Checkpoint folders as transformers names them, and which one a run resumes from.

Both runners (``LightweightTrainer`` and ``TrainerPlus``) write ``<output_dir>/checkpoint-<step>/``
with ``trainer_state.json`` written last, so a folder without a readable state file is a save
that did not finish (the disk filled up, the process was killed). transformers resumes
``resume_from_checkpoint=True`` from the highest-numbered folder whatever it holds, then fails
inside its loading code; our runners resume from the newest *complete* one and say which
incomplete ones they skipped.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Optional, Union

from .state import TRAINER_STATE_NAME

__all__ = [
    "PREFIX_CHECKPOINT_DIR",
    "checkpoint_folder",
    "checkpoint_steps",
    "get_last_checkpoint",
    "incomplete_reason",
    "newest_complete_checkpoint",
]

logger = logging.getLogger("hf_callbacks_plus")

#: Checkpoint folders are named ``checkpoint-<global_step>`` (same as transformers).
PREFIX_CHECKPOINT_DIR = "checkpoint"
_RE_CHECKPOINT = re.compile(r"^" + PREFIX_CHECKPOINT_DIR + r"\-(\d+)$")


def checkpoint_folder(output_dir: Union[str, os.PathLike], step: int) -> str:
    """``<output_dir>/checkpoint-<step>``."""
    return os.path.join(os.fspath(output_dir), f"{PREFIX_CHECKPOINT_DIR}-{step}")


def checkpoint_steps(output_dir: Union[str, os.PathLike]) -> list[int]:
    """The steps of the ``checkpoint-N`` folders in ``output_dir``, highest first."""
    if not os.path.isdir(output_dir):
        return []
    steps = []
    for name in os.listdir(output_dir):
        match = _RE_CHECKPOINT.search(name)
        if match is not None and os.path.isdir(os.path.join(output_dir, name)):
            steps.append(int(match.group(1)))
    return sorted(steps, reverse=True)


def get_last_checkpoint(output_dir: Union[str, os.PathLike]) -> Optional[str]:
    """The ``checkpoint-N`` folder with the highest N in ``output_dir`` (complete or not), or None."""
    steps = checkpoint_steps(output_dir)
    return checkpoint_folder(output_dir, steps[0]) if steps else None


def incomplete_reason(checkpoint: Union[str, os.PathLike]) -> Optional[str]:
    """Why ``checkpoint`` cannot be resumed from, or None when its ``trainer_state.json`` reads."""
    path = os.path.join(checkpoint, TRAINER_STATE_NAME)
    if not os.path.isfile(path):
        return f"no {TRAINER_STATE_NAME}"
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError, ValueError) as error:
        return f"unreadable {TRAINER_STATE_NAME} ({type(error).__name__}: {error})"
    if not isinstance(data, dict) or "global_step" not in data:
        return f"{TRAINER_STATE_NAME} holds no global_step"
    return None


def newest_complete_checkpoint(output_dir: Union[str, os.PathLike], *, trainer_name: str) -> Optional[str]:
    """The highest-numbered ``checkpoint-N`` in ``output_dir`` whose state file reads.

    Newer incomplete folders are skipped with one WARNING naming each and why (they are left
    on disk).

    Args:
        output_dir: The run's output directory.
        trainer_name: Named in the warning (``"LightweightTrainer"``, ``"TrainerPlus"``).

    Returns:
        The folder's path, or None when ``output_dir`` holds no ``checkpoint-N`` folder.

    Raises:
        FileNotFoundError: Every ``checkpoint-N`` folder is incomplete and the newest has no
            state file (what transformers raises loading it); the message lists them.
        ValueError: Every folder is incomplete and the newest one's state does not read.
    """
    skipped: list[str] = []
    for step in checkpoint_steps(output_dir):
        folder = checkpoint_folder(output_dir, step)
        reason = incomplete_reason(folder)
        if reason is None:
            if skipped:
                logger.warning(
                    "%s: resume_from_checkpoint=True skips incomplete checkpoint(s) %s and resumes from %s "
                    "(the newest complete one). An interrupted save (disk full, killed process) leaves a "
                    "folder without its state; delete it once you no longer need it.",
                    trainer_name, "; ".join(skipped), folder,
                )
            return folder
        skipped.append(f"{folder} ({reason})")
    if skipped:
        # the type transformers raises reading the newest folder's state: a missing file, or bad JSON
        error = FileNotFoundError if skipped[0].endswith(f"(no {TRAINER_STATE_NAME})") else ValueError
        raise error(
            f"{trainer_name}.train(resume_from_checkpoint=True): no complete checkpoint in "
            f"output_dir={os.fspath(output_dir)!r}; every checkpoint-N folder is incomplete: "
            f"{'; '.join(skipped)}. Pass resume_from_checkpoint=None to start over, or a folder path."
        )
    return None
