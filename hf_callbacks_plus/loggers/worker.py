"""The background worker of a tracker logger: queue, retry with backoff, spill file, replay.

The training thread only calls `BackgroundWorker.submit` (one ``SimpleQueue.put`` of a
`RawLog` or a record, after one comparison). A daemon thread renders raw logs into records,
starts the run on the `Backend`, then sends records in order, in batches, planning each batch
with the `StepLedger` (resume boundary, repeats) and marking what was delivered. While the
backend answers, it takes queued items in only while its backlog has room and goes back to
sending (a burst waits in the queue). When the backend fails with a *transient* error, the
worker keeps the records in memory (up to ``max_memory_records`` records and
``max_memory_points`` metric points), then appends the overflow to a JSONL spill file, and
retries with exponential backoff; when the backend answers again it replays memory, then the
file, in order.

The memory bound holds whatever the worker thread is doing: at most ``max_memory_points``
metric points in its backlog and as many again in the queue. Between backend calls the worker
bounds the queue itself (it spills what exceeds it). When a record would take the queue over
its bound while a backend call has been running for more than ``HUNG_CALL_SECONDS`` (a call
that hangs: nobody else would take anything out), `BackgroundWorker.submit` itself moves the
oldest queued items to the end of the spill file until the record fits (rendered, under the
spill lock), with one warning; the worker sends them from there when the backend answers. Order
is kept: memory, then the file, then the queue. (A burst to a backend that answers waits in the
queue, for the worker to pace: the training thread spills nothing then.)

Closing is bounded: `BackgroundWorker.close` gives the worker ``timeout`` seconds, whether the
backend is down or merely slow; what is not delivered by then goes to the spill file, with
one warning saying where it is and how to replay it (``hf-callbacks-plus replay``, or the next
run writing to the same spill path). When the run's final status could not be set, a
`FinishRecord` in the spill file carries it, and the replay sets it.

A record the backend rejects (a permanent error) is isolated: a batch is resent record by
record, a log record is split key by key (halving), so only the rejected key is dropped, with
one warning. No exception escapes the worker thread; an unwritable spill directory falls back
to a temporary one, with one warning.

The spill file is `SpillFile` (`hf_callbacks_plus.loggers.spill`): each spilled record
carries its run id, so a later run replays it into its own run.

One warning when the backend becomes unreachable and one when it is back, never one per step.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Optional

from .backend import FINISHED, Backend
from .ledger import StepLedger, plan_batch
from .records import (
    ArtifactRecord,
    FinishRecord,
    LogRecord,
    NameSanitizer,
    ParamsRecord,
    RawLog,
    Record,
    RecordRenderer,
    TagsRecord,
)
from .spill import SpillFile, replay_hint

__all__ = ["HUNG_CALL_SECONDS", "BackgroundWorker", "deliver", "send_to_run"]

logger = logging.getLogger("hf_callbacks_plus")


class _Stop:
    """The marker that asks the worker thread to stop."""


_STOP = _Stop()


#: A backend call running longer than this is hung for `BackgroundWorker.submit`, which then
#: bounds the queue itself (the worker bounds it between calls).
HUNG_CALL_SECONDS = 0.5

#: Rejected keys listed one by one per error type, before one summary error.
_REJECTIONS_TOLD = 5


def points(record: Record) -> int:
    """Metric points and summary values a record holds (1 for other records)."""
    if isinstance(record, LogRecord):
        return max(1, len(record.metrics) + len(record.summary))
    return 1


# -- delivery ----------------------------------------------------------------------------
def deliver(backend: Backend, planned: list[tuple[Record, Optional[LogRecord]]], run_id: str,
            delivered: Optional[Callable[[LogRecord, LogRecord], None]] = None,
            finish: bool = True) -> None:
    """Hand planned records (see `plan_batch`) to the backend; consecutive log records go in one call.

    Args:
        backend: Where to send.
        planned: ``(record, planned log record or None)`` pairs.
        run_id: The run to write to.
        delivered: Called for each log record once the backend took it. Defaults to None.
        finish: Apply `FinishRecord` statuses (replaying another run); the open run's own
            status is set when its worker closes. Defaults to True.
    """
    logs: list[tuple[LogRecord, LogRecord]] = []

    def send_logs() -> None:
        if logs:
            backend.log([item for _, item in logs], run_id)
            if delivered is not None:
                for record, item in logs:
                    delivered(record, item)
            logs.clear()

    for record, item in planned:
        if item is not None:
            logs.append((record, item))  # type: ignore[arg-type]
            continue
        send_logs()
        if isinstance(record, ParamsRecord):
            params = list(record.params.items())
            size = backend.max_params_per_batch or len(params) or 1
            for index in range(0, len(params), size):
                backend.store_config(dict(params[index:index + size]), run_id)
        elif isinstance(record, TagsRecord):
            backend.set_tags(record.tags, run_id)
        elif isinstance(record, ArtifactRecord):
            backend.log_artifact(record, run_id)
        elif isinstance(record, FinishRecord) and finish:
            backend.finish(record.status, run_id)
    send_logs()


def send_to_run(backend: Backend, sanitize: Callable[[str], str], run_id: Optional[str],
                records: list[Record]) -> str:
    """Send records an earlier session left in a spill file to *their* run; return its id.

    Steps that run already holds are skipped (so sending twice sends nothing new), and its
    final status is set when the records carry one. Records of a run that never opened (the
    backend was down from its start) go to the run their run key names, found or created
    (`Backend.recovery_run`), or to a new run of their own without a key, closed FINISHED unless
    a status was recorded.
    """
    run_key = next((record.run_key for record in records if record.run_key), None)
    target = backend.recovery_run(run_key) if run_id is None else run_id
    held = backend.logged_steps(target)
    planned = list(plan_batch(records, held, sanitize, backend.summary_as_curves))
    deliver(backend, planned, target)
    if run_id is None and not any(isinstance(record, FinishRecord) for record in records):
        backend.finish(FINISHED, target)
    return target


# -- worker ------------------------------------------------------------------------------
class BackgroundWorker:
    """Sends records to a `Backend` from a daemon thread.

    Args:
        backend: The tracking service; only this worker's thread calls it.
        ledger: The run id and the steps the run holds; updated as records are delivered.
        spill_path: JSONL file for records that do not fit in memory or are unsent at close.
        renderer: Turns submitted `RawLog` data into log records. Defaults to None (only
            records are submitted).
        name: Shown in warnings and in the thread name. Defaults to the backend's name.
        max_memory_records: Records kept in memory before spilling to disk. Defaults to 10000.
        max_memory_points: Metric points kept in memory before spilling to disk (bounds the
            memory of heavy records: 500 metrics per step), and, as many again, waiting in the
            queue: at most ``2 * max_memory_points`` points are held at once, even while a
            backend call hangs (the training thread then spills what the queue cannot hold; a
            single record larger than the bound is spilled alone). Defaults to 200000.
        batch_size: Most records handed to the backend at once. Defaults to 64.
        backoff_initial: First retry delay in seconds, doubled after each failure. Defaults to 0.5.
        backoff_max: Longest retry delay in seconds. Defaults to 30.
        target: What the records are for (``Backend.target()``), saved beside the spill file
            for ``hf-callbacks-plus replay``. Defaults to None.

    Raises:
        ValueError: ``max_memory_records`` or ``max_memory_points`` < 1, or a bad backoff.
    """

    def __init__(
        self,
        backend: Backend,
        ledger: StepLedger,
        spill_path: Path,
        renderer: Optional[RecordRenderer] = None,
        name: Optional[str] = None,
        max_memory_records: int = 10_000,
        max_memory_points: int = 200_000,
        batch_size: int = 64,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        target: Optional[dict[str, Any]] = None,
    ) -> None:
        if max_memory_records < 1 or max_memory_points < 1:
            raise ValueError(f"max_memory_records and max_memory_points must be >= 1, got "
                             f"{max_memory_records!r} and {max_memory_points!r}")
        if backoff_initial <= 0 or backoff_max < backoff_initial:
            raise ValueError(
                f"backoff must satisfy 0 < backoff_initial <= backoff_max, got "
                f"backoff_initial={backoff_initial!r}, backoff_max={backoff_max!r}"
            )
        self.name = name or backend.name
        self.backend = backend
        self.ledger = ledger
        self.renderer = renderer
        self._spill = SpillFile(Path(spill_path), self.name, target)
        self._sanitize = NameSanitizer(backend.clean_name, backend.max_name_length)
        self._session = ledger.session
        self._max_memory = max_memory_records
        self._max_points = max_memory_points
        self._batch_size = batch_size
        self._last_send = 0.0  # when the last batch went out (monotonic)
        self._flushes = 0  # flush() calls waiting: no lingering meanwhile
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._pending: deque[Record] = deque()
        self._pending_points = 0
        # points put in the queue (training thread) and taken out (worker): each counter has one
        # writer, so their difference is the queue's backlog without a lock
        self._queued_in = 0
        self._queued_out = 0
        self._started = threading.Event()
        self._failed = False  # the run could not start: records go to the spill file
        self._deadline: Optional[float] = None  # set by close(): give up after it
        self._condition = threading.Condition()
        # Held by whoever moves items out of the queue (the worker, or `submit` when the queue is
        # over its bound) until they are placed, and by every spill file access: items are
        # placed in the order they were submitted. Reentrant: `_drain` appends while holding it.
        self._spill_lock = threading.RLock()
        self._waiting = False  # the worker waits for the queue outside the lock (see `_drain`)
        self._call_started: Optional[float] = None  # when the backend call in progress began
        self._warned_overflow = False
        self._abandoned = False
        self._shut_down = False
        self._submitted = 0  # written by the training thread only (`submit`); read by both
        self._split_extra = 0  # records added by splitting rejected ones: the worker's own count
        self._settled = 0  # sent, dropped or spilled
        self._spilled_total = 0
        self._down_since: Optional[float] = None
        self._warned_permanent: set[tuple[str, str]] = set()
        self._isolate = 0
        self._status: Optional[str] = None  # set by close(): the run's final status
        self._finish_ok = True
        self.sent = 0
        self.dropped = 0
        self.failures = 0
        #: Most metric points held in memory at once (the backlog's peak).
        self.peak_points = 0
        #: Most metric points seen waiting in the queue (between ``on_log`` and the worker).
        self.peak_queued_points = 0
        #: Records the training thread spilled itself because the queue was over its bound.
        self.spilled_by_submit = 0
        leftover = self._spill.leftover()
        if leftover:
            self._submitted += leftover
            logger.warning("%s: replaying %d record(s) left in %s by a previous run, each into its own run.",
                           self.name, leftover, self._spill.path)
        self._thread = threading.Thread(target=self._run, name=f"hf-callbacks-plus-{self.name}", daemon=True)
        self._thread.start()

    # -- training-thread API -----------------------------------------------------------
    def submit(self, item: RawLog | Record) -> None:
        """Queue a record, or raw ``on_log`` data the worker renders; never waits for the
        backend, never raises.

        Raw data keeps rendering and normalization off the training thread: the caller only
        copies what it hands over. When the item would take the queue over
        ``max_memory_points`` while the worker is stuck in a backend call (running for more
        than ``HUNG_CALL_SECONDS``), the oldest queued items are rendered and appended to the
        spill file here until it fits, in order, so memory stays bounded; the worker sends them
        when the backend answers.
        """
        self._submitted += 1
        size = len(item.logs) if isinstance(item, RawLog) else points(item)
        if self._queued_in - self._queued_out + size > self._max_points and self._stuck_in_call():
            self._spill_from_submit(item, size)
            return
        self._queued_in += size
        self._queue.put(item)

    def _stuck_in_call(self) -> bool:
        """A backend call has been running for more than ``HUNG_CALL_SECONDS``."""
        started = self._call_started
        return started is not None and time.monotonic() - started > HUNG_CALL_SECONDS

    def _spill_from_submit(self, item: RawLog | Record, size: int) -> None:
        """Training thread, queue over its bound: the oldest queued items go to the spill file
        until ``item`` fits in the queue (``item`` itself too when the queue is empty).

        The order stays memory, file, queue: the items moved are the queue's head and the file
        comes before the queue. Queued items are taken under the spill lock, which the worker
        holds from taking an item to placing it. When the worker is waiting for the queue (it
        takes the item at once) or closing, the item is simply queued.
        """
        with self._spill_lock:
            if self._waiting or self._deadline is not None or self._abandoned or self._shut_down:
                self._queued_in += size
                self._queue.put(item)
                return
            self.peak_queued_points = max(self.peak_queued_points, self._queued_in - self._queued_out)
            taken = 0
            moved: list[RawLog | Record] = []
            try:
                while self._queued_in - taken - self._queued_out + size > self._max_points:
                    queued = self._queue.get_nowait()
                    if isinstance(queued, _Stop):  # not expected before close(): put it back, stop
                        self._queue.put(queued)
                        break
                    taken += len(queued.logs) if isinstance(queued, RawLog) else points(queued)
                    moved.append(queued)
            except queue.Empty:  # the queue is empty and ``item`` alone is over the bound
                moved.append(item)
                item = None
            self._queued_in -= taken  # this thread is the one writer of _queued_in
            records = []
            for entry in moved:
                record = self._render(entry) if isinstance(entry, RawLog) else entry
                if record is not None:
                    records.append(record)
            if records:
                try:
                    self._append_to_file(records)
                    self.spilled_by_submit += len(records)
                except Exception as error:  # never raise into the training loop
                    logger.error("%s: could not write %d record(s) to the spill file %s (%s: %s); they "
                                 "are dropped.", self.name, len(records), self._spill.path,
                                 type(error).__name__, str(error)[:300])
                    self.dropped += len(records)
                    self._settle(len(records))
            if item is not None:
                self._queued_in += size
                self._queue.put(item)
            if not self._warned_overflow:
                self._warned_overflow = True
                started = self._call_started
                running = ("" if started is None else
                           f" (a call has been running for {time.monotonic() - started:.1f} s)")
                logger.warning(
                    "%s: the backend is slow or unreachable%s and the queue reached its bound of %d metric "
                    "points; records are spilled to %s and sent in order when it answers.",
                    self.name, running, self._max_points, self._spill.path,
                )

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every record submitted so far is sent (or dropped, or spilled).

        Args:
            timeout: Longest wait in seconds; None waits forever. Defaults to None.

        Returns:
            True when everything was settled, False on timeout.
        """
        target = self._submitted
        end = None if timeout is None else time.monotonic() + timeout
        self._flushes += 1
        try:
            with self._condition:
                while self._settled < target + self._split_extra and self._thread.is_alive():
                    remaining = None if end is None else end - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._condition.wait(remaining if remaining is None else min(remaining, 0.5))
        finally:
            self._flushes -= 1
        return self._settled >= target + self._split_extra

    def wait_started(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until the run is open; stop waiting as soon as the
        backend is unreachable or the run cannot start. Never waits on the backlog."""
        end = time.monotonic() + timeout
        while not self._started.wait(0.05):
            if not self.healthy or not self._thread.is_alive() or time.monotonic() >= end:
                return False
        return True

    @property
    def queued_points(self) -> int:
        """Metric points waiting in the queue now (read without locking)."""
        return max(0, self._queued_in - self._queued_out)

    @property
    def held_points(self) -> int:
        """Metric points in the worker's backlog (memory) now (read without locking)."""
        return self._pending_points

    @property
    def pending(self) -> int:
        """Records submitted and not yet sent, dropped or spilled (read without locking)."""
        return max(0, self._submitted + self._split_extra - self._settled)

    def close(self, timeout: float, status: Optional[str] = FINISHED, grace: float = 5.0) -> bool:
        """Send what is left for at most ``timeout`` seconds, finish the run, stop the thread.

        The deadline holds whether the backend is down or slow: records still unsent then are
        written to the spill file, with one warning saying how to replay them. When the
        worker is stuck in a backend call ``grace`` seconds past the deadline, this thread
        writes what it still holds to the spill file itself.

        Args:
            timeout: Seconds to keep sending.
            status: The run's final status (``"FINISHED"``/``"FAILED"``), or None to leave the
                run open. Defaults to "FINISHED".
            grace: Extra seconds for a backend call in flight at the deadline. Defaults to 5.

        Returns:
            True when every record was sent and the run was finished.
        """
        if not self._thread.is_alive():
            return False
        self._status = status
        self._finish_ok = status is None
        self._deadline = time.monotonic() + max(0.0, timeout)
        self._queue.put(_STOP)
        self._thread.join(max(0.0, timeout) + grace)
        if self._thread.is_alive():
            self._abandon()
            return False
        return self._finish_ok and not self._spill.exists()

    @property
    def healthy(self) -> bool:
        """False while the backend is unreachable, or when the run could not start."""
        return self._down_since is None and not self._failed

    @property
    def spilled(self) -> int:
        """Records written to the spill file so far."""
        return self._spilled_total

    @property
    def spill_path(self) -> Path:
        """The spill file (it moves to a temporary directory when its own is not writable)."""
        return self._spill.path

    # -- worker thread -----------------------------------------------------------------
    def _settle(self, count: int) -> None:
        with self._condition:
            self._settled += count
            self._condition.notify_all()

    def _expired(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # never let an exception escape the worker thread
            logger.exception("%s: the logging worker hit an unexpected error; what it holds is spilled.",
                             self.name)
        if not self._abandoned:
            try:
                self._shutdown()
            except Exception:
                logger.exception("%s: could not write the spill file.", self.name)

    def _loop(self) -> None:
        stopping = False
        backoff = self._backoff_initial
        while not self._abandoned:
            if self._failed:  # the run cannot start: keep what comes in the spill file
                stopping = self._drain(block=not stopping) or stopping
                if self._pending:
                    self._spill_pending()
                if stopping:
                    return
                continue
            started = self._started.is_set()
            idle = started and not self._pending and not self._spill.exists()
            stopping = self._drain(block=idle and not stopping) or stopping
            if not started:
                outcome = self._attempt(self._start_run, None)
                if outcome == "ok":
                    self._started.set()
                    backoff = self._backoff_initial
                    self._replay_other_runs()
                    continue
                if outcome == "fatal":
                    self._failed = True
                    continue
            else:
                if not self._pending:
                    self._load_from_file()
                if not self._pending:
                    if stopping:
                        return
                    continue
                if stopping and self._expired():
                    return  # the deadline holds for a slow backend too: the rest is spilled
                linger = self._linger_left(stopping)
                if linger > 0:  # gather more records into this call (a store paying per call); in
                    # slices, so a flush() or close() is seen within 0.1 s
                    stopping = self._drain(block=True, timeout=min(linger, 0.1)) or stopping
                    continue
                outcome = self._send_next()
                if outcome in ("ok", "dropped", "isolate"):
                    backoff = self._backoff_initial
                    continue
            # the backend is down: wait (moving incoming records to memory/spill), then retry
            if stopping and self._expired():
                return
            wait_until = time.monotonic() + backoff
            if self._deadline is not None:
                wait_until = min(wait_until, self._deadline)
            while time.monotonic() < wait_until and not self._abandoned:
                remaining = max(0.0, wait_until - time.monotonic())
                stopping = self._drain(block=True, timeout=remaining) or stopping
            backoff = min(backoff * 2, self._backoff_max)

    def _linger_left(self, stopping: bool) -> float:
        """Seconds to wait before sending what is pending (`Backend.send_interval`): none when
        closing, flushing, retrying kept records, or when a full batch is ready."""
        interval = self.backend.send_interval
        if interval <= 0 or stopping or self._flushes or self._isolate or self._down_since is not None:
            return 0.0
        if len(self._pending) >= self._batch_size or self._spill.exists():
            return 0.0
        limit = self.backend.max_metrics_per_batch
        if limit is not None and self._pending_points >= limit:
            return 0.0
        return max(0.0, self._last_send + interval - time.monotonic())

    def _send_next(self) -> str:
        size = 1 if self._isolate > 0 else self._batch_size
        limit = self.backend.max_metrics_per_batch or float("inf")
        batch: list[Record] = []
        total = 0
        for record in self._pending:  # up to the backend's limit per call: one call per batch
            if batch and (len(batch) >= size or total + points(record) > limit):
                break
            batch.append(record)
            total += points(record)
        outcome = self._attempt(self._send, batch)
        self._last_send = time.monotonic()
        if self._abandoned:
            return outcome
        if outcome in ("ok", "dropped"):
            for record in batch:
                self._pending.popleft()
                self._pending_points -= points(record)
            if outcome == "ok":
                self.sent += len(batch)
            self._isolate = max(0, self._isolate - len(batch))
            self._settle(len(batch))
        elif outcome == "isolate":
            if len(batch) > 1:
                self._isolate = len(batch)
            else:  # one log record rejected: split it, so only the rejected key is dropped
                record = self._pending.popleft()
                halves = _split(record)
                for half in reversed(halves):
                    self._pending.appendleft(half)
                with self._condition:  # never `_submitted`: the training thread writes it meanwhile
                    self._split_extra += len(halves) - 1
                self._isolate = max(self._isolate - 1, 0) + len(halves)
        return outcome

    def _start_run(self) -> None:
        ledger = self.ledger
        # the identity was fixed on the training thread (`StepLedger.begin_run`): a run id made by
        # the client for a new run is no resume
        resume = ledger.resume
        ledger.run_id = self.backend.start(ledger.run_id, resume, run_key=ledger.run_key)
        if not ledger.boundary_ready:  # not when reopened in this session (evaluate() after train())
            ledger.fix_boundary(self.backend.logged_steps(ledger.run_id) if resume else {})

    def _send(self, batch: list[Record]) -> None:
        """Send records in order, skipping steps held before this session."""
        run_id = self.ledger.run_id
        planned = self.ledger.plan(batch, self._sanitize, self.backend.summary_as_curves)
        deliver(self.backend, planned, run_id, self.ledger.delivered, finish=False)

    def _attempt(self, function: Callable[..., None], batch: Optional[list[Record]]) -> str:
        """Run ``function``; return "ok", "transient", "dropped", "isolate" or "fatal"."""
        self._call_started = time.monotonic()
        try:
            function() if batch is None else function(batch)
        except Exception as error:  # the backend must never crash training
            self._call_started = None
            if not self.backend.is_transient(error):
                if batch is None:
                    logger.error("%s: could not start the run (%s: %s). Nothing will be sent to the backend; "
                                 "the records are kept in %s.", self.name, type(error).__name__,
                                 str(error)[:500], self._spill.path)
                    return "fatal"
                if len(batch) > 1 or _splittable(batch[0]):
                    return "isolate"  # resend one by one (and key by key) to find what was rejected
                key = type(error).__name__
                what = _describe(batch[0])
                if (key, _key_of(batch[0])) not in self._warned_permanent:
                    self._warned_permanent.add((key, _key_of(batch[0])))
                    rejected = sum(1 for seen, _ in self._warned_permanent if seen == key)
                    if rejected <= _REJECTIONS_TOLD:
                        logger.warning("%s: the backend rejected %s, which is dropped; other keys and "
                                       "records are still sent (%s: %s).", self.name, what, key,
                                       str(error)[:300])
                    if rejected == _REJECTIONS_TOLD:
                        logger.error("%s: the backend has rejected %d different keys with %s; further "
                                     "rejections of this kind are dropped without being listed. If the "
                                     "keys look right, this looks like a fault of the logger or the "
                                     "backend: please report it with this message (%s).", self.name,
                                     rejected, key, str(error)[:300])
                self.dropped += 1
                return "dropped"
            self.failures += 1
            if self._down_since is None:
                self._down_since = time.monotonic()
                logger.warning(
                    "%s: the backend is unreachable (%s: %s). Training continues; records are kept "
                    "in memory (up to %d), then spilled to %s, and replayed in order when it is back.",
                    self.name, type(error).__name__, str(error)[:300], self._max_memory, self._spill.path,
                )
            return "transient"
        self._call_started = None
        if self._down_since is not None:
            logger.warning(
                "%s: the backend is reachable again after %.1f s; replaying kept records in order.",
                self.name, time.monotonic() - self._down_since,
            )
            self._down_since = None
        return "ok"

    def _has_room(self, extra: int = 1) -> bool:
        return len(self._pending) < self._max_memory and self._pending_points + extra <= self._max_points

    def _queue_over_bound(self) -> bool:
        """The queue holds more than ``max_memory_points`` points: the overflow goes to the spill file."""
        return self._queued_in - self._queued_out > self._max_points

    def _intake_open(self, spilling: bool) -> bool:
        """Whether to take the next queued item now.

        While the backend answers, the queue is the cheapest place for what the backlog has no
        room for: intake stops when memory is full (or the spill file, which comes first in
        order, is not read yet), so the worker goes back to sending instead of rendering and
        spilling a whole burst; the queue is bounded by spilling what exceeds
        ``max_memory_points`` in it. While the backend is down, everything is taken (memory,
        then the spill file), so that what outlasts the outage is on disk, not in the queue.
        """
        if not self.healthy or self._queue_over_bound():
            return True
        if spilling or self._spill.exists():
            return False
        return self._has_room() or not self._pending

    def _drain(self, block: bool, timeout: Optional[float] = None) -> bool:
        """Move queued records to memory or the spill file (appended in one write).

        Takes items while `_intake_open` says so. ``block`` waits (at most ``timeout``) for the
        first item when intake is open; when it is closed the call waits at most 50 ms (a
        caller waiting out a backoff does not spin).

        Items are taken and placed under the spill lock, so `submit` spilling an over-full queue
        never interleaves with this (the wait for the first item is outside the lock, flagged
        by ``_waiting``: `submit` then queues instead of spilling).

        Returns True when asked to stop, or when closing and past the deadline (what is still
        queued is then left for `_shutdown`).
        """
        item: Any = None  # an item taken from the queue, not placed yet
        if block:
            closing = self._deadline is not None and self._expired()
            if not closing and not self._intake_open(False):
                time.sleep(0.05 if timeout is None else min(timeout, 0.05))
                return False
            with self._spill_lock:
                self._waiting = True
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                with self._spill_lock:
                    self._waiting = False
                return False
        stop = False
        to_file: list[Record] = []
        with self._spill_lock:
            self._waiting = False
            self.peak_queued_points = max(self.peak_queued_points, self._queued_in - self._queued_out)
            while True:
                closing = self._deadline is not None and self._expired()
                if item is None:
                    if not closing and not self._intake_open(bool(to_file)):
                        break
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                if isinstance(item, RawLog):
                    self._queued_out += len(item.logs)
                    item = self._render(item)
                elif not isinstance(item, _Stop):
                    self._queued_out += points(item)
                if item is None:
                    pass
                elif isinstance(item, _Stop):
                    stop = True
                elif (to_file or self._spill.exists()
                      or not (self._has_room(points(item)) or not self._pending)):
                    to_file.append(item)
                    if len(to_file) >= 256:
                        self._append_to_file(to_file)
                        to_file = []
                else:
                    self._pending.append(item)
                    self._pending_points += points(item)
                    self.peak_points = max(self.peak_points, self._pending_points)
                item = None
                if closing:
                    stop = True  # closing: the rest of the queue goes straight to the spill file
                    break
            if to_file:
                self._append_to_file(to_file)
        return stop

    def _render(self, raw: RawLog) -> Optional[LogRecord]:
        """A log record from ``on_log`` data; None (and settled) when nothing is left."""
        record = None
        if self.renderer is not None:
            try:
                record = self.renderer.render(raw)
            except Exception:  # a bad value must never kill the worker
                logger.exception("%s: could not prepare a log record; it is dropped.", self.name)
        if record is None:
            self._settle(1)
        return record

    # -- spill file --------------------------------------------------------------------
    def _stamp(self, record: Record) -> Record:
        """The record with the run it belongs to (this worker's records without an id get it)."""
        if record.session not in (None, self._session):
            return record
        return dataclasses.replace(record, session=self._session, run_id=record.run_id or self.ledger.run_id,
                                   run_key=record.run_key or self.ledger.run_key)

    def _append_to_file(self, records: list[Record]) -> None:
        with self._spill_lock:  # after an abandon too: never lose what this thread holds
            self._spill.append([self._stamp(record) for record in records])
            self._spilled_total += len(records)
        if self._failed:  # nothing will load them back in this process: they are settled there
            self._settle(len(records))

    def _spill_pending(self) -> None:
        """The run cannot start: what is in memory goes to the spill file."""
        records = list(self._pending)
        self._pending.clear()
        self._pending_points = 0
        self._append_to_file(records)

    def _load_from_file(self) -> None:
        with self._spill_lock:
            if self._abandoned:
                return
            moved = self._spill.load(self._pending, lambda: self._has_room() or not self._pending,
                                     lambda: self._settle(1))
        self._pending_points += sum(points(record) for record in moved)

    def _replay_other_runs(self) -> None:
        """Once the run is open: send records of other runs (left by earlier processes) to their run."""
        current, key = self.ledger.run_id, self.ledger.run_key

        def is_own(record: Record) -> bool:
            session = record.session  # None: written before run ids were recorded
            return (current is None or session is None or session == self._session or record.run_id == current
                    or (record.run_id is None and key is not None and record.run_key == key))

        with self._spill_lock:  # `submit` may append to the file meanwhile
            others = self._spill.partition(is_own)
        kept: list[Record] = []
        for run_id, records in others.items():
            try:
                send_to_run(self.backend, self._sanitize, run_id, records)
                self.sent += len(records)
            except Exception as error:  # keep them for a later run or a replay
                kept.extend(records)
                logger.warning("%s: could not replay %d record(s) of run %s (%s: %s); they are kept in %s, "
                               "and %s.", self.name, len(records), run_id, type(error).__name__,
                               str(error)[:300], self._spill.held_path, replay_hint(self._spill.held_path))
            self._settle(len(records))
        with self._spill_lock:
            self._spill.hold(kept)

    def _unsent(self) -> tuple[list[Record], list[Record]]:
        """What this worker still holds: ``(in memory, still queued)``; the spill file sits between."""
        in_memory = list(self._pending)
        self._pending.clear()
        self._pending_points = 0
        queued: list[Record] = []
        try:
            while True:
                item = self._queue.get_nowait()
                if isinstance(item, RawLog):
                    item = self._render(item)
                if item is not None and not isinstance(item, _Stop):
                    queued.append(item)
        except queue.Empty:
            pass
        return in_memory, queued

    def _keep(self, unsent: tuple[list[Record], list[Record]], status_set: bool) -> None:
        """Write what is unsent (and the final status, when not set) to the spill file, in order:
        memory, the file's unread part, the queue; one warning."""
        in_memory, queued = unsent
        keep_status = self._status is not None and not status_set and (
            in_memory or queued or self._spill.exists() or self._failed or not self._started.is_set())
        if not in_memory and not queued and not self._spill.exists() and not keep_status:
            return
        kept = self._spill.rewrite([self._stamp(record) for record in in_memory], self._stamp)
        tail = [self._stamp(record) for record in queued]
        if keep_status:  # after every record of the run: a replay sets it last
            tail.append(self._stamp(FinishRecord(self._status)))
        if tail:
            self._spill.append(tail)
            kept += len(tail)
        unsent = in_memory + queued
        self._spilled_total += len(unsent)
        reason = ("the run could not start" if self._failed else
                  "the backend was unreachable" if self._down_since is not None else
                  "the run did not open within the close deadline" if not self._started.is_set() else
                  "the backend was too slow to take them within the close deadline")
        logger.warning(
            "%s: %d record(s) were not delivered (%s); they are kept in %s. The next run writing to "
            "this spill path replays them, or %s.", self.name, kept, reason, self._spill.path,
            replay_hint(self._spill.path),
        )

    def _shutdown(self) -> None:
        status_set = False
        if self._status is not None and self._started.is_set() and not self._failed:
            try:  # records may be left: the run gets its status now, a replay sends the rest
                self.backend.finish(self._status, self.ledger.run_id)
                status_set = True
            except Exception as error:
                logger.warning("%s: could not set the run's final status %s (%s: %s); it is kept in the "
                               "spill file.", self.name, self._status, type(error).__name__, str(error)[:300])
        with self._spill_lock:
            if not self._abandoned:
                self._keep(self._unsent(), status_set)
            self._shut_down = True
        with self._condition:  # what is left is kept for the next run: nothing to wait for
            self._settled = max(self._settled, self._submitted + self._split_extra)
            self._condition.notify_all()
        self._finish_ok = status_set or self._status is None

    def _abandon(self) -> None:
        """Training thread: the worker is stuck in a backend call past the deadline; keep its records."""
        with self._spill_lock:  # waits for a file write of the worker in progress
            if self._abandoned or self._shut_down or not self._thread.is_alive():
                return
            self._abandoned = True
            unsent = self._unsent()
            self._keep(unsent, status_set=False)
        logger.warning("%s: the backend did not answer within the close deadline; the records it was "
                       "sending are in the spill file too (a replay skips the steps the run already holds).",
                       self.name)


def _splittable(record: Record) -> bool:
    return isinstance(record, LogRecord) and len(record.metrics) + len(record.summary) > 1


def _split(record: Record) -> list[Record]:
    """Two log records with half of the keys each (a rejected record is bisected to its bad key)."""
    if not _splittable(record):
        return [record]
    items = [("m", key, value) for key, value in record.metrics.items()] + [
        ("s", key, value) for key, value in record.summary.items()]
    middle = len(items) // 2
    halves = []
    for part in (items[:middle], items[middle:]):
        halves.append(dataclasses.replace(
            record, metrics={key: value for kind, key, value in part if kind == "m"},
            summary={key: value for kind, key, value in part if kind == "s"}))
    return halves


def _describe(record: Record) -> str:
    if isinstance(record, LogRecord):
        keys = [*record.metrics, *record.summary]
        return f"{keys[0]!r} at step {record.step}" if len(keys) == 1 else f"a record at step {record.step}"
    return f"a {record.kind} record"


def _key_of(record: Record) -> str:
    """What one warning is about: the metric name of a one-key log record, else the record kind."""
    if isinstance(record, LogRecord):
        keys = [*record.metrics, *record.summary]
        if len(keys) == 1:
            return keys[0]
    return record.kind
