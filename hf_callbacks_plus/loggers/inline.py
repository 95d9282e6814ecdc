"""`InlineWriter`: log records handed to the tracker's library on the training thread, for
trackers whose library buffers and writes in the background itself (JSONL, TensorBoard, W&B).

Nothing here queues, retries or spills: the library does what our worker would (the JSONL
file's buffered append; the ``SummaryWriter``'s own queue thread; W&B's service process, which
writes every record to its own run file, ``run-<id>.wandb``, and uploads it, riding out network
outages: ``wandb sync`` uploads what an interrupted process left). `InlineWriter.submit`
renders a record with the shared key grammar, plans it with the `StepLedger` (resume boundary,
repeats) and hands it to the backend.

Opening the run: a local file is opened when the writer is made, on the training thread, so a
file that cannot be written is an error raised at the start of ``train()`` (or of the
``evaluate()`` that opens the run), naming the file, before any work is done. A backend that
opens slowly (`Backend.opens_slowly`: ``wandb.init`` takes seconds) is opened on a thread of
this writer; the records logged meanwhile wait in memory (up to ``max_memory_points`` points)
and go out, in order, with the first record after it opened. Closing waits for the opening and
for the backend's ``finish`` at most ``timeout`` (+ ``grace``) seconds.

A write that fails (a full disk, a run that could not open) is told at once, then counted, and
the count is told again at close, with where the data still is: every logged record is also in
the trainer's ``state.log_history`` (``trainer_state.json`` of each checkpoint). Training goes on.

`flush` writes what the library holds to disk (``Backend.sync``): the logger calls it at every
checkpoint save, so what was logged before a checkpoint survives a crash after it.

MLflow goes through `BackgroundWorker` instead.
"""

from __future__ import annotations

import logging
import threading
from typing import Optional

from .backend import Backend
from .ledger import StepLedger
from .records import NameSanitizer, RawLog, Record, RecordRenderer
from .worker import deliver, points

__all__ = ["InlineWriter"]

logger = logging.getLogger("hf_callbacks_plus")

#: Where every logged record still is when a tracker lost it.
_LOG_HISTORY = "every logged record is also in the trainer's state.log_history (trainer_state.json)"


