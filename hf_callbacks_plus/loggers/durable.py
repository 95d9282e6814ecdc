"""The write-ahead log between the training thread and a tracker's client: docs/loggers_faults.md.

The training thread renders a record and appends it to the run's `WriteAheadLog` (one line, one
``os.write``: the kernel has it when ``on_log`` returns); a `Sender` thread hands the file to the tracker
in order and drops what the tracker holds. MLflow's store holds a record once its call answered. W&B's
service (32 KiB blocks kept in memory), TensorBoard's writer thread and trackio's queue write in the
background and lose what they hold to a kill: their records stay in the file until
`Backend.confirm_durable` says the tracker's own files hold them (asked at each checkpoint save), so a
checkpoint is complete only with every record up to its step on disk, in their files or in ours. A
resume of such a tracker rewinds it to just before the file's first record (`Backend.rewind`) and sends
the file again up to the checkpoint.
"""

from __future__ import annotations

from contextlib import suppress
from pathlib import Path
from typing import Any, Optional

from .base import FAILED, LogRecord, TrackerLogger, logger
from .wal import Sender, WriteAheadLog

__all__ = ["DurableLogger"]


class DurableLogger(TrackerLogger):
    """A `TrackerLogger` whose records go through a write-ahead log, sent by a thread of its own."""

    #: ``(initial, max)`` retry delays in seconds while the tracker fails transiently.
    backoff = (0.5, 30.0)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._wal: Optional[WriteAheadLog] = None
        self._sender: Optional[Sender] = None
        #: The position of the last record placed when the resumed checkpoint was saved.
        self._checkpoint_position: Optional[int] = None

    # -- where the log is, and what it names (MLflow overrides) ------------------------------------------
    @property
    def wal_path(self) -> Path:
        """The run's write-ahead log: ``<output_dir>/.tracker_journal/<run key>.jsonl``."""
        return Path(self._output_dir or Path.cwd()) / ".tracker_journal" / f"{self.run_key}.jsonl"

    def wal_target(self) -> dict[str, Any]:
        """What the log's first line names."""
        return {"logger": self.logger_name, "run_key": self.run_key}

    def sender_options(self) -> dict[str, Any]:
        """More keyword arguments of the `Sender`. Defaults to none."""
        return {}

    # -- checkpointed state -------------------------------------------------------------------------
    def state_attributes(self) -> dict[str, Any]:
        """The base's, and the position of the last record placed (a resume sends the log up to it)."""
        if self._sender is not None:
            self._sender.confirm_soon()
        position = None if self.backend is None else self.backend.position
        return {**super().state_attributes(), "position": position}

    def load_state_attributes(self, attributes: dict[str, Any]) -> None:
        """The base's; the checkpoint's position, when the checkpoint's run is the one resumed."""
        super().load_state_attributes(attributes)
        same_run = attributes.get("run_id") is not None and attributes.get("run_id") == self.run_id
        self._checkpoint_position = attributes.get("position") if same_run else None

    # -- writing -----------------------------------------------------------------------------------
    def _open_run(self, resume: bool, boundary: bool) -> None:
        with self._told_unwritable(self.backend.location):
            self.backend.prepare(self.run_id)
        wal = WriteAheadLog(self.wal_path)
        with self._told_unwritable(lambda: wal.path):
            wal.open(self.wal_target(), wait=self.flush_timeout)
        if self._session_start and not self.backend.durable_on_answer:
            self._rewind(wal, boundary)
        elif boundary:  # a resume: the sender asks the store which steps it holds
            wal.append({"kind": "boundary"})
        self._wal = wal
        self._sender = Sender(wal, self.backend, self.run_key, self.run_id, resume=resume,
                              name=self.logger_name, backoff=self.backoff,
                              on_run_id=lambda run_id: setattr(self, "run_id", run_id),
                              **self.sender_options())
        self.run_id = self._sender.run_id
        self._sender.start()

    def _rewind(self, wal: WriteAheadLog, boundary: bool) -> None:
        """Keep the log's records up to the resumed checkpoint (none for a new run) and rewind the
        tracker to just before the first of them, so they are sent again."""
        checkpoint, self._checkpoint_position = self._checkpoint_position, None
        kept, start = [], wal.recover()[0]  # the tracker's files hold what lies before
        end = start
        for entry, after in wal.entries(start) if checkpoint is not None else ():
            if entry.get("kind") == "log" and entry.get("position", checkpoint + 1) > checkpoint:
                break  # the log's order is the run's: the rest came after the checkpoint
            kept.append(entry)
            end = after
        positions = [entry["position"] for entry in kept if "position" in entry]
        rewind = min(positions[0] - 1, checkpoint) if positions else checkpoint
        if rewind is not None and rewind >= 0:
            self.backend.rewind(rewind)
        if end < wal.size or boundary:  # a tracker that cannot rewind skips what its store holds
            wal.keep(start, end, before=[{"kind": "boundary"}] if boundary else [])
        if positions:
            steps = [entry["step"] for entry in kept if entry.get("kind") == "log"]
            logger.warning("%s: sending again %d record(s) of steps %d-%d that %s may not hold (the training "
                           "before this resume ended before they reached its files).", self.logger_name,
                           len(steps), steps[0], steps[-1], self.backend.location())

    def _append(self, entry: dict[str, Any]) -> Optional[tuple[int, int]]:
        try:
            return self._wal.append(entry)
        except Exception as error:  # a full disk: never into the training loop
            self._lose(1, error)
            return None
        finally:
            self._sender.check_silence()

    def _write(self, record: LogRecord) -> None:
        offsets = self._append({"kind": "log", "step": record.step, "time": record.time,
                                "metrics": record.metrics, "summary": record.summary,
                                "position": self.backend.place(record)})
        if offsets is not None:
            self._sender.hand_inline(*offsets, record)

    def _write_config(self, params: dict[str, str]) -> None:
        self._append({"kind": "params", "params": params})

    def _write_file(self, folder: str, name: str, kind: str) -> None:
        self._append({"kind": "file", "folder": folder, "name": name, "type": kind})

    def _sync(self, timeout: float) -> bool:
        if timeout <= 0:  # a checkpoint save: on disk, never waiting for the tracker
            self._wal.sync()
            return True
        return self._sender.flush(timeout)

    def _close_run(self, status: str, timeout: float) -> bool:
        wal, sender = self._wal, self._sender
        with suppress(OSError):  # a full disk: the sender sets the status itself
            wal.append({"kind": "finish", "status": status})
        delivered = sender.close(status, timeout)
        self._tell_lost(wal.path)
        wal.close(delete=delivered)
        self.backend.close()
        self._wal = self._sender = None
        return delivered and self._lost == 0 and not sender.dropped

    def close_after_exception(self) -> bool:
        """Close the run FAILED within ``min(flush_timeout, exception_timeout)`` s, at once while the
        tracker is unreachable."""
        sender = self._sender
        down = sender is not None and (sender.start_error is not None or sender.down)
        return self.close(FAILED, timeout=0.0 if down else min(self.flush_timeout, self.exception_timeout))
