"""Run a stock transformers.Trainer with EarlyStopping slowly, so a test can SIGKILL it mid-run.

Usage: python early_stopping_kill_script.py OUTPUT_DIR
Prints one JSON line with the outcome when it finishes (only when not killed).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from transformers import TrainerCallback  # noqa: E402

from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping  # noqa: E402
from tests.callbacks.early_stopping_helpers import RESUME_SCRIPT, scripted_trainer  # noqa: E402


class Slow(TrainerCallback):
    """Sleeps after each step so the parent process can kill the run between two checkpoints."""

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.15)


def run(output_dir: str, resume: str | None = None, slow: bool = False):
    """Train (or resume) the run; returns ``(trainer, stopper)``."""
    stopper = EarlyStopping("eval_score", mode="min", patience=3)
    callbacks = [stopper, Slow()] if slow else [stopper]
    trainer = scripted_trainer(output_dir, RESUME_SCRIPT, callbacks=callbacks, save_strategy="steps",
                               save_steps=2, logging_steps=100)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, stopper


def main() -> None:
    trainer, stopper = run(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None, slow=True)
    print(json.dumps({"global_step": trainer.state.global_step, "stopped_step": stopper.stopped_step,
                      "best_value": stopper.best_value, "best_step": stopper.best_step}))


if __name__ == "__main__":
    main()
