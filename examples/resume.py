"""Resume from a checkpoint: early stopping keeps its counter, the loggers reattach to their runs.

    python examples/resume.py [output_dir] [--interrupt-at STEP] [--patience N] [--min-delta X]

Phase 1 trains a ``TrainerPlus`` with ``EarlyStopping``, ``MLflowLogger``, ``WandbLogger``
(offline) and ``JsonlLogger`` and is interrupted right after the checkpoint of step
``--interrupt-at`` (a callback raises, as a preemption would; ``on_exception`` closes the
tracker runs as FAILED). Phase 2 builds everything anew, as a new process would, and calls
``trainer.train(resume_from_checkpoint=True)``:

* ``EarlyStopping`` restores its patience counter and best value from the checkpoint by
  itself (no ``restore_callback_states_from_checkpoint``) and stops where the uninterrupted
  run would have stopped;
* ``MLflowLogger`` and ``WandbLogger`` read their run ids from the checkpoint and continue
  the same MLflow run and W&B run on the same step axis, without logging a step twice; the
  MLflow run ends FINISHED.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo_pipeline import (  # noqa: E402
    build_datasets,
    build_model,
    build_tokenizer,
    compute_metrics,
    data_collator,
    example_sizes,
    training_arguments,
)

from hf_callbacks_plus import (  # noqa: E402
    EarlyStopping,
    JsonlLogger,
    MLflowLogger,
    TrainerCallback,
    TrainerPlus,
    WandbLogger,
)


class Preempted(RuntimeError):
    """Raised by :class:`InterruptAfterSave` to simulate a preemption."""


class InterruptAfterSave(TrainerCallback):
    """Raises :class:`Preempted` once the checkpoint of step ``step`` is written."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            raise Preempted(f"simulated preemption after the checkpoint of step {self.step}")


def build(output_dir: Path, options: argparse.Namespace, interrupt_at: int | None = None) -> tuple[Any, dict]:
    """A fresh trainer and fresh callbacks, as a new process would build them."""
    sizes = example_sizes()
    tokenizer = build_tokenizer()
    train_data, eval_data = build_datasets(tokenizer, n_train=sizes["n_train"], n_eval=sizes["n_eval"])
    callbacks = {
        "early_stopping": EarlyStopping("eval_loss", patience=options.patience, min_delta=options.min_delta),
        "mlflow": MLflowLogger(tracking_uri=f"sqlite:///{output_dir.parent / 'mlflow.db'}",
                               experiment_name=f"resume-{output_dir.name}"),
        "wandb": WandbLogger(project="resume-example", mode="offline", dir=str(output_dir)),
        "jsonl": JsonlLogger(str(output_dir / "metrics.jsonl")),
    }
    extra = [InterruptAfterSave(interrupt_at)] if interrupt_at is not None else []
    trainer = TrainerPlus(
        model=build_model(tokenizer, hidden_size=sizes["hidden_size"]),
        args=training_arguments(str(output_dir), num_train_epochs=3 * sizes["epochs"]),
        train_dataset=train_data, eval_dataset=eval_data, data_collator=data_collator(tokenizer),
        compute_metrics=compute_metrics, callbacks=[*callbacks.values(), *extra],
    )
    return trainer, callbacks


def describe(label: str, trainer: Any, callbacks: dict) -> None:
    stopper = callbacks["early_stopping"]
    print(f"{label}: global_step {trainer.state.global_step}, early stopping "
          f"{'stopped at step ' + str(stopper.stopped_step) if stopper.stopped else 'did not stop'} "
          f"(best eval_loss {stopper.best_value:.4f} at step {stopper.best_step}); "
          f"MLflow run {callbacks['mlflow'].run_id}, W&B run {callbacks['wandb'].run_id}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("output_dir", nargs="?", default=None)
    parser.add_argument("--interrupt-at", type=int, default=None,
                        help="step of the checkpoint after which phase 1 is interrupted (default: 2nd save)")
    parser.add_argument("--patience", type=int, default=3)
    parser.add_argument("--min-delta", type=float, default=0.0)
    parser.add_argument("--compare", action="store_true", help="also train without interruption")
    options = parser.parse_args(argv)
    root = Path(options.output_dir or tempfile.mkdtemp(prefix="resume-")).resolve()
    interrupt_at = options.interrupt_at or 2 * example_sizes()["eval_steps"]

    trainer, callbacks = build(root / "run", options, interrupt_at=interrupt_at)
    try:
        trainer.train()
    except Preempted as error:
        print(f"phase 1 interrupted: {error}")
    describe("phase 1", trainer, callbacks)

    trainer, callbacks = build(root / "run", options)
    trainer.train(resume_from_checkpoint=True)
    describe("phase 2 (resumed)", trainer, callbacks)

    if options.compare:
        trainer, callbacks = build(root / "uninterrupted", options)
        trainer.train()
        describe("uninterrupted", trainer, callbacks)


if __name__ == "__main__":
    main()
