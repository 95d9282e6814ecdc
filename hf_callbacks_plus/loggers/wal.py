"""The write-ahead log of a store without a durable buffer of its own (MLflow): docs/architecture.md."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional, Union

try:
    import fcntl
except ImportError:  # Windows: the file is not locked between processes
    fcntl = None  # type: ignore[assignment]

from .base import Backend, LogRecord, logger

__all__ = ["Sender", "WriteAheadLog", "find_logs", "replay"]

#: Entries of a batch (log entries only: any other entry is sent alone).
BATCH_ENTRIES = 64
#: A call holds up to this many of the store's batches (``MlflowClient.log_batch`` splits it).
CALL_BATCHES = 2
#: A backlog this large (about a full call: 2000 points) is sent at once, without waiting for the pace.
FULL_BATCH_BYTES = 64_000
#: Past this size, a file the sender has caught up with is emptied.
COMPACT_BYTES = 16 * 2**20
#: A call to the store silent for this long is told as an outage (mlflow retries inside a call).
SILENT_CALL_SECONDS = 30.0
#: Refused records told one by one per error type, before one error saying so.
REFUSALS_TOLD = 5
#: How often an idle sender looks for new entries.
POLL_SECONDS = 0.1


def replay_hint(path: Union[str, Path]) -> str:
    """The sentence telling how to send a write-ahead log by hand."""
    return f"`hf-callbacks-plus replay {path}` sends them (add --dry-run to list them first)"


def _lock(fd: int, wait: float) -> bool:
    """Take an exclusive ``flock`` on ``fd`` within ``wait`` seconds (always True without fcntl)."""
    end = time.monotonic() + wait
    while fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= end:
                return False
            time.sleep(0.05)
    return True


class WriteAheadLog:
    """One run's append-only file of entries, and its sidecar.

    Args:
        path: The file, ``<wal_dir>/<run key>.jsonl``.
    """

    def __init__(self, path: Union[str, Path]) -> None:
        self.path = Path(path)
        self.sidecar = self.path.with_suffix(".json")
        self._fd: Optional[int] = None
        self._append_lock = threading.Lock()
        self._state: Optional[dict[str, Any]] = None

    def state(self) -> dict[str, Any]:
        """The sidecar's content ({} when there is none)."""
        if self._state is None:
            try:
                self._state = json.loads(self.sidecar.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return {}
        return dict(self._state)

    def save_state(self, **changes: Any) -> None:
        """Merge ``changes`` into the sidecar, atomically (a kill leaves the old or the new one)."""
        state = {**self.state(), **changes}
        temporary = self.sidecar.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(state), encoding="utf-8")
        os.replace(temporary, self.sidecar)
        self._state = state

    def open(self, target: dict[str, Any], wait: float) -> None:
        """Open for appending, take the lock within ``wait`` seconds, drop a half-written last line.

        Raises:
            RuntimeError: Another process (a training or a replay) holds the file.
            OSError: The folder cannot be written.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        if not _lock(fd, wait):
            os.close(fd)
            raise RuntimeError(f"{self.path} is in use by another process (a training or `hf-callbacks-plus "
                               "replay` of the same run); wait for it to end.")
        self._fd = fd
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            tail = os.pread(fd, min(size, 1 << 20), max(0, size - (1 << 20)))
            os.ftruncate(fd, size - len(tail) + tail.rfind(b"\n") + 1)
        if not self.sidecar.exists():
            self.save_state(**target, acked=0, held=None)

    def append(self, entry: dict[str, Any]) -> None:
        """Append one entry: one ``os.write`` of a whole line (the kernel has it when this returns)."""
        data = (json.dumps(entry, allow_nan=True) + "\n").encode()
        with self._append_lock:
            while data:
                data = data[os.write(self._fd, data):]

    def sync(self) -> None:
        """``fsync`` the file (a checkpoint is saved: it survives a machine crash too)."""
        if self._fd is not None:
            os.fsync(self._fd)

    def compact(self, acked: int) -> bool:
        """Empty the file when ``acked`` is its size (the sidecar says 0 first); True when emptied."""
        with self._append_lock:
            if self._fd is None or os.fstat(self._fd).st_size != acked:
                return False
            self.save_state(acked=0)
            os.ftruncate(self._fd, 0)
            return True

    def close(self, delete: bool = False) -> None:
        """Let go of the file and the lock; with ``delete``, remove it and its sidecar first."""
        if delete:
            self.path.unlink(missing_ok=True)
            self.sidecar.unlink(missing_ok=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def size(self) -> int:
        """The file's size in bytes (0 when it does not exist)."""
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def read(self, offset: int, max_points: int, max_entries: int) -> tuple[list[tuple[dict, int]], bool]:
        """Complete entries from ``offset``: a run of log entries (at most ``max_points`` points, one
        at least) or one other entry, each with the offset after it; and whether more follow."""
        found: list[tuple[dict, int]] = []
        points = 0
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return found, False
        with handle:
            handle.seek(offset)
            for line in handle:
                if not line.endswith(b"\n"):
                    break  # being written
                try:
                    entry = json.loads(line)
                except ValueError:
                    logger.warning("MLflowLogger: skipping a corrupt line at byte %d of %s.", offset,
                                   self.path)
                    entry = {"kind": "corrupt"}
                size = len(entry.get("metrics", ())) + len(entry.get("summary", ())) or 1
                if found and (entry.get("kind") != "log" or found[0][0].get("kind") != "log"
                              or points + size > max_points or len(found) >= max_entries):
                    return found, True
                offset += len(line)
                found.append((entry, offset))
                points += size
        return found, False

    def count_logs(self, offset: int) -> int:
        """Log entries past ``offset`` (for messages)."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(offset)
                return sum(line.startswith(b'{"kind": "log"') and line.endswith(b"\n") for line in handle)
        except OSError:
            return 0


class Sender:
    """Sends a `WriteAheadLog` to its run from the acknowledged offset, in order, in batches; retries
    transient errors with backoff, drops a refused entry alone (docs/architecture.md).

    Args:
        wal: The log.
        backend: The store (MLflow's: ``is_transient``, ``send_interval``, ``max_metrics_per_batch``).
        run_key: The run's key (finds the run when its id is not known).
        run_id: The run's id, when known (else the sidecar's). Defaults to None.
        resume: The run may exist already. Defaults to True.
        name: Shown in messages. Defaults to the backend's name.
        backoff: ``(initial, max)`` retry delays in seconds. Defaults to (0.5, 30).
        on_run_id: Called with the run's id once it is open. Defaults to None.
        for_target: Builds the backend another log's sidecar names; with it, other runs' logs in the
            folder for the same store are sent once the run is open. Defaults to None.
    """

    def __init__(self, wal: WriteAheadLog, backend: Backend, run_key: Optional[str],
                 run_id: Optional[str] = None, resume: bool = True, name: Optional[str] = None,
                 backoff: tuple[float, float] = (0.5, 30.0),
                 on_run_id: Optional[Callable[[str], None]] = None,
                 for_target: Optional[Callable[[dict], Backend]] = None) -> None:
        state = wal.state()
        self.wal, self.backend, self.name = wal, backend, name or backend.name
        self.run_key = run_key or state.get("run_key")
        self.run_id: Optional[str] = run_id or state.get("run_id")
        self.resume = resume or self.run_id is not None
        self.acked = int(state.get("acked") or 0)
        self.held: Optional[dict[str, int]] = state.get("held")
        self.backoff, self.on_run_id, self.for_target = backoff, on_run_id, for_target
        #: Entries sent and records the store refused (dropped), in this process.
        self.sent = self.dropped = 0
        #: Why the run could not start (told once; nothing is sent then).
        self.start_error: Optional[BaseException] = None
        self._started = self._closing = self._abandoned = False
        self._down_since: Optional[float] = None
        self._call_started: Optional[float] = None
        self._deadline = float("inf")
        self._isolate_until = self._flushing = self._compactions = 0
        self._last_send = 0.0
        self._refused: dict[str, int] = {}
        self._wake = threading.Event()
        self._progress = threading.Condition()
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
            self._down_since = started
            logger.warning("%s: the store has not answered a call for %.0f s (mlflow retries inside the "
                           "call: MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_TIMEOUT). Training "
                           "continues; records wait in %s and are sent in order when it answers.", self.name,
                           silent, self.wal.path)

    def flush(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until everything appended so far is acknowledged."""
        target, end, compactions = self.wal.size(), time.monotonic() + timeout, self._compactions
        self._flushing += 1
        self._wake.set()
        try:
            with self._progress:
                while self.acked < target and compactions == self._compactions and self._thread.is_alive():
                    if time.monotonic() >= end:
                        return False
                    self._progress.wait(min(end - time.monotonic(), 0.2))
        finally:
            self._flushing -= 1
        return self.acked >= target or compactions != self._compactions

    def close(self, status: str, timeout: float, grace: float, while_down: bool = True) -> bool:
        """Send what is left for at most ``timeout`` seconds (``grace`` more for a call in flight; without
        ``while_down``, not once the store is unreachable), then stop; warn about what is left.

        Returns:
            True when everything was acknowledged.
        """
        self._closing, self._deadline = True, time.monotonic() + timeout
        self._wake.set()
        end = self._deadline
        while self._thread.is_alive() and time.monotonic() < end:
            self._thread.join(min(0.05 if self.down else 0.5, max(0.0, end - time.monotonic())))
            self.check_silence()
            if self.down and not while_down:
                self._deadline = end = time.monotonic()
                self._wake.set()
            if time.monotonic() >= self._deadline and self._call_started is not None:
                end = self._deadline + grace
        if self._thread.is_alive():
            self._abandoned = True  # stuck in a call: it writes nothing more
        if self.acked >= self.wal.size():
            return True
        reason = self._why_not_delivered()
        if self._started and self._down_since is None and not self._thread.is_alive():
            try:  # the run gets its status now; the log keeps the rest (and the status) for later
                self.backend.finish(status, self.run_id)
            except Exception as error:
                reason += f"; its status {status} could not be set either ({type(error).__name__}: {error})"
        logger.warning("%s: %d record(s) were not delivered (%s); they are kept in %s. Resuming this run "
                       "sends them, or %s.", self.name, self.wal.count_logs(self.acked), reason,
                       self.wal.path, replay_hint(self.wal.path))
        return False

    def _why_not_delivered(self) -> str:
        if self.start_error is not None:
            error = self.start_error
            return f"the run could not start: {type(error).__name__}: {str(error)[:200]}"
        if self._call_started is not None:
            return f"a call to the store had not answered after {time.monotonic() - self._call_started:.0f} s"
        if self._down_since is not None:
            return f"the store was unreachable for the last {time.monotonic() - self._down_since:.0f} s"
        if not self._started:
            return "the run did not open within the close deadline"
        return "the store was too slow to take them within the close deadline"

    def send_to_end(self) -> None:
        """Send everything on this thread (``replay``); raise on a failure other than a refused record."""
        self._closing = True
        if not self._started:
            self._start_run()
        while True:
            entries, _ = self._next_batch()
            if not entries:
                return
            if self._attempt(self._send, entries) == "transient":
                raise self._last_error

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:  # never let an exception escape the thread: the entries stay in the file
            logger.exception("%s: the sender hit an unexpected error; what is not sent stays in %s.",
                             self.name, self.wal.path)

    def _loop(self) -> None:
        backoff = self.backoff[0]
        while not self._abandoned and time.monotonic() < self._deadline:
            if not self._started:
                outcome = self._attempt(self._start_run)
                if outcome == "fatal":
                    return
                if outcome == "ok":
                    self._replay_siblings()
                    continue
            else:
                backlog = self.wal.size() - self.acked
                left = self._last_send + getattr(self.backend, "send_interval", 0.0) - time.monotonic()
                if 0 < backlog < FULL_BATCH_BYTES and left > 0 and not (self._closing or self._flushing):
                    self._wait(min(left, POLL_SECONDS))  # gather about a second's records in one call
                    continue
                entries, _ = self._next_batch()
                if not entries:
                    if self._closing:
                        return
                    if self.acked >= COMPACT_BYTES and self.wal.compact(self.acked):
                        self._compactions += 1
                        self._ack(0)
                    self._wait(POLL_SECONDS)
                    continue
                outcome = self._attempt(self._send, entries)
                self._last_send = time.monotonic()
                if outcome != "transient":
                    backoff = self.backoff[0]
                    continue
            self._wait(max(0.0, min(backoff, self._deadline - time.monotonic())))
            backoff = min(backoff * 2, self.backoff[1])

    def _wait(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def _next_batch(self) -> tuple[list[tuple[dict, int]], bool]:
        if self.wal.size() <= self.acked:
            return [], False
        limit = CALL_BATCHES * (getattr(self.backend, "max_metrics_per_batch", None) or 1000)
        return self.wal.read(self.acked, limit, 1 if self.acked < self._isolate_until else BATCH_ENTRIES)

    def _start_run(self) -> None:
        self.run_id = self.backend.start(self.run_id, self.run_key, self.resume)
        self._started = True
        if not self._abandoned:
            self.wal.save_state(run_id=self.run_id)
        if self.on_run_id is not None:
            self.on_run_id(self.run_id)

    def _send(self, entries: list[tuple[dict, int]]) -> None:
        """Send one batch; acknowledge it once the store answered."""
        backend, run_id, first = self.backend, self.run_id, entries[0][0]
        kind = first.get("kind")
        if kind == "log":
            records = [record for record in map(self._unheld, (entry for entry, _ in entries)) if record]
            if records:
                backend.log(records, run_id)
        elif kind == "params":
            backend.log_config(first["params"], run_id)
        elif kind == "file":
            backend.log_file(first["folder"], first["name"], first.get("type", "model"), run_id)
        elif kind == "boundary":
            self.held = backend.logged_steps(run_id)
        elif kind == "finish" and entries[-1][1] >= self.wal.size():  # the last entry: the session ended
            backend.finish(first["status"], run_id)
        self.sent += len(entries)
        self._ack(entries[-1][1])

    def _unheld(self, entry: dict) -> Optional[LogRecord]:
        """The entry's record without the points at or below the boundary in force."""
        step, metrics, held = int(entry["step"]), entry.get("metrics") or {}, self.held
        if held:
            metrics = {key: value for key, value in metrics.items() if step > held.get(key, -1)}
        summary = entry.get("summary") or {}
        return LogRecord(step, int(entry["time"]), metrics, summary) if metrics or summary else None

    def _ack(self, offset: int) -> None:
        if self._abandoned:
            return
        self.wal.save_state(acked=offset, held=self.held)
        with self._progress:
            self.acked = offset
            self._progress.notify_all()

    def _attempt(self, function: Callable[..., None], *args: Any) -> str:
        """Run ``function``: "ok", "transient" (retry), "dropped" (a refused entry) or "fatal" (no run)."""
        self._call_started = time.monotonic()
        try:
            function(*args)
        except Exception as error:  # the store must never crash training
            self._last_error = error
            return self._failed(error, args[0] if args else None)
        finally:
            self._call_started = None
        if self._down_since is not None:
            logger.warning("%s: the store is reachable again after %.1f s; sending what waited in order.",
                           self.name, time.monotonic() - self._down_since)
            self._down_since = None
        return "ok"

    def _failed(self, error: Exception, entries: Optional[list[tuple[dict, int]]]) -> str:
        if getattr(self.backend, "is_transient", lambda error: True)(error):
            if self._down_since is None:
                self._down_since = self._call_started or time.monotonic()
                logger.warning("%s: the store is unreachable (%s: %s); records wait in %s and are sent in "
                               "order when it answers.", self.name, type(error).__name__, str(error)[:300],
                               self.wal.path)
            return "transient"
        if entries is None:
            self.start_error = error
            logger.error("%s: could not start the run (%s: %s). Nothing is sent; the records stay in %s.",
                         self.name, type(error).__name__, str(error)[:500], self.wal.path)
            return "fatal"
        if len(entries) > 1:  # send them one by one: only the refused one is dropped
            self._isolate_until = entries[-1][1]
            return "dropped"
        entry, kind = entries[0][0], type(error).__name__
        what = (f"the record of step {entry.get('step')} ({', '.join(list(entry.get('metrics', {}))[:5])})"
                if entry.get("kind") == "log" else f"a {entry.get('kind')} entry")
        told = self._refused[kind] = self._refused.get(kind, 0) + 1
        if told <= REFUSALS_TOLD:
            logger.warning("%s: the store refused %s, which is dropped; the other records are sent (%s: %s).",
                           self.name, what, kind, str(error)[:300])
        if told == REFUSALS_TOLD:
            logger.error("%s: the store has refused %d records with %s; further ones are dropped without "
                         "being listed. If the records look right, this looks like a fault of the logger or "
                         "the store: please report it with this message (%s).", self.name, told, kind,
                         str(error)[:300])
        self.dropped += 1
        self._ack(entries[0][1])
        return "dropped"

    def _replay_siblings(self) -> None:
        """Send the logs other runs left in this folder for the same store, each to its own run."""
        if self._thread is None or self.for_target is None:
            return
        mine = self.wal.state()
        for path in find_logs(self.wal.path.parent):
            theirs = WriteAheadLog(path)
            state = theirs.state()
            if (path == self.wal.path or theirs.size() <= int(state.get("acked") or 0)
                    or any(state.get(key) != mine.get(key)
                           for key in ("logger", "tracking_uri", "experiment_name"))):
                continue
            try:
                sent = replay(path, self.for_target)
                logger.warning("%s: sent %d entries an earlier training left in %s to run %s.", self.name,
                               sent.sent, path, sent.run_id)
            except Exception as error:  # kept for a later run or a replay
                logger.warning("%s: could not send what %s holds (%s: %s); %s.", self.name, path,
                               type(error).__name__, str(error)[:300], replay_hint(path))


def find_logs(folder: Union[str, Path]) -> list[Path]:
    """The write-ahead logs under ``folder``: every ``*.jsonl`` with a sidecar."""
    return sorted(file for file in Path(folder).rglob("*.jsonl") if file.with_suffix(".json").is_file())


def replay(path: Union[str, Path], for_target: Callable[[dict], Backend]) -> Sender:
    """Send a write-ahead log past its acknowledged offset to its run, remove it; return the `Sender`.

    Args:
        path: The log (``<run key>.jsonl``).
        for_target: Builds the backend its sidecar names (``MLflowBackend.for_target``).

    Raises:
        RuntimeError: A training (or another replay) holds the log.
        Exception: What the store raised (the log is kept).
    """
    wal = WriteAheadLog(path)
    fd = os.open(wal.path, os.O_RDONLY)
    try:
        if not _lock(fd, 0.0):
            raise RuntimeError(f"{wal.path} is in use by a running training (or another replay), which "
                               "sends it")
        state = wal.state()
        sender = Sender(wal, for_target(state), state.get("run_key"), state.get("run_id"))
        if wal.size() > sender.acked:
            sender.send_to_end()
        wal.close(delete=True)
    finally:
        os.close(fd)
    return sender
