"""Fixtures for the logger tests: a real ``mlflow server`` on 127.0.0.1, started once per session,
and a TCP proxy in front of it that a test cuts and restores (an outage without restarting the
server, which takes 20-30 s to start on the shared machine). The server runs in its own process
group, stopped by pid at the end of the session.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MlflowServer:
    """A real ``mlflow server --backend-store-uri sqlite:///...`` on 127.0.0.1."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.db = root / "mlflow.db"
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, wait: bool = True) -> None:
        mlflow_cli = Path(sys.executable).with_name("mlflow")
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 - owned by the process
        self.process = subprocess.Popen(
            [str(mlflow_cli), "server", "--backend-store-uri", f"sqlite:///{self.db}",
             "--default-artifact-root", str(self.root / "artifacts"),
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
        )
        if wait:
            self.wait_healthy()

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def wait_healthy(self, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.healthy():
                return
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.root / 'server.log').read_text()[-2000:]}")
            time.sleep(0.25)
        raise TimeoutError(f"mlflow server not healthy after {timeout} s")

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the group: uvicorn workers die too
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)
        self.process = None
        end = time.monotonic() + 10
        while self.healthy() and time.monotonic() < end:
            time.sleep(0.1)


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to the server. `cut` closes every connection and the listening
    socket (the server unreachable: connections refused); `restore` listens again on the same port.
    ``lose_answers[marker] = n``: the answers to the next ``n`` requests whose first bytes hold
    ``marker`` never come back (fault injection: the server did the work, then the connection died)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.lose_answers: dict[bytes, int] = {}
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            connections, self._open = self._open, set()
        if listener is not None:
            listener.close()
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            connection.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # cut
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    client.close()
                    upstream.close()
                    return
                self._open.update((client, upstream))
            lose = threading.Event()  # set by the request side, read by the answer side
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, target, lose, source is client),
                                 daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, lose: threading.Event,
              requests: bool) -> None:
        try:
            while data := source.recv(65536):
                with self._lock:
                    marker = next((m for m, n in self.lose_answers.items() if n and m in data[:300]), None)
                    if requests and marker is not None:
                        self.lose_answers[marker] -= 1
                        lose.set()
                if not requests and lose.is_set():
                    break  # the answer is dropped with the connection
                target.sendall(data)
        except OSError:
            pass
        for end in (source, target):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    pytest.importorskip("mlflow")
    server = MlflowServer(tmp_path_factory.mktemp("mlflow_server"))
    server.start()
    yield server
    server.stop()


#: Environment variables of the trackers a test must not inherit from the caller's shell.
TRACKER_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID", "MLFLOW_TAGS",
               "MLFLOW_NESTED_RUN", "MLFLOW_RUN_NAME", "MLFLOW_MAX_LOG_PARAMS",
               "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "RANK",
               "TENSORBOARD_LOGGING_DIR")


@pytest.fixture(autouse=True)
def clean_tracker_env(monkeypatch):
    """Every logger test starts without the trackers' environment variables of the caller."""
    for name in TRACKER_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def mlflow_proxy(mlflow_server):
    """A `TcpProxy` to the session's server, for this test only."""
    proxy = TcpProxy(mlflow_server.port)
    yield proxy
    proxy.cut()


@pytest.fixture(scope="session")
def _template_db(tmp_path_factory) -> Path:
    """An initialized MLflow sqlite store (creating the schema takes seconds), copied per test."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow_template") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def sqlite_uri(tmp_path, _template_db) -> str:
    """A fresh, already initialized MLflow sqlite store in the test's temp dir."""
    shutil.copy(_template_db, tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"
