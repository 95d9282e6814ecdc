"""The package and the lightweight loop work in a fresh venv WITHOUT torch, transformers or tqdm.

A wheel is built from a copy of the sources (no network: ``--no-deps --no-build-isolation``
with the dev venv's setuptools), installed into a new ``python -m venv`` with its
dependencies but no index (so any declared dependency fails the install), and a script runs
a LightweightTrainer with callbacks, ``EarlyStopping`` and ``JsonlLogger`` there.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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


def test_lightweight_loop_in_venv_without_torch_or_transformers(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(
        REPO / "hf_callbacks_plus", source / "hf_callbacks_plus", ignore=shutil.ignore_patterns("__pycache__")
    )
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    wheel = next(wheels.glob("hf_callbacks_plus-*.whl"))
    subprocess.run(
        # with dependencies but no index: any declared dependency would make this fail
        [str(python), "-m", "pip", "install", "-q", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
    )
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [str(python), str(script), str(tmp_path / "out")], capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "STANDALONE-OK ['checkpoint-4', 'metrics.jsonl']" in result.stdout
    assert "'train_loss'" in result.stdout  # PrinterCallback printed the final record
