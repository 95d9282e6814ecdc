"""The spill file of a tracker logger: JSONL records kept while they cannot be delivered.

Every spilled record carries the id of the run it belongs to (``run_id``) and the session that
wrote it (``session``), so a later run (or ``hf-callbacks-plus replay``) sends each record to
its own run:

* ``<name>.jsonl``: records of the current worker (and, until the worker partitions it at
  start, records left by earlier ones), read back in order;
* ``<name>.held.jsonl``: records of other runs that could not be replayed into their run
  when the worker started (the store refused); kept, and tried again by the next worker
  writing to this spill path (or by ``hf-callbacks-plus replay``);
* ``<name>.target.json``: which logger and target (tracking URI with its credentials masked,
  experiment...) the records are for;
* ``<name>.jsonl.lock``: an advisory lock (``fcntl.flock``), held by every append and every
  read-modify-rewrite of the two files above, by the training process and by
  ``hf-callbacks-plus replay`` alike, so an append never lands in a file being rewritten (and
  lost). It is never deleted (deleting a lock file lets two processes lock different files).

When the directory cannot be written, the files move to a temporary directory, with one
warning naming both places.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Optional

try:
    import fcntl
except ImportError:  # Windows: no flock; appends and rewrites are then not serialized between processes
    fcntl = None  # type: ignore[assignment]

from .records import Record, record_from_json, record_to_json

__all__ = ["SpillFile", "lock_path", "locked", "read_records", "replay_hint", "write_records"]

logger = logging.getLogger("hf_callbacks_plus")


def replay_hint(path: Path) -> str:
    """The sentence telling how to replay a spill file."""
    return f"replay them with `hf-callbacks-plus replay {path}` (add --dry-run to list them first)"


# -- lock --------------------------------------------------------------------------------
def lock_path(path: Path) -> Path:
    """The lock file of a spill file or of its held file: ``<name>.jsonl.lock`` for both."""
    path = Path(path)
    stem = path.stem[: -len(".held")] if path.stem.endswith(".held") else path.stem
    return path.with_name(f"{stem}{path.suffix}.lock")


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the advisory lock of the spill file ``path`` (and of its held file) for the block.

    An exclusive ``fcntl.flock`` on `lock_path`: it excludes other processes and, since each
    call opens the lock file anew, other threads of this process too (so the calls must not
    nest). Without ``fcntl`` (Windows), or when the lock file cannot be created (a read-only
    directory, where nothing can be appended either), the block runs unlocked.
    """
    handle = None
    if fcntl is not None:
        lock = lock_path(path)
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            handle = open(lock, "a")  # noqa: SIM115 - closed below, which releases the lock
        except OSError:
            handle = None
    if handle is None:
        yield
        return
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield
    finally:
        handle.close()


# -- spill file --------------------------------------------------------------------------
def _parse(line: str, name: str, path: Path) -> Optional[Record]:
    if not line.strip():
        return None
    try:
        record = record_from_json(json.loads(line))
    except (json.JSONDecodeError, TypeError):
        record = None
    if record is None:
        logger.warning("%s: skipping a corrupt line in %s", name, path)
    return record


def read_records(path: Path, name: str = "spill", offset: int = 0) -> list[Record]:
    """Every record of a spill file, in order (corrupt lines skipped with a warning).

    Args:
        path: The file.
        name: Shown in warnings. Defaults to "spill".
        offset: Byte offset to start reading at (what was appended after an earlier read).
            Defaults to 0.
    """
    records: list[Record] = []
    if path.exists():
        with open(path, encoding="utf-8") as handle:
            handle.seek(offset)
            for line in handle:
                record = _parse(line, name, path)
                if record is not None:
                    records.append(record)
    return records


def _dump(record: Record) -> str:
    return json.dumps(record_to_json(record), allow_nan=True) + "\n"


def write_records(path: Path, records: list[Record]) -> None:
    """Replace ``path`` with ``records`` (atomically); delete it when there are none."""
    if not records:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.writelines(_dump(record) for record in records)
    os.replace(tmp, path)


