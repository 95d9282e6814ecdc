"""``TrackerLogger``, the callback every tracker logger is, and its `Backend` (docs/architecture.md)."""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

from ..core.claims import TrainBeginClaims
from ..core.stateful import SelfRestoringState
from ..metrics.keys import KeyGrammar, flatten_metrics, grammar_for
from ..metrics.numbers import to_float
from .artifacts import stage_folder
from .config import collect_config, truncate
from .secrets import REDACTED, looks_like_secret, mask_secrets

__all__ = ["FAILED", "FINISHED", "Backend", "LogRecord", "TrackerLogger", "is_main_process"]

logger = logging.getLogger("hf_callbacks_plus")

FINISHED = "FINISHED"
FAILED = "FAILED"
NONFINITE_POLICIES = ("keep", "drop")
KEY_NAMES = ("sections", "stock")

#: One logger per state key and ``train()`` (see `TrackerLogger._check_neighbours`).
_CLAIMS = TrainBeginClaims()
#: The ``report_to`` name of transformers' callback for each tracker (in ``swap.py``'s order).
_STOCK_REPORT_TO = {"MLflowCallback": "mlflow", "WandbCallback": "wandb",
                    "TensorBoardCallback": "tensorboard", "TrackioCallback": "trackio"}
#: Loggers of this process with an open run, held until it is closed (within reach of the exit hook).
_OPEN_LOGGERS: dict[int, TrackerLogger] = {}


def is_main_process(state: Any = None) -> bool:
    """True on the process that should log: world rank 0 (``state`` and env ``RANK``)."""
    if os.environ.get("RANK", "0").strip() not in ("", "0"):
        return False
    return bool(getattr(state, "is_world_process_zero", True)) if state is not None else True


@dataclass
class LogRecord:
    """One rendered ``on_log`` record: curve points at ``step`` and run-summary values."""

    step: int
    time: int  # milliseconds since the epoch
    metrics: dict[str, float]
    summary: dict[str, Any]
    #: Where the record goes in the run (`Backend.place`: W&B's history row, else the step).
    position: Optional[int] = None


class Backend:
    """One tracker's client, called on one thread in order: `start`, writes, `finish`.
    Subclasses implement `start`, `log`, `log_config` and `finish`; the rest is optional."""

    #: Shown in messages.
    name = "backend"
    #: The positions of the last record placed (`place`) and of the last one handed to `log` (set by a
    #: client that writes in the background, for `confirm_durable`).
    position: Optional[int] = None
    handed: Optional[int] = None
    #: True when a call that returned means the tracker's files hold what it was given (MLflow's store);
    #: False for a client that writes in the background (`confirm_durable` tells how far it has).
    durable_on_answer = True
    #: The sender's pace: seconds between two calls, and points per batch of the store (`wal.Sender`).
    send_interval = 0.0
    max_metrics_per_batch = 1000

    def new_run_id(self) -> Optional[str]:
        """A new run's id when the client chooses it (W&B, TensorBoard, JSONL). Defaults to None."""
        return None

    def prepare(self, run_id: Optional[str]) -> None:
        """On the training thread, before a sender opens the run: what the user must fix at once raises
        (an unwritable folder: ``OSError``). Defaults to nothing."""

    def start(self, run_id: Optional[str], run_key: str, resume: bool) -> str:
        """Open the run (reattach to it when ``resume``; by ``run_key`` when ``run_id`` is None); its id."""
        raise NotImplementedError

    def logged_steps(self, run_id: str) -> dict[str, int]:
        """Last step per metric the run holds (a session attaches to it). Defaults to {}."""
        return {}

    def log(self, records: list[LogRecord], run_id: str) -> None:
        """Write log records, in order."""
        raise NotImplementedError

    def log_config(self, params: dict[str, str], run_id: str) -> None:
        """Write the run config (flat, redacted strings)."""
        raise NotImplementedError

    def log_file(self, folder: str, name: str, kind: str, run_id: str) -> None:
        """Upload a staged folder as ``name`` (``kind``: ``"model"``...), then remove it. Default: no-op."""

    def finish(self, status: str, run_id: str) -> None:
        """Close the run with ``"FINISHED"`` or ``"FAILED"``."""
        raise NotImplementedError

    def sync(self) -> bool:
        """Write what the library buffers to disk (a checkpoint is saved); False when it could not.
        Defaults to nothing (True)."""
        return True

    def place(self, record: LogRecord, position: Optional[int] = None) -> int:
        """Set where ``record`` goes in the run (``position`` when it was placed before, a record sent
        again); its position. Defaults to its step."""
        record.position = self.position = record.step
        return record.step

    def confirm_durable(self) -> Optional[int]:
        """The position up to which the tracker's own files hold every record handed before this call
        (it may block; called on the sender's thread), or None when unknown. Defaults to every position
        before the last one handed, once `sync` wrote (the last may get more records: a resume sends it
        again whole)."""
        return self.handed - 1 if self.handed is not None and self.sync() else None

    def is_transient(self, error: BaseException) -> bool:
        """Whether a call that raised ``error`` may succeed when retried. Defaults to False."""
        return False

    def explain(self, error: BaseException) -> tuple[str, Optional[str]]:
        """The cause of ``error`` in words, and its kind (``"refused"``, ``"dns"``, ``"tls"``, ``"auth"``,
        else None). Defaults to its type and text."""
        return f"{type(error).__name__}: {error}", None

    def probe(self) -> Optional[tuple[str, str]]:
        """Ask cheaply whether the store answers: `explain`'s cause and kind when not. Defaults to None."""
        return None

    def rewind(self, position: int) -> None:
        """Make a resumed session go on after ``position``: what the run holds after it is dropped.
        Defaults to nothing (the run cannot drop records: `logged_steps` keeps them from repeating)."""

    def close(self) -> None:
        """Release what the client holds between sessions (MLflow's helper process). Defaults to nothing."""

    def location(self) -> str:
        """Where the run is written, for messages. Defaults to the name."""
        return self.name


