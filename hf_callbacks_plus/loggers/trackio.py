"""``TrackioLogger``: Hugging Face's local-first tracker through its run object (docs/loggers_trackio.md)."""

from __future__ import annotations

import contextvars
import uuid
from typing import Any, Optional

from .._compat import require
from .base import FAILED, Backend, LogRecord
from .config import typed
from .durable import DurableLogger
from .secrets import mask_secrets

__all__ = ["TrackioBackend", "TrackioLogger"]

#: The end-of-training totals transformers' ``TrackioCallback`` leaves out of its curves.
_TOTALS = frozenset({"train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss",
                     "total_flos"})


def check_project(project: str) -> str:
    """``project``, when trackio accepts it as a project name (else its ``ValueError``, naming it)."""
    from trackio.sqlite_storage import SQLiteStorage

    SQLiteStorage.validate_project_name(project)
    return project


class TrackioBackend(Backend):
    """One trackio run, found by its name in its project: ``trackio.init`` in a context of its own (the
    module's current run, the user's, is left alone), then only the run's methods (``Run.log`` queues,
    trackio's thread writes; the module-level ``trackio.log`` is not thread-safe).

    Args:
        trackio: The ``trackio`` module.
        init: Keyword arguments of ``trackio.init`` besides ``project`` and ``name`` (None values left out).
    """

    name = "TrackioLogger"
    #: trackio's thread writes the store every half second.
    durable_on_answer = False

    def __init__(self, trackio: Any, init: dict[str, Any]) -> None:
        self._trackio, self.init = trackio, init
        #: Set by the logger before a run opens: the project and the prefix of a new run's name.
        self.project = "huggingface"
        self.name_prefix = "run"
        self.run: Any = None

    def new_run_id(self) -> str:
        """A new run's name (trackio finds a run by its name): ``<run_name or "run">-<8 hex digits>``."""
        return f"{self.name_prefix}-{uuid.uuid4().hex[:8]}"

    def start(self, run_id: Optional[str], run_key: str, resume: bool) -> str:
        name = mask_secrets(run_id or self.new_run_id())
        init = {key: value for key, value in self.init.items() if value is not None}
        self.run = contextvars.Context().run(self._trackio.init, project=self.project, name=name,
                                             resume="allow", embed=False, **init)
        if resume:  # trackio's resumed run would replace the stored config with its own, empty one
            stored = next((run.config for run in self._trackio.Api().runs(self.project)
                           if run.name == name), None) or {}
            self.run.config.update({key: val for key, val in stored.items() if not key.startswith("_")})
        return name

    def _local(self) -> bool:
        return self.init.get("space_id") is None and self.init.get("server_url") is None

    def logged_steps(self, run_id: str) -> dict[str, int]:
        """Last step per metric of the run in the local store (a resumed run does not log them again)."""
        if not self._local():
            return {}
        from trackio.sqlite_storage import SQLiteStorage  # trackio's own reader of its store

        steps: dict[str, int] = {}
        for row in SQLiteStorage.get_logs(self.project, run_id):
            for key in row:
                if key not in ("step", "timestamp"):
                    steps[key] = max(steps.get(key, -1), int(row["step"]))
        return steps

    def log(self, records: list[LogRecord], run_id: str) -> None:
        """One ``Run.log`` per record at its step; trackio has no run summary, so texts are values too."""
        for record in records:
            self.run.log({**record.metrics, **record.summary}, step=record.step)
            self.handed = record.step

    def log_config(self, params: dict[str, str], run_id: str) -> None:
        """Into ``run.config``, which trackio writes with the run's first record."""
        self.run.config.update({key: typed(value) for key, value in params.items()})

    def sync(self) -> bool:
        """Write the run's queue to the local store now (trackio writes every 0.5 s); False when it could
        not (a Space, a busy writer)."""
        flush, lock = (getattr(self.run, name, None) for name in ("_flush_queues_inline", "_client_lock"))
        if not (callable(flush) and lock is not None and self._local() and lock.acquire(timeout=5.0)):
            return False
        try:  # trackio's writer holds the lock while it writes: at most 5 s
            flush()
        finally:
            lock.release()
        return True

    def finish(self, status: str, run_id: str) -> None:
        """``Run.finish`` (trackio writes what is queued); a failed training is an ERROR alert first."""
        run, self.run = self.run, None
        if run is None:
            return
        if status == FAILED:
            run.alert(title="training failed", text="The training raised; the run holds what was logged "
                      "before.", level=self._trackio.AlertLevel.ERROR)
        run.finish()

    def location(self) -> str:
        """The project's store: its sqlite file, or the Space or server it syncs to."""
        remote = self.init.get("space_id") or self.init.get("server_url")
        if remote:
            return f"trackio project {self.project!r} on {remote}"
        from trackio.sqlite_storage import SQLiteStorage

        return str(SQLiteStorage.get_project_db_path(self.project))


