"""The journal of a tracker whose client holds records in memory before its files (W&B's service,
TensorBoard's writer thread, trackio's queue): docs/loggers_faults.md#a-checkpoint-holds-every-record.

A checkpoint is complete only when every record up to its step is on disk. These trackers write in the
background: W&B's service keeps 32 KiB blocks in memory, TensorBoard's writer thread a queue, trackio a
queue flushed every half second; a kill loses what they hold. So each record is also appended to a
journal of ours (one line, one ``os.write``, on the training thread, before the client gets it) and
dropped from it once the tracker's files hold it. A resume from a checkpoint rewinds the tracker to
just before the journal's first record (or to the checkpoint) and sends the journal's records up to the
checkpoint again; a run closed cleanly deletes its journal.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Optional

from .base import FINISHED, LogRecord, TrackerLogger, logger
from .wal import WriteAheadLog

__all__ = ["JournaledLogger"]

#: Seconds between two confirmations of what the tracker's files hold, when no checkpoint asks sooner.
CONFIRM_EVERY = 60.0


class JournaledLogger(TrackerLogger):
    """A `TrackerLogger` whose records are also kept in a journal until the tracker's files hold them.

    The backend places each record (`Backend.place`: its W&B history row, else its step), says how far
    its files hold the run (`Backend.confirm_durable`, asked on a thread of ours at each checkpoint and
    at least every minute) and where a resumed run goes on from (`Backend.rewind`).
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._journal: Optional[WriteAheadLog] = None
        #: The position of the last record placed when the resumed checkpoint was saved.
        self._checkpoint_position: Optional[int] = None
        self._confirming: Optional[threading.Thread] = None
        self._confirmed_at = 0.0

    def journal_path(self) -> Path:
        """``<output_dir>/.tracker_journal/<run key>.jsonl``."""
        return Path(self._output_dir or Path.cwd()) / ".tracker_journal" / f"{self.run_key}.jsonl"

    def state_attributes(self) -> dict[str, Any]:
        """The base's, and the position of the last record placed (a resume sends what follows)."""
        if self._journal is not None:
            self._confirm_soon()
        position = None if self.backend is None else self.backend.position
        return {**super().state_attributes(), "position": position}

    def load_state_attributes(self, attributes: dict[str, Any]) -> None:
        """The base's; the checkpoint's position, when the checkpoint's run is the one resumed."""
        super().load_state_attributes(attributes)
        same_run = attributes.get("run_id") is not None and attributes.get("run_id") == self.run_id
        self._checkpoint_position = attributes.get("position") if same_run else None

    def _open_run(self, resume: bool, boundary: bool) -> None:
        journal = WriteAheadLog(self.journal_path())
        try:
            journal.open({"logger": self.logger_name, "run_key": self.run_key}, wait=self.flush_timeout)
        except OSError as error:
            raise OSError(error.errno, f"{self.logger_name}: cannot write its journal {journal.path}: "
                          f"{error.strerror or error}. Pass a writable output_dir.") from error
        again: list[dict[str, Any]] = []
        if self._session_start:
            again = self._rewind(journal)
        self._journal, self._confirmed_at = journal, time.monotonic()
        super()._open_run(resume, boundary)
        held = self.backend.logged_steps(self.run_id) if again else {}
        for entry in again:  # the records the tracker may have lost, before anything new
            step = int(entry["step"])
            metrics = {key: value for key, value in entry["metrics"].items() if step > held.get(key, -1)}
            record = LogRecord(step, int(entry["time"]), metrics, entry["summary"])
            self.backend.place(record, int(entry["position"]))
            self._call(self.backend.log, [record], self.run_id)

    def _rewind(self, journal: WriteAheadLog) -> list[dict[str, Any]]:
        """Keep the journal's records up to the resumed checkpoint, rewind the tracker to just before
        the first of them; return them (a new run, or no checkpoint of this run: none)."""
        checkpoint, self._checkpoint_position = self._checkpoint_position, None
        if checkpoint is None:
            if journal.size > journal.first:
                journal.keep(journal.size)
            return []
        kept, end = [], journal.first
        for entry, after in journal.entries(journal.first):
            if entry.get("position", checkpoint + 1) > checkpoint:
                break  # the journal's order is the run's: the rest came after the checkpoint
            kept.append(entry)
            end = after
        if end < journal.size:
            journal.keep(journal.first, end)
        rewind = min(int(kept[0]["position"]) - 1, checkpoint) if kept else checkpoint
        if rewind >= 0:
            self.backend.rewind(rewind)
        if kept:
            logger.warning("%s: sending again %d record(s) of steps %d-%d that %s may not hold (the training "
                           "before this resume ended before they reached its files).", self.logger_name,
                           len(kept), kept[0]["step"], kept[-1]["step"], self.backend.location())
        return kept

    def _write(self, record: LogRecord) -> None:
        position = self.backend.place(record)
        try:
            self._journal.append({"kind": "log", "step": record.step, "time": record.time,
                                  "metrics": record.metrics, "summary": record.summary, "position": position})
        except Exception as error:  # a full disk: the tracker still gets it, a kill may lose it
            self.warn(("journal",), "%s: could not append to its journal %s (%s); records not yet in the "
                      "tracker's files may be lost if the training is killed.", self.logger_name,
                      self._journal.path, error)
        super()._write(record)
        if time.monotonic() - self._confirmed_at > CONFIRM_EVERY:
            self._confirm_soon()

    def _sync(self, timeout: float) -> bool:
        """A checkpoint save (``timeout`` 0) waits for nothing: the journal holds what the tracker may not."""
        return super()._sync(timeout) if timeout > 0 else self._lost == 0

    def _confirm_soon(self) -> None:
        """Ask the tracker how far its files hold the run, on a thread; drop what they hold."""
        if self._confirming is not None and self._confirming.is_alive():
            return
        self._confirmed_at = time.monotonic()
        self._confirming = threading.Thread(target=self._confirm, args=(self._journal, self._journal.size),
                                            daemon=True, name=f"hf-callbacks-plus-{self.logger_name}-journal")
        self._confirming.start()

    def _confirm(self, journal: WriteAheadLog, size: int) -> None:
        try:
            durable = self.backend.confirm_durable()  # covers every record placed before this call
            if durable is None:
                return
            held = journal.first
            for entry, after in journal.entries(journal.first):
                if after > size or entry.get("position", durable + 1) > durable:
                    break
                held = after
            if held > journal.first:
                journal.keep(held)
        except Exception as error:  # never into training: the journal keeps every record
            self.warn(("confirm", type(error).__name__), "%s: could not learn how far %s holds the run "
                      "(%s: %s); its journal keeps every record.", self.logger_name, self.backend.location(),
                      type(error).__name__, str(error)[:300])

    def close(self, status: str = FINISHED, timeout: Optional[float] = None) -> bool:
        """Close the run (`TrackerLogger.close`); delete the journal once the tracker closed it, else keep
        it and say where it is."""
        closed = super().close(status, timeout)
        journal, self._journal = self._journal, None
        if journal is None:
            return closed
        if self._confirming is not None:
            self._confirming.join(5.0)
        if not closed and journal.size > journal.first:
            logger.warning("%s: the records %s may not hold are kept in %s; resuming this run from its "
                           "checkpoint sends them again.", self.logger_name, self.backend.location(),
                           journal.path)
        journal.close(delete=closed)
        return closed