class WarnOnce:
    """Log a warning once per key."""

    def __init__(self) -> None:
        self._seen: set[Any] = set()

    def __call__(self, key: Any, message: str, *args: Any) -> None:
        """Log ``message % args`` as a warning the first time ``key`` is seen."""
        if key not in self._seen:
            self._seen.add(key)
            logger.warning(message, *args)


def stock_names(logs: Mapping[str, Any], style: str,
                summary_keys: frozenset = frozenset()) -> tuple[dict[str, Any], dict[str, Any]]:
    """Name ``logs`` as the stock callback of ``style`` does: ``(curves, summary)``. ``"raw"`` (MLflow) keeps
    keys, ``"rewrite_logs"`` (W&B, TensorBoard) makes ``eval_``/``test_`` sections and puts the rest in
    ``train/``; ``summary_keys`` go to the summary under their raw name (W&B's run totals)."""
    curves: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    for key, value in flatten_metrics(logs).items():
        if key in summary_keys:
            summary[key] = value
            continue
        name = key
        if style == "rewrite_logs":
            section, _, rest = key.partition("_")
            name = f"{section}/{rest}" if section in ("eval", "test") and rest else "train/" + key
        (summary if isinstance(value, str) else curves)[name] = value
    return curves, summary


def normalize_value(value: Any) -> tuple[str, Any]:
    """Classify one logged value: ``("number", float)``, ``("text", str)`` or ``("drop", value)``."""
    if type(value) is float:  # the common case first: a record can hold hundreds
        return "number", value
    if isinstance(value, str):
        return "text", value
    try:
        number = to_float(value, accept_bool=True)
    except OverflowError:  # an int beyond float's range (10**400)
        return "drop", value
    return ("drop", value) if number is None else ("number", number)


