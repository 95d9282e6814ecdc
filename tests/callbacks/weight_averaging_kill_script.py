"""Train the tiny Llama with WeightAveraging and wait to be SIGKILLed inside the save of a checkpoint.

Usage: python weight_averaging_kill_script.py OUTPUT_DIR STEP

Inside the save of ``checkpoint-STEP`` (the model, the average's file and the optimizer written,
not yet the RNG state and ``trainer_state.json``) the run writes ``OUTPUT_DIR/paused`` and waits on
its standard input (a fault-injection gate: the test kills it there; if the test goes away
instead, stdin closes and the run exits with code 3). `run` is also what the test calls in its own
process for the uninterrupted run and the resume.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

STEPS = 6


def run(output_dir: str, *, resume: Any = None, pause_at: Optional[int] = None) -> tuple[Any, Any]:
    """A ``TrainerPlus`` (it resumes from the newest *complete* checkpoint) with
    ``WeightAveraging(BEMA(lag=2), update_every=2)``, evaluating and saving every 2 steps."""
    from transformers import Trainer

    from hf_callbacks_plus import BEMA, TrainerPlus, WeightAveraging
    from tests.sharded import lm_rows
    from tests.tiny_models import training_args
    from tests.trl_peft import tiny_lm

    averaging = WeightAveraging(BEMA(lag=2), update_every=2)
    args = training_args(output_dir, max_steps=STEPS, learning_rate=5e-3, per_device_train_batch_size=4,
                         per_device_eval_batch_size=4, eval_strategy="steps", eval_steps=2, logging_steps=1,
                         save_strategy="steps", save_steps=2)
    trainer = TrainerPlus(model=tiny_lm.causal_lm(), args=args, train_dataset=lm_rows(0, 32),
                          eval_dataset=lm_rows(1000, 8), processing_class=tiny_lm.tokenizer(),
                          callbacks=[averaging])
    original = Trainer._save_rng_state

    def save_rng_state(self: Any, folder: str) -> None:  # fault injection: the gate for the kill
        if pause_at is not None and self.state.global_step == pause_at:
            Path(output_dir, "paused").touch()
            sys.stdin.read()  # returns only when the test closed our stdin without killing us
            sys.exit(3)
        original(self, folder)

    Trainer._save_rng_state = save_rng_state
    try:
        trainer.train(resume_from_checkpoint=resume)
    finally:
        Trainer._save_rng_state = original
    return trainer, averaging


if __name__ == "__main__":
    run(sys.argv[1], pause_at=int(sys.argv[2]))
