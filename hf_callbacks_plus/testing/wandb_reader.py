"""W&B run files (``run-*.wandb``) read back into a `WandbRun` (history rows, config, summary, identity,
exit code), for tests to assert what a training really logged (docs/testing_wandb.md). The format is read
by ``hf_callbacks_plus.loggers.wandb_files``, which `WandbLogger` also uses.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from .._compat import require
from ..loggers.wandb_files import BLOCK_LEN, WandbLogFormatError, split_records

__all__ = [
    "BLOCK_LEN",
    "WandbLogFormatError",
    "WandbRun",
    "find_wandb_runs",
    "iter_wandb_records",
    "read_wandb_run",
    "split_records",
]

PathLike = Union[str, "os.PathLike[str]"]

def iter_wandb_records(path: PathLike) -> Iterator[bytes]:
    """Yield the raw protobuf payload of every record of a ``.wandb`` file.

    Every chunk's CRC is verified and first/middle/last chunks are joined.

    Args:
        path: A ``run-*.wandb`` file.

    Yields:
        Serialized ``wandb_internal_pb2.Record`` messages. A file cut in the middle of a
        record ends the iteration; ``read_wandb_run`` reports it.

    Raises:
        WandbLogFormatError: Bad file header, checksum mismatch or chunks out of order.
    """
    records, _ = split_records(Path(path).read_bytes(), str(path))
    yield from records


#: Keys W&B adds on its own; left out of history/summary/config unless asked for.
INTERNAL_KEYS = frozenset({"_wandb", "_runtime", "_timestamp"})

@dataclass
class WandbRun:
    """Everything a W&B run file recorded, folded into plain Python values.

    Attributes:
        path: The ``run-*.wandb`` file read.
        run_id: The run id.
        project: Project name ("" when W&B picked its default).
        entity: Entity ("" offline unless set).
        name: Display name.
        group: Run group.
        job_type: Job type.
        notes: Run notes.
        tags: Run tags, in order.
        config: Final config (updates and removals applied), values decoded from JSON.
        summary: Final summary (updates and removals applied, nested keys as dicts).
        history: One dict per committed history row, with ``_step`` and the logged keys.
        metrics: ``define_metric`` declarations, as dicts (``name``/``glob_name``,
            ``step_metric``...).
        exit_code: Exit code of ``run.finish``; None when the run never finished.
        start_time: Start time of the run (seconds since the epoch), or None.
        record_counts: How many records of each type the file holds.
        truncated: The file ends in the middle of a record (a run still being written or
            a process that died); everything before it was read.
        branch_point: Where this run continues another (``wandb.init(resume_from=...)``, a rewind, or
            ``fork_from``): ``{"run": id, "metric": "_step", "value": step}``; when synced, W&B drops
            the run's rows after ``value`` and these rows follow. None otherwise.
    """

    path: Path
    run_id: str = ""
    project: str = ""
    entity: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    notes: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    exit_code: Optional[int] = None
    start_time: Optional[float] = None
    record_counts: dict[str, int] = field(default_factory=dict)
    truncated: bool = False
    branch_point: Optional[dict[str, Any]] = None

    @property
    def finished(self) -> bool:
        """True when the file holds the exit record written by ``run.finish``."""
        return self.exit_code is not None

    def steps(self, key: Optional[str] = None) -> list[int]:
        """The ``_step`` of every history row (that holds ``key``, when given)."""
        return [row["_step"] for row in self.history if key is None or key in row]

    def series(self, key: str) -> list[tuple[int, Any]]:
        """``(step, value)`` of every history row holding ``key``, in logging order."""
        return [(row["_step"], row[key]) for row in self.history if key in row]

    def keys(self) -> set[str]:
        """Every key that appears in at least one history row."""
        return {key for row in self.history for key in row}


def find_wandb_runs(directory: PathLike) -> list[Path]:
    """Find the run files under a W&B directory, oldest first.

    Args:
        directory: ``WANDB_DIR``, its ``wandb`` subfolder, or a run folder.

    Returns:
        The ``run-*.wandb`` files (``latest-run`` links are skipped), ordered by the start
        time recorded in each file, then by folder name.
    """
    root = Path(directory)
    if (root / "wandb").is_dir():
        root = root / "wandb"
    found = {
        file.resolve()
        for file in root.glob("**/run-*.wandb")
        if "latest-run" not in file.relative_to(root).parts
    }

    def start_key(file: Path) -> tuple[float, str]:
        try:
            start = read_wandb_run(file).start_time
        except (WandbLogFormatError, OSError):
            start = None
        return (start if start is not None else float("inf"), str(file.parent.name))

    return sorted(found, key=start_key)


def _resolve(path: PathLike) -> Path:
    target = Path(path)
    if target.is_file():
        return target
    if not target.exists():
        raise FileNotFoundError(f"read_wandb_run: {str(target)!r} does not exist")
    runs = find_wandb_runs(target)
    if len(runs) == 1:
        return runs[0]
    if not runs:
        raise FileNotFoundError(f"read_wandb_run: no run-*.wandb file under {str(target)!r}")
    listing = ", ".join(str(run) for run in runs)
    raise ValueError(
        f"read_wandb_run: {str(target)!r} holds {len(runs)} runs ({listing}); pass one file or "
        "folder, or iterate over find_wandb_runs(directory)."
    )


def read_wandb_run(path: PathLike, *, internal_keys: bool = False, wait: float = 0.0) -> WandbRun:
    """Read a W&B run file (offline runs, or the local copy of an online run).

    Args:
        path: A ``run-*.wandb`` file, its run folder, or a W&B directory holding exactly
            one run (``WANDB_DIR`` or its ``wandb`` subfolder).
        internal_keys: Keep the keys W&B adds by itself (``_runtime``, ``_timestamp``,
            ``_wandb``) in history, summary and config. ``_step`` is always kept.
            Defaults to False.
        wait: Seconds to wait for the run to be complete (exit record written, no
            truncated record). ``run.finish()`` returns before the W&B service has flushed
            the file, so tests reading right after a training should pass a few seconds.
            After the wait, what is on disk is returned. Defaults to 0.0 (read once).

    Returns:
        The folded run.

    Raises:
        FileNotFoundError: No run file at ``path``.
        ValueError: ``path`` holds several runs.
        WandbLogFormatError: The file is not a W&B run log or is corrupted.
        ModuleNotFoundError: ``wandb`` (for its protobuf classes) is not installed.

    Example:
        >>> run = read_wandb_run("wandb/offline-run-20250101_000000-abc123")  # doctest: +SKIP
        >>> run.series("eval/loss")                                         # doctest: +SKIP
        [(10, 0.52), (20, 0.31)]
    """
    deadline = time.monotonic() + wait
    while True:
        try:
            run = _read_once(_resolve(path), internal_keys)
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise
        else:
            if (run.finished and not run.truncated) or time.monotonic() >= deadline:
                return run
        time.sleep(0.05)


def _read_once(file: Path, internal_keys: bool) -> WandbRun:
    pb = require("wandb.proto.wandb_internal_pb2", "read_wandb_run")
    raw_records, truncated = split_records(file.read_bytes(), str(file))
    run = WandbRun(path=file, truncated=truncated)
    folder = _Folder(run, internal_keys)
    for payload in raw_records:
        try:
            record = pb.Record.FromString(payload)
        except Exception as error:  # protobuf raises its own DecodeError
            raise WandbLogFormatError(f"{file}: a record is not a valid protobuf Record: {error}") from error
        folder.add(record)
    return run


def _decode(value_json: str) -> Any:
    try:
        return json.loads(value_json)
    except ValueError:
        return value_json


def _item_path(item: Any) -> list[str]:
    nested = list(getattr(item, "nested_key", []))
    return nested if nested else [item.key]


class _Folder:
    """Applies records, in order, to a `WandbRun`."""

    def __init__(self, run: WandbRun, internal_keys: bool) -> None:
        self.run = run
        self.internal = internal_keys

    def keep(self, key: str) -> bool:
        return self.internal or key not in INTERNAL_KEYS

    def add(self, record: Any) -> None:
        kind = record.WhichOneof("record_type") or "unknown"
        counts = self.run.record_counts
        counts[kind] = counts.get(kind, 0) + 1
        if kind in ("config", "summary"):
            self._apply(getattr(self.run, kind), getattr(record, kind))
        elif hasattr(self, f"_on_{kind}"):
            getattr(self, f"_on_{kind}")(getattr(record, kind))

    def _on_run(self, rec: Any) -> None:
        # The first run record carries everything; later ones (``run.tags = ...``,
        # ``run.name = ...``) carry what changed, so empty fields keep earlier values.
        run = self.run
        first = not run.run_id
        for attribute, name in (
            ("run_id", "run_id"), ("project", "project"), ("entity", "entity"), ("name", "display_name"),
            ("group", "run_group"), ("job_type", "job_type"), ("notes", "notes"),
        ):
            value = getattr(rec, name)
            if value or first:
                setattr(run, attribute, value)
        if rec.tags or first:
            run.tags = list(rec.tags)
        if rec.HasField("start_time") and run.start_time is None:
            run.start_time = rec.start_time.seconds + rec.start_time.nanos / 1e9
        if rec.HasField("branch_point") and rec.branch_point.run:
            point = rec.branch_point
            run.branch_point = {"run": point.run, "metric": point.metric, "value": point.value}
        for kind in ("config", "summary"):
            if rec.HasField(kind):
                self._apply(getattr(run, kind), getattr(rec, kind))

    def _apply(self, target: dict[str, Any], rec: Any) -> None:
        """A config or summary record's updates, then its removals."""
        for item in rec.update:
            keys = _item_path(item)
            if not self.keep(keys[0]):
                continue
            node = target
            for key in keys[:-1]:
                child = node.get(key)
                if not isinstance(child, dict):
                    child = node[key] = {}
                node = child
            node[keys[-1]] = _decode(item.value_json)
        for item in rec.remove:
            keys = _item_path(item)
            node = target
            for key in keys[:-1]:
                node = node.get(key) if isinstance(node.get(key), dict) else {}
            node.pop(keys[-1], None)

    def _on_history(self, rec: Any) -> None:
        row: dict[str, Any] = {}
        for item in rec.item:
            key = ".".join(_item_path(item))
            if self.keep(key):
                row[key] = _decode(item.value_json)
        if "_step" not in row and rec.HasField("step"):
            row["_step"] = rec.step.num
        self.run.history.append(row)

    def _on_metric(self, rec: Any) -> None:
        entry: dict[str, Any] = {}
        for descriptor, value in rec.ListFields():
            if descriptor.message_type is None:
                entry[descriptor.name] = value
            else:
                entry[descriptor.name] = {sub.name: sub_value for sub, sub_value in value.ListFields()}
        self.run.metrics.append(entry)

    def _on_exit(self, rec: Any) -> None:
        self.run.exit_code = rec.exit_code