class Renderer:
    """Turns ``on_log`` data into a `LogRecord` for the logger ``owner`` (its policy and naming); a
    repeated point and a point at or below ``held`` (the resume boundary) are left out."""

    def __init__(self, owner: TrackerLogger) -> None:
        self.owner = owner
        self.grammar = owner.grammar
        #: The resume boundary: last step per metric the run held when this session started.
        self.held: dict[str, int] = {}
        #: Last step per metric rendered (checkpointed).
        self.last_steps: dict[str, int] = {}
        self._last_points: dict[str, tuple[int, float]] = {}
        self._names: dict[str, str] = {}
        self._owners: dict[str, str] = {}
        self._learned: tuple[Any, ...] = ()

    def name(self, raw: str) -> str:
        """The tracker's name for a rendered name (stable for the life of the renderer)."""
        known = self._names.get(raw)
        if known is not None:
            return known
        owner = self.owner
        limit = owner.max_name_length
        cleaned = owner.clean_name(mask_secrets(raw))[:limit]
        candidate, counter = cleaned, 2
        while self._owners.get(candidate, raw) != raw:
            suffix = f"_{counter}"
            candidate = (cleaned if limit is None else cleaned[: limit - len(suffix)]) + suffix
            counter += 1
        if candidate != cleaned:
            logger.warning("Metric names %r and %r both become %r for this tracker; logging %r as %r.",
                           self._owners[cleaned], raw, cleaned, raw, candidate)
        self._names[raw] = candidate
        self._owners[candidate] = raw
        return candidate

    def render(self, logs: Mapping[str, Any], step: int, time_ms: int) -> Optional[LogRecord]:
        """One record from ``on_log`` data; None when nothing is left to send."""
        owner, warn = self.owner, self.owner.warn
        keys = tuple(logs)
        if keys != self._learned:  # learning is idempotent: once per key set in a row
            self.grammar.learn_from_metrics(logs)
            self._learned = keys
        if owner.key_names == "stock":
            curves, summary_in = stock_names(logs, owner.stock_key_style, owner.stock_summary_keys)
        else:
            curves, summary_in = self.grammar.render_logs(logs)
        metrics: dict[str, float] = {}
        summary: dict[str, Any] = {}
        held, last, steps = self.held, self._last_points, self.last_steps
        for is_curve, values in ((True, curves), (False, summary_in)):
            for raw, value in values.items():
                kind, number = normalize_value(value)
                name = self.name(raw)
                if kind == "text":
                    summary[name] = REDACTED if looks_like_secret(raw, number) else mask_secrets(number)
                    continue
                if kind == "drop":
                    reason = ("is too large for a float" if isinstance(value, int) else
                              f"has a value of type {type(value).__name__}, neither a number nor a string")
                    warn(("drop", raw), "%s: %r %s; it is not logged (the other metrics are).",
                         owner.logger_name, raw, reason)
                    continue
                if owner.nonfinite == "drop" and not math.isfinite(number):
                    warn(("nonfinite", raw), "%s: dropping non-finite value %r of %r (nonfinite='drop').",
                         owner.logger_name, number, raw)
                    continue
                if not is_curve and not owner.summary_as_curves:
                    summary[name] = number
                    continue
                if (held and step <= held.get(name, -1)) or last.get(name) == (step, number):
                    continue  # the run held this step before this session, or a repeat
                last[name] = (step, number)
                if step > steps.get(name, -1):
                    steps[name] = step
                metrics[name] = number
        return LogRecord(int(step), time_ms, metrics, summary) if metrics or summary else None


def _close_at_exit(reference: weakref.ref[TrackerLogger]) -> None:
    tracker = reference()
    if tracker is None:
        return
    try:
        if tracker.training:  # on_train_end never came: the training raised (stock Trainer)
            tracker.close_after_exception()
        else:
            tracker.close(FINISHED)
    except Exception as error:  # never raise at interpreter exit
        logger.warning("%s: could not close at exit: %s", tracker.logger_name, error)


