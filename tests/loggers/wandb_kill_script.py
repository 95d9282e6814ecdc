"""Train a stock ``transformers.Trainer`` with ``WandbLogger`` (offline) slowly, so a test can
SIGKILL it after a checkpoint.

Usage: python wandb_kill_script.py OUTPUT_DIR (``WANDB_DIR``/``WANDB_MODE`` from the environment).
Prints ``SAVED <step>`` after each checkpoint is written.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from transformers import TrainerCallback  # noqa: E402

from tests.loggers.wandb_helpers import fast_logger  # noqa: E402
from tests.tiny_models import make_trainer  # noqa: E402


class Slow(TrainerCallback):
    """Sleeps after each step and says when a checkpoint is saved, so the parent can kill the run
    between two checkpoints."""

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.1)

    def on_save(self, args, state, control, **kwargs):
        print("SAVED", state.global_step, flush=True)


def main() -> None:
    make_trainer(sys.argv[1], callbacks=[fast_logger(project="killed"), Slow()], max_steps=200,
                 logging_steps=1, save_strategy="steps", save_steps=4).train()


if __name__ == "__main__":
    main()
