"""The store a tracking URI names (`Store`), and the helper process that makes it and writes its large
calls (docs/architecture.md, "Who writes a local store", "Who makes a new store"). The helper process
imports only the standard library and mlflow.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import logging
import os
import pickle
import re
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator, Optional
from urllib.parse import urlparse

__all__ = ["HelperEnded", "Store", "StoreCallFailed", "StoreHelper", "explain_mlflow_error",
           "is_transient_mlflow_error", "make_store", "store_is_made"]

#: The helper starts once this process has spent this long in the calls it would take.
START_AFTER_SECONDS = 1.0
#: How long `StoreHelper.close` waits for an idle helper to end.
CLOSE_SECONDS = 5.0
#: How long `make_store` waits for another process to finish a store it is making.
WAIT_SECONDS = 60.0
#: MLflow error codes of a store that may answer later (the request itself was fine).
_TRANSIENT_ERROR_CODES = frozenset({"TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED", "INTERNAL_ERROR",
                                    "DEADLINE_EXCEEDED"})
#: What an MLflow error message shows of an HTTP 5xx/429 answer or of retries given up.
_TRANSIENT_MESSAGE = re.compile(
    r"max retries exceeded|too many \d{3} error responses|error code (5\d\d|429)\b|"
    r"\b(5\d\d|429) (server error|too many requests)|database is locked", re.IGNORECASE)


class StoreCallFailed(Exception):
    """An MLflow call that failed in the helper, as the helper classified it (a pickled exception loses
    its cause and error code): `explain_mlflow_error`'s ``cause`` and ``kind``, and ``transient``,
    `is_transient_mlflow_error`'s verdict."""

    message_is_cause = True

    def __init__(self, cause: str, transient: bool, kind: Optional[str]) -> None:
        super().__init__(cause)
        self.transient, self.kind = transient, kind


def is_transient_mlflow_error(error: BaseException) -> bool:
    """Tell whether an error of an MLflow call may clear by itself (worth retrying): a connection or
    timeout error, an MLflow error of a transient code or an HTTP 5xx/429, a locked sqlite database, or
    an error caused by one of these. Anything else (a refused value, a missing run, a bug) is permanent."""
    transient = getattr(error, "transient", None)
    if isinstance(transient, bool):  # the helper process's verdict
        return transient
    import requests  # both installed with mlflow
    import urllib3

    web, lost = requests.exceptions, urllib3.exceptions
    network = (ConnectionError, TimeoutError, web.ConnectionError, web.Timeout, lost.MaxRetryError,
               lost.NewConnectionError, lost.ProtocolError, lost.TimeoutError)
    for _ in range(5):  # the error and what caused it (``raise ... from``)
        if error is None:
            return False
        code = getattr(error, "error_code", None)
        if isinstance(error, network) or isinstance(code, str) and (
                code in _TRANSIENT_ERROR_CODES or _TRANSIENT_MESSAGE.search(str(error))):
            return True
        if type(error).__name__ == "OperationalError" and "database is locked" in str(error):
            return True  # sqlite3's, or SQLAlchemy's around it
        error = error.__cause__
    return False


def explain_mlflow_error(error: BaseException, uri: Optional[str] = None) -> tuple[str, Optional[str]]:
    """Why an MLflow call failed, whole, and its kind: ``"refused"``, ``"dns"`` or ``"tls"`` (the server
    cannot be reached, and waiting does not change that), ``"auth"`` (it refused the credentials),
    ``"timeout"``, or None (anything else: the error's own message, cut only past 1000 characters)."""
    if getattr(error, "message_is_cause", False):  # told already: the helper's verdict, an unreachable store
        return str(error), getattr(error, "kind", None)
    chain: list[BaseException] = []
    while error is not None and len(chain) < 10 and error not in chain:
        chain.append(error)
        reason = getattr(error, "reason", None)  # urllib3's MaxRetryError
        reason = reason if isinstance(reason, BaseException) else None
        error = error.__cause__ or error.__context__ or reason
    text = " ".join(str(each) for each in chain)
    parsed = urlparse(uri or "")
    try:
        port = parsed.port or {"http": 80, "https": 443}.get(parsed.scheme)
    except ValueError:
        port = None
    place = f"{parsed.hostname}:{port}" if parsed.hostname else "the server"
    code = getattr(chain[0], "error_code", None)
    if any(isinstance(each, ConnectionRefusedError) for each in chain) or "Connection refused" in text:
        return (f"connection refused at {place}: nothing listens there (is the server running, and is the "
                "port right?)"), "refused"
    if any(isinstance(each, socket.gaierror) for each in chain) or "Failed to resolve" in text:
        return (f"the host name {parsed.hostname or ''!r} does not resolve (is it spelled right, and is this "
                "machine on its network?)"), "dns"
    tls = [each for each in chain if isinstance(each, ssl.SSLError)]
    if tls or "SSLError" in text:
        return (f"the TLS handshake with {place} failed ({tls[-1] if tls else text[-300:]}): an http:// "
                "server addressed as https://, or its certificate (MLFLOW_TRACKING_SERVER_CERT_PATH, "
                "MLFLOW_TRACKING_INSECURE_TLS)"), "tls"
    if code == "UNAUTHENTICATED" or "error code 401" in text:
        return (f"{place} refused the credentials (HTTP 401): set MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN"), "auth"
    if code == "PERMISSION_DENIED" or "error code 403" in text:
        return (f"{place} refused access (HTTP 403): the credentials lack a permission on the experiment or "
                "the run"), "auth"
    if any("timeout" in type(each).__name__.lower() for each in chain) or "timed out" in text:
        return (f"no answer from {place} within the request timeout (MLFLOW_HTTP_REQUEST_TIMEOUT, "
                "MLFLOW_HTTP_REQUEST_MAX_RETRIES)"), "timeout"
    message = f"{type(chain[0]).__name__}: {chain[0]}"
    if len(message) > 1000:
        message = f"{message[:1000].rsplit(' ', 1)[0]} ... ({len(message) - 1000} more characters)"
    return message, None


