"""Helpers for the example tests: run an example script in a subprocess, tiny sizes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

#: Sizes that make the demo pipeline train in a few seconds.
TINY = ["--n-train", "96", "--n-eval", "48", "--subset-size", "32", "--eval-steps", "3",
        "--batch-size", "16", "--hidden-size", "32", "--no-progress"]


def example_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DIR": str(tmp_path),
        "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'env-mlflow.db'}",
    })
    env.pop("RANK", None)
    return env


def run_example(tmp_path: Path, script: str, *args: str, timeout: float = 240,
                command: list[str] | None = None) -> subprocess.CompletedProcess:
    """Run ``examples/<script>`` with ``args``; fail with its output when it exits non-zero."""
    command = command or [sys.executable]
    result = subprocess.run(
        [*command, str(EXAMPLES / script), *args], cwd=tmp_path, env=example_env(tmp_path),
        capture_output=True, text=True, timeout=timeout,
    )
    if result.returncode != 0:
        pytest.fail(f"{script} exited with {result.returncode}\n--- stdout\n{result.stdout[-6000:]}"
                    f"\n--- stderr\n{result.stderr[-6000:]}")
    return result
