"""Run a stock transformers.Trainer with EarlyStopping that waits to be SIGKILLed at a chosen point.

Usage: python early_stopping_kill_script.py OUTPUT_DIR PAUSE

``PAUSE`` is ``<step>:between`` (after the step, between two checkpoints) or ``<step>:mid-save``
(inside the save of the checkpoint of that step: model and optimizer written, not yet
``trainer_state.json``). There the run writes ``OUTPUT_DIR/paused`` and waits on its standard
input (a fault-injection gate: the test kills it there; if the test goes away instead, stdin
closes and the run exits with code 3).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from transformers import TrainerCallback, TrainerState  # noqa: E402

from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping  # noqa: E402
from tests.callbacks.early_stopping_helpers import RESUME_SCRIPT, scripted_trainer  # noqa: E402

#: Where a run can be paused for the kill.
PAUSES = ("between", "mid-save")


def wait_for_the_kill(output_dir: str) -> None:
    Path(output_dir, "paused").touch()
    sys.stdin.read()  # returns only when the test closed our stdin without killing us
    sys.exit(3)


class PauseBetweenCheckpoints(TrainerCallback):
    """Fault injection: waits for the kill after step ``step`` (no checkpoint is being written)."""

    def __init__(self, step: int, output_dir: str) -> None:
        self.step, self.output_dir = step, output_dir

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            wait_for_the_kill(self.output_dir)


def pause_mid_save(step: int, output_dir: str) -> None:
    """Fault injection: the save of checkpoint-``step`` waits for the kill before writing its
    ``trainer_state.json`` (the Trainer writes that file last)."""
    original = TrainerState.save_to_json

    def save_to_json(self: Any, json_path: str) -> None:
        if Path(json_path).parent.name == f"checkpoint-{step}":
            wait_for_the_kill(output_dir)
        original(self, json_path)

    TrainerState.save_to_json = save_to_json


def run(output_dir: str, resume: str | None = None, pause: str | None = None):
    """Train (or resume) the run, pausing for the kill at ``pause``; returns ``(trainer, stopper)``."""
    stopper = EarlyStopping("eval_score", mode="min", patience=3)
    callbacks: list[Any] = [stopper]
    if pause is not None:
        step, _, where = pause.partition(":")
        if where not in PAUSES:
            raise ValueError(f"pause must be '<step>:<where>' with where in {PAUSES}, got {pause!r}")
        if where == "between":
            callbacks.append(PauseBetweenCheckpoints(int(step), output_dir))
        else:
            pause_mid_save(int(step), output_dir)
    trainer = scripted_trainer(output_dir, RESUME_SCRIPT, callbacks=callbacks, save_strategy="steps",
                               save_steps=2, logging_steps=100)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, stopper


if __name__ == "__main__":
    run(sys.argv[1], pause=sys.argv[2])