@dataclass(frozen=True)
class Store:
    """A tracking URI, parsed once.

    Attributes:
        uri: As MLflow is given it; a local store's path absolute (a replay from another folder reaches
            the same store, and MLflow caches a store per URI string).
        scheme: Lower case; a one-word remote URI's word.
        kind: ``"sqlite"`` or ``"file"`` (a local store at ``path``), ``"database"`` (another SQLAlchemy
            database), ``"memory"`` (in-memory sqlite), ``"remote"`` (a server, Databricks, a plugin's).
    """

    uri: str
    scheme: str
    kind: str
    path: Optional[str] = None

    @classmethod
    def parse(cls, uri: str) -> Store:
        """Parse ``uri`` (a URI or a local path) as MLflow's registry of stores does."""
        from mlflow.store.db.db_types import DATABASE_ENGINES

        scheme = urlparse(uri).scheme.lower()
        if uri in ("databricks", "databricks-uc", "uc"):  # MLflow's one-word remote stores
            return cls(uri, uri, "remote")
        if len(scheme) <= 1 or scheme == "file":  # a path, a Windows drive letter, file:
            from mlflow.utils.file_utils import local_file_uri_to_path

            path = os.path.abspath(local_file_uri_to_path(uri))
            return cls(path, "file", "file", path)
        base, _, rest = uri.partition(":///")
        path = rest.split("?", 1)[0]
        if scheme.split("+")[0] == "sqlite":
            if not path or path == ":memory:":
                return cls(uri, scheme, "memory")
            return cls(f"{base}:///{os.path.abspath(path)}{rest[len(path):]}", scheme, "sqlite",
                       os.path.abspath(path))
        return cls(uri, scheme, "database" if scheme.split("+")[0] in DATABASE_ENGINES else "remote")

    @property
    def written_here(self) -> bool:
        """MLflow writes it in the calling process (a helper process reaches the same store)."""
        return self.kind in ("sqlite", "file", "database")

    @property
    def http(self) -> bool:
        """An ``http(s)://`` server."""
        return self.scheme in ("http", "https")