class SpillFile:
    """The JSONL spill file (and the held and target files beside it) of one logger.

    When the directory cannot be written, the files move to a temporary directory, with one
    warning naming both places.

    Args:
        path: The spill file.
        name: Shown in warnings.
        target: What the records are for (`Backend.target`), written beside the file.
            Defaults to None.
    """

    def __init__(self, path: Path, name: str, target: Optional[dict[str, Any]] = None) -> None:
        self.name = name
        self.target = target
        self.offset = 0  # bytes of ``path`` already loaded into memory
        self._moved = False
        self._set_path(Path(path))

    def _set_path(self, path: Path) -> None:
        self.path = path
        self.held_path = path.with_name(f"{path.stem}.held{path.suffix}")
        self.target_path = path.with_name(f"{path.stem}.target.json")

    def _io(self, action: Callable[[], Any]) -> Any:
        """Run a write; on OSError move the files to a temporary directory once and retry."""
        try:
            return action()
        except OSError as error:
            if self._moved:
                raise
            fallback = Path(tempfile.mkdtemp(prefix="hf_callbacks_plus_spill_")) / self.path.name
            logger.warning("%s: cannot write the spill file %s (%s: %s); using %s instead.",
                           self.name, self.path, type(error).__name__, error, fallback)
            old = self.path
            self._moved = True
            self._set_path(fallback)
            for source, destination in ((old, self.path), (old.with_name(f"{old.stem}.held{old.suffix}"),
                                                           self.held_path)):
                if source.exists():  # readable but not writable: carry the records over
                    try:
                        destination.write_bytes(source.read_bytes())
                    except OSError:
                        pass
            return action()

    def exists(self) -> bool:
        """True while the spill file holds records not yet loaded."""
        return self.path.exists()

    def leftover(self) -> int:
        """Records left by earlier runs (spill and held files)."""
        count = 0
        for path in (self.path, self.held_path):
            if path.exists():
                with open(path, encoding="utf-8") as handle:
                    count += sum(1 for line in handle if line.strip())
        return count

    def _write_target(self) -> None:
        if self.target is not None and not self.target_path.exists():
            self.target_path.write_text(json.dumps(self.target, indent=1), encoding="utf-8")

    def append(self, records: list[Record]) -> None:
        """Append records at the end of the spill file (under its lock)."""
        def write() -> None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with locked(self.path):
                self._write_target()
                with open(self.path, "a", encoding="utf-8") as handle:
                    handle.writelines(_dump(record) for record in records)

        self._io(write)

    def load(self, pending: deque[Record], room: Callable[[], bool],
             on_corrupt: Callable[[], None]) -> list[Record]:
        """Move records from the file into ``pending`` while ``room()``; delete it at its end.

        Returns:
            The records moved.
        """
        moved: list[Record] = []
        if not self.path.exists():
            return moved
        with locked(self.path):
            return self._load(pending, room, on_corrupt, moved)

    def _load(self, pending: deque[Record], room: Callable[[], bool], on_corrupt: Callable[[], None],
              moved: list[Record]) -> list[Record]:
        if not self.path.exists():
            return moved
        with open(self.path, encoding="utf-8") as handle:
            handle.seek(self.offset)
            while room():
                line = handle.readline()
                if not line:
                    break
                self.offset = handle.tell()
                if line.strip():
                    record = _parse(line, self.name, self.path)
                    if record is None:
                        on_corrupt()
                    else:
                        pending.append(record)
                        moved.append(record)
            at_end = not handle.readline()
        if at_end:
            self.path.unlink()
            self.offset = 0
        return moved

    def rewrite(self, first: list[Record], stamp: Callable[[Record], Record]) -> int:
        """Write ``first`` then the records not loaded yet (stamped) as the new spill file.

        Returns:
            The number of records in the file.
        """
        count = 0

        def write() -> None:  # read and rewrite under one lock: an append in between is kept
            nonlocal count
            with locked(self.path):
                rest: list[Record] = []
                if self.path.exists():
                    with open(self.path, encoding="utf-8") as handle:
                        handle.seek(self.offset)
                        for line in handle:
                            record = _parse(line, self.name, self.path)
                            if record is not None:
                                rest.append(stamp(record))
                write_records(self.path, first + rest)
                if first or rest:
                    self._write_target()
                count = len(first) + len(rest)

        self._io(write)
        self.offset = 0
        return count

    def partition(self, is_own: Callable[[Record], bool]) -> dict[Optional[str], list[Record]]:
        """Keep this run's records in the spill file; return the others grouped by run id, in order.

        Reads the held file first (older), then the spill file. Call it once, before loading.
        """
        others: dict[Optional[str], list[Record]] = {}
        if not self.path.exists() and not self.held_path.exists():
            return others  # nothing spilled: no lock file, no spill folder

        def write() -> None:  # read and rewrite under one lock: an append in between is kept
            others.clear()
            with locked(self.path):
                own = []
                for record in read_records(self.held_path, self.name) + read_records(self.path, self.name):
                    if is_own(record):
                        own.append(record)
                    else:
                        others.setdefault(record.run_id, []).append(record)
                self.held_path.unlink(missing_ok=True)
                write_records(self.path, own)

        self._io(write)
        self.offset = 0
        return others

    def hold(self, records: list[Record]) -> None:
        """Keep records of other runs in the held file (replacing it; under the lock)."""
        if not records and not self.held_path.exists():
            return  # nothing to keep: no lock file, no spill folder

        def write() -> None:
            with locked(self.path):
                write_records(self.held_path, records)

        self._io(write)
