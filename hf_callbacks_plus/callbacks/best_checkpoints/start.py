"""Where the ranking of `KeepBestCheckpoints` starts at train begin, and what that changes on disk.

A ranking belongs to one **line of training** (its ``run_id``): a fresh run starts one; a resume
from the newest save of a line continues it; a resume from an earlier save of a line (an earlier
``checkpoint-N``, a kept folder: the run then trains those steps again, maybe on other data), or
from a checkpoint of another line, starts a new line that inherits the ranking at the resumed
step.

The ranking a resumed run starts from is the one in the resumed checkpoint's state (the ranking
through the save before it: the trainer asks for the state before ``on_save`` ranks the
checkpoint being saved), or the manifest when it is the same line's and newer (transformers
< 4.45 writes callback states only at train begin). The resumed step itself is then ranked from
the values in its ``log_history``, through the same keep as a save.

What is on disk in ``<dirname>/`` is matched with it:

* **continuing a line**: its folders are its own. Those the ranking holds stay; the others
  (evicted by a save whose deletion a crash interrupted) are deleted; a kept folder a crash left
  unmade is made from its ``checkpoint-N``;
* **a new line**: nothing is deleted. The folders of the line it leaves (or of anyone else) are
  **set aside** in a sibling folder ``<dirname>.run-<id>-step-<last step>/`` with their manifest,
  and the user is told where. Folders the new line shares with them (saves on the way to the
  resumed step, the resumed folder itself) stay where they are for the new line, and a copy goes
  with the others, so each line keeps all of its own.

A folder or ``checkpoint-N`` is taken as a save of the resumed history only when its
``trainer_state.json`` says so (`history_matches`): the same step, a ``log_history`` that is a
prefix of the resumed one. A ranked step whose folder cannot be found or made keeps its place,
marked missing, and is told once: as *gone* when it should have been there, as *evicted later*
when the line left behind evicted it after the resumed step.

A fresh run into an ``output_dir`` whose ``<dirname>/`` holds kept checkpoints (a script run
again: the usual habit) sets them aside the same way, with a warning, unless
``earlier_runs="refuse"``: then it refuses to start (its ranking would mix with them).

`plan_start` reads the disk and changes nothing: the callback applies the plan on the processes
that write, so every rank takes rank 0's plan.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from ...core.checkpoint_folders import checkpoint_folder, checkpoint_steps
from .files import history_matches, leftovers, read_manifest
from .ranking import Kept

__all__ = ["EARLIER_RUNS", "SetAside", "Start", "plan_start"]

_OWNER = "KeepBestCheckpoints"
#: What a fresh run does with the kept checkpoints of an earlier run in its folder.
EARLIER_RUNS = ("set_aside", "refuse")


@dataclass
class SetAside:
    """Folders of another line moved (``move``) or copied (``copy``) into ``path``, with its
    manifest (``manifest``: its content, or None)."""

    path: str
    move: list[int] = field(default_factory=list)
    copy: list[int] = field(default_factory=list)
    manifest: Optional[dict[str, Any]] = None


@dataclass
class Start:
    """The ranking a run starts from and the disk changes that go with it.

    Attributes:
        run_id, output_dir, last_step, entries: The ranking (the callback's state) before the
            resumed step is ranked.
        candidate: The resumed step with its logged values, to rank through a keep, or None.
        sources: Step -> the folder its kept folder is made from (a verified ``checkpoint-N``);
            a step whose folder is in place has none.
        set_aside: The folders of another line to put aside, or None.
        remove: Steps whose kept folder (this line's, not ranked) is to be deleted.
        cleanup: Half-made or half-deleted folders to delete.
        problem: Why the run cannot start (raise it), or None.
        warnings, notes: What to tell the user (WARNING, INFO).
    """

    run_id: str
    output_dir: str
    last_step: int
    entries: tuple[Kept, ...] = ()
    candidate: Optional[Kept] = None
    sources: dict[int, str] = field(default_factory=dict)
    set_aside: Optional[SetAside] = None
    remove: list[int] = field(default_factory=list)
    cleanup: list[str] = field(default_factory=list)
    problem: Optional[str] = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _entries(data: Mapping[str, Any]) -> tuple[Kept, ...]:
    return tuple(Kept.from_json(entry) for entry in data.get("entries") or data.get("checkpoints") or [])


def _new_line() -> str:
    return uuid.uuid4().hex


def plan_start(saved: Optional[Mapping[str, Any]], step: int, history: Sequence[Any],
               candidate: Optional[Kept], output_dir: str, directory: str,
               earlier_runs: str = "set_aside") -> Start:
    """Plan the start of a run's ranking (see the module docstring).

    Args:
        saved: Our attributes in the resumed checkpoint (None when it has none, or a fresh run).
        step: The trainer's ``global_step`` at train begin (0 for a fresh run).
        history: The resumed ``log_history``.
        candidate: The values of the resumed step in its ``log_history``, or None.
        output_dir: The run's ``output_dir`` (resolved).
        directory: Our folder in it.
        earlier_runs: ``"set_aside"`` or ``"refuse"``: what a fresh run does with the kept
            checkpoints of an earlier run in ``directory``. Defaults to ``"set_aside"``.

    Returns:
        The `Start`.
    """
    manifest = read_manifest(directory) or {}
    folders = checkpoint_steps(directory)
    if step == 0 and folders and earlier_runs == "refuse":
        whose = f"run {manifest['run_id']}" if manifest.get("run_id") else "an unknown run (no manifest)"
        return Start(_new_line(), output_dir, 0, problem=(
            f"{_OWNER}: {directory} holds kept checkpoints of {whose} (steps {sorted(folders)}) and "
            f"earlier_runs='refuse'. A new ranking would mix with them. Move or delete that folder, use "
            f"another output_dir or dirname, resume that run (train(resume_from_checkpoint=True)), or pass "
            f"earlier_runs='set_aside'."))
    line = saved.get("run_id") if saved is not None else None
    moved = None
    if line and saved.get("output_dir") != output_dir and manifest.get("run_id") != line:
        moved, line = saved.get("output_dir"), None
    entries, last = (_entries(saved), saved.get("last_step") or 0) if line else ((), 0)
    manifest_step = manifest.get("last_step") if isinstance(manifest.get("last_step"), int) else 0
    ours = bool(line) and manifest.get("run_id") == line
    continues = bool(line) and ((ours and manifest_step <= step and all(n <= step for n in folders))
                                or not (manifest or folders))
    if ours and continues and manifest_step > last:  # the manifest is newer than the checkpoint's state
        entries, last = _entries(manifest), manifest_step
    start = Start(line if continues else _new_line(), output_dir, last, entries)
    if candidate is not None and line and last < step:  # a fresh ranking ranks the steps trained here
        start.candidate = candidate
    needed = {entry.step for entry in entries} | ({step} if start.candidate is not None else set())
    in_place = {n for n in folders if n in needed and n <= step
                and history_matches(checkpoint_folder(directory, n), n, history)}
    if continues:
        start.cleanup = leftovers(directory)
        start.remove = sorted(n for n in folders if n not in in_place)
        if start.remove:
            start.notes.append(f"{_OWNER}: deleting kept checkpoint(s) {start.remove} of this run from "
                               f"{directory}: the ranking at step {step} does not hold them (evicted by a "
                               f"save whose deletion was interrupted).")
    elif folders or manifest:
        start.cleanup = leftovers(directory)
        start.set_aside = _set_aside(directory, manifest, folders, in_place)
        kept_before = sorted(folders)
        whose = f"run {manifest['run_id']}" if manifest.get("run_id") else "an unknown run (no manifest)"
        if ours:
            why = (f"this run resumes from step {step} of run {line}, which went on to step "
                   f"{manifest_step}; the steps after {step} are trained again")
        elif line:
            why = f"this run resumes from step {step} of run {line}, and {directory} holds {whose}'s"
        elif step == 0:
            why = (f"this fresh run's {directory} holds {whose}'s, an earlier run into this output_dir "
                   f"(pass earlier_runs='refuse' to refuse such a start)")
        else:
            why = (f"the checkpoint this run resumes from (step {step}) holds no ranking of {directory}, "
                   f"which holds {whose}'s")
        shared = (f" (steps {sorted(in_place)}, shared with this run, are copied there and stay here)"
                  if in_place else "")
        start.warnings.append(
            f"{_OWNER}: {why}. A new ranking (run {start.run_id}) starts from "
            f"{f'the ranking at step {step}' if line else 'there'}. "
            f"The kept checkpoints of {whose} (steps {kept_before}) are set aside, not deleted: in "
            f"{start.set_aside.path}{shared}.")
    if moved is not None:
        start.warnings.insert(0, f"{_OWNER}: the checkpoint this run resumes from was written in "
                                 f"output_dir={moved!r}, not {output_dir!r}; its ranking stays there and a "
                                 f"fresh ranking starts here.")
    _reconcile(start, step, history, in_place, manifest if ours and not continues else None, directory)
    return start


def _set_aside(directory: str, manifest: Mapping[str, Any], folders: Sequence[int],
               shared: set[int]) -> SetAside:
    """Where another line's folders go: ``<directory>.run-<id>-step-<last step>`` (the same place
    again when an interrupted set-aside is resumed)."""
    run_id, last = manifest.get("run_id"), manifest.get("last_step")
    name = f"{directory}.run-{str(run_id)[:8]}-step-{last}" if run_id else f"{directory}.unknown-run"
    path, number = name, 1
    while os.path.lexists(path):
        existing = read_manifest(path) or {}
        if run_id and (existing.get("run_id"), existing.get("last_step")) == (run_id, last):
            break
        number += 1
        path = f"{name}.{number}"
    return SetAside(path, sorted(n for n in folders if n not in shared), sorted(shared),
                    dict(manifest) if manifest else None)


def _source(output_dir: str, directory: str, step: int, history: Sequence[Any]) -> Optional[str]:
    """A save of ``step`` on the way to ``history`` to make its kept folder from: its
    ``checkpoint-N``, or a kept folder set aside (the folder a run resumes from may be one)."""
    parent, name = os.path.split(directory)
    aside = sorted(os.path.join(parent, other) for other in os.listdir(parent)
                   if other.startswith(f"{name}.")) if os.path.isdir(parent) else []
    for folder in [checkpoint_folder(output_dir, step), *(checkpoint_folder(path, step) for path in aside)]:
        if history_matches(folder, step, history):
            return folder
    return None


def _reconcile(start: Start, step: int, history: Sequence[Any], in_place: set[int],
               left: Optional[Mapping[str, Any]], directory: str) -> None:
    """Find a source for every ranked step whose folder is not in place; mark the others missing.
    ``left``: the manifest of the same line's later part, which this run leaves (or None)."""
    left_kept = {entry.step for entry in _entries(left)} if left is not None else set()
    entries, gone, evicted = [], [], []
    for entry in start.entries:
        if entry.step in in_place:
            entry = Kept(entry.step, entry.values, entry.epoch)
        elif not entry.missing:
            source = _source(start.output_dir, directory, entry.step, history)
            if source is not None:
                start.sources[entry.step] = source
            else:
                entry = entry.lost()
                (evicted if left is not None and entry.step not in left_kept else gone).append(entry)
        entries.append(entry)
    start.entries = tuple(entries)
    if start.candidate is not None and step not in in_place:
        source = _source(start.output_dir, directory, step, history)
        if source is not None:
            start.sources[step] = source
    if gone:
        start.warnings.append(
            f"{_OWNER}: the kept checkpoint(s) of {', '.join(entry.describe() for entry in gone)} are "
            f"gone from {directory} and no checkpoint-N of those steps is left to keep them from. They keep "
            f"their place in the ranking, marked missing in the manifest; nothing is kept in their stead.")
    if evicted:
        start.warnings.append(
            f"{_OWNER}: the ranking at step {step} holds "
            f"{', '.join(entry.describe() for entry in evicted)}, which the later part of that run evicted "
            f"(after step {step}); no checkpoint-N of those steps is left. They keep their place in this "
            f"run's ranking, marked missing; nothing is kept in their stead.")
