"""`InlineWriter`: log records written on the training thread, for trackers whose library buffers
local files itself (JSONL, TensorBoard).

A local file has no outage to ride out, so nothing here queues, retries or spills:
`InlineWriter.submit` renders a record with the shared key grammar, plans it with the
`StepLedger` (resume boundary, repeats) and hands it to the backend, which buffers it (the
JSONL file's buffered append; the ``SummaryWriter``'s own queue thread, which writes the event
file). The run starts when the writer is made, on the training thread: a file that cannot be
written is an error raised at the start of ``train()`` (or of the ``evaluate()`` that opens the
run), naming the file, before any work is done. A write that fails later (a full disk) is told
at once, then counted, and the count is told again at close; training goes on.

`flush` writes what the library holds to disk (``Backend.sync``): the logger calls it at every
checkpoint save, so what was logged before a checkpoint survives a crash after it.

The remote stores (MLflow, W&B) go through `BackgroundWorker` instead.
"""

from __future__ import annotations

import logging
from typing import Optional

from .backend import Backend
from .ledger import StepLedger
from .records import NameSanitizer, RawLog, Record, RecordRenderer
from .worker import deliver

__all__ = ["InlineWriter"]

logger = logging.getLogger("hf_callbacks_plus")


class InlineWriter:
    """Writes records to a local-file `Backend` on the caller's thread; same interface as
    `BackgroundWorker` (``submit``, ``flush``, ``close``...).

    Args:
        backend: The tracker (`Backend.writes_locally`).
        ledger: The run id and the steps the run holds; updated as records are written.
        renderer: Turns ``on_log`` data into log records.
        name: Shown in messages.

    Raises:
        OSError: The run cannot start (the file or folder cannot be written); the message names it.
    """

    def __init__(self, backend: Backend, ledger: StepLedger, renderer: RecordRenderer, name: str) -> None:
        self.backend = backend
        self.ledger = ledger
        self.renderer = renderer
        self.name = name
        self._sanitize = NameSanitizer(backend.clean_name, backend.max_name_length)
        #: Records that could not be written (told once at once, and counted at close).
        self.lost = 0
        resume = ledger.resume
        try:
            ledger.run_id = backend.start(ledger.run_id, resume, run_key=ledger.run_key)
        except OSError as error:
            raise OSError(error.errno, f"{name}: cannot write the run to {backend.location()}: "
                          f"{error.strerror or error}. Pass a writable location.") from error
        if not ledger.boundary_ready:  # not when reopened in this session (evaluate() after train())
            ledger.fix_boundary(backend.logged_steps(ledger.run_id) if resume else {})

    # the interface the logger shares with `BackgroundWorker`
    pending = 0
    healthy = True

    def submit(self, item: RawLog | Record) -> None:
        """Render, plan and write one record; never raises (a failure is told and counted)."""
        try:
            record = self.renderer.render(item) if isinstance(item, RawLog) else item
            if record is None:
                return
            planned = self.ledger.plan([record], self._sanitize, self.backend.summary_as_curves)
            deliver(self.backend, planned, self.ledger.run_id, self.ledger.delivered, finish=False)
        except Exception as error:  # a full disk, a bad value: never into the training loop
            self.lost += 1
            if self.lost == 1:
                logger.error("%s: could not write to %s (%s: %s); training continues, and every record "
                             "that cannot be written is counted and told at the end.", self.name,
                             self.backend.location(), type(error).__name__, str(error)[:300])

    def flush(self, timeout: Optional[float] = None) -> bool:
        """Write what the library buffers to disk (``timeout`` is unused: nothing is queued here).

        Returns:
            True when every record so far was written.
        """
        try:
            self.backend.sync()
        except Exception as error:
            logger.warning("%s: could not write %s to disk: %s", self.name, self.backend.location(), error)
            return False
        return self.lost == 0

    def wait_started(self, timeout: float) -> bool:
        """The run started when the writer was made: True."""
        return True

    def close(self, timeout: float, status: Optional[str] = None, grace: float = 0.0) -> bool:
        """Close the run with ``status`` (None leaves it open); tell how many records were lost.

        Returns:
            True when every record was written and the run was closed.
        """
        closed = True
        if status is not None:
            try:
                self.backend.finish(status, self.ledger.run_id)
            except Exception as error:
                closed = False
                logger.error("%s: could not close the run in %s with status %s (%s: %s).", self.name,
                             self.backend.location(), status, type(error).__name__, str(error)[:300])
        if self.lost:
            logger.error("%s: %d record(s) could not be written to %s and are not in the run.", self.name,
                         self.lost, self.backend.location())
        return closed and self.lost == 0

    def __repr__(self) -> str:
        return f"InlineWriter({self.name}, lost={self.lost})"

