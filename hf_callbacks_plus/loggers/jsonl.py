"""``JsonlLogger``: the embedded default logger, one JSON line per log event (format: docs/loggers.md)."""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

from .base import Backend, LogRecord, TrackerLogger, logger

__all__ = ["JsonlBackend", "JsonlLogger"]

DEFAULT_FILE_NAME = "metrics.jsonl"


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


class JsonlBackend(Backend):
    """Appends one JSON line per event to a file.

    Args:
        file: Returns the file to write to (it follows the trainer's ``output_dir``).
    """

    name = "JsonlLogger"

    def __init__(self, file: Callable[[], Path]) -> None:
        self._file = file

    def location(self) -> str:
        """The file."""
        return str(self._file())

    def sync(self) -> bool:
        """``fsync`` the file (every append is already in the OS's hands; this survives a machine crash)."""
        path = self._file()
        if path.is_file():
            with open(path, "a", encoding="utf-8") as handle:
                os.fsync(handle.fileno())
        return True

    def _close_partial_line(self) -> None:
        """End a file cut mid-line (a killed process) with a newline; readers skip the partial line."""
        path = self._file()
        if not path.is_file() or path.stat().st_size == 0:
            return
        with open(path, "rb+") as handle:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                handle.write(b"\n")
                logger.warning("JsonlLogger: %s ended in the middle of a line (a process was killed "
                               "while writing); the line is closed and left as it is.", path)

    def _append(self, lines: list[dict[str, Any]]) -> None:
        path = self._file()
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            handle.writelines(json.dumps(line, allow_nan=False) + "\n" for line in lines)

    def new_run_id(self) -> str:
        """A new run's id (``uuid4().hex``)."""
        return uuid.uuid4().hex

    def start(self, run_id: Optional[str], run_key: str, resume: bool) -> str:
        run_id = run_id or self.new_run_id()
        self._close_partial_line()
        self._append([{"event": "start", "run_id": run_id, "time": time.time(), "resumed": resume}])
        return run_id

    def logged_steps(self, run_id: str) -> dict[str, int]:
        steps: dict[str, int] = {}
        path = self._file()
        if not path.exists():
            return steps
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if record.get("event") == "log":
                    for key in record.get("curves", {}):
                        steps[key] = max(steps.get(key, -1), int(record.get("step", -1)))
        return steps

    def log(self, records: list[LogRecord], run_id: str) -> None:
        self._append([{"event": "log", "step": record.step, "time": record.time / 1000.0,
                       "curves": {k: _json_number(v) for k, v in record.metrics.items()},
                       "summary": {k: _json_number(v) for k, v in record.summary.items()}}
                      for record in records])

    def log_config(self, params: dict[str, str], run_id: str) -> None:
        self._append([{"event": "params", "params": params}])

    def finish(self, status: str, run_id: str) -> None:
        self._append([{"event": "finish", "status": status, "time": time.time()}])


class JsonlLogger(TrackerLogger):
    """Writes every log event as one JSON line; works in any trainer, needs nothing installed.

    Args:
        path: The JSONL file. Defaults to ``<output_dir>/metrics.jsonl``.
        **kwargs: Options of `TrackerLogger` (``log_config``, ``nonfinite``, ``key_names``...).
    """

    def __init__(self, path: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}: {path!r}")
        if path is not None and os.path.isdir(path):
            raise ValueError(f"JsonlLogger: path={str(path)!r} is a directory; pass a file path "
                             f"(e.g. {os.path.join(str(path), DEFAULT_FILE_NAME)!r}) or leave it unset "
                             "for <output_dir>/" + DEFAULT_FILE_NAME + ".")
        self.path = None if path is None else str(path)
        self.backend: JsonlBackend = JsonlBackend(lambda: self.file)

    def state_args(self) -> dict[str, Any]:
        """Constructor kwargs that rebuild this logger."""
        return {"path": self.path}

    @property
    def file(self) -> Path:
        """The file written to: ``path``, else the resumed run's file, else ``<output_dir>/metrics.jsonl``."""
        return Path(self.local_location() or DEFAULT_FILE_NAME)

    def explicit_location(self) -> Optional[str]:
        """``path``, when given."""
        return self.path

    def default_location(self) -> Optional[str]:
        """``<output_dir>/metrics.jsonl``."""
        return str(Path(self._output_dir or ".") / DEFAULT_FILE_NAME)
