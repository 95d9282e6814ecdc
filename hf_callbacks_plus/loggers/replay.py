"""Replay spill files into their runs: what ``hf-callbacks-plus replay`` does.

A logger spills the records it could not deliver (backend down, too slow for the close
deadline, run that could not start) to ``<spill dir>/<logger>.jsonl`` (and ``.held.jsonl``),
with a ``.target.json`` beside them naming the logger and its target. `replay_spill` sends
every record to the run it belongs to, in order, skipping the steps that run already holds,
sets the run's final status when the records carry one, and removes what was delivered from
the file: replaying twice sends nothing twice.

A training may still be appending to the file: the file is read under its lock
(`hf_callbacks_plus.loggers.spill.locked`), the records are sent without it, and the file is
rewritten under it again with what was not delivered plus what was appended meanwhile. When
the training rewrote the file in between (its worker took the records back), the file is left
as the training wrote it (a later replay skips the steps the run already holds).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

from .backend import Backend
from .records import FinishRecord, LogRecord, NameSanitizer, Record, record_from_json
from .spill import locked, read_records, write_records
from .worker import send_to_run

__all__ = ["ReplayedRun", "backend_for", "find_spill_files", "replay_spill"]

logger = logging.getLogger("hf_callbacks_plus")


@dataclass
class ReplayedRun:
    """What one run got (or would get, with ``dry_run``) from one spill file."""

    file: Path
    logger: str
    run_id: Optional[str]
    log_records: int = 0
    points: int = 0
    steps: tuple[int, int] = (0, 0)
    other_records: int = 0
    status: Optional[str] = None
    #: The run the records went to (a new one for records whose run never opened).
    sent_to: Optional[str] = None
    error: Optional[str] = None
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """One line for the console."""
        run = self.run_id or "(never opened: a new run)"
        parts = [f"{self.logger} run {run}: {self.log_records} log record(s), {self.points} point(s)"]
        if self.log_records:
            parts.append(f"steps {self.steps[0]}-{self.steps[1]}")
        if self.other_records:
            parts.append(f"{self.other_records} params/tags record(s)")
        parts.append(f"final status {self.status}" if self.status else "no final status recorded")
        if self.sent_to and self.sent_to != self.run_id:
            parts.append(f"sent to run {self.sent_to}")
        if self.error:
            parts.append(f"NOT sent: {self.error}")
        return ", ".join(parts)


def find_spill_files(path: Union[str, Path]) -> list[Path]:
    """The spill files at ``path``: the file itself, or every ``*.jsonl`` spill file under a folder
    (one with a ``.target.json`` beside it; none when everything was replayed already).

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"replay: {str(root)!r} does not exist")
    if root.is_file():
        return [root]
    found = sorted(file for file in root.rglob("*.jsonl") if _target_path(file).exists())
    held_first = sorted(found, key=lambda file: (not file.stem.endswith(".held"), str(file)))
    return held_first