class InlineWriter:
    """Writes records to a `Backend` that buffers itself, on the caller's thread; same interface as
    `BackgroundWorker` (``submit``, ``flush``, ``close``...).

    Args:
        backend: The tracker (`Backend.buffers_itself`).
        ledger: The run id and the steps the run holds; updated as records are written.
        renderer: Turns ``on_log`` data into log records.
        name: Shown in messages.
        max_memory_points: Metric points kept in memory while a slowly opening run is not open
            yet; later records are counted as lost and told. Defaults to 200000.

    Raises:
        OSError: The run cannot start (the file or folder cannot be written); the message names it.
    """

    def __init__(self, backend: Backend, ledger: StepLedger, renderer: RecordRenderer, name: str,
                 max_memory_points: int = 200_000) -> None:
        self.backend = backend
        self.ledger = ledger
        self.renderer = renderer
        self.name = name
        self._sanitize = NameSanitizer(backend.clean_name, backend.max_name_length)
        self._max_points = max_memory_points
        #: Records that could not be written (told once at once, and counted at close).
        self.lost = 0
        self._waiting: list[Record] = []  # logged before a slowly opening run was open
        self._waiting_points = 0
        self._opened = threading.Event()
        self._start_error: Optional[BaseException] = None
        self._opener: Optional[threading.Thread] = None
        if backend.opens_slowly:
            self._opener = threading.Thread(target=self._open_in_background, daemon=True,
                                            name=f"hf-callbacks-plus-{name}-open")
            self._opener.start()
            return
        try:
            self._open()
        except OSError as error:
            raise OSError(error.errno, f"{name}: cannot write the run to {backend.location()}: "
                          f"{error.strerror or error}. Pass a writable location.") from error

    def _open(self) -> None:
        ledger, backend = self.ledger, self.backend
        resume = ledger.resume
        ledger.run_id = backend.start(ledger.run_id, resume, run_key=ledger.run_key)
        if not ledger.boundary_ready:  # not when reopened in this session (evaluate() after train())
            ledger.fix_boundary(backend.logged_steps(ledger.run_id) if resume else {})
        self._opened.set()

    def _open_in_background(self) -> None:
        try:
            self._open()
        except Exception as error:  # never into the training loop: told, and every record counted
            self._start_error = error
            logger.error("%s: could not open the run (%s: %s); nothing is logged to it in this training, "
                         "and the records are counted and told at the end (%s).", self.name,
                         type(error).__name__, str(error)[:500], _LOG_HISTORY)
            self._opened.set()

    @property
    def pending(self) -> int:
        """Records waiting for a slowly opening run."""
        return len(self._waiting)

    @property
    def healthy(self) -> bool:
        """False when the run could not open."""
        return self._start_error is None

    def submit(self, item: RawLog | Record) -> None:
        """Render, plan and write one record; never raises (a failure is told and counted)."""
        try:
            record = self.renderer.render(item) if isinstance(item, RawLog) else item
        except Exception as error:  # a bad value: never into the training loop
            self._lose(1, error)
            return
        if record is None:
            return
        if not self._opened.is_set():
            self._wait_for_the_run(record)
            return
        self._write_waiting()
        self._write([record])

    def _wait_for_the_run(self, record: Record) -> None:
        size = points(record)
        if self._waiting_points + size > self._max_points:
            self.lost += 1
            if self.lost == 1:
                logger.error("%s: the run is not open yet and %d metric points are waiting for it; "
                             "records that do not fit within max_memory_points=%d are counted as lost until "
                             "it opens (%s).", self.name, self._waiting_points, self._max_points,
                             _LOG_HISTORY)
            return
        self._waiting.append(record)
        self._waiting_points += size

    def _write_waiting(self) -> None:
        if self._waiting:
            waiting, self._waiting, self._waiting_points = self._waiting, [], 0
            self._write(waiting)

    def _write(self, records: list[Record]) -> None:
        if self._start_error is not None:
            self.lost += len(records)
            return
        try:
            planned = self.ledger.plan(records, self._sanitize, self.backend.summary_as_curves)
            deliver(self.backend, planned, self.ledger.run_id, self.ledger.delivered, finish=False)
        except Exception as error:  # a full disk, a closed run: never into the training loop
            self._lose(len(records), error)

    def _lose(self, count: int, error: BaseException) -> None:
        self.lost += count
        if self.lost == count:
            logger.error("%s: could not write to %s (%s: %s); training continues, and every record that "
                         "cannot be written is counted and told at the end.", self.name,
                         self.backend.location(), type(error).__name__, str(error)[:300])

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Write what waits and what the library buffers to disk; waits at most ``timeout`` seconds
        (None: no limit) for a slowly opening run.

        Returns:
            True when every record so far was written.
        """
        if self._opened.wait(timeout):
            self._write_waiting()
        else:
            return False
        try:
            self.backend.sync()
        except Exception as error:
            logger.warning("%s: could not write %s to disk: %s", self.name, self.backend.location(), error)
            return False
        return self.lost == 0

    def wait_started(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until the run is open; False when it is not, or failed."""
        return self._opened.wait(timeout) and self._start_error is None

    def close(self, timeout: float, status: Optional[str] = None, grace: float = 0.0) -> bool:
        """Close the run with ``status`` (None leaves it open) within ``timeout`` + ``grace`` seconds;
        tell how many records were lost.

        Returns:
            True when every record was written and the run was closed.
        """
        closed = self._opened.wait(timeout)
        if not closed:
            self.lost += len(self._waiting)
            logger.error("%s: the run did not open within %.0f s (the close deadline); the %d record(s) "
                         "logged meanwhile are not in it (%s).", self.name, timeout, len(self._waiting),
                         _LOG_HISTORY)
        else:
            self._write_waiting()
            if status is not None and self._start_error is None:
                closed = self._finish(status, timeout + grace)
        if self.lost:
            logger.error("%s: %d record(s) could not be written to %s and are not in the run (%s).",
                         self.name, self.lost, self.backend.location(), _LOG_HISTORY)
        return closed and self.lost == 0

    def _finish(self, status: str, seconds: float) -> bool:
        """``backend.finish``; on a thread of its own, waited for ``seconds``, when the run opens
        slowly (W&B's ``finish`` waits for its service to write and upload the run)."""
        errors: list[BaseException] = []
        where = self.backend.location()  # the run's folder, named before the run lets go of it

        def finish() -> None:
            try:
                self.backend.finish(status, self.ledger.run_id)
            except Exception as error:
                errors.append(error)

        finishing = None
        if self._opener is not None:
            finishing = threading.Thread(target=finish, daemon=True,
                                         name=f"hf-callbacks-plus-{self.name}-finish")
            try:
                finishing.start()
            except RuntimeError:  # interpreter shutdown (Python >= 3.12 refuses new threads there)
                finishing = None
        if finishing is None:
            finish()
        else:
            finishing.join(seconds)
            if finishing.is_alive():
                logger.warning("%s: the run %s is still being finished after %.0f s; its library goes on "
                               "in the background and keeps the run's data in %s.", self.name,
                               self.ledger.run_id, seconds, where)
                return False
        if errors:
            logger.error("%s: could not close the run in %s with status %s (%s: %s).", self.name,
                         where, status, type(errors[0]).__name__, str(errors[0])[:300])
            return False
        return True

    def __repr__(self) -> str:
        return f"InlineWriter({self.name}, lost={self.lost})"
