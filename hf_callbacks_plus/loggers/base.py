"""``TrackerLogger``: the base callback of every experiment-tracker logger.

What the base class does, once for every backend (W&B, MLflow, JSONL):

* renders every key with the shared `KeyGrammar`
  (curves vs. end-of-training summary), normalizes values (see
  `hf_callbacks_plus.loggers.values`) and sanitizes names per backend;
* hands each record to a `BackgroundWorker`, so
  ``on_log`` returns in microseconds, and backend errors never reach the training loop;
* keeps one step axis (``global_step``): the run id and the last logged step of every metric
  are part of the checkpointed state, so a resumed training continues the same run and does
  not log again the steps the earlier process sent (the *resume boundary*, fixed when the
  training starts); every point produced in the current session is delivered, including a
  second value at one step (``trainer.evaluate()`` after training);
* logs the ``TrainingArguments`` and the model config once, flattened, cut to the backend's
  limits, secrets redacted;
* logs only on the main process (``state.is_world_process_zero`` and ``RANK``, checked at
  call time);
* closes the run FINISHED at ``on_train_end``, FAILED at ``on_exception`` (TrainerPlus,
  LightweightTrainer) and, for a stock ``transformers.Trainer`` which has no exception event,
  FAILED at interpreter exit when ``on_train_end`` never came (an ``atexit`` hook).

A backend subclass implements ``_start``, ``_log_metrics``, ``_log_summary``, ``_log_params``,
``_set_tags``, ``_finish`` (and optionally ``_log_records``, ``_logged_steps``,
``_is_transient``, ``_send_to_run``), and sets the class attributes ``max_param_length``,
``max_params_per_batch`` and ``max_name_length`` and the static method ``clean_name``.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
import uuid
import weakref
from pathlib import Path
from typing import Any, Optional

from ..core.stateful import SelfRestoringState
from ..metrics.keys import KeyGrammar, grammar_for
from .config import collect_config
from .lifecycle import FAILED, FINISHED, LIVE, is_main_process
from .records import make_log_record, plan_batch
from .values import NONFINITE_POLICIES, NameSanitizer, WarnOnce, truncate
from .worker import BackgroundWorker

__all__ = ["FAILED", "FINISHED", "TrackerLogger", "is_main_process"]

logger = logging.getLogger("hf_callbacks_plus")


class TrackerLogger(SelfRestoringState):
    """Base callback for experiment trackers; never blocks and never crashes training.

    Args:
        log_config: Log the ``TrainingArguments`` and the model config once, as params.
            Defaults to True.
        nonfinite: What to do with NaN/+-Inf values: ``"keep"`` logs them (the curve shows
            the divergence), ``"drop"`` drops them with one warning per key. Defaults to "keep".
        flush_timeout: Seconds to wait at train end / exception / exit for the backend to take
            the remaining records; what is still unsent goes to the spill file. Defaults to 30.
        spill_dir: Directory of the spill file. Defaults to ``<output_dir>/.tracker_spill``.
        max_memory_records: Records kept in memory while the backend is unreachable before
            spilling to disk. Defaults to 10000.
        backoff: ``(initial, max)`` retry delays in seconds. Defaults to (0.5, 30.0).
        grammar: The key grammar to render keys with. Defaults to a new ``KeyGrammar()``, which
            learns evaluation prefixes and dataset names from the metrics it sees.

    Raises:
        ValueError: An argument is out of range.
    """

    #: Longest param value the backend accepts (None: no limit).
    max_param_length: Optional[int] = None
    #: Most params per call of ``_log_params`` (None: no limit).
    max_params_per_batch: Optional[int] = None
    #: Longest metric name the backend accepts (None: no limit).
    max_name_length: Optional[int] = None
    #: Send numeric summary values as curve points at the current step (backends without a
    #: run summary, such as MLflow); they are then deduplicated per step like curves.
    summary_as_curves: bool = False
    #: The backend can write to any run (``_send_to_run``): spilled records of an earlier run go
    #: to that run. When False (W&B: only the open run), they are held until that run resumes.
    can_write_other_runs: bool = False

    def __init__(
        self,
        log_config: bool = True,
        nonfinite: str = "keep",
        flush_timeout: float = 30.0,
        spill_dir: Optional[str] = None,
        max_memory_records: int = 10_000,
        backoff: tuple[float, float] = (0.5, 30.0),
        grammar: Optional[KeyGrammar] = None,
    ) -> None:
        super().__init__()
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")
        if not isinstance(flush_timeout, (int, float)) or flush_timeout < 0:
            raise ValueError(f"flush_timeout must be a number >= 0, got {flush_timeout!r}")
        if not isinstance(max_memory_records, int) or max_memory_records < 1:
            raise ValueError(f"max_memory_records must be an int >= 1, got {max_memory_records!r}")
        if len(backoff) != 2 or not 0 < backoff[0] <= backoff[1]:
            raise ValueError(f"backoff must be (initial, max) with 0 < initial <= max, got {backoff!r}")
        self.log_config = log_config
        self.nonfinite = nonfinite
        self.flush_timeout = float(flush_timeout)
        self.spill_dir = spill_dir
        self.max_memory_records = max_memory_records
        self.backoff = (float(backoff[0]), float(backoff[1]))
        self._own_grammar = grammar is not None
        self.grammar = grammar if grammar is not None else KeyGrammar()
        #: The run id (None until the first run started); checkpointed.
        self.run_id: Optional[str] = None
        self.explicit_run_id: Optional[str] = None
        self.training = False
        self._params_logged = False
        self._last_steps: dict[str, int] = {}
        #: The resume boundary: last step per metric the run held before this session.
        self._held: dict[str, int] = {}
        self._replayed: dict[str, int] = {}
        self._last_points: dict[str, tuple[int, float]] = {}
        self._boundary_ready = False
        self._session = uuid.uuid4().hex
        self._steps_lock = threading.Lock()
        self._worker: Optional[BackgroundWorker] = None
        self._trainer_ref: Optional[weakref.ref[Any]] = None
        self._output_dir: Optional[str] = None
        self._warn = WarnOnce()
        self._sanitize = NameSanitizer(self.clean_name, self.max_name_length)
        self._lifecycle_lock = threading.Lock()

    # -- backend interface (override) --------------------------------------------------
    @staticmethod
    def clean_name(name: str) -> str:
        """Turn a rendered metric name into one the backend accepts. Defaults to unchanged."""
        return name

    def _start(self, run_id: Optional[str], resume: bool) -> str:
        """Open (or reattach to, when ``resume``) the run; return its id. Worker thread."""
        raise NotImplementedError

    def _log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Log curve values at ``step``. Worker thread."""
        raise NotImplementedError

    def _log_summary(self, values: dict[str, Any]) -> None:
        """Record run totals (numbers) and text values. Worker thread."""
        raise NotImplementedError

    def _log_params(self, params: dict[str, str]) -> None:
        """Log config params (at most ``max_params_per_batch``). Worker thread."""
        raise NotImplementedError

    def _set_tags(self, tags: dict[str, str]) -> None:
        """Set run tags. Worker thread. Defaults to doing nothing."""

    def _finish(self, status: str) -> None:
        """Close the run with ``"FINISHED"`` or ``"FAILED"``. Worker thread."""
        raise NotImplementedError

    def _log_records(self, records: list[dict[str, Any]]) -> None:
        """Send several log records (``step``, ``timestamp``, ``metrics``, ``summary``) in order.

        Backends that batch (MLflow ``log_batch``) override this; the default calls
        ``_log_metrics`` and ``_log_summary`` per record.
        """
        for record in records:
            if record["metrics"]:
                self._log_metrics(record["metrics"], record["step"])
            if record["summary"]:
                self._log_summary(record["summary"])

    def _send_to_run(self, run_id: Optional[str], records: list[dict[str, Any]]) -> None:
        """Send records left in the spill file by another run to *that* run (``run_id``, or None
        when it never opened). Worker thread. Only called when ``can_write_other_runs``."""
        raise NotImplementedError

    def _logged_steps(self) -> dict[str, int]:
        """Last step already logged per metric in the reattached run (queried on resume)."""
        return {}

    def _is_transient(self, error: BaseException) -> bool:
        """Tell whether a backend error is worth retrying. Defaults to True."""
        return True

    # -- public API --------------------------------------------------------------------
    def attach_trainer(self, trainer: Any) -> None:
        """Give the logger its trainer: eval dataset names (``eval_dataset`` dict) and model.

        Args:
            trainer: A ``transformers.Trainer``, ``TrainerPlus`` or ``LightweightTrainer``.
        """
        self._trainer_ref = weakref.ref(trainer)
        if not self._own_grammar:
            self.grammar = grammar_for(trainer)
        eval_dataset = getattr(trainer, "eval_dataset", None)
        if isinstance(eval_dataset, dict):
            for name in eval_dataset:
                self.grammar.declare_dataset(str(name))

    @property
    def spill_path(self) -> Path:
        """The JSONL file records are spilled to while the backend is unreachable."""
        base = self.spill_dir or (
            os.path.join(self._output_dir, ".tracker_spill") if self._output_dir
            else os.path.join(tempfile.gettempdir(), "hf_callbacks_plus_spill")
        )
        return Path(base) / f"{self.state_key}.jsonl"

    @property
    def worker(self) -> Optional[BackgroundWorker]:
        """The background worker of the open run (None when closed)."""
        return self._worker

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every record so far reached the backend. Returns False on timeout."""
        worker = self._worker
        return True if worker is None else worker.flush(self.flush_timeout if timeout is None else timeout)

    def close(self, status: str = FINISHED, timeout: Optional[float] = None) -> bool:
        """Send what is left, close the run with ``status`` and stop the worker.

        Args:
            status: ``"FINISHED"`` or ``"FAILED"``. Defaults to "FINISHED".
            timeout: Seconds to wait for the backend. Defaults to ``flush_timeout``.

        Returns:
            True when everything was delivered and the run was closed.
        """
        if status not in (FINISHED, FAILED):
            raise ValueError(f"status must be 'FINISHED' or 'FAILED', got {status!r}")
        with self._lifecycle_lock:
            worker, self._worker = self._worker, None
            self.training = False
        if worker is None:
            return True
        LIVE.discard(self)
        return worker.close(self.flush_timeout if timeout is None else timeout,
                            finish=lambda: self._finish(status))

    # -- checkpointed state -----------------------------------------------------------
    def state_attributes(self) -> dict[str, Any]:
        """Run id, last logged step per metric and whether the config was logged.

        Called when a checkpoint is saved: while the backend is reachable it first waits (at
        most ``flush_timeout`` seconds) for the run to be open and the queued records
        to be sent, so the checkpoint holds the run id and exact steps.
        """
        worker = self._worker
        if worker is not None and worker.healthy:
            worker.flush(self.flush_timeout)
        with self._steps_lock:
            last_steps = dict(self._last_steps)
        return {"run_id": self.run_id, "last_steps": last_steps, "params_logged": self._params_logged}

    def load_state_attributes(self, attributes: dict[str, Any]) -> None:
        """Restore the run id and the logged steps from a checkpoint."""
        run_id = attributes.get("run_id")
        if run_id and self.explicit_run_id and run_id != self.explicit_run_id:
            logger.warning("%s: the checkpoint belongs to run %r but run id %r was given; using %r.",
                           type(self).__name__, run_id, self.explicit_run_id, self.explicit_run_id)
            return
        self.run_id = run_id or self.run_id
        with self._steps_lock:
            for key, step in (attributes.get("last_steps") or {}).items():
                self._last_steps[key] = max(int(step), self._last_steps.get(key, -1))
        self._params_logged = bool(attributes.get("params_logged", False))

    # -- events ------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any):
        """Restore the run from the checkpoint, start the worker, queue the config."""
        if not is_main_process(state):
            return
        if self._worker is not None:  # a previous train() that never ended
            self.close(FAILED)
        self.run_id = self.explicit_run_id
        self._params_logged = False
        self._session = uuid.uuid4().hex
        self._boundary_ready = False
        with self._steps_lock:
            self._last_steps, self._held, self._replayed, self._last_points = {}, {}, {}, {}
        super().on_train_begin(args, state, control, **kwargs)
        self._output_dir = getattr(args, "output_dir", None)
        self.training = True
        self._open()
        if self.log_config and not self._params_logged:
            self._queue_config(args, model)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any):
        """Copy ``logs`` and queue them; the worker renders and sends them. Returns at once."""
        if not logs or not is_main_process(state):
            return
        if self._worker is None:  # e.g. trainer.evaluate() after training: reopen the run
            self._output_dir = self._output_dir or getattr(args, "output_dir", None)
            self._open()
        self._worker.submit_raw((dict(logs), state.global_step, int(time.time() * 1000)))

    def _prepare_log(self, payload: tuple[dict[str, Any], int, int]) -> Optional[dict[str, Any]]:
        """Worker thread: turn ``on_log`` data into a record (see `make_log_record`)."""
        logs, step, timestamp_ms = payload
        return make_log_record(logs, step, self.grammar, self.nonfinite, self._warn, type(self).__name__,
                               timestamp_ms)

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any):
        """Learn evaluation prefixes / dataset names from the metrics."""
        if metrics:
            self.grammar.learn_from_metrics(metrics)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any):
        """Flush and close the run FINISHED."""
        if is_main_process(state):
            self.close(FINISHED)

    def on_exception(self, args: Any, state: Any, control: Any, exception: Any = None, **kwargs: Any):
        """Flush and close the run FAILED (TrainerPlus and LightweightTrainer fire this)."""
        if is_main_process(state):
            self.close(FAILED)

    # -- internals ---------------------------------------------------------------------
    def _open(self) -> None:
        with self._lifecycle_lock:
            if self._worker is not None:
                return
            self._worker = BackgroundWorker(
                name=type(self).__name__, start=self._start_in_worker, send=self._send,
                spill_path=self.spill_path, is_transient=self._is_transient,
                max_memory_records=self.max_memory_records,
                backoff_initial=self.backoff[0], backoff_max=self.backoff[1],
                run_id=lambda: self.run_id,
                send_other=self._send_to_run if self.can_write_other_runs else None,
                prepare=self._prepare_log, session=self._session,
            )
            LIVE.add(self)

    def _start_in_worker(self) -> None:
        resume = self.run_id is not None
        self.run_id = self._start(self.run_id, resume)
        if self._boundary_ready:  # reopened in this session (evaluate() after train()): keep it
            return
        logged = self._logged_steps() if resume else {}
        with self._steps_lock:
            for key, step in logged.items():
                self._last_steps[key] = max(int(step), self._last_steps.get(key, -1))
            self._held = dict(self._last_steps)
        self._boundary_ready = True

    def _queue_config(self, args: Any, model: Any) -> None:
        trainer = self._trainer_ref() if self._trainer_ref is not None else None
        if model is None and trainer is not None:
            model = getattr(trainer, "model", None)
        params = collect_config(args, model)
        for key, value in params.items():
            if self.max_param_length is not None and len(value) > self.max_param_length:
                self._warn(("long-param", key), "%s: param %r is longer than %d characters; cut.",
                           type(self).__name__, key, self.max_param_length)
                params[key] = truncate(value, self.max_param_length)
        if params and self._worker is not None:
            self._worker.submit({"kind": "params", "params": params})
            self._params_logged = True

    def _send(self, batch: list[dict[str, Any]]) -> None:
        """Worker thread: send records in order, skipping steps held before this session."""
        with self._steps_lock:
            held = dict(self._held)
        planned = dict(self._last_points)
        for kind, payload in plan_batch(batch, held, self._sanitize, self.summary_as_curves,
                                        self._session, self._replayed, planned):
            if kind == "logs":
                self._log_records(payload)
                with self._steps_lock:  # mark what was delivered, so a retry does not resend it
                    for record in payload:
                        record["source"]["sent"] = True
                        for key, value in record["metrics"].items():
                            self._last_steps[key] = max(record["step"], self._last_steps.get(key, -1))
                            self._last_points[key] = (record["step"], value)
            elif kind == "params":
                self._send_params(payload, self._log_params)
            elif kind == "tags":
                self._set_tags(payload)

    def _send_params(self, params: dict[str, str], log_params: Any) -> None:
        items = list(params.items())
        size = self.max_params_per_batch or len(items) or 1
        for index in range(0, len(items), size):
            log_params(dict(items[index:index + size]))