class TrackioLogger(DurableLogger):
    """Logs to trackio (local sqlite store under ``TRACKIO_DIR``, optionally synced to a Space).

    Args:
        project: The trackio project. Defaults to ``TrainingArguments.project`` (transformers' default
            ``"huggingface"``), like ``TrackioCallback``.
        name: The run's name, which identifies it in its project: a training given a name continues the
            run of that name when it exists (as ``TrackioCallback`` does with ``run_name``). Defaults to
            the name saved in the checkpoint being resumed, else a new ``<run_name or "run">-<8 hex>``.
        group: The run's group. Defaults to None.
        space_id: A Hugging Face Space to sync to. Defaults to ``TrainingArguments.trackio_space_id``,
            else trackio's own (``TRACKIO_SPACE_ID``; none: local only).
        **kwargs: Options of `TrackerLogger` (``log_config``, ``nonfinite``, ``key_names``...).

    Raises:
        ModuleNotFoundError: ``trackio`` is not installed (``hf-callbacks-plus[trackio]``).
        TypeError: ``project``, ``name``, ``group`` or ``space_id`` is not a string.
    """

    stock_callback = "TrackioCallback"
    summary_as_curves = True
    stock_key_style = "rewrite_logs"
    stock_summary_keys = _TOTALS

    def __init__(self, project: Optional[str] = None, name: Optional[str] = None,
                 group: Optional[str] = None, space_id: Optional[str] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        given = {"project": project, "name": name, "group": group, "space_id": space_id}
        for argument, value in given.items():
            if value is not None and not isinstance(value, str):
                raise TypeError(f"TrackioLogger: {argument} must be a string, got {value!r}")
        self.project, self.name, self.group, self.space_id = project, name, group, space_id
        self.explicit_run_id = name
        trackio = require("trackio", "TrackioLogger")
        if project is not None:
            check_project(project)
        self.backend: TrackioBackend = TrackioBackend(trackio, {"group": group, "space_id": space_id})

    def state_args(self) -> dict[str, Any]:
        """Constructor kwargs that rebuild this logger (the run's name is in the attributes)."""
        return {"project": self.project, "name": self.name, "group": self.group, "space_id": self.space_id}

    def _read_args(self, args: Any) -> None:
        """Take the project, the Space and a new run's name prefix from ``TrainingArguments``."""
        backend = self.backend
        backend.project = check_project(self.project or getattr(args, "project", None) or "huggingface")
        run_name = getattr(args, "run_name", None)
        from_args = run_name and run_name != getattr(args, "output_dir", None)
        backend.name_prefix = run_name if from_args else "run"
        backend.init.update(space_id=self.space_id or getattr(args, "trackio_space_id", None),
                            bucket_id=getattr(args, "trackio_bucket_id", None))

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any):
        """Read the project from ``args``, then open (or reattach to) the run."""
        self._read_args(args)
        return super().on_train_begin(args, state, control, **kwargs)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any):
        """Read the project from ``args`` when the run opens for an evaluation outside training."""
        if not self._is_open:
            self._read_args(args)
        return super().on_log(args, state, control, logs=logs, **kwargs)
