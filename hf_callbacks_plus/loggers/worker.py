"""The background worker of a tracker logger: queue, retry with backoff, spill file, replay.

The training thread only calls `BackgroundWorker.submit` (one ``SimpleQueue.put`` of a
`RawLog` or a record). A daemon thread renders raw logs into records, starts the run on the
`Backend`, then sends records in order, in batches, planning each batch with the
`StepLedger` (resume boundary, repeats) and marking what was delivered. When the backend
fails with a *transient* error, the worker keeps the records in memory (up to
``max_memory_records``), then appends the overflow to a JSONL spill file, and retries with
exponential backoff; when the backend answers again it replays memory, then the file, in
order. Records still unsent when the worker is closed are written to the spill file, which
the next worker writing to the same spill path replays first.

The spill file (`SpillFile`): every spilled record carries the id of the run it belongs to
(``run_id``) and the session that wrote it (``session``), so a later run replays each record
into its own run:

* ``<name>.jsonl``: records of the current worker (and, until the worker partitions it at
  start, records left by earlier ones), read back in order;
* ``<name>.held.jsonl``: records of other runs that the backend cannot write to now (W&B
  writes only to its open run); kept, and replayed by the run they belong to when it is
  resumed. A backend that writes to any run (MLflow) gets them at once.

One warning when the backend becomes unreachable and one when it is back, never one per step.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
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
    LogRecord,
    NameSanitizer,
    ParamsRecord,
    RawLog,
    Record,
    RecordRenderer,
    TagsRecord,
    record_from_json,
    record_to_json,
)

__all__ = ["BackgroundWorker", "SpillFile"]

logger = logging.getLogger("hf_callbacks_plus")


class _Stop:
    """The marker that asks the worker thread to stop."""


_STOP = _Stop()


# -- spill file --------------------------------------------------------------------------
def _read_records(path: Path, name: str) -> list[Record]:
    records: list[Record] = []
    if path.exists():
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                record = _parse(line, name, path)
                if record is not None:
                    records.append(record)
    return records


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


def _dump(record: Record) -> str:
    return json.dumps(record_to_json(record), allow_nan=True) + "\n"


def _write(path: Path, records: list[Record]) -> None:
    if not records:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.writelines(_dump(record) for record in records)
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

    def append(self, records: list[Record]) -> None:
        """Append records at the end of the spill file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.writelines(_dump(record) for record in records)

    def load(self, pending: deque[Record], limit: int, on_corrupt: Callable[[], None]) -> None:
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
                    record = _parse(line, self.name, self.path)
                    if record is None:
                        on_corrupt()
                    else:
                        pending.append(record)
            at_end = not handle.readline()
        if at_end:
            self.path.unlink()
            self.offset = 0

    def rewrite(self, first: list[Record], stamp: Callable[[Record], Record]) -> int:
        """Write ``first`` then the records not loaded yet (stamped) as the new spill file.

        Returns:
            The number of records in the file.
        """
        rest: list[Record] = []
        if self.path.exists():
            with open(self.path, encoding="utf-8") as handle:
                handle.seek(self.offset)
                for line in handle:
                    record = _parse(line, self.name, self.path)
                    if record is not None:
                        rest.append(stamp(record))
        _write(self.path, first + rest)
        self.offset = 0
        return len(first) + len(rest)

    def partition(self, is_own: Callable[[Record], bool]) -> dict[Optional[str], list[Record]]:
        """Keep this run's records in the spill file; return the others grouped by run id, in order.

        Reads the held file first (older), then the spill file. Call it once, before loading.
        """
        others: dict[Optional[str], list[Record]] = {}
        own = []
        for record in _read_records(self.held_path, self.name) + _read_records(self.path, self.name):
            if is_own(record):
                own.append(record)
            else:
                others.setdefault(record.run_id, []).append(record)
        self.held_path.unlink(missing_ok=True)
        _write(self.path, own)
        self.offset = 0
        return others

    def hold(self, records: list[Record]) -> None:
        """Keep records of other runs in the held file (replacing it)."""
        _write(self.held_path, records)


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
        max_memory_records: Records kept in memory while the backend is down. Defaults to 10000.
        batch_size: Most records handed to the backend at once. Defaults to 64.
        backoff_initial: First retry delay in seconds, doubled after each failure. Defaults to 0.5.
        backoff_max: Longest retry delay in seconds. Defaults to 30.

    Raises:
        ValueError: ``max_memory_records`` < 1 or a bad backoff.
    """

    def __init__(
        self,
        backend: Backend,
        ledger: StepLedger,
        spill_path: Path,
        renderer: Optional[RecordRenderer] = None,
        name: Optional[str] = None,
        max_memory_records: int = 10_000,
        batch_size: int = 64,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
    ) -> None:
        if max_memory_records < 1:
            raise ValueError(f"max_memory_records must be >= 1, got {max_memory_records!r}")
        if backoff_initial <= 0 or backoff_max < backoff_initial:
            raise ValueError(
                f"backoff must satisfy 0 < backoff_initial <= backoff_max, got "
                f"backoff_initial={backoff_initial!r}, backoff_max={backoff_max!r}"
            )
        self.name = name or backend.name
        self.backend = backend
        self.ledger = ledger
        self.renderer = renderer
        self.spill_path = Path(spill_path)
        self._spill = SpillFile(self.spill_path, self.name)
        self._sanitize = NameSanitizer(backend.clean_name, backend.max_name_length)
        self._session = ledger.session
        self._max_memory = max_memory_records
        self._batch_size = batch_size
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._pending: deque[Record] = deque()
        self._started = False
        self._deadline: Optional[float] = None  # set by close(): give up retrying after it
        self._condition = threading.Condition()
        self._submitted = 0
        self._settled = 0  # sent, dropped or spilled at close
        self._spilled_total = 0
        self._down_since: Optional[float] = None
        self._warned_permanent: set[str] = set()
        self._isolate = 0
        self._status: Optional[str] = None  # set by close(): the run's final status
        self._finish_ok = True
        self.sent = 0
        self.dropped = 0
        self.failures = 0
        leftover = self._spill.leftover()
        if leftover:
            self._submitted += leftover
            logger.warning("%s: replaying %d record(s) left in %s by a previous run, each into its own run.",
                           self.name, leftover, self.spill_path)
        self._thread = threading.Thread(target=self._run, name=f"hf-callbacks-plus-{self.name}", daemon=True)
        self._thread.start()

    # -- training-thread API -----------------------------------------------------------
    def submit(self, item: RawLog | Record) -> None:
        """Queue a record, or raw ``on_log`` data the worker renders; never blocks, never raises.

        Raw data keeps rendering and normalization off the training thread: the caller only
        copies what it hands over.
        """
        self._submitted += 1
        self._queue.put(item)

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

    def close(self, timeout: float, status: Optional[str] = FINISHED) -> bool:
        """Send what is left (for at most ``timeout`` seconds), finish the run, stop the thread.

        Records still unsent at the deadline are written to the spill file for the next run.

        Args:
            timeout: Seconds to keep trying.
            status: The run's final status (``"FINISHED"``/``"FAILED"``), or None to leave the
                run open. Defaults to "FINISHED".

        Returns:
            True when every record was sent and the run was finished.
        """
        if not self._thread.is_alive():
            return False
        self._status = status
        self._finish_ok = status is None
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
            idle = self._started and not self._pending and not self._spill.exists()
            stopping = self._drain(block=idle and not stopping) or stopping
            if not self._started:
                outcome = self._attempt(self._start_run, None)
                if outcome == "ok":
                    self._started = True
                    backoff = self._backoff_initial
                    self._replay_other_runs()
                    continue
                if outcome == "fatal":
                    break
            else:
                if not self._pending:
                    self._spill.load(self._pending, self._max_memory, lambda: self._settle(1))
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

    def _start_run(self) -> None:
        ledger = self.ledger
        resume = ledger.run_id is not None
        ledger.run_id = self.backend.start(ledger.run_id, resume)
        if not ledger.boundary_ready:  # not when reopened in this session (evaluate() after train())
            ledger.fix_boundary(self.backend.logged_steps(ledger.run_id) if resume else {})

    def _send(self, batch: list[Record]) -> None:
        """Send records in order, skipping steps held before this session."""
        run_id = self.ledger.run_id
        planned = self.ledger.plan(batch, self._sanitize, self.backend.summary_as_curves)
        self._deliver(planned, run_id, self.ledger.delivered)

    def _deliver(self, planned: list[tuple[Record, Optional[LogRecord]]], run_id: str,
                 delivered: Optional[Callable[[LogRecord, LogRecord], None]] = None) -> None:
        """Hand planned records to the backend; consecutive log records go in one call."""
        logs: list[tuple[LogRecord, LogRecord]] = []

        def send_logs() -> None:
            if logs:
                self.backend.log([item for _, item in logs], run_id)
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
                size = self.backend.max_params_per_batch or len(params) or 1
                for index in range(0, len(params), size):
                    self.backend.store_config(dict(params[index:index + size]), run_id)
            elif isinstance(record, TagsRecord):
                self.backend.set_tags(record.tags, run_id)
            elif isinstance(record, ArtifactRecord):
                self.backend.log_artifact(record, run_id)
        send_logs()

    def _send_to_run(self, run_id: Optional[str], records: list[Record]) -> None:
        """Send records an earlier worker left in the spill file to *their* run.

        Steps that run already holds are skipped. Records of a run that never opened (the
        backend was down from its start) get a new run of their own (`Backend.recovery_run`).
        """
        created = run_id is None
        target = self.backend.recovery_run() if run_id is None else run_id
        held = self.backend.logged_steps(target)
        planned = list(plan_batch(records, held, self._sanitize, self.backend.summary_as_curves))
        self._deliver(planned, target)
        if created:
            self.backend.finish(FINISHED, target)

    def _attempt(self, function: Callable[..., None], batch: Optional[list[Record]]) -> str:
        """Run ``function``; return "ok", "transient", "dropped", "isolate" or "fatal"."""
        try:
            function() if batch is None else function(batch)
        except Exception as error:  # the backend must never crash training
            if not self.backend.is_transient(error):
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
            if isinstance(item, RawLog):
                item = self._render(item)
            if item is None:
                pass
            elif isinstance(item, _Stop):
                stop = True
            elif self._spill.exists() or len(self._pending) >= self._max_memory:
                self._append_to_file([item])
            else:
                self._pending.append(item)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
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
        return dataclasses.replace(record, session=self._session, run_id=record.run_id or self.ledger.run_id)

    def _append_to_file(self, records: list[Record]) -> None:
        self._spill.append([self._stamp(record) for record in records])
        self._spilled_total += len(records)

    def _replay_other_runs(self) -> None:
        """Once the run is open: send records of other runs to their run, or hold them."""
        current = self.ledger.run_id

        def is_own(record: Record) -> bool:
            session = record.session  # None: written before run ids were recorded
            return current is None or session is None or session == self._session or record.run_id == current

        held: list[Record] = []
        for run_id, records in self._spill.partition(is_own).items():
            if self.backend.can_write_other_runs:
                try:
                    self._send_to_run(run_id, records)
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
        if held and not self.backend.can_write_other_runs:
            runs = sorted({str(record.run_id) for record in held})
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
                if isinstance(item, RawLog):
                    item = self._render(item)
                if item is not None and not isinstance(item, _Stop):
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
        if self._status is not None and self._started:
            try:
                self.backend.finish(self._status, self.ledger.run_id)
                self._finish_ok = True
            except Exception as error:
                logger.warning("%s: could not close the run: %s", self.name, error)
