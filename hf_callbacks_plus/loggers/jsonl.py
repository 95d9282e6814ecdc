"""``JsonlLogger``: the embedded default logger, one JSON line per log event, nothing to install.

Each line is one of::

    {"event": "start", "run_id": "...", "time": 1712345678.9, "resumed": false}
    {"event": "params", "params": {"learning_rate": "0.1", ...}}
    {"event": "log", "step": 10, "time": 1712345679.1, "curves": {"train/loss": 0.3}, "summary": {}}
    {"event": "finish", "status": "FINISHED", "time": ...}

Non-finite values are written as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` so
every line is strict JSON. A resumed training appends to the same file and, like every
tracker logger, never writes a step twice for one metric.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any, Optional

from .base import TrackerLogger

__all__ = ["JsonlLogger"]

DEFAULT_FILE_NAME = "metrics.jsonl"


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


class JsonlLogger(TrackerLogger):
    """Writes every log event as one JSON line; works in any trainer, needs nothing installed.

    Args:
        path: The JSONL file. Defaults to ``<output_dir>/metrics.jsonl`` (``output_dir`` of the
            trainer's arguments).
        **kwargs: Options of `TrackerLogger`
            (``log_config``, ``nonfinite``, ``flush_timeout``...).

    Example:
        >>> from hf_callbacks_plus import JsonlLogger
        >>> logger = JsonlLogger("runs/metrics.jsonl")
    """

    def __init__(self, path: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}: {path!r}")
        self.path = None if path is None else str(path)

    def state_args(self) -> dict[str, Any]:
        """Constructor kwargs that rebuild this logger."""
        return {"path": self.path}

    @property
    def file(self) -> Path:
        """The file written to."""
        if self.path is not None:
            return Path(self.path)
        return Path(self._output_dir or ".") / DEFAULT_FILE_NAME

    def _write(self, line: dict[str, Any]) -> None:
        self.file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.file, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(line, allow_nan=False) + "\n")

    def _start(self, run_id: Optional[str], resume: bool) -> str:
        run_id = run_id or uuid.uuid4().hex
        self._write({"event": "start", "run_id": run_id, "time": time.time(), "resumed": resume})
        return run_id

    def _logged_steps(self) -> dict[str, int]:
        steps: dict[str, int] = {}
        if not self.file.exists():
            return steps
        with open(self.file, encoding="utf-8") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if record.get("event") == "log":
                    for key in record.get("curves", {}):
                        steps[key] = max(steps.get(key, -1), int(record.get("step", -1)))
        return steps

    def _log_records(self, records: list[dict[str, Any]]) -> None:
        self.file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.file, "a", encoding="utf-8") as handle:
            for record in records:
                line = {
                    "event": "log",
                    "step": record["step"],
                    "time": record["timestamp"] / 1000.0,
                    "curves": {k: _json_number(v) for k, v in record["metrics"].items()},
                    "summary": {k: _json_number(v) for k, v in record["summary"].items()},
                }
                handle.write(json.dumps(line, allow_nan=False) + "\n")

    def _log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self._log_records([{"step": step, "timestamp": int(time.time() * 1000), "metrics": metrics,
                            "summary": {}}])

    def _log_summary(self, values: dict[str, Any]) -> None:
        self._write({"event": "summary", "summary": {k: _json_number(v) for k, v in values.items()}})

    def _log_params(self, params: dict[str, str]) -> None:
        self._write({"event": "params", "params": params})

    def _set_tags(self, tags: dict[str, str]) -> None:
        self._write({"event": "tags", "tags": tags})

    def _finish(self, status: str) -> None:
        self._write({"event": "finish", "status": status, "time": time.time()})
