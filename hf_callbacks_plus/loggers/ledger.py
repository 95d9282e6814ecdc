"""The resume/dedupe ledger of a tracker logger: which run, which steps it holds, what to skip.

The run's identity is fixed on the training thread when the run is opened (`StepLedger.begin_run`),
never by waiting on the backend: a *run key* made by the client (``uuid4().hex``, kept when
restored from a checkpoint) and, for backends whose run ids the client chooses (W&B, TensorBoard,
JSONL), the run id itself. Every checkpoint holds both, so a resumed training finds its run even
when the first process never heard back from the store (MLflow tags the run with the key and
looks it up by it).

`StepLedger` is one object, shared by the logger (which checkpoints it) and the worker
(which plans every batch with it and marks what was delivered). `plan_batch` is its pure
planning rule.

What is skipped, and only that: a metric point at a step the run already held from a
*previous* session (the resume boundary: the checkpointed / queried last step per metric when
the training started), so a resumed run does not log twice the steps the earlier process
already sent; a point equal to the last one delivered for its metric (same step, same
value: the ``epoch`` of the end-of-training record repeats the last step's); and records
already delivered (``sent``, set after a successful send, so a batch retried after a partial
failure is not sent twice). Every point produced in the current session is delivered,
including a second value at one step (``trainer.evaluate()`` on other data at the step of the
last evaluation): MLflow and JSONL keep both, W&B keeps the first in its history row and puts
the later one in the run summary, with one warning per key.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any, Callable, Optional

from .records import LogRecord, Record

__all__ = ["StepLedger", "plan_batch"]


def plan_batch(batch: list[Record], held: dict[str, int], sanitize: Callable[[str], str],
               summary_as_curves: bool, session: Optional[str] = None,
               replayed: Optional[dict[str, int]] = None,
               last_points: Optional[dict[str, tuple[int, float]]] = None,
               ) -> Iterator[tuple[Record, Optional[LogRecord]]]:
    """What to send for ``batch``, in order: ``(record, planned)`` pairs.

    Args:
        batch: Queued records. A log record whose ``session`` differs from ``session`` was
            produced by an earlier process (replayed from the spill file).
        held: The resume boundary: last step per (sanitized) metric name that the run held
            from previous sessions when this one started. Points at or below it are skipped.
        sanitize: Turns a rendered name into one the backend accepts.
        summary_as_curves: Send numeric summary values as points at the record's step
            (backends without a run summary, such as MLflow).
        session: The current session id. Defaults to None (every record is current).
        replayed: Last step per metric delivered from records of earlier sessions in this
            session (updated here); current points at or below it are skipped too, since the
            earlier process logged those steps. Defaults to a new dict.
        last_points: ``(step, value)`` of the last point per metric; updated as points are
            planned. A point equal to it is not sent again. Defaults to a new dict.

    Yields:
        For a log record with something left to send: ``(record, planned)``, ``planned`` being a
        new `LogRecord` with sanitized names and only the points to send. Other records:
        ``(record, None)``, sent as they are. Log records with nothing left are not yielded.
    """
    replayed = {} if replayed is None else replayed
    last_points = {} if last_points is None else last_points
    for record in batch:
        if not isinstance(record, LogRecord):
            yield record, None
            continue
        if record.sent:
            continue  # delivered before a later part of its batch failed
        step = record.step
        earlier = (record.session or session) != session
        values, summary_in = record.metrics, record.summary
        if summary_as_curves:  # e.g. MLflow: totals are metrics at the last step
            values = {**values, **{k: v for k, v in summary_in.items() if not isinstance(v, str)}}
            summary_in = {k: v for k, v in summary_in.items() if isinstance(v, str)}
        metrics = {}
        # the hot loop of every logger (hundreds of keys per record): bound methods, and the
        # boundary checks only when there is a boundary (a resumed run, replayed records)
        bounded = bool(held) or bool(replayed)
        last_get, held_get, replayed_get = last_points.get, held.get, replayed.get
        for name, value in values.items():
            clean = sanitize(name)
            if bounded:
                limit = held_get(clean, -1)
                if not earlier:
                    limit = max(limit, replayed_get(clean, -1))
                if step <= limit:
                    continue  # the run held this step before this session started
            point = (step, value)
            if last_get(clean) == point:
                continue  # a repeat
            last_points[clean] = point
            if earlier:
                replayed[clean] = max(step, replayed_get(clean, -1))
            metrics[clean] = value
        summary = {sanitize(name): value for name, value in summary_in.items()}
        if metrics or summary:
            yield record, LogRecord(step, record.timestamp, metrics, summary)


class StepLedger:
    """The run a logger writes to and the steps that run holds, per metric.

    Thread-safe: the training thread checkpoints it (`snapshot`), the worker plans with it and
    marks what was delivered.

    Args:
        run_id: The run to write to, when known up front. Defaults to None.
        run_key: The client-made key of the run, when known up front. Defaults to None.
    """

    def __init__(self, run_id: Optional[str] = None, run_key: Optional[str] = None) -> None:
        self._lock = threading.Lock()
        self.run_id: Optional[str] = run_id
        #: The client-made key of the run (``uuid4().hex``): checkpointed, set as a run tag where
        #: the store assigns run ids (MLflow), so a resume finds the run without its id.
        self.run_key: Optional[str] = run_key
        #: The run existed before this open (an id or key given, restored or used earlier in this
        #: session): the backend reattaches to it and the resume boundary is read from it.
        self.resume = run_id is not None
        self.session = uuid.uuid4().hex
        self._last_steps: dict[str, int] = {}
        self._held: dict[str, int] = {}
        self._replayed: dict[str, int] = {}
        self._last_points: dict[str, tuple[int, float]] = {}
        self._newest_step = -1  # the highest step in _last_steps
        #: The resume boundary is fixed (the run was started once in this session).
        self.boundary_ready = False

    def new_session(self, run_id: Optional[str]) -> None:
        """Start a new logging session (``on_train_begin``) writing to ``run_id`` (None: a new run)."""
        with self._lock:
            self.run_id = run_id
            self.run_key = None
            self.resume = run_id is not None
            self.session = uuid.uuid4().hex
            self.boundary_ready = False
            self._last_steps, self._held, self._replayed, self._last_points = {}, {}, {}, {}
            self._newest_step = -1

    def begin_run(self, new_run_id: Callable[[], Optional[str]]) -> None:
        """Fix the run's identity when it is opened, on the training thread, without the backend.

        The run key is kept when known (restored from a checkpoint, or from an earlier open in this
        session), else made now; the run id is kept when known (given, restored, or assigned by
        an earlier open), else ``new_run_id()`` is asked (a backend whose ids the client chooses
        returns one; a store that assigns ids returns None). `resume` tells whether the run
        existed before: an id or a key was known.

        Args:
            new_run_id: Makes the id of a new run, or returns None when the store assigns it.
        """
        with self._lock:
            self.resume = self.run_id is not None or self.run_key is not None
            if self.run_key is None:
                self.run_key = uuid.uuid4().hex
            if self.run_id is None:
                self.run_id = new_run_id()

    def restore(self, last_steps: dict[str, Any]) -> None:
        """Merge last steps per metric saved in a checkpoint."""
        with self._lock:
            for key, step in (last_steps or {}).items():
                self._last_steps[key] = max(int(step), self._last_steps.get(key, -1))
                self._newest_step = max(self._newest_step, int(step))

    def fix_boundary(self, logged: dict[str, int]) -> None:
        """Fix the resume boundary: the checkpointed steps merged with what the run reports."""
        with self._lock:
            for key, step in logged.items():
                self._last_steps[key] = max(int(step), self._last_steps.get(key, -1))
                self._newest_step = max(self._newest_step, int(step))
            self._held = dict(self._last_steps)
            self.boundary_ready = True

    def last_steps(self) -> dict[str, int]:
        """Last delivered (or held) step per metric, for the checkpoint."""
        with self._lock:
            return dict(self._last_steps)

    def plan(self, batch: list[Record], sanitize: Callable[[str], str],
             summary_as_curves: bool) -> list[tuple[Record, Optional[LogRecord]]]:
        """`plan_batch` against this ledger (nothing is marked delivered yet)."""
        with self._lock:
            held = dict(self._held)
            planned_points = dict(self._last_points)
        return list(plan_batch(batch, held, sanitize, summary_as_curves, self.session, self._replayed,
                               planned_points))

    def delivered(self, record: LogRecord, planned: LogRecord) -> None:
        """Mark a planned log record as delivered: not resent by a retry, its steps checkpointed."""
        step = planned.step
        with self._lock:
            record.sent = True
            if step >= self._newest_step:  # in order (the common case): no per-key comparison
                self._newest_step = step
                self._last_steps.update(dict.fromkeys(planned.metrics, step))
            else:
                last_steps = self._last_steps
                for key in planned.metrics:
                    last_steps[key] = max(step, last_steps.get(key, -1))
            self._last_points.update({key: (step, value) for key, value in planned.metrics.items()})
