"""Fixtures for the logger tests: a real ``mlflow server`` on 127.0.0.1, started once per session.

The server takes 20-30 s to start on the shared CI machine, so it is started once and shared;
the outage test stops and restarts it (same port, same sqlite file) through :class:`MlflowServer`.
It runs in its own process group, stopped by pid at the end of the session.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
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


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    pytest.importorskip("mlflow")
    server = MlflowServer(tmp_path_factory.mktemp("mlflow_server"))
    server.start()
    yield server
    server.stop()


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
