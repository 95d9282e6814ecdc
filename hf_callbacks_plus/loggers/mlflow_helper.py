"""A store MLflow writes in the caller's process (sqlite, another database, a file store), written from a
helper process, as a tracking server writes its own store.

MLflow writes such a store with about 90 µs of SQLAlchemy work per point, holding the GIL. On the sender's
thread that work kept the training thread waiting for the GIL between its tensor operations: at 500
metrics a step ``train()`` of the 100 ms model took 55 % longer while the training thread's own CPU grew
3 % (docs/benchmarks.md). So large ``log_batch`` calls go over a pipe to one helper Python process that
holds its own ``MlflowClient``; the sender waits on the pipe without the GIL. Small calls stay in this
process, and so do the large ones until they have taken a second: the helper's import of mlflow costs
about 2.5 s of CPU, which a run that logs little never pays. The helper then starts in the background
and takes calls once it says it is up: no call waits for its start.

The helper classifies its own errors (`StoreCallFailed`: a pickled exception loses its cause and error
code), ignores SIGINT and SIGTERM (the training decides when to stop) and ends when its pipe closes: at
`StoreHelper.close`, or when this process ends, killed or not.
"""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional
from urllib.parse import urlparse

from .mlflow_errors import StoreCallFailed, explain_mlflow_error, is_transient_mlflow_error

__all__ = ["HelperEnded", "StoreHelper", "writes_in_process"]

#: Schemes of the stores MLflow writes in the calling process (SQLAlchemy dialects, a file store).
IN_PROCESS_SCHEMES = ("", "file", "sqlite", "postgresql", "mysql", "mssql")
#: The helper starts once this process has spent this long in the calls it would take: a run that
#: logs little never pays its start (mlflow's import: about 2.5 s of CPU).
START_AFTER_SECONDS = 1.0
#: Tracking URIs of one word that name a remote store (Databricks' profiles and Unity Catalog).
REMOTE_NAMES = ("databricks", "databricks-uc", "uc")
#: How long `StoreHelper.close` waits for an idle helper to end.
CLOSE_SECONDS = 5.0
_HEADER = struct.Struct("<Q")


class HelperEnded(ConnectionError):
    """The helper process could not start or ended; the message says how (its exit code)."""


def writes_in_process(uri: Optional[str]) -> bool:
    """Whether MLflow writes the store at ``uri`` from the calling process (not a server's)."""
    if (uri or "").lower() in REMOTE_NAMES:
        return False
    scheme = urlparse(uri or "").scheme.lower()
    return len(scheme) <= 1 or scheme.split("+")[0] in IN_PROCESS_SCHEMES  # a path, or a database