def _on_engine(uri: str, call: Any) -> Any:
    """``call(engine)`` on a new SQLAlchemy engine for ``uri``."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(uri)
    try:
        return call(engine)
    finally:
        engine.dispose()


def store_is_made(store: Store) -> bool:
    """Whether a store `Store.written_here` has every table of MLflow's models (MLflow's own test): opening
    it runs no migration. One its maker holds locked is not."""
    if store.path is not None and not os.path.exists(store.path):
        return False
    if store.kind == "file":
        return True
    from mlflow.store.db.utils import _all_tables_exist
    from sqlalchemy.exc import OperationalError

    try:
        return _on_engine(store.uri, _all_tables_exist)
    except OperationalError as error:
        if "locked" not in str(error):
            raise
        return False


def make_store(store: Store) -> None:
    """Make the store whole, in the helper process only (alembic's state is process-wide).

    A sqlite or file store that does not exist is made as ``<store>.creating-<pid>`` and moved to its
    place unless a store appeared there meanwhile, which is used, never replaced; the next creation
    removes the draft of a process that died. Another database gets MLflow's tables at once when it has
    none. A store someone else is making is waited for, at most `WAIT_SECONDS`; one still not whole
    then is made whole as MLflow does when it opens one.
    """
    if store.path is not None and not os.path.exists(store.path):
        for draft in glob.glob(f"{glob.escape(store.path)}.creating-*"):  # with their journal files
            try:
                os.kill(int(re.match(r"\d+", draft[len(f"{store.path}.creating-"):]).group()), 0)
            except ProcessLookupError:
                _remove(draft)
            except (AttributeError, OSError):
                continue
        draft = f"{store.path}.creating-{os.getpid()}"
        os.makedirs(os.path.dirname(store.path), exist_ok=True)
        try:
            if store.kind == "sqlite":
                from mlflow.store.db.utils import _safe_initialize_tables

                _on_engine(f"sqlite:///{draft}", _safe_initialize_tables)
            else:
                from mlflow.store.tracking.file_store import FileStore
                from mlflow.utils.file_utils import path_to_local_file_uri

                FileStore(draft, path_to_local_file_uri(store.path))
            _move_unless_there(draft, store.path)
        finally:
            _remove(draft)
    if store.kind == "file":
        return
    from mlflow.store.db.utils import _is_empty_database, _safe_initialize_tables

    deadline = time.monotonic() + WAIT_SECONDS
    while not store_is_made(store):
        empty = store.kind == "database" and _on_engine(store.uri, _is_empty_database)
        if empty or time.monotonic() >= deadline:
            try:
                _on_engine(store.uri, _safe_initialize_tables)
            except Exception:  # made meanwhile by another (a database refuses the second maker)
                if not store_is_made(store):
                    raise
            return
        time.sleep(0.1)


def _move_unless_there(source: str, target: str) -> None:
    """Rename ``source`` to ``target`` unless ``target`` exists, which is never replaced: Linux's
    ``renameat2(RENAME_NOREPLACE)``; without it, a hard link for a file, and for a folder a rename,
    which replaces at most an empty folder."""
    try:
        try:
            if ctypes.CDLL(None, use_errno=True).renameat2(-100, os.fsencode(source), -100,  # AT_FDCWD
                                                            os.fsencode(target), 1):  # RENAME_NOREPLACE
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), target)
        except (AttributeError, OSError) as error:
            if getattr(error, "errno", errno.ENOSYS) not in (errno.ENOSYS, errno.EINVAL):
                raise
            os.rename(source, target) if os.path.isdir(source) else os.link(source, target)
    except OSError as error:
        if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


class HelperEnded(ConnectionError):
    """The helper process could not start or ended; the message says how (its exit code)."""


def _write(stream: BinaryIO, value: Any) -> None:
    pickle.dump(value, stream, protocol=pickle.HIGHEST_PROTOCOL)
    stream.flush()


def _read(stream: BinaryIO) -> Any:
    """One value from the pipe (a pickle ends itself). Raises ``EOFError`` when the pipe closed."""
    try:
        return pickle.load(stream)
    except pickle.UnpicklingError as error:  # cut short
        raise EOFError("the pipe closed") from error


class StoreHelper:
    """A helper process that makes a store (`make_store`) and takes its large ``log_batch`` calls; one
    thread calls it at a time (the sender's). A call that finds the helper ended raises `HelperEnded`
    and the next one starts another; a call that failed in the helper raises `StoreCallFailed`.

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
        spent `START_AFTER_SECONDS` in such calls (the helper is started then) and the helper is up."""
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
        """``MlflowClient.log_batch`` in the helper; metrics as ``(key, value, timestamp, step)``."""
        self._call((run_id, metrics, tags))

    def make_store(self) -> None:
        """`make_store` in the helper."""
        self._call("make")

    def _call(self, call: Any) -> None:
        self._calling = True
        try:
            self.start()
            with self._ended_as_error():
                _write(self._process.stdin, call)
                answer = _read(self._process.stdout)
        finally:
            self._calling = False
        if answer is not None:
            raise StoreCallFailed(*answer)

    def start(self, timeout: Optional[float] = None) -> bool:
        """Start the helper if none runs; whether it is up (it has imported mlflow) within ``timeout``
        seconds (None: wait until it is)."""
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
        """A failure of the pipe as `HelperEnded`; the dead helper is forgotten."""
        try:
            yield
        except (OSError, EOFError) as error:
            process, self._process, self._up = self._process, None, False
            if process is None:
                raise HelperEnded(f"the helper process did not start ({error})") from error
            try:
                code = process.wait(CLOSE_SECONDS)
            except subprocess.TimeoutExpired:
                code = None
            raise HelperEnded(f"the helper process writing the store ended (exit code {code})") from error

    def close(self) -> None:
        """End the helper: one still starting is stopped; a call in flight (an abandoned sender's) is not
        waited for, the helper ends after it."""
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
    """The helper: answer ``"make"`` and each ``(run_id, metrics, tags)`` with None or ``(cause, transient,
    kind)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the answers
    calls = sys.stdin.buffer
    store = Store.parse(_read(calls))
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # its INFO lines the training printed already
    _write(answers, "up")
    client = None
    while True:
        try:
            call = _read(calls)
        except EOFError:
            return
        try:
            if call == "make":
                make_store(store)
            else:
                run_id, metrics, tags = call
                client = client or MlflowClient(store.uri)  # in the call: a locked store is an answer
                client.log_batch(run_id, metrics=[Metric(*metric) for metric in metrics],
                                 tags=[RunTag(*tag) for tag in tags], synchronous=True)
            answer = None
        except Exception as error:  # told to the sender, which retries or drops the record
            cause, kind = explain_mlflow_error(error, store.uri)
            answer = (cause, is_transient_mlflow_error(error), kind)
        _write(answers, answer)


if __name__ == "__main__":
    main()
