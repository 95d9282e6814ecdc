"""Helpers for the example tests: run an example's ``main(argv)`` in this process, tiny sizes.

Every example has ``main(argv: list[str] | None = None)``; the tests call it here (no new
interpreter, no second torch/transformers import) with the environment an example run gets
(:data:`EXAMPLE_ENV`, W&B offline under the test's folder) and the test's folder as the
working directory. One test runs an example as a command (``test_examples.py``).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

#: Sizes that make the demo pipeline train in a few seconds.
TINY = ["--n-train", "96", "--n-eval", "48", "--subset-size", "32", "--eval-steps", "3",
        "--batch-size", "16", "--hidden-size", "32"]


def example_env(tmp_path: Path) -> dict[str, str]:
    """The variables an example run gets (on top of the test process's own)."""
    return {
        "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
        "WANDB_DIR": str(tmp_path), "TOKENIZERS_PARALLELISM": "false", "EXAMPLES_TINY": "1",
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'env-mlflow.db'}",
    }


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` as the module ``<name>`` (as its own imports see it); the
    variables it sets by default at import are taken back, so they never leak into other tests."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    environ = dict(os.environ)
    try:
        module = importlib.import_module(name)
    finally:
        os.environ.clear()
        os.environ.update(environ)
    if Path(module.__file__).resolve().parent != EXAMPLES:
        raise RuntimeError(f"module {name!r} is {module.__file__}, not the example: rename the example")
    return module


def run_main(name: str, argv: list[str], tmp_path: Path, monkeypatch, capsys):
    """``examples/<name>.py``'s ``main(argv)`` in this process; returns ``(result, stdout)``."""
    module = load_example(name)
    for key, value in example_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.chdir(tmp_path)
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None  # the demo sets it
    try:
        result = module.main(argv)
    finally:
        if threads is not None:
            torch.set_num_threads(threads)
    return result, capsys.readouterr().out


def run_command(tmp_path: Path, command: list[str], timeout: float = 240,
                unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run ``command`` in ``tmp_path`` with :func:`example_env` less the variables in ``unset``;
    fail with its output when it fails."""
    env = {**os.environ, **example_env(tmp_path), "PYTHONPATH": str(ROOT)}
    for name in ("RANK", *unset):
        env.pop(name, None)
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        pytest.fail(f"{command} exited with {result.returncode}\n--- stdout\n{result.stdout[-6000:]}"
                    f"\n--- stderr\n{result.stderr[-6000:]}")
    return result