class TrackerLogger(SelfRestoringState):
    """Base callback for experiment trackers (a subclass sets ``self.backend``); never crashes training.

    Args:
        log_config: Log the ``TrainingArguments`` and the model config once, as params. Defaults to True.
        nonfinite: ``"keep"`` logs NaN/+-Inf, ``"drop"`` drops them with one warning per key.
            Defaults to "keep".
        flush_timeout: Longest wait in seconds at train end, exception or exit for the tracker to take
            what is left and close the run. Defaults to 30.
        grammar: The key grammar. Defaults to the trainer's (``grammar_for``), else a new one.
        key_names: ``"sections"`` (``train/loss``, ``eval/loss``...) or ``"stock"`` (the names of the
            stock transformers callback of this tracker). Defaults to "sections".

    Raises:
        ValueError: An argument is out of range.
    """

    #: Capability: sends logs out (`run_before_integrations` puts the callbacks fixing logs ahead).
    sends_logs_out = True
    #: The tracking service, set by the subclass (None: the logger does nothing).
    backend: Optional[Backend] = None
    #: Class name of transformers' ``report_to`` callback for the same tracker.
    stock_callback: Optional[str] = None
    #: Naming: longest name and param; totals as points; the stock callback's style and summary keys.
    max_name_length: Optional[int] = None
    max_param_length: Optional[int] = None
    summary_as_curves = False
    stock_key_style = "raw"
    stock_summary_keys: frozenset = frozenset()
    #: Longest wait for the backlog after an exception in training (the exception waits for it).
    exception_timeout = 2.0
    #: False: the run stays open after ``train()`` (a tracker whose reopened run is a second one).
    close_at_train_end = True

    def __init__(self, log_config: bool = True, nonfinite: str = "keep", flush_timeout: float = 30.0,
                 grammar: Optional[KeyGrammar] = None, key_names: str = "sections") -> None:
        super().__init__()
        if key_names not in KEY_NAMES:
            raise ValueError(f"key_names must be one of {KEY_NAMES}, got {key_names!r}")
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")
        if type(flush_timeout) not in (int, float) or flush_timeout < 0:
            raise ValueError(f"flush_timeout must be a number >= 0, got {flush_timeout!r}")
        self.log_config = log_config
        self.nonfinite = nonfinite
        self.flush_timeout = float(flush_timeout)
        self.key_names = key_names
        self._own_grammar = grammar is not None
        self.grammar = grammar if grammar is not None else KeyGrammar()
        self.warn = WarnOnce()
        #: The run id given by the user (argument or environment); wins over a checkpoint's.
        self.explicit_run_id: Optional[str] = None
        #: The run's id (None until known) and client-made key; checkpointed.
        self.run_id: Optional[str] = None
        self.run_key: Optional[str] = None
        #: True between ``on_train_begin`` and the run's close.
        self.training = False
        #: Where the checkpoint's run was written (`local_location`, absolute), set on resume.
        self.restored_location: Optional[str] = None
        self._renderer = Renderer(self)
        self._restored_steps: dict[str, int] = {}
        self._params_logged = False
        self._is_open = False
        self._new_session = True
        #: True while the run opened by this train()'s first ``_open`` (not a reopening for evaluate()).
        self._session_start = False
        self._lost = 0
        self._lost_error: Optional[BaseException] = None
        self._trainer_ref: Optional[weakref.ref[Any]] = None
        self._output_dir: Optional[str] = None
        self._lifecycle_lock = threading.Lock()
        self._exit_hook: Optional[Any] = None

    @property
    def logger_name(self) -> str:
        """The logger's class name, shown in messages."""
        return type(self).__name__

    def clean_name(self, name: str) -> str:
        """Turn a rendered metric name into one the tracker accepts. Defaults to unchanged."""
        return name

    # -- public API --------------------------------------------------------------------
    def bind(self, trainer: Any) -> TrackerLogger:
        """Give the logger its trainer (called by every runner; see ``bind_trainer``)."""
        self.attach_trainer(trainer)
        return self

    def attach_trainer(self, trainer: Any) -> None:
        """Take the trainer's key grammar and its eval dataset names (``eval_dataset`` dict)."""
        self._trainer_ref = weakref.ref(trainer)
        if not self._own_grammar:
            self.grammar = self._renderer.grammar = grammar_for(trainer)
        eval_dataset = getattr(trainer, "eval_dataset", None)
        if isinstance(eval_dataset, dict):
            for name in eval_dataset:
                self.grammar.declare_dataset(str(name))

    def log_file(self, path: Union[str, os.PathLike], name: str, artifact_type: str = "predictions") -> bool:
        """Upload a copy of the file ``path`` to the open run as ``name`` (MLflow: a folder; W&B: an
        artifact of type ``artifact_type``).

        Returns:
            False when this tracker keeps no files (JSONL, TensorBoard) or no run is open.
        """
        if not self._is_open or type(self.backend).log_file is Backend.log_file:
            return False
        staging = Path(self._output_dir or tempfile.gettempdir()) / ".tracker_artifacts"
        staged = stage_folder(path, staging, name)
        if staged is not None:
            self._write_file(str(staged), name, artifact_type)
        return staged is not None

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Hand what was logged to disk or to the tracker; False when not all there after ``timeout`` s."""
        return not self._is_open or self._sync(self.flush_timeout if timeout is None else timeout)

    def close(self, status: str = FINISHED, timeout: Optional[float] = None) -> bool:
        """Close the run with ``status`` within ``timeout`` s (default ``flush_timeout``); True if done."""
        if status not in (FINISHED, FAILED):
            raise ValueError(f"status must be 'FINISHED' or 'FAILED', got {status!r}")
        with self._lifecycle_lock:
            was_open, self._is_open, self.training = self._is_open, False, False
            _OPEN_LOGGERS.pop(id(self), None)
        if not was_open:
            return True
        return self._close_run(status, self.flush_timeout if timeout is None else max(0.0, timeout))

    def close_after_exception(self) -> bool:
        """Close the run FAILED within ``min(flush_timeout, exception_timeout)`` seconds."""
        return self.close(FAILED, timeout=min(self.flush_timeout, self.exception_timeout))

    # -- checkpointed state -----------------------------------------------------------
    def state_attributes(self) -> dict[str, Any]:
        """The run's identity, last step per metric, config logged, local location (never waits)."""
        location = self.local_location()
        return {"run_id": self.run_id, "run_key": self.run_key, "last_steps": dict(self._renderer.last_steps),
                "params_logged": self._params_logged,
                "location": None if location is None else os.path.abspath(location)}

    def load_state_attributes(self, attributes: dict[str, Any]) -> None:
        """Restore the run's identity and steps from a checkpoint (an explicit run id wins)."""
        run_id = attributes.get("run_id")
        if run_id and self.explicit_run_id and run_id != self.explicit_run_id:
            logger.warning("%s: the checkpoint belongs to run %r but run id %r was given; using %r.",
                           self.logger_name, run_id, self.explicit_run_id, self.explicit_run_id)
            return
        self.run_id = run_id or self.run_id
        self.run_key = attributes.get("run_key") or self.run_key
        self.restored_location = attributes.get("location")
        self._restored_steps = {str(k): int(v) for k, v in (attributes.get("last_steps") or {}).items()}
        self._renderer.last_steps.update(self._restored_steps)
        self._params_logged = bool(attributes.get("params_logged", False))

    # -- events ------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any):
        """Restore the run from the checkpoint, open it, log the config."""
        if self.backend is None or not is_main_process(state):
            return
        self._check_neighbours(state, args)
        if self._is_open:  # a run left open by evaluate() (ended well) or by a train() that raised
            self.close(FAILED if self.training else FINISHED)
        self.run_id, self.run_key = self.explicit_run_id, None
        self.restored_location, self._restored_steps, self._params_logged = None, {}, False
        self._renderer = Renderer(self)
        self._new_session = True
        super().on_train_begin(args, state, control, **kwargs)
        self._output_dir = getattr(args, "output_dir", None)
        self._tell_moved_location()
        self._close_earlier_holder()
        self.training = True
        self._open()
        if self.log_config and not self._params_logged:
            self._log_config(args, model)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any):
        """Render ``logs`` and write the record (reopening the run after training, for evaluate())."""
        if not logs or self.backend is None or not is_main_process(state):
            return
        if not self._is_open:
            self._output_dir = self._output_dir or getattr(args, "output_dir", None)
            self._open()
        try:
            record = self._renderer.render(logs, state.global_step, int(time.time() * 1000))
        except Exception as error:  # a value we cannot render must not stop training
            self._lose(1, error)
            return
        if record is not None:
            self._write(record)

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any):
        """Learn evaluation prefixes and dataset names from the metrics."""
        if metrics:
            self.grammar.learn_from_metrics(metrics)

    def on_predict(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any):
        """Log ``trainer.predict()`` metrics at the current step (``predict`` fires no ``on_log``)."""
        if metrics:
            self.grammar.learn_from_metrics(metrics)
            self.on_log(args, state, control, logs=dict(metrics))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any):
        """Put what was logged before this checkpoint on disk (never waits for a remote store)."""
        super().on_save(args, state, control, **kwargs)
        if self._is_open and is_main_process(state):
            self._sync(0.0)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any):
        """Close the run FINISHED (or, with ``close_at_train_end=False``, keep it open for evaluate())."""
        _CLAIMS.release(state, self.state_key, self)
        if not is_main_process(state):
            return
        if self.close_at_train_end:
            self.close(FINISHED)
        elif self._is_open:  # ended well: closed FINISHED at exit, by the next train() or by close()
            self.training = False
            self._sync(0.0)

    def on_exception(self, args: Any, state: Any, control: Any, exception: Any = None, **kwargs: Any):
        """Close the run FAILED (``TrainerPlus`` and ``LightweightTrainer`` fire this)."""
        if is_main_process(state):
            self.close_after_exception()

    # -- where the run is on this machine (JSONL file, TensorBoard folder, MLflow's log) -------
    def explicit_location(self) -> Optional[str]:
        """The file or folder the user chose for the run. Defaults to None."""
        return None

    def default_location(self) -> Optional[str]:
        """Where the run goes without a choice (under ``output_dir``). Defaults to None."""
        return None

    def local_location(self) -> Optional[str]:
        """The user's choice, else the checkpoint's when it exists here, else `default_location`."""
        explicit = self.explicit_location()
        if explicit is not None:
            return explicit
        restored = self.restored_location
        return restored if restored and os.path.exists(restored) else self.default_location()

    # -- writing: on the training thread, to the backend (a durable logger overrides these) ----
    def _open_run(self, resume: bool, boundary: bool) -> None:
        """Open the run; with ``boundary``, fix the steps it held before this session."""
        backend = self.backend
        with self._told_unwritable(backend.location):
            self.run_id = backend.start(self.run_id, self.run_key, resume)
        if boundary:
            held = dict(self._restored_steps)
            for key, step in backend.logged_steps(self.run_id).items():
                held[key] = max(step, held.get(key, -1))
            self._renderer.held = held

    def _write(self, record: LogRecord) -> None:
        self._call(self.backend.log, [record], self.run_id)

    def _write_config(self, params: dict[str, str]) -> None:
        self._call(self.backend.log_config, params, self.run_id)

    def _write_file(self, folder: str, name: str, kind: str) -> None:
        self._call(self.backend.log_file, folder, name, kind, self.run_id)

    def _sync(self, timeout: float) -> bool:
        try:
            self.backend.sync()
        except Exception as error:
            logger.warning("%s: could not write %s to disk: %s", self.logger_name, self.backend.location(),
                           error)
            return False
        return self._lost == 0

    def _close_run(self, status: str, timeout: float) -> bool:
        ok = self._call(self.backend.finish, status, self.run_id)
        self._tell_lost(self.backend.location())
        return ok and self._lost == 0

    def _call(self, function: Callable[..., Any], *args: Any) -> bool:
        try:
            function(*args)
        except Exception as error:  # a full disk, a closed run: never into the training loop
            self._lose(1, error)
            return False
        return True

    @contextlib.contextmanager
    def _told_unwritable(self, where: Callable[[], Any]) -> Iterator[None]:
        """An ``OSError`` inside names the logger and ``where()`` (at train begin: the user fixes it)."""
        try:
            yield
        except OSError as error:
            raise OSError(error.errno, f"{self.logger_name}: cannot write the run to {where()}: "
                          f"{error.strerror or error}. Pass a writable location.") from error

    def _tell_lost(self, where: Any) -> None:
        if self._lost:
            logger.error("%s: %d record(s) could not be written to %s (%s) and are not in the run (every "
                         "logged record is also in the trainer's state.log_history, trainer_state.json).",
                         self.logger_name, self._lost, where, self._lost_error)

    def _lose(self, count: int, error: BaseException) -> None:
        self._lost, self._lost_error = self._lost + count, error
        if self._lost == count:
            logger.error("%s: could not write to %s (%s: %s); training continues, and every record that "
                         "cannot be written is counted and told at the end.", self.logger_name,
                         self.backend.location(), type(error).__name__, str(error)[:300])

    # -- internals ---------------------------------------------------------------------
    def _open(self) -> None:
        """Fix the run's identity without the backend (checkpoints name it at once), then open it."""
        with self._lifecycle_lock:
            if self._is_open:
                return
            resume = self.run_id is not None or self.run_key is not None
            self.run_key = self.run_key or uuid.uuid4().hex
            self.run_id = self.run_id or self.backend.new_run_id()
            self._session_start, self._new_session = self._new_session, False
            boundary = resume and self._session_start
            self._lost = 0
            self._open_run(resume, boundary)
            if self._exit_hook is None:  # one hook per logger
                self._exit_hook = atexit.register(_close_at_exit, weakref.ref(self))
            self._is_open = True
            _OPEN_LOGGERS[id(self)] = self

    def _log_config(self, args: Any, model: Any) -> None:
        trainer = self._trainer_ref() if self._trainer_ref is not None else None
        if model is None and trainer is not None:
            model = getattr(trainer, "model", None)
        params = collect_config(args, model)
        limit = self.max_param_length
        for key, value in params.items():
            if limit is not None and len(value) > limit:
                self.warn(("long-param", key), "%s: param %r is longer than %d characters; cut.",
                          self.logger_name, key, limit)
                params[key] = truncate(value, limit)
        if params:
            self._write_config(params)
            self._params_logged = True

    def _check_neighbours(self, state: Any, args: Any = None) -> None:
        """Refuse a second logger with this state key; warn when transformers' twin callback runs too."""
        trainer = self._trainer_ref() if self._trainer_ref is not None else None
        callbacks = getattr(getattr(trainer, "callback_handler", None), "callbacks", None) or ()
        conflict = (f"so they would share one checkpoint entry and a resumed run would attach to the "
                    f"other's run. Use one {self.logger_name} per trainer.")
        twins = [other for other in callbacks if other is not self and isinstance(other, TrackerLogger)
                 and other.state_key == self.state_key]
        if twins:  # before any of them opens a run
            raise ValueError(f"{self.logger_name}: 2 instances share state_key={self.state_key!r}, "
                             f"{conflict}")
        try:
            _CLAIMS.claim(state, self.state_key, self, conflict)
        except ValueError:
            for other in list(_OPEN_LOGGERS.values()):  # the first one opened its run: no stray run
                if other is not self and other.state_key == self.state_key and other.training:
                    other.close(FAILED, timeout=min(other.flush_timeout, 5.0))
            raise
        stock = [other for other in callbacks if self.stock_callback is not None
                 and type(other).__name__ == self.stock_callback
                 and type(other).__module__.startswith("transformers.integrations")]
        if stock or self._stock_in_report_to(args):
            self.warn(("stock-twin",), "%s: transformers' %s (report_to) runs in this trainer too, so the "
                      "same metrics go to the tracker twice (a second run, or a second value per step). "
                      "Set report_to='none', or call hf_callbacks_plus.replace_report_to_callbacks(trainer) "
                      "to swap it for this logger.", self.logger_name, self.stock_callback)

    def _stock_in_report_to(self, args: Any) -> bool:
        """Whether ``args.report_to`` adds transformers' callback for this tracker (``TrainingArguments``
        has made ``"all"`` the list of what is installed)."""
        name = _STOCK_REPORT_TO.get(self.stock_callback or "")
        return name is not None and name in (getattr(args, "report_to", None) or ())

    def _tell_moved_location(self) -> None:
        """On resume, say where the run continues when that is not where this ``output_dir`` puts it."""
        restored, default = self.restored_location, self.default_location()
        if (not restored or default is None or self.explicit_location() is not None
                or os.path.abspath(default) == restored):
            return
        if os.path.exists(restored):
            logger.warning("%s: resuming the run kept in %s (named by the checkpoint); it continues there, "
                           "not in %s. Pass the location explicitly to write elsewhere.", self.logger_name,
                           restored, default)
        else:
            logger.warning("%s: the checkpoint's run is in %s, which does not exist here; this resumed "
                           "training writes to %s, without what was logged before the checkpoint.",
                           self.logger_name, restored, default)

    def _close_earlier_holder(self) -> None:
        """Close the run this logger resumes when another logger of this process still holds it."""
        run_id, run_key = self.run_id, self.run_key
        if run_id is None and run_key is None:
            return
        for other in list(_OPEN_LOGGERS.values()):
            same = (run_id is not None and other.run_id == run_id) or (
                run_key is not None and other.run_key == run_key)
            if other is self or not same or other.state_key != self.state_key:
                continue
            crashed = other.training
            logger.warning("%s: run %s is still open in this process (an earlier %s whose train() %s); "
                           "closing it %s before this train() reopens it.", self.logger_name,
                           run_id or other.run_id or f"with key {run_key}", other.logger_name,
                           "raised" if crashed else "ended", FAILED if crashed else FINISHED)
            if crashed:
                other.close_after_exception()
            else:
                other.close(FINISHED)
