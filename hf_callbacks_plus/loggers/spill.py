"""The spill file of a tracker logger: JSONL records kept while the backend is unreachable.

Every spilled record carries the id of the run it belongs to (``run_id``) and the worker
that wrote it (``session``), so a later run replays each record into its own run:

* ``<name>.jsonl``: records of the current worker (and, until the worker partitions it at
  start, records left by earlier ones), read back in order;
* ``<name>.held.jsonl``: records of other runs that the backend cannot write to now (W&B
  writes only to its open run); kept, and replayed by the run they belong to when it is
  resumed.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from pathlib import Path
from typing import Any, Callable, Optional

__all__ = ["SpillFile"]

logger = logging.getLogger("hf_callbacks_plus")

Record = dict[str, Any]


def _read_lines(path: Path, name: str) -> list[dict[str, Any]]:
    records = []
    if path.exists():
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError:
                        logger.warning("%s: skipping a corrupt line in %s", name, path)
    return records


def _write(path: Path, records: list[dict[str, Any]], rest: tuple[str, ...] = ()) -> None:
    if not records and not rest:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, allow_nan=True) + "\n")
        handle.writelines(rest)
    os.replace(tmp, path)


class SpillFile:
    """The JSONL spill file (and the held file beside it) of one logger.

    Args:
        path: The spill file.
        name: Shown in warnings.
    """

    def __init__(self, path: Path, name: str) -> None:
        self.path = Path(path)
        self.held_path = self.path.with_name(f"{self.path.stem}.held{self.path.suffix}")
        self.name = name
        self.offset = 0  # bytes of ``path`` already loaded into memory

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

    def append(self, records: list[dict[str, Any]]) -> None:
        """Append records at the end of the spill file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            for record in records:
                handle.write(json.dumps(record, allow_nan=True) + "\n")

    def load(self, pending: deque[dict[str, Any]], limit: int, on_corrupt: Callable[[], None]) -> None:
        """Move records from the file into ``pending`` (up to ``limit`` in memory); delete it at its end."""
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8") as handle:
            handle.seek(self.offset)
            while len(pending) < limit:
                line = handle.readline()
                if not line:
                    break
                self.offset = handle.tell()
                if line.strip():
                    try:
                        pending.append(json.loads(line))
                    except json.JSONDecodeError:
                        logger.warning("%s: skipping a corrupt line in %s", self.name, self.path)
                        on_corrupt()
            at_end = not handle.readline()
        if at_end:
            self.path.unlink()
            self.offset = 0

    def rewrite(self, first: list[dict[str, Any]], stamp: Callable[[dict[str, Any]], dict[str, Any]]) -> int:
        """Write ``first`` then the records not loaded yet (stamped) as the new spill file.

        Returns:
            The number of records in the file.
        """
        rest: list[dict[str, Any]] = []
        if self.path.exists():
            with open(self.path, encoding="utf-8") as handle:
                handle.seek(self.offset)
                for line in handle:
                    if line.strip():
                        try:
                            rest.append(stamp(json.loads(line)))
                        except json.JSONDecodeError:
                            logger.warning("%s: skipping a corrupt line in %s", self.name, self.path)
        _write(self.path, first + rest)
        self.offset = 0
        return len(first) + len(rest)

    def partition(self, is_own: Callable[[Record], bool]) -> dict[Optional[str], list[Record]]:
        """Keep this run's records in the spill file; return the others grouped by run id, in order.

        Reads the held file first (older), then the spill file. Call it once, before loading.
        """
        others: dict[Optional[str], list[Record]] = {}
        own = []
        for record in _read_lines(self.held_path, self.name) + _read_lines(self.path, self.name):
            if is_own(record):
                own.append(record)
            else:
                others.setdefault(record.get("run_id"), []).append(record)
        self.held_path.unlink(missing_ok=True)
        _write(self.path, own)
        self.offset = 0
        return others

    def hold(self, records: list[dict[str, Any]]) -> None:
        """Keep records of other runs in the held file (replacing it)."""
        _write(self.held_path, records)
