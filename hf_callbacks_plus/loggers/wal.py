"""The write-ahead log of a store without a durable buffer of its own (MLflow): docs/architecture.md."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import struct
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Union

try:
    import fcntl
except ImportError:  # Windows: the file is not locked between processes
    fcntl = None  # type: ignore[assignment]

from .base import FINISHED, Backend, LogRecord, logger

__all__ = ["Sender", "StoreUnreachable", "WriteAheadLog", "find_logs", "read_target", "replay"]

#: Entries of a batch (log entries only: any other entry is sent alone).
BATCH_ENTRIES = 64
#: A call holds up to this many of the store's batches (``MlflowClient.log_batch`` splits it): with
#: its points grouped by key, the store updates each key's latest value once per batch, so larger
#: calls cost it less (8 batches: a third less CPU than 2 at 500 metrics a step; 16: no better).
CALL_BATCHES = 8
#: A backlog this large (about a full call: 8000 points) is sent at once, without waiting for the pace.
FULL_BATCH_BYTES = 256_000
#: A call to the store silent for this long is told as an outage (mlflow retries inside a call).
SILENT_CALL_SECONDS = 30.0
#: Seconds between two questions to a tracker that writes in the background of how far its files hold
#: the run, when no checkpoint asks sooner.
CONFIRM_SECONDS = 60.0
#: Refused records told one by one per error type, before one error saying so.
REFUSALS_TOLD = 5
#: How often an idle sender looks for new entries.
POLL_SECONDS = 0.1
#: Bytes read at a time.
CHUNK_BYTES = 1 << 18
#: The log's own lines: its first line names the target; a ``sent`` line records how far the store
#: acknowledged the file, and the run's id (`Sender` passes over both).
TARGET_LINE, SENT_LINE = b'{"kind": "target"', b'{"kind": "sent"'


class StoreUnreachable(ConnectionError):
    """The store cannot be reached; the message says why (a replay raises it)."""

    message_is_cause = True


#: The names `WriteAheadLog._line` packed last, and their JSON.
_NAMES_JSON: tuple[tuple[str, ...], str] = ((), "[]")


def replay_hint(path: Union[str, Path]) -> str:
    """The sentence telling how to send a write-ahead log by hand."""
    return f"`hf-callbacks-plus replay {path}` sends them (add --dry-run to list them first)"


def _open_locked(path: Path, wait: float, create: bool) -> int:
    """Open ``path`` read-write with its exclusive ``flock`` taken within ``wait`` seconds. The lock is
    on the file the path names once it is held: a file another process deleted (or replaced) before
    letting go of it is never written; the path is opened again.

    Raises:
        RuntimeError: Another process holds the file.
        FileNotFoundError: There is no file (and not ``create``).
    """
    end = time.monotonic() + wait
    while True:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0), 0o644)
        try:
            while fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= end:
                        raise RuntimeError(f"{path} is in use by another process (a training of the "
                                           "same run, or `hf-callbacks-plus replay`); wait for it to end."
                                           ) from None
                    time.sleep(0.05)
            held = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        try:
            named = os.stat(path)
        except FileNotFoundError:
            named = None
        if named is not None and (named.st_ino, named.st_dev) == (held.st_ino, held.st_dev):
            return fd
        os.close(fd)
        if named is None and not create:
            raise FileNotFoundError(f"{path} no longer exists (another process sent it to its end)")


def read_target(path: Union[str, Path]) -> dict[str, Any]:
    """The target a log names on its first line ({} when the file is not a write-ahead log)."""
    try:
        with open(path, "rb") as handle:
            first = handle.readline(1 << 16)
        return json.loads(first) if first.startswith(TARGET_LINE) and first.endswith(b"\n") else {}
    except (OSError, ValueError):
        return {}


class WriteAheadLog:
    """One run's append-only file: a target line, then entries and ``sent`` lines, one JSON line each.

    This process is the file's only writer while it holds the lock (`open`), so it knows the file's end;
    an append that fails (a full disk) is cut off again, so no torn line can merge with the next one.

    Args:
        path: The file, ``<wal_dir>/<run key>.jsonl``.
    """

    def __init__(self, path: Union[str, Path]) -> None:
        self.path = Path(path)
        #: What the first line names (logger, tracking URI with credentials masked, experiment, run key).
        self.target: dict[str, Any] = {}
        #: The file's size, and the offset of its first entry (after the target line); read-only.
        self.size = self.first = 0
        self._fd: Optional[int] = None
        self._lock = threading.RLock()
        self._owed = b""  # lines the last emptying could not write; they go first in the next write

    def open(self, target: Optional[dict[str, Any]], wait: float) -> None:
        """Open and lock the file; without ``target`` it must exist; with it, a new or empty file gets it
        as its first line. A half-written last line (a kill during a write) is dropped.

        Raises:
            RuntimeError: Another process holds the file.
            ValueError: The file is not a write-ahead log.
            OSError: The folder cannot be written (or, without ``target``, there is no file).
        """
        if target is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._load(_open_locked(self.path, wait, create=target is not None), target, writable=True)

    def inspect(self) -> None:
        """Open for reading only, without the lock (a listing; a training may be writing it)."""
        self._load(os.open(self.path, os.O_RDONLY), None, writable=False)

    def _load(self, fd: int, target: Optional[dict[str, Any]], writable: bool) -> None:
        self._fd = fd
        try:
            size = self.size = os.fstat(fd).st_size
            if writable and size and os.pread(fd, 1, size - 1) != b"\n":
                tail = os.pread(fd, min(size, 1 << 20), max(0, size - (1 << 20)))
                self.size = size - len(tail) + tail.rfind(b"\n") + 1
                os.ftruncate(fd, self.size)
            if self.size == 0 and target is not None:
                self._write(self._line({"kind": "target", **target}))
            line, self.first = next(self._lines(0), (b"", 0))
            if not line.startswith(TARGET_LINE):
                raise ValueError(f"{self.path} is not a write-ahead log of hf-callbacks-plus (its first "
                                 "line names no target)")
            self.target = json.loads(line)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _line(entry: dict[str, Any]) -> bytes:
        global _NAMES_JSON
        metrics = entry.get("metrics")
        if not metrics:
            return (json.dumps(entry, allow_nan=True) + "\n").encode()
        # packed: ``[names, values]``, the values as float64 bytes (exact, and a tenth of JSON's cost);
        # the names' JSON is kept while they repeat (a logger writes the same names at every step)
        names, cached = tuple(metrics), _NAMES_JSON
        if names != cached[0]:
            cached = _NAMES_JSON = (names, json.dumps(list(names)))
        rest = json.dumps({key: value for key, value in entry.items() if key != "metrics"}, allow_nan=True)
        values = base64.b64encode(struct.pack(f"<{len(names)}d", *metrics.values())).decode()
        return f'{rest[:-1]}, "metrics": [{cached[1]}, "{values}"]}}\n'.encode()

    def append(self, entry: dict[str, Any]) -> tuple[int, int]:
        """Append one entry: one ``os.write`` of a whole line (the kernel has it when this returns); the
        offsets of its start and end.

        Raises:
            OSError: It could not be written (nothing of it is left in the file).
        """
        data = self._line(entry)
        with self._lock:
            self._write(data)
            return self.size - len(data), self.size

    def _write(self, data: bytes) -> None:
        start, data = self.size, self._owed + data
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
        except OSError:
            try:
                os.ftruncate(self._fd, start)
            except OSError:
                pass
            raise
        self.size, self._owed = start + len(data), b""

    def settle(self, acked: int, run_id: Optional[str], boundary: bool) -> int:
        """Record that the tracker holds everything before ``acked``; return where that offset is now.

        All of the file is emptied down to its target line in place (a full disk frees it); a start at
        least as large as the rest, when the rest is under `FULL_BATCH_BYTES` (appends wait while it is
        copied), is dropped by `keep` (a full disk keeps it); else a ``sent`` line records ``acked``. A
        dropped start leaves a ``sent`` line with the run's id, after a boundary line when ``boundary``
        (a later reader asks the store for the steps again). A line that cannot be written is left out
        (a ``sent`` line is only a shortcut) or owed to the next write (the boundary).
        """
        compacted = [{"kind": "boundary", "compacted": True}] * boundary
        sent = {"kind": "sent", "offset": self.first, "run_id": run_id}
        with self._lock:
            if acked < self.size <= acked + min(acked - self.first, FULL_BATCH_BYTES):
                with suppress(OSError):
                    return self.keep(acked, before=[*compacted, sent])
            emptied = acked >= self.size
            if emptied:
                os.ftruncate(self._fd, self.first)
                self.size = self.first
                self._owed = b"".join(map(self._line, compacted))
            else:
                sent["offset"] = acked
            with suppress(OSError):
                self._write(self._line(sent))
            return self.size if emptied else acked

    def sync(self) -> None:
        """``fsync`` the file (a checkpoint is saved: it survives a machine crash too)."""
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)

    def close(self, delete: bool = False) -> None:
        """Let go of the file and the lock; with ``delete``, remove it first (while locked)."""
        with self._lock:
            if self._fd is None:
                return
            if delete:
                self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None

    def _lines(self, offset: int) -> Iterator[tuple[bytes, int]]:
        """Complete lines from ``offset`` to the end, each with the offset after it."""
        pending, position = b"", offset  # ``pending`` starts at ``position``
        while offset < self.size:
            chunk = os.pread(self._fd, min(CHUNK_BYTES, self.size - offset), offset)
            if not chunk:
                return
            offset += len(chunk)
            data, start = pending + chunk, 0
            while (newline := data.find(b"\n", start)) >= 0:
                yield data[start:newline + 1], position + newline + 1
                start = newline + 1
            pending, position = data[start:], position + start

    def entries(self, offset: int, own: bool = False) -> Iterator[tuple[Optional[dict[str, Any]], int]]:
        """The entries from ``offset``, each with the offset after it; the log's own lines (target, ``sent``)
        and corrupt ones (told) are left out, or given as None with ``own``."""
        for line, end in self._lines(offset):
            entry = None
            if not line.startswith((TARGET_LINE, SENT_LINE)):
                try:
                    entry = json.loads(line)
                    if type(entry.get("metrics")) is list:  # packed by `_line`
                        names, values = entry["metrics"]
                        entry["metrics"] = dict(zip(names, struct.unpack(f"<{len(names)}d",
                                                                         base64.b64decode(values))))
                except (ValueError, TypeError, struct.error):
                    entry = None
                    logger.warning("%s: skipping a corrupt line at byte %d of %s.",
                                   self.target.get("logger"), end - len(line), self.path)
            if entry is not None or own:
                yield entry, end

    def keep(self, start: int, end: Optional[int] = None, before: Iterable[dict[str, Any]] = ()) -> int:
        """Keep only the entries between offsets ``start`` and ``end`` (default: the file's end), after
        the entries ``before``, in one step: a new file with the target line and them is renamed over
        this one (appends wait). Returns where ``start`` is now."""
        with self._lock:
            head = os.pread(self._fd, self.first, 0) + b"".join(map(self._line, before))
            kept = os.pread(self._fd, (self.size if end is None else end) - start, start)
            temporary = self.path.with_name(self.path.name + ".new")
            try:
                temporary.write_bytes(head + kept)
                os.replace(temporary, self.path)
            except OSError:
                temporary.unlink(missing_ok=True)
                raise
            fd = _open_locked(self.path, 0.0, create=False)
            os.close(self._fd)
            self._fd, self.size, self._owed = fd, len(head) + len(kept), b""
            return len(head)

    def recover(self) -> tuple[int, Optional[str], bool]:
        """From the ``sent`` lines: the offset the store acknowledged, the run's id, and whether a
        boundary lies before that offset (the steps the run held must be asked for again)."""
        acked, run_id, boundaries = self.first, self.target.get("run_id"), []
        for line, end in self._lines(self.first):
            if line.startswith(SENT_LINE):
                sent = json.loads(line)
                acked, run_id = max(acked, int(sent["offset"])), sent.get("run_id") or run_id
            elif line.startswith(b'{"kind": "boundary"'):
                boundaries.append(end)
        return acked, run_id, any(end <= acked for end in boundaries)

    def read(self, offset: int, max_points: int, max_entries: int) -> tuple[list[dict], int]:
        """Entries from ``offset``: a run of log entries (at most ``max_points`` points, one at least) or
        one other entry; and the offset after them (and after the log's own lines among them)."""
        found: list[dict] = []
        points = 0
        for entry, end in self.entries(offset, own=True):
            if entry is not None:
                size = len(entry.get("metrics", ())) + len(entry.get("summary", ())) or 1
                if found and (entry.get("kind") != "log" or found[0].get("kind") != "log"
                              or points + size > max_points or len(found) >= max_entries):
                    break
                found.append(entry)
                points += size
            offset = end
        return found, offset

    def pending(self, offset: int) -> dict[str, Any]:
        """What lies past ``offset``: log records, their points and steps, params, files, the last status."""
        counts: dict[str, Any] = {"log": 0, "points": 0, "steps": [], "params": 0, "file": 0, "status": None}
        for entry, _ in self.entries(offset):
            kind = entry.get("kind")
            if kind == "log":
                counts["points"] += len(entry.get("metrics", {})) + len(entry.get("summary", {}))
                counts["steps"].append(int(entry["step"]))
            if kind in ("log", "params", "file"):
                counts[kind] += 1
            elif kind == "finish":
                counts["status"] = entry.get("status")
        return counts


def describe_pending(counts: dict[str, Any]) -> str:
    """``"5 log record(s) (40 points, steps 3-7), the params, 1 file(s) and the final status FAILED"``."""
    steps = counts["steps"]
    parts = [f"{counts['log']} log record(s) ({counts['points']} points, steps {min(steps)}-{max(steps)})"
             ] if steps else []
    parts += ["the params"] * bool(counts["params"]) + [f"{counts['file']} file(s)"] * bool(counts["file"])
    parts += [f"the final status {counts['status']}"] * bool(counts["status"])
    return " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts) or "nothing"


class Sender:
    """Sends a `WriteAheadLog` to its run from the acknowledged offset, in order, in batches; retries
    transient errors with backoff, drops a refused entry alone (docs/architecture.md). A tracker that
    writes in the background (``backend.durable_on_answer`` False) keeps what it was handed in the file
    until `Backend.confirm_durable` says its files hold it (`confirm_soon`, at least every minute).

    Args:
        wal: The log, open.
        backend: The store.
        run_key: The run's key (finds the run when its id is not known). Defaults to the log's.
        run_id: The run's id, when known. Defaults to the log's.
        resume: The run may exist already. Defaults to True.
        name: Shown in messages. Defaults to the backend's name.
        backoff: ``(initial, max)`` retry delays in seconds. Defaults to (0.5, 30).
        on_run_id: Called with the run's id once it is open. Defaults to None.
        for_target: Builds the backend another log's target names; with it, other runs' logs in the
            folder for the same store are sent in the background once this run is open. Defaults to None.
    """

    def __init__(self, wal: WriteAheadLog, backend: Backend, run_key: Optional[str] = None,
                 run_id: Optional[str] = None, resume: bool = True, name: Optional[str] = None,
                 backoff: tuple[float, float] = (0.5, 30.0),
                 on_run_id: Optional[Callable[[str], None]] = None,
                 for_target: Optional[Callable[[dict], Backend]] = None) -> None:
        acked, logged_run_id, self._ask_held = wal.recover()
        self.wal, self.backend, self.name = wal, backend, name or backend.name
        self.run_key = run_key or wal.target.get("run_key")
        self.run_id: Optional[str] = run_id or logged_run_id
        self.resume = resume or logged_run_id is not None
        #: The offsets the tracker holds everything before, and was handed everything before.
        self.acked = self.handed = acked
        self._confirm_at = time.monotonic() + CONFIRM_SECONDS  # `_confirm` on the sender's thread
        #: The steps the run held at the last boundary (None: no boundary met).
        self.held: Optional[dict[str, int]] = None
        self.backoff, self.on_run_id, self.for_target = backoff, on_run_id, for_target
        #: Entries sent and records the store refused (dropped), in this process.
        self.sent = self.dropped = 0
        #: Why the run could not start, or the store refused every call (told once; nothing more is sent).
        self.start_error: Optional[BaseException] = None
        self.finished = False
        self._started = self._closing = self._abandoned = self._hopeless = False
        self._down_since: Optional[float] = None
        self._call_started: Optional[float] = None
        self._cause = ""
        self._last_error: BaseException = RuntimeError("nothing sent yet")
        self._deadline = float("inf")
        self._isolate_until = self._flushing = 0
        self._last_send = 0.0
        self._refused: dict[str, int] = {}
        self._wake = threading.Event()
        self._progress = threading.Condition()
        #: Held while entries are handed to the tracker, by the sender's thread or `hand_inline`.
        self._handing = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    @property
    def down(self) -> bool:
        """The store was told unreachable and has not answered since."""
        return self._down_since is not None

    def start(self) -> None:
        """Send on a daemon thread of its own (a live training)."""
        self._thread = threading.Thread(target=self._run, name=f"hf-callbacks-plus-{self.name}", daemon=True)
        self._thread.start()

    def check_silence(self) -> None:
        """Tell an outage when a call has not answered for `SILENT_CALL_SECONDS` (cheap: on_log calls it)."""
        started = self._call_started
        silent = 0.0 if started is None else time.monotonic() - started
        if self._down_since is None and silent > SILENT_CALL_SECONDS:
            self._unreachable(f"it has not answered a call for {silent:.0f} s (mlflow retries inside the "
                              "call: MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_TIMEOUT)", None)

    def confirm_soon(self) -> None:
        """Ask the tracker, on the sender's thread, how far its files hold the run (a checkpoint is saved)."""
        self._confirm_at = 0.0
        self._wake.set()

    def wait_open(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for the run to open (or fail to); whether it is open."""
        end = time.monotonic() + timeout
        with self._progress:
            while not self._started and self.start_error is None and self._thread.is_alive():
                if time.monotonic() >= end:
                    break
                self._progress.wait(min(end - time.monotonic(), 0.1))
        return self._started

    def flush(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until the tracker has every entry of the file (the training
        thread, which appends them, waits here); a tracker that writes in the background then writes what
        it holds (``backend.sync``)."""
        end = time.monotonic() + timeout
        self._flushing += 1
        self._wake.set()
        try:
            with self._progress:
                while self.handed < self.wal.size and self._thread.is_alive():
                    if time.monotonic() >= end:
                        return False
                    self._progress.wait(min(end - time.monotonic(), 0.2))
            if not self.backend.durable_on_answer:
                self.backend.sync()
            return self.handed >= self.wal.size
        finally:
            self._flushing -= 1

    def close(self, status: str, timeout: float) -> bool:
        """Send what is left for at most ``timeout`` seconds (5 s more for a call in flight, 1 s when
        ``status`` is FAILED; not at all once the store is known unreachable for a reason waiting cannot
        cure, such as a refused connection, or, when FAILED, once it is unreachable), stop, set the run's
        status when the store answers; warn about what is left.

        Returns:
            True when everything was acknowledged.
        """
        self._closing, self._deadline = True, time.monotonic() + timeout
        self._wake.set()
        end, probed, finished = self._deadline, False, status == FINISHED  # FAILED: an exception waits
        hopeless = self.down and self._hopeless and not self._probe()  # still refused (DNS, TLS) now?
        while self._thread.is_alive() and time.monotonic() < end:
            self._thread.join(min(0.05 if self.down else 0.5, max(0.0, end - time.monotonic())))
            self.check_silence()
            started = self._call_started
            if started is not None and not probed and time.monotonic() - started > 1.0:
                probed = True  # a call silent at the close: is anything there to answer it?
                hopeless = not self._probe() and self._hopeless
            if self.down and (hopeless or not finished):
                self._deadline = end = time.monotonic()
                self._wake.set()
            if time.monotonic() >= self._deadline and self._call_started is not None:
                end = self._deadline + (5.0 if finished else 1.0)
        if self._thread.is_alive():
            self._abandoned = True  # stuck in a call: it writes nothing more
        if self._started and not self.finished and not self.down and not self._thread.is_alive():
            try:  # the finish entry was not sent (or not written): the run gets its status now
                self.backend.finish(status, self.run_id)
                self.finished = True
                if not self.backend.durable_on_answer and self.handed >= self.wal.size:
                    self._hold(self.wal.size)  # a finished run is in the tracker's files
            except Exception as error:
                self._cause = self.backend.explain(error)[0]
        if self.acked >= self.wal.size:
            return True
        logger.warning("%s: %s were not delivered (%s); they are kept in %s: %s.", self.name,
                       describe_pending(self.wal.pending(self.acked)),
                       self._why_not_delivered(status), self.wal.path, self._resend_hint())
        return False

    def _resend_hint(self) -> str:
        """How the records kept in the log reach the run: ``replay`` (MLflow), else a resume."""
        if self.for_target is not None:
            return f"resuming this run sends them, or {replay_hint(self.wal.path)}"
        return "resuming the training from its newest checkpoint sends them"

    def _why_not_delivered(self, status: str) -> str:
        where = getattr(self.backend, "where", self.name)
        if self.start_error is not None:
            reason = f"{where}: {self.backend.explain(self.start_error)[0]}"
        elif self._call_started is not None and not self._hopeless:
            reason = f"a call to {where} had not answered after {time.monotonic() - self._call_started:.0f} s"
        elif self._down_since is not None:
            since = time.monotonic() - self._down_since
            reason = (f"{where} is unreachable" + (f" since {since:.0f} s" if since >= 1 else "")
                      + f": {self._cause or 'no answer'}")
        elif not self._started:
            reason = f"the run did not open at {where} within the close deadline"
        else:
            reason = f"{where} was too slow to take them within the close deadline"
        return reason + ("" if self.finished else f"; the run's status {status} is not set either")

    def step(self) -> str:
        """One call: open the run, or send the next batch. Returns "done" when nothing is left, else the
        call's outcome: "ok", "transient" (retry), "dropped" (a refused entry) or "fatal" (stop)."""
        if self.start_error is not None:
            return "fatal"
        if not self._started:
            return self._attempt(self._start_run)
        with self._handing:
            if self.wal.size <= self.handed:
                return "done"
            limit = CALL_BATCHES * self.backend.max_metrics_per_batch
            alone = self.handed < self._isolate_until
            entries, end = self.wal.read(self.handed, limit, 1 if alone else BATCH_ENTRIES)
            if not entries:  # only the log's own lines
                moved = end > self.handed
                self._ack(end, sent=False)
                return "ok" if moved and end < self.wal.size else "done"
            return self._attempt(self._send, entries, end)

    def hand_inline(self, start: int, end: int, record: LogRecord) -> bool:
        """Hand ``record``, the log's entry between offsets ``start`` and ``end``, to a tracker that writes in
        the background, from the caller's thread, when nothing before it waits (its client's call is a
        hand-off to its own queue; a second thread doing it would only contend for the GIL). False: the
        sender's thread hands it (the run is not open yet, a backlog, an error)."""
        if (self.backend.durable_on_answer or not self._started or self._closing
                or self.start_error is not None or self.handed != start
                or not self._handing.acquire(blocking=False)):
            return False
        try:
            if self.handed != start or self._abandoned:
                return False
            unheld = self._unheld(record)  # as the sender's thread would send it
            if unheld is not None:
                self.backend.log([unheld], self.run_id)
            self._ack(end)
            return True
        except Exception:  # the sender's thread tries it again and tells what fails
            return False
        finally:
            self._handing.release()

    def send_to_end(self, stop: Optional[Callable[[], bool]] = None) -> None:
        """Send everything on this thread (``replay``) unless ``stop()`` says to stop between calls; raise
        on a failure other than a refused record."""
        self._closing = True
        while (outcome := self.step()) != "done" and not (stop is not None and stop()):
            if outcome in ("transient", "fatal"):
                raise self._last_error

    def _run(self) -> None:
        siblings: Optional[threading.Thread] = None
        try:
            backoff = self.backoff[0]
            while not self._abandoned and time.monotonic() < self._deadline:
                if self._started and siblings is None and self.for_target is not None:
                    siblings = threading.Thread(target=self._send_siblings, daemon=True,
                                                name=f"hf-callbacks-plus-{self.name}-earlier-runs")
                    siblings.start()
                if self._started and not self.backend.durable_on_answer and (
                        time.monotonic() >= self._confirm_at):
                    self._confirm()
                backlog = self.wal.size - self.handed
                left = self._last_send + self.backend.send_interval - time.monotonic()
                if (self._started and 0 < backlog < FULL_BATCH_BYTES and left > 0
                        and not (self._closing or self._flushing)):
                    self._wait(min(left, POLL_SECONDS))  # gather about a second's records in one call
                    continue
                sending, outcome = self._started, self.step()
                if outcome == "fatal" or (outcome == "done" and self._closing):
                    return
                if outcome == "done":
                    self._wait(POLL_SECONDS)
                elif outcome == "transient":
                    self._wait(max(0.0, min(backoff, self._deadline - time.monotonic())))
                    backoff = min(backoff * 2, self.backoff[1])
                else:
                    backoff, self._last_send = self.backoff[0], time.monotonic() if sending else 0.0
        except Exception:  # never let an exception escape the thread: the entries stay in the file
            logger.exception("%s: the sender hit an unexpected error; what is not sent stays in %s.",
                             self.name, self.wal.path)

    def _wait(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _start_run(self) -> None:
        self.run_id = self.backend.start(self.run_id, self.run_key, self.resume)
        if self._abandoned:  # opened after the close gave up on it: nobody's run
            self.backend.finish("FAILED", self.run_id)
            return
        if self._ask_held:  # recovered past a boundary: the steps the run holds are asked for again
            self.held = self.backend.logged_steps(self.run_id)
        self._started = True
        self._ack(self.handed)  # the run's id, in the file
        if self.on_run_id is not None:
            self.on_run_id(self.run_id)

    def _send(self, entries: list[dict], end: int) -> None:
        """Send one batch; acknowledge it once the store answered."""
        backend, run_id, first = self.backend, self.run_id, entries[0]
        kind, sent = first.get("kind"), True
        if kind == "log":
            records = [record for entry in entries if (record := self._unheld(LogRecord(
                int(entry["step"]), int(entry["time"]), entry.get("metrics") or {},
                entry.get("summary") or {}, entry.get("position"))))]
            if records:
                backend.log(records, run_id)
        elif kind == "params":
            backend.log_config(first["params"], run_id)
        elif kind == "file":
            backend.log_file(first["folder"], first["name"], first.get("type", "model"), run_id)
        elif kind == "boundary" and not (first.get("compacted") and self.held is not None):
            self.held = backend.logged_steps(run_id)
        elif kind == "finish" and end >= self.wal.size:  # the last entry: the session ended
            backend.finish(first["status"], run_id)
            self.finished = True
            if not backend.durable_on_answer:  # a finished run is in the tracker's files
                self._hold(end)
                return
        else:
            sent = False
        self.sent += len(entries)
        self._ack(end, sent)

    def _unheld(self, record: LogRecord) -> Optional[LogRecord]:
        """``record`` without the points at or below the boundary in force (the run held them before this
        session); None when nothing is left."""
        held, metrics = self.held, record.metrics
        if held:
            metrics = {key: value for key, value in metrics.items() if record.step > held.get(key, -1)}
        if not (metrics or record.summary):
            return None
        return record if metrics is record.metrics else dataclasses.replace(record, metrics=metrics)

    def _ack(self, offset: int, sent: bool = True) -> None:
        """The tracker was handed the entries before ``offset``; a store that holds what it answered
        holds them too (`_hold`, when ``sent``)."""
        durable = self.backend.durable_on_answer
        if sent and durable:
            self._hold(offset)
        elif not self._abandoned:
            with self._progress:
                self.handed, self.acked = offset, offset if durable else self.acked
                self._progress.notify_all()

    def _hold(self, offset: int) -> None:
        """The tracker holds the entries before ``offset``: the file drops them (`WriteAheadLog.settle`)."""
        if self._abandoned:
            return
        with self._progress:  # `flush` sees the file and the offsets move together
            now = self.wal.settle(offset, self.run_id, boundary=self.held is not None)
            self.acked, self.handed = now, max(self.handed, offset) - offset + now  # the rest moved back
            self._isolate_until = max(0, self._isolate_until - offset + now)
            self._progress.notify_all()

    def _confirm(self) -> None:
        """Drop from the file what a tracker that writes in the background holds in its files now."""
        self._confirm_at = time.monotonic() + CONFIRM_SECONDS
        with self._handing:
            try:
                durable = self.backend.confirm_durable()  # covers every record handed so far
            except Exception as error:  # the log keeps every record
                logger.warning("%s: could not learn how far %s holds the run (%s); its log keeps every "
                               "record.", self.name, self.backend.location(), self.backend.explain(error)[0])
                return
            held = self.acked
            for entry, after in self.wal.entries(self.acked) if durable is not None else ():
                log = entry.get("kind") == "log"
                if after > self.handed or (log and entry.get("position", durable) > durable):
                    break
                held = after if log else held
            if held > self.acked:
                self._hold(held)

    def _probe(self) -> bool:
        """Ask the backend, cheaply, whether the store can be reached; tell it at once when it cannot."""
        found = self.backend.probe()
        if found is not None:
            self._unreachable(*found)
        return found is None

    def _unreachable(self, cause: str, kind: Optional[str]) -> str:
        self._cause, self._hopeless = cause, kind in ("refused", "dns", "tls")
        if self._down_since is None:
            self._down_since = self._call_started or time.monotonic()
            if self._thread is not None:  # a replay raises it instead
                logger.warning("%s: %s is unreachable: %s. Training continues; records wait in %s and are "
                               "sent in order when it answers.", self.name,
                               getattr(self.backend, "where", "the store"), cause, self.wal.path)
        return "transient"

    def _attempt(self, function: Callable[..., None], *args: Any) -> str:
        """Run ``function``: "ok", "transient" (retry), "dropped" (a refused entry) or "fatal" (stop)."""
        if (self._down_since is not None or not self._started) and not self._probe():
            self._last_error = StoreUnreachable(self._cause)
            return "transient"
        self._call_started = time.monotonic()
        try:
            function(*args)
        except Exception as error:  # the store must never crash training
            self._last_error = error
            return self._failed(error, args[0] if args else None, args[1] if args else 0)
        finally:
            self._call_started = None
        if self._down_since is not None:
            logger.warning("%s: the store is reachable again after %.1f s; sending what waited in order.",
                           self.name, time.monotonic() - self._down_since)
            self._down_since, self._hopeless = None, False
        return "ok"

    def _failed(self, error: Exception, entries: Optional[list[dict]], end: int) -> str:
        cause, kind = self.backend.explain(error)
        if kind in ("refused", "dns", "tls") or (
                kind != "auth" and self.backend.is_transient(error)):
            return self._unreachable(cause, kind)
        if entries is None or kind == "auth":
            self.start_error = error
            if self._thread is not None:  # a replay raises it instead
                what = "could not start the run at" if entries is None else "cannot write to"
                where = getattr(self.backend, "where", self.backend.location())
                logger.error("%s: %s %s (%s). Nothing more is sent; the records stay in %s: fix the cause; "
                             "%s.", self.name, what, where, cause, self.wal.path, self._resend_hint())
            return "fatal"
        if len(entries) > 1:  # send them one by one: only the refused one is dropped
            self._isolate_until = end
            return "dropped"
        entry, kind = entries[0], type(error).__name__
        what = (f"the record of step {entry.get('step')} ({', '.join(list(entry.get('metrics', {}))[:5])})"
                if entry.get("kind") == "log" else f"a {entry.get('kind')} entry")
        told = self._refused[kind] = self._refused.get(kind, 0) + 1
        if told <= REFUSALS_TOLD:
            logger.warning("%s: the store refused %s, which is dropped; the other records are sent (%s).",
                           self.name, what, cause)
        if told == REFUSALS_TOLD:
            logger.error("%s: the store has refused %d records with %s; further ones are dropped without "
                         "being listed. If the records look right, this looks like a fault of the logger or "
                         "the store: please report it with this message (%s).", self.name, told, kind, cause)
        self.dropped += 1
        self._ack(end)
        return "dropped"

    def _send_siblings(self) -> None:
        """Send, after this run's own records and at their pace, the logs other runs left in this folder
        for the same store, each to its own run; stop at this run's close (what is left stays)."""
        mine = self.wal.target
        for path in find_logs(self.wal.path.parent):
            theirs = read_target(path)
            if self._closing or self._abandoned:
                return
            if path == self.wal.path or any(theirs.get(key) != mine.get(key)
                                            for key in ("logger", "tracking_uri", "experiment_name")):
                continue
            try:
                sender = replay(path, self.for_target, stop=lambda: self._closing or self._abandoned,
                                pace=self.backend.send_interval)
            except (RuntimeError, FileNotFoundError):  # another process has it
                continue
            except Exception as error:  # kept for a later run or a replay
                logger.warning("%s: could not send what %s holds (%s); %s.", self.name, path,
                               self.backend.explain(error)[0], replay_hint(path))
                continue
            if sender.acked >= sender.wal.size:
                logger.warning("%s: sent %d entries an earlier training left in %s to run %s.", self.name,
                               sender.sent, path, sender.run_id)


def find_logs(folder: Union[str, Path]) -> list[Path]:
    """The write-ahead logs under ``folder``: every ``*.jsonl`` whose first line names a target."""
    return sorted(file for file in Path(folder).rglob("*.jsonl") if read_target(file))


def replay(path: Union[str, Path], for_target: Callable[[dict], Backend],
           announce: Optional[Callable[[Sender], None]] = None, stop: Optional[Callable[[], bool]] = None,
           pace: float = 0.0) -> Sender:
    """Send a write-ahead log past its acknowledged offset to its run, remove it; return the `Sender`.

    Args:
        path: The log (``<run key>.jsonl``).
        for_target: Builds the backend its target names (``MLflowBackend.for_target``).
        announce: Called with the `Sender` before anything is sent (the CLI prints where it sends).
            Defaults to None.
        stop: Called between calls; True stops (the log keeps what is left). Defaults to None.
        pace: Seconds between calls. Defaults to 0.

    Raises:
        RuntimeError: A training (or another replay) holds the log.
        FileNotFoundError: The log no longer exists.
        ValueError: The file is not a write-ahead log, or one of another logger.
        Exception: What the store raised (the log is kept).
    """
    wal = WriteAheadLog(path)
    wal.open(None, wait=0.0)
    done, backend = False, None
    try:
        sender = Sender(wal, backend := for_target(wal.target))
        if announce is not None:
            announce(sender)
        paced = stop if not pace else (lambda: time.sleep(pace) or (stop is not None and stop()))
        sender.send_to_end(paced)
        done = sender.acked >= wal.size
    finally:
        wal.close(delete=done)
        if backend is not None:
            backend.close()
    return sender
