"""The background worker every tracker logger uses: queue, retry with backoff, spill, replay.

The training thread only calls `BackgroundWorker.submit` (one ``SimpleQueue.put``).
A daemon thread starts the run, then sends records in order, in batches. When the backend
fails with a *transient* error, the worker keeps the records in memory (up to
``max_memory_records``), then appends the overflow to a JSONL spill file, and retries with
exponential backoff; when the backend answers again it replays memory, then the file, in
order. Records still unsent when the worker is closed are written to the spill file, which
the next run writing to the same spill path replays first. Each spilled record carries its
run id (see `spill`): records of another run go to that run
(``send_other``, e.g. MLflow, which can write to any run) or, for backends that write only
to their open run, stay in the held file, with one warning. One warning when the backend
becomes unreachable and one when it is back, never one per step.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any, Callable, Optional

from .spill import SpillFile

__all__ = ["BackgroundWorker"]

logger = logging.getLogger("hf_callbacks_plus")

_STOP = object()


class BackgroundWorker:
    """Sends JSON-serializable records to a backend from a daemon thread.

    Args:
        name: Shown in warnings and in the thread name.
        start: Called once in the worker thread before any record is sent (opens the run);
            retried like a send when it raises a transient error.
        send: Sends a non-empty list of records, in order; must be idempotent (a batch that
            failed may be sent again).
        spill_path: JSONL file for records that do not fit in memory or are unsent at close.
        is_transient: Tells whether an error is worth retrying. A permanent error drops the
            record(s) it concerns, with one warning per error type. Defaults to "always".
        max_memory_records: Records kept in memory while the backend is down. Defaults to 10000.
        batch_size: Most records handed to ``send`` at once. Defaults to 64.
        backoff_initial: First retry delay in seconds, doubled after each failure. Defaults to 0.5.
        backoff_max: Longest retry delay in seconds. Defaults to 30.
        run_id: Returns the id of the run being logged to (None before it is open); spilled
            records carry it. Defaults to "no id".
        send_other: Sends records left by an earlier worker to *their* run (given its id, or
            None when that run never opened); None when the backend can only write to its
            open run: such records are then held. Defaults to None.
        prepare: Turns ``submit_raw`` data into a record (worker thread). Defaults to None.
        session: Id of the logging session; spilled records carry it, so a later process
            tells its own records from those of earlier ones. Defaults to a new id.
    """

    def __init__(
        self,
        name: str,
        start: Callable[[], None],
        send: Callable[[list[dict[str, Any]]], None],
        spill_path: Path,
        is_transient: Callable[[BaseException], bool] = lambda error: True,
        max_memory_records: int = 10_000,
        batch_size: int = 64,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        run_id: Callable[[], Optional[str]] = lambda: None,
        send_other: Optional[Callable[[Optional[str], list[dict[str, Any]]], None]] = None,
        prepare: Optional[Callable[[tuple[Any, ...]], Optional[dict[str, Any]]]] = None,
        session: Optional[str] = None,
    ) -> None:
        if max_memory_records < 1:
            raise ValueError(f"max_memory_records must be >= 1, got {max_memory_records!r}")
        if backoff_initial <= 0 or backoff_max < backoff_initial:
            raise ValueError(
                f"backoff must satisfy 0 < backoff_initial <= backoff_max, got "
                f"backoff_initial={backoff_initial!r}, backoff_max={backoff_max!r}"
            )
        self.name = name
        self._start = start
        self._send = send
        self._is_transient = is_transient
        self.spill_path = Path(spill_path)
        self._spill = SpillFile(self.spill_path, name)
        self._run_id = run_id
        self._send_other = send_other
        self._prepare = prepare
        self._session = session or uuid.uuid4().hex
        self._max_memory = max_memory_records
        self._batch_size = batch_size
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._pending: deque[dict[str, Any]] = deque()
        self._started = False
        self._deadline: Optional[float] = None  # set by close(): give up retrying after it
        self._condition = threading.Condition()
        self._submitted = 0
        self._settled = 0  # sent, dropped or spilled at close
        self._spilled_total = 0
        self._down_since: Optional[float] = None
        self._warned_permanent: set[str] = set()
        self._isolate = 0
        self._finish: Optional[Callable[[], None]] = None
        self._finish_ok = True
        self.sent = 0
        self.dropped = 0
        self.failures = 0
        leftover = self._spill.leftover()
        if leftover:
            self._submitted += leftover
            logger.warning("%s: replaying %d record(s) left in %s by a previous run, each into its own run.",
                           name, leftover, self.spill_path)
        self._thread = threading.Thread(target=self._run, name=f"hf-callbacks-plus-{name}", daemon=True)
        self._thread.start()

    # -- training-thread API -----------------------------------------------------------
    def submit(self, record: dict[str, Any]) -> None:
        """Queue one record; never blocks and never raises."""
        self._submitted += 1
        self._queue.put(record)

    def submit_raw(self, payload: tuple[Any, ...]) -> None:
        """Queue raw data that the worker turns into a record with ``prepare``.

        Keeps rendering and normalization off the training thread: the caller only copies
        what it hands over. Never blocks and never raises.
        """
        self._submitted += 1
        self._queue.put(payload)

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Wait until every record submitted so far is sent (or dropped).

        Args:
            timeout: Longest wait in seconds; None waits forever. Defaults to None.

        Returns:
            True when everything was sent, False on timeout.
        """
        target = self._submitted
        end = None if timeout is None else time.monotonic() + timeout
        with self._condition:
            while self._settled < target and self._thread.is_alive():
                remaining = None if end is None else end - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._condition.wait(remaining if remaining is None else min(remaining, 0.5))
        return self._settled >= target

    def close(self, timeout: float, finish: Optional[Callable[[], None]] = None) -> bool:
        """Send what is left (for at most ``timeout`` seconds), call ``finish``, stop the thread.

        Records still unsent at the deadline are written to the spill file for the next run.

        Returns:
            True when every record was sent and ``finish`` succeeded.
        """
        if not self._thread.is_alive():
            return False
        self._finish = finish
        self._finish_ok = finish is None
        self._deadline = time.monotonic() + max(0.0, timeout)
        self._queue.put(_STOP)
        self._thread.join(timeout + 5.0)
        return not self._thread.is_alive() and self._finish_ok and not self._spill.exists()

    @property
    def healthy(self) -> bool:
        """False while the backend is unreachable."""
        return self._down_since is None

    @property
    def spilled(self) -> int:
        """Records written to the spill file so far."""
        return self._spilled_total

    # -- worker thread -----------------------------------------------------------------
    def _settle(self, count: int) -> None:
        with self._condition:
            self._settled += count
            self._condition.notify_all()

    def _expired(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _run(self) -> None:
        stopping = False
        backoff = self._backoff_initial
        while True:
            idle = self._started and not self._pending and not self._file_unread()
            stopping = self._drain(block=idle and not stopping) or stopping
            if not self._started:
                outcome = self._attempt(self._start, None)
                if outcome == "ok":
                    self._started = True
                    backoff = self._backoff_initial
                    self._replay_other_runs()
                    continue
                if outcome == "fatal":
                    break
            else:
                if not self._pending:
                    self._load_from_file()
                if not self._pending:
                    if stopping:
                        break
                    continue
                size = 1 if self._isolate > 0 else self._batch_size
                batch = [self._pending[i] for i in range(min(size, len(self._pending)))]
                outcome = self._attempt(self._send, batch)
                if outcome in ("ok", "dropped"):
                    for _ in batch:
                        self._pending.popleft()
                    if outcome == "ok":
                        self.sent += len(batch)
                    else:
                        self.dropped += len(batch)
                    self._isolate = max(0, self._isolate - len(batch))
                    self._settle(len(batch))
                    backoff = self._backoff_initial
                    continue
                if outcome == "isolate":
                    self._isolate = len(batch)
                    continue
            # the backend is down: wait (moving incoming records to memory/spill), then retry
            if stopping and self._expired():
                break
            wait_until = time.monotonic() + backoff
            if self._deadline is not None:
                wait_until = min(wait_until, self._deadline)
            while time.monotonic() < wait_until:
                remaining = max(0.0, wait_until - time.monotonic())
                stopping = self._drain(block=True, timeout=remaining) or stopping
            backoff = min(backoff * 2, self._backoff_max)
        self._shutdown()

    def _attempt(self, function: Callable[..., None], batch: Optional[list[dict[str, Any]]]) -> str:
        """Run ``function``; return "ok", "transient", "dropped", "isolate" or "fatal"."""
        try:
            function() if batch is None else function(batch)
        except Exception as error:  # the backend must never crash training
            if not self._is_transient(error):
                if batch is None:
                    logger.error("%s: could not start the run (%s: %s); nothing will be logged.",
                                 self.name, type(error).__name__, error)
                    return "fatal"
                if len(batch) > 1:
                    return "isolate"  # resend one by one to find the rejected record
                key = type(error).__name__
                if key not in self._warned_permanent:
                    self._warned_permanent.add(key)
                    logger.warning("%s: the backend rejected a record, which is dropped (%s: %s).",
                                   self.name, key, str(error)[:300])
                return "dropped"
            self.failures += 1
            if self._down_since is None:
                self._down_since = time.monotonic()
                logger.warning(
                    "%s: the backend is unreachable (%s: %s). Training continues; records are kept "
                    "in memory (up to %d), then spilled to %s, and replayed in order when it is back.",
                    self.name, type(error).__name__, str(error)[:300], self._max_memory, self.spill_path,
                )
            return "transient"
        if self._down_since is not None:
            logger.warning(
                "%s: the backend is reachable again after %.1f s; replaying kept records in order.",
                self.name, time.monotonic() - self._down_since,
            )
            self._down_since = None
        return "ok"

    def _drain(self, block: bool, timeout: Optional[float] = None) -> bool:
        """Move queued records to memory or the spill file. Returns True when asked to stop."""
        stop = False
        try:
            item = self._queue.get(block=block, timeout=timeout if block else None)
        except queue.Empty:
            return False
        while True:
            if type(item) is tuple:  # raw data from submit_raw(): build the record here
                item = self._prepare_raw(item)
            if item is None:
                pass
            elif item is _STOP:
                stop = True
            elif self._file_unread() or len(self._pending) >= self._max_memory:
                self._append_to_file([item])
            else:
                self._pending.append(item)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return stop

    def _prepare_raw(self, payload: tuple[Any, ...]) -> Optional[dict[str, Any]]:
        """Build a record from ``submit_raw`` data; None (and settled) when nothing is left."""
        record = None
        if self._prepare is not None:
            try:
                record = self._prepare(payload)
            except Exception:  # a bad value must never kill the worker
                logger.exception("%s: could not prepare a log record; it is dropped.", self.name)
        if record is None:
            self._settle(1)
        return record

    # -- spill file --------------------------------------------------------------------
    def _file_unread(self) -> bool:
        return self._spill.exists()

    def _stamp(self, record: dict[str, Any]) -> dict[str, Any]:
        """The record with the run it belongs to (this worker's records without an id get it)."""
        if record.get("session", self._session) != self._session:
            return record
        return {**record, "session": self._session, "run_id": record.get("run_id") or self._run_id()}

    def _append_to_file(self, records: list[dict[str, Any]]) -> None:
        self._spill.append([self._stamp(record) for record in records])
        self._spilled_total += len(records)

    def _load_from_file(self) -> None:
        self._spill.load(self._pending, self._max_memory, lambda: self._settle(1))

    def _replay_other_runs(self) -> None:
        """Once the run is open: send records of other runs to their run, or hold them."""
        current = self._run_id()

        def is_own(record: dict[str, Any]) -> bool:
            session = record.get("session")  # None: written before run ids were recorded
            return current is None or session is None or session == self._session or (
                record.get("run_id") == current)

        held: list[dict[str, Any]] = []
        for run_id, records in self._spill.partition(is_own).items():
            if self._send_other is not None:
                try:
                    self._send_other(run_id, records)
                    self.sent += len(records)
                    self._settle(len(records))
                    continue
                except Exception as error:  # keep them for a later run
                    logger.warning("%s: could not replay %d record(s) of run %s (%s: %s); kept in %s.",
                                   self.name, len(records), run_id, type(error).__name__,
                                   str(error)[:300], self._spill.held_path)
            held.extend(records)
            self._settle(len(records))
        self._spill.hold(held)
        if held and self._send_other is None:
            runs = sorted({str(record.get("run_id")) for record in held})
            logger.warning(
                "%s: %d record(s) in the spill file belong to other run(s) (%s), and this backend can only "
                "write to the open run %s; they are kept in %s and replayed when their run is resumed "
                "(delete the file to discard them).",
                self.name, len(held), ", ".join(runs), current, self._spill.held_path,
            )

    def _shutdown(self) -> None:
        unsent = list(self._pending)
        self._pending.clear()
        try:
            while True:
                item = self._queue.get_nowait()
                if item is not _STOP:
                    unsent.append(item)
        except queue.Empty:
            pass
        if unsent or self._spill.exists():
            kept = self._spill.rewrite([self._stamp(record) for record in unsent], self._stamp)
            self._spilled_total += len(unsent)
            logger.warning(
                "%s: the backend did not come back in time; %d record(s) are kept in %s and will be "
                "replayed by the next run that uses this output directory.",
                self.name, kept, self.spill_path,
            )
        with self._condition:  # what is left is kept for the next run: nothing to wait for
            self._settled = max(self._settled, self._submitted)
            self._condition.notify_all()
        finish = self._finish
        if finish is not None and self._started:
            try:
                finish()
                self._finish_ok = True
            except Exception as error:
                logger.warning("%s: could not close the run: %s", self.name, error)

