"""Run a training script in a child process and SIGKILL it at the moment it names (the kill tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def kill_when_paused(script: str, args: list[str], paused: Path, log: Path, within: float = 180.0) -> None:
    """Run ``script args`` until it writes ``paused`` (then it waits on its stdin), SIGKILL it there.

    Fails the test when the run ends first or takes longer than ``within`` seconds; its stderr is in ``log``.
    """
    with log.open("w") as stderr:
        process = subprocess.Popen([sys.executable, script, *args], cwd=REPO,
                                   env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            deadline = time.monotonic() + within
            while not paused.exists():
                if process.poll() is not None:
                    pytest.fail(f"the run ended before the kill point: {log.read_text()[-3000:]}")
                assert time.monotonic() < deadline, f"the run did not reach the kill point in {within:.0f} s"
                time.sleep(0.05)
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            process.stdin.close()
    assert process.returncode == -signal.SIGKILL