def _refuse_non_spill_file(file: Path) -> None:
    """A file given by path with no ``.target.json`` beside it: refuse it unless its lines are
    spill records (a metrics JSONL log or any other file is not replayable).

    Raises:
        ValueError: The file holds lines that are not spill records.
    """
    with open(file, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                data = None
            if not isinstance(data, dict) or record_from_json(data) is None:
                raise ValueError(
                    f"replay: {str(file)!r} is not a spill file (its lines are not spilled tracker "
                    "records, and it has no .target.json beside it; a metrics JSONL log is read "
                    "with `hf-callbacks-plus plot`). Spill files are in <output_dir>/.tracker_spill/; "
                    "pass that folder."
                )
            return


def _target_path(file: Path) -> Path:
    stem = file.stem[: -len(".held")] if file.stem.endswith(".held") else file.stem
    return file.with_name(f"{stem}.target.json")


#: Loggers whose spill files hf-callbacks-plus 0.2.0 wrote and this version no longer replays.
_SPILLED_UNTIL_0_2 = ("WandbLogger", "JsonlLogger")


def backend_for(target: dict[str, Any], tracking_uri: Optional[str] = None) -> Backend:
    """Rebuild the backend a spill file's target names.

    Args:
        target: The ``.target.json`` content (``{"logger": "MLflowLogger", ...}``).
        tracking_uri: MLflow tracking URI to use instead of the recorded one (which has its
            credentials masked: the real one is read from ``MLFLOW_TRACKING_URI`` when it
            matches). Defaults to None.

    Raises:
        ValueError: Unknown logger, a spill file of an earlier version's `WandbLogger` or
            `JsonlLogger` (the message gives the command that replays it), or a masked URI whose
            real value is unknown.
    """
    name = target.get("logger")
    if name == "MLflowLogger":
        from .._compat import require
        from .mlflow import MLflowBackend, validate_tracking_uri
        from .secrets import unmask_url

        uri = tracking_uri or unmask_url(target.get("tracking_uri"), "MLFLOW_TRACKING_URI")
        return MLflowBackend(require("mlflow", "replay"), validate_tracking_uri(uri),
                             target.get("experiment_name"), None, {}, None)
    if name in _SPILLED_UNTIL_0_2:  # a file left by an earlier version: say how to send it
        raise ValueError(
            f"replay: this spill file was written by the {name} of hf-callbacks-plus 0.2.0 or earlier; "
            f"{name} no longer spills (it hands records to its library), so this version cannot send it. "
            "Replay it with the version that wrote it, in a virtualenv of its own: pip install "
            f"'hf-callbacks-plus{'[wandb]' if name == 'WandbLogger' else ''}==0.2.0' && "
            "hf-callbacks-plus replay <this file>.")
    raise ValueError(f"replay: unknown logger {name!r} in the target file; expected MLflowLogger "
                     "(JsonlLogger, TensorBoardLogger and WandbLogger hand their records to their library "
                     "and never spill; W&B's own run files are uploaded with `wandb sync`).")


def _identity(file: Path) -> Optional[tuple[int, int, int]]:
    """``(device, inode, size)`` of a file, or None when it does not exist."""
    try:
        stat = file.stat()
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino, stat.st_size


def _groups(records: list[Record]) -> Iterator[tuple[Optional[str], list[Record]]]:
    """Records by run: their run id, else their run key (a run whose id was never known)."""
    by_run: dict[tuple[Optional[str], Optional[str]], list[Record]] = {}
    for record in records:
        by_run.setdefault((record.run_id, None if record.run_id else record.run_key), []).append(record)
    for (run_id, _), group in by_run.items():
        yield run_id, group


def _summary(file: Path, name: str, run_id: Optional[str], records: list[Record]) -> ReplayedRun:
    logs = [record for record in records if isinstance(record, LogRecord)]
    statuses = [record.status for record in records if isinstance(record, FinishRecord)]
    steps = [record.step for record in logs]
    return ReplayedRun(file, name, run_id, len(logs), sum(len(r.metrics) + len(r.summary) for r in logs),
                       (min(steps), max(steps)) if steps else (0, 0),
                       len(records) - len(logs) - len(statuses), statuses[-1] if statuses else None)


def replay_spill(path: Union[str, Path], dry_run: bool = False, tracking_uri: Optional[str] = None,
                 report: Callable[[str], None] = print) -> list[ReplayedRun]:
    """Send spilled records to their runs, exactly once.

    Args:
        path: A spill file or a folder holding spill files (``<output_dir>/.tracker_spill``).
        dry_run: Only list what would be sent. Defaults to False.
        tracking_uri: MLflow tracking URI to use instead of the recorded one. Defaults to None.
        report: Receives one line per run. Defaults to ``print``.

    Returns:
        One entry per (file, run).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: A target names an unknown logger, or its URI cannot be unmasked.
    """
    results: list[ReplayedRun] = []
    files = find_spill_files(path)
    if not files:
        report(f"nothing to replay in {path}")
    for file in files:
        target_file = _target_path(file)
        if not target_file.exists():
            _refuse_non_spill_file(file)
        target = json.loads(target_file.read_text(encoding="utf-8")) if target_file.exists() else {}
        name = str(target.get("logger", "unknown logger"))
        with locked(file):
            records = read_records(file, name)
            read_as = _identity(file)
        backend = None if dry_run else backend_for(target, tracking_uri)
        left: list[Record] = []
        for run_id, group in _groups(records):
            entry = _summary(file, name, run_id, group)
            if backend is not None:
                try:
                    sanitize = NameSanitizer(backend.clean_name, backend.max_name_length)
                    entry.sent_to = send_to_run(backend, sanitize, run_id, group)
                except Exception as error:  # keep this run's records, go on with the others
                    entry.error = f"{type(error).__name__}: {str(error)[:300]}"
                    left.extend(group)
            results.append(entry)
            report(("would send " if dry_run else "") + entry.describe())
        if not dry_run:
            with locked(file):  # what a training appended meanwhile is kept, after what is left
                now = _identity(file)
                appended_only = (read_as is not None and now is not None and now[:2] == read_as[:2]
                                 and now[2] >= read_as[2])
                if appended_only:
                    write_records(file, left + read_records(file, name, offset=read_as[2]))
                elif read_as is not None and now != read_as:
                    report(f"{file} was rewritten or emptied by a training while it was replayed; it is "
                           "left as the training wrote it (a later replay skips the steps the runs hold)")
                stem = target_file.name[: -len(".target.json")]
                siblings = (file.with_name(f"{stem}{suffix}") for suffix in (".jsonl", ".held.jsonl"))
                if not any(sibling.exists() for sibling in siblings):
                    target_file.unlink(missing_ok=True)  # nothing left to replay
    return results