def _write(stream: BinaryIO, value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read(stream: BinaryIO) -> Any:
    header = stream.read(_HEADER.size)
    size = _HEADER.unpack(header)[0] if len(header) == _HEADER.size else -1
    data = stream.read(size) if size >= 0 else b""
    if size < 0 or len(data) < size:
        raise EOFError("the pipe closed")
    return pickle.loads(data)


class StoreHelper:
    """``log_batch`` calls to a local store, made by a helper process.

    Args:
        tracking_uri: The store (its real URI: it goes through the pipe, never on a command line).
        min_points: The smallest call it takes. Defaults to 1000 (MLflow's batch).
    """

    def __init__(self, tracking_uri: str, min_points: int = 1000) -> None:
        self.tracking_uri, self.min_points = tracking_uri, min_points
        #: Seconds this process spent in calls of ``min_points`` or more (`spent`).
        self.seconds_here = 0.0
        self._process: Optional[subprocess.Popen] = None
        self._up = self._calling = False

    def takes(self, points: int) -> bool:
        """Whether a call of ``points`` goes to the helper: ``min_points`` or more, once this process has
        spent `START_AFTER_SECONDS` in such calls (the helper is started then) and the helper is up. Never
        waits: until the helper has imported mlflow, calls stay here.

        Raises:
            HelperEnded: The helper could not start, or ended while starting.
        """
        return points >= self.min_points and self.seconds_here >= START_AFTER_SECONDS and self.start(0.0)

    def spent(self, points: int, seconds: float) -> None:
        """Count a call of ``points`` made from this process in ``seconds``."""
        if points >= self.min_points:
            self.seconds_here += seconds

    @property
    def pid(self) -> Optional[int]:
        """The helper's process id (None before it is started and after `close`)."""
        return None if self._process is None else self._process.pid

    def log_batch(self, run_id: str, metrics: list[tuple[str, float, int, int]],
                  tags: list[tuple[str, str]]) -> None:
        """``MlflowClient.log_batch`` in the helper (started and waited for when it is not up); metrics as
        ``(key, value, timestamp, step)``. One thread calls it (the sender's).

        Raises:
            StoreCallFailed: The call failed in the helper (classified there).
            HelperEnded: The helper could not start, or has ended.
        """
        self._calling = True
        try:
            self.start()
            with self._ended_as_error():
                _write(self._process.stdin, (run_id, metrics, tags))
                answer = _read(self._process.stdout)
        finally:
            self._calling = False
        if answer is not None:
            raise StoreCallFailed(*answer)

    def start(self, timeout: Optional[float] = None) -> bool:
        """Start the helper if none runs; whether it is up (it has imported mlflow) within ``timeout``
        seconds (None: wait until it is).

        Raises:
            HelperEnded: The helper could not start, or ended while starting.
        """
        with self._ended_as_error():
            if self._process is None:
                root = str(Path(__file__).resolve().parents[2])  # this package, as this process imported it
                path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
                self._process = subprocess.Popen(
                    [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    env={**os.environ, "PYTHONPATH": path}, start_new_session=True)
                _write(self._process.stdin, self.tracking_uri)
            answers = self._process.stdout
            if not self._up and (timeout is None or os.name != "posix"
                                 or select.select([answers], [], [], timeout)[0]):
                self._up = _read(answers) == "up"
        return self._up

    @contextmanager
    def _ended_as_error(self) -> Iterator[None]:
        try:
            yield
        except (OSError, EOFError) as error:
            process = self._process
            if process is None:
                raise HelperEnded(f"the helper process did not start ({error})") from error
            try:
                code = process.wait(CLOSE_SECONDS)
            except subprocess.TimeoutExpired:
                code = None
            raise HelperEnded(f"the helper process writing the store ended (exit code {code})") from error

    def close(self) -> None:
        """End the helper: one still starting is stopped; a call still in flight (an abandoned sender's) is
        not waited for, the helper ends after it. A later call starts a new helper."""
        process, self._process, up = self._process, None, self._up
        self._up = False
        if process is None:
            return
        try:
            process.stdin.close()
            if not up:
                process.kill()  # still importing mlflow: it has taken no call
            if not self._calling:
                process.wait(CLOSE_SECONDS)
                process.stdout.close()
        except (OSError, subprocess.TimeoutExpired):
            pass


def main() -> None:
    """The helper: answer each ``(run_id, metrics, tags)`` with None or ``(cause, transient, kind)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the answers
    calls = sys.stdin.buffer
    uri = _read(calls)
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # its INFO lines the training printed already
    _write(answers, "up")
    client = None
    while True:
        try:
            run_id, metrics, tags = _read(calls)
        except EOFError:
            return
        try:
            client = client or MlflowClient(uri)  # in the call: a locked store is an answer, not an exit
            client.log_batch(run_id, metrics=[Metric(*metric) for metric in metrics],
                             tags=[RunTag(*tag) for tag in tags], synchronous=True)
            answer = None
        except Exception as error:  # told to the sender, which retries or drops the record
            cause, kind = explain_mlflow_error(error, uri)
            answer = (cause, is_transient_mlflow_error(error), kind)
        _write(answers, answer)


if __name__ == "__main__":
    main()
