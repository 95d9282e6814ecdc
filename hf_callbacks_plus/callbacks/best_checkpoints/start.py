"""Where the ranking of `KeepBestCheckpoints` starts at train begin, and what that changes on disk.

Three sources can say what a run has kept so far, trusted in this order:

1. the state in the checkpoint being resumed (``trainer_state.json``): complete on transformers
   >= 4.45, which asks for it inside ``_save_checkpoint``, and on any version once our
   ``on_save`` of that step ran;
2. the manifest, when the checkpoint's state is older than its step (transformers < 4.45 and a
   crash between the trainer's save and ours): it was written at our last ``on_save``;
3. nothing (a fresh ranking): a fresh run, a checkpoint without our state, or a checkpoint
   copied from another ``output_dir`` (its ranking stays there).

A resumed step not ranked yet is ranked from the values in the checkpoint's ``log_history``.
Then the plan reconciles with the disk, only inside our folder: a kept folder a crash left unmade
is made from its ``checkpoint-N``; one gone with its checkpoint is marked missing (and told);
folders of this run that the ranking does not hold (made after the resumed step, or evicted by
it) are deleted; folders of another run are left alone. A fresh ranking refuses a folder that
holds another run's checkpoints.

`plan_start` reads the disk and changes nothing: the callback applies the plan on the processes
that write, so every rank takes rank 0's plan.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from ...core.checkpoint_folders import checkpoint_folder, checkpoint_steps, incomplete_reason
from .files import kept_folder, leftovers, read_manifest
from .ranking import Kept, TopK, admit

__all__ = ["Start", "plan_start"]

_OWNER = "KeepBestCheckpoints"


@dataclass
class Start:
    """The ranking a run starts from and the disk changes that go with it.

    Attributes:
        run_id, output_dir, last_step, entries: The ranking (the callback's state).
        make: Steps whose kept folder is to be made from their ``checkpoint-N``.
        remove: Steps whose kept folder (of this run) is to be deleted.
        cleanup: Half-made or half-deleted folders of this run to delete.
        problem: Why the run cannot start (raise it), or None.
        warnings: What to tell the user.
    """

    run_id: str
    output_dir: str
    last_step: int
    entries: tuple[Kept, ...] = ()
    make: list[int] = field(default_factory=list)
    remove: list[int] = field(default_factory=list)
    cleanup: list[str] = field(default_factory=list)
    problem: Optional[str] = None
    warnings: list[str] = field(default_factory=list)


def _entries(data: Mapping[str, Any]) -> tuple[Kept, ...]:
    return tuple(Kept.from_json(entry) for entry in data.get("entries") or data.get("checkpoints") or [])


def plan_start(saved: Optional[Mapping[str, Any]], step: int, candidate: Optional[Kept],
               specs: Sequence[TopK], output_dir: str, directory: str) -> Start:
    """Plan the start of a run's ranking (see the module docstring).

    Args:
        saved: Our attributes in the resumed checkpoint (None when it has none, or a fresh run).
        step: The trainer's ``global_step`` at train begin (0 for a fresh run).
        candidate: The values of the resumed step in its ``log_history``, or None.
        specs: The rankings.
        output_dir: The run's ``output_dir`` (resolved).
        directory: Our folder in it.

    Returns:
        The `Start`.
    """
    manifest = read_manifest(directory) or {}
    if step > 0 and saved is not None:
        run_id, last_step = saved.get("run_id"), saved.get("last_step")
        same_place = saved.get("output_dir") == output_dir or (run_id and manifest.get("run_id") == run_id)
        if run_id and not same_place:
            start = _fresh(step, output_dir, directory, manifest)
            start.warnings.insert(0, f"{_OWNER}: the checkpoint this run resumes from was written in "
                                     f"output_dir={saved.get('output_dir')!r}, not {output_dir!r}; its "
                                     f"ranking stays there and a fresh ranking starts here.")
            return start
        entries = _entries(saved)
        manifest_step = manifest.get("last_step")
        ours = manifest.get("run_id") == run_id if run_id else manifest.get("output_dir") == output_dir
        if (last_step is None or last_step < step) and ours and isinstance(manifest_step, int) \
                and (last_step or 0) <= manifest_step <= step:  # a state older than its checkpoint
            run_id, last_step, entries = manifest["run_id"], manifest_step, _entries(manifest)
        if run_id:
            if candidate is not None and (last_step is None or last_step < step):
                entries = admit(entries, candidate, specs).kept
            start = Start(run_id, output_dir, max(step, last_step or 0), entries)
            return _reconcile(start, step, manifest.get("run_id") == run_id, directory)
    return _fresh(step, output_dir, directory, manifest)


def _fresh(step: int, output_dir: str, directory: str, manifest: Mapping[str, Any]) -> Start:
    start = Start(uuid.uuid4().hex, output_dir, step)
    steps = checkpoint_steps(directory)
    if steps:
        owner = f"run {manifest['run_id']}" if manifest.get("run_id") else "an unknown run (no manifest)"
        start.problem = (
            f"{_OWNER}: {directory} holds kept checkpoints of {owner} (steps {sorted(steps)}). A new ranking "
            f"would mix with them, and transformers rewrites checkpoint-N files in place, which those kept "
            f"folders share as hard links. Move or delete that folder, use another output_dir or dirname, or "
            f"resume that run (train(resume_from_checkpoint=True)).")
    return start


def _reconcile(start: Start, step: int, ours: bool, directory: str) -> Start:
    """Match the ranking with the folders on disk (see the module docstring)."""
    if ours:
        start.cleanup = leftovers(directory)
    stated, entries, gone = {entry.step for entry in start.entries}, [], []
    for entry in start.entries:
        if not entry.missing and not os.path.isdir(kept_folder(directory, entry.step)):
            source = checkpoint_folder(start.output_dir, entry.step)
            if os.path.isdir(source) and incomplete_reason(source) is None:
                start.make.append(entry.step)
            else:
                entry = entry.lost()
                gone.append(entry)
        entries.append(entry)
    start.entries = tuple(entries)
    if gone:
        start.warnings.append(
            f"{_OWNER}: the kept checkpoint(s) of {', '.join(entry.describe() for entry in gone)} are gone "
            f"from {directory} and no checkpoint-N of those steps is left to keep them from. They keep their "
            f"place in the ranking, marked missing in the manifest; nothing is kept in their stead.")
    for folder_step in checkpoint_steps(directory):
        if folder_step in stated:
            continue
        if ours:
            start.remove.append(folder_step)
            start.warnings.append(f"{_OWNER}: removing kept checkpoint-{folder_step}: the ranking at the "
                                  f"step this run resumes from (step {step}) does not hold it (it was made "
                                  f"or evicted after that step, which the resumed run trains again).")
        else:
            start.warnings.append(f"{_OWNER}: {kept_folder(directory, folder_step)} is not in this run's "
                                  f"ranking and the manifest is not this run's; it is left alone.")
    return start
