"""The package and the lightweight loop work in a fresh venv WITHOUT torch, transformers or tqdm.

A wheel is built from a copy of the sources (no network: ``--no-deps --no-build-isolation``
with the dev venv's setuptools), installed into a new ``python -m venv`` with its
dependencies but no index (so any declared dependency fails the install), and a script runs
a LightweightTrainer with callbacks, ``EarlyStopping`` and ``JsonlLogger`` there.

The venv is cached by the digest of what it installs (the wheel's sources, the python and
setuptools versions) under ``$XDG_CACHE_HOME/hf-callbacks-plus-tests`` (``~/.cache/...``):
a run with unchanged sources reuses it; any change to the package builds a new one.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scripts.build_docs import files_digest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import sys
    import hf_callbacks_plus
    from hf_callbacks_plus import LightweightTrainer, LoopArguments, TrainerCallback
    from hf_callbacks_plus.testing import EventRecorder

    for heavy in ("torch", "transformers", "tqdm"):
        try:
            __import__(heavy)
        except ModuleNotFoundError:
            pass
        else:
            raise SystemExit(f"{heavy} is importable in the standalone venv")

    class Stop(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 5:
                control.should_training_stop = True

    from hf_callbacks_plus import EarlyStopping, JsonlLogger

    recorder = EventRecorder(custom_events=["on_pre_log"])
    jsonl = JsonlLogger()  # the embedded logger needs nothing installed
    stopper = EarlyStopping("eval_accuracy", patience=10)  # neither does early stopping
    args = LoopArguments(output_dir=sys.argv[1], num_train_epochs=3, logging_steps=2, eval_strategy="epoch",
                         save_strategy="steps", save_steps=2, save_total_limit=1)
    trainer = LightweightTrainer(args, train_step=lambda batch: sum(batch) / len(batch),
                                 train_data=[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]],
                                 eval_fn=lambda data: {"accuracy": 0.5},
                                 callbacks=[Stop(), recorder, jsonl, stopper])
    output = trainer.train()
    assert output.global_step == 5, output
    assert recorder.count("on_evaluate") == 2 and recorder.count("on_pre_log") == recorder.count("on_log")
    assert type(trainer.callback_handler.callbacks[-1]).__name__ == "PrinterCallback"
    try:
        from hf_callbacks_plus.loop import ProgressCallback
        ProgressCallback()
    except ModuleNotFoundError as error:
        assert "hf-callbacks-plus[progress]" in str(error), error
    else:
        raise SystemExit("ProgressCallback worked without tqdm")
    lines = (__import__("pathlib").Path(sys.argv[1]) / "metrics.jsonl").read_text().splitlines()
    assert any('"eval/accuracy"' in line for line in lines), lines
    assert stopper.best_value == 0.5 and not stopper.stopped
    assert "transformers" not in sys.modules and "torch" not in sys.modules
    print("STANDALONE-OK", sorted(p.name for p in __import__("pathlib").Path(sys.argv[1]).iterdir()))
    """
)


#: What the wheel is built from (the package data, ``py.typed``, included).
WHEEL_SOURCES = ("pyproject.toml", "README.md", "hf_callbacks_plus")


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hf-callbacks-plus-tests"


def install_digest(repo: Path = REPO) -> str:
    """Digest of everything the standalone venv installs: the wheel's sources, python, setuptools."""
    salt = f"{sys.version}\0{sys.base_prefix}\0{importlib.metadata.version('setuptools')}"
    return files_digest(repo, WHEEL_SOURCES, salt=salt)[:16]


def build_standalone_venv(target: Path, work: Path) -> None:
    """Build the wheel from a copy of the sources and install it, without an index, into ``target``."""
    source = work / "src"
    source.mkdir()
    for name in WHEEL_SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, source / name)
    wheels = work / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
         str(source)],
        check=True, capture_output=True,
    )
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True, capture_output=True)
    wheel = next(wheels.glob("hf_callbacks_plus-*.whl"))
    subprocess.run(
        # with dependencies but no index: any declared dependency would make this fail
        [str(target / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", str(wheel)],
        check=True, capture_output=True,
    )


def standalone_python(tmp_path: Path) -> Path:
    """The cached venv's python for the sources as they are; built (and older ones removed) if new."""
    root = cache_root()
    venv = root / f"standalone-{install_digest()}"
    if not (venv / "complete").is_file():
        root.mkdir(parents=True, exist_ok=True)
        building = root / f"building-{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        work = tmp_path / "build"
        work.mkdir()
        build_standalone_venv(building, work)
        (building / "complete").touch()
        for old in root.glob("standalone-*"):
            shutil.rmtree(old, ignore_errors=True)
        try:
            building.rename(venv)  # atomic: a parallel run sees no venv or a complete one
        except OSError:
            shutil.rmtree(building, ignore_errors=True)  # another run was first: same digest, same venv
    return venv / "bin" / "python"


def test_lightweight_loop_in_venv_without_torch_or_transformers(tmp_path):
    python = standalone_python(tmp_path)
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [str(python), str(script), str(tmp_path / "out")], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "STANDALONE-OK ['checkpoint-4', 'metrics.jsonl']" in result.stdout
    assert "'train_loss'" in result.stdout  # PrinterCallback printed the final record
