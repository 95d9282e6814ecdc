"""A small run of the transformers-free loop with a few callbacks, printing its logs.

No torch, no transformers: a one-parameter linear model fitted by plain SGD in Python.
The callbacks are ordinary ``TrainerCallback`` subclasses; the very same classes run in a
stock ``transformers.Trainer``.

Run: python examples/lightweight_loop.py [output_dir]
"""

from __future__ import annotations

import argparse
import random
import tempfile
from typing import Optional

from hf_callbacks_plus import LightweightTrainer, LoopArguments, TrainerCallback


class LinearModel:
    """``y = w * x + b`` with a ``state_dict`` so checkpoints can save it."""

    def __init__(self) -> None:
        self.w, self.b = 0.0, 0.0

    def state_dict(self) -> dict[str, float]:
        return {"w": self.w, "b": self.b}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.w, self.b = state["w"], state["b"]


def make_batches(n_batches: int, size: int, seed: int) -> list[list[tuple[float, float]]]:
    rng = random.Random(seed)
    batches = []
    for _ in range(n_batches):
        xs = [rng.uniform(-1, 1) for _ in range(size)]
        batches.append([(x, 2.0 * x + 3.0 + rng.gauss(0, 0.1)) for x in xs])
    return batches


class StepTimer(TrainerCallback):
    """Counts optimizer steps per epoch."""

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.start = state.global_step

    def on_epoch_end(self, args, state, control, **kwargs):
        print(f"[StepTimer] epoch {state.epoch:.2f} took {state.global_step - self.start} optimizer steps")


class AddWeights(TrainerCallback):
    """A custom event of our loop: edit a log record before anything sees it."""

    def __init__(self, model: LinearModel) -> None:
        self.model = model

    def on_pre_log(self, args, state, control, logs, **kwargs):
        if "loss" in logs:
            logs["model/w"] = round(self.model.w, 4)
            logs["model/b"] = round(self.model.b, 4)


class StopWhenGoodEnough(TrainerCallback):
    """Stops training once the evaluation error is small."""

    def on_evaluate(self, args, state, control, metrics, **kwargs):
        if metrics["eval_mae"] < 0.12:
            print(
                f"[StopWhenGoodEnough] eval_mae={metrics['eval_mae']:.3f} at step {state.global_step}: stop"
            )
            control.should_training_stop = True


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: ``argv`` is ``[output_dir]`` (a temporary folder, removed at the end, when empty)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("output_dir", nargs="?",
                        help="where the checkpoints go (default: a temporary folder)")
    output_dir = parser.parse_args(argv).output_dir
    if output_dir is None:
        with tempfile.TemporaryDirectory() as directory:
            train(directory)
    else:
        train(output_dir)


def train(output_dir: str) -> None:
    """Fit the linear model with the loop and the callbacks; print what happened."""
    model = LinearModel()
    learning_rate = 0.3
    gradients = {"w": 0.0, "b": 0.0}

    def train_step(batch):
        loss = 0.0
        for x, y in batch:
            error = model.w * x + model.b - y
            loss += error * error / len(batch)
            gradients["w"] += 2 * error * x / len(batch)
            gradients["b"] += 2 * error / len(batch)
        return loss

    def optimizer_step():
        model.w -= learning_rate * gradients["w"]
        model.b -= learning_rate * gradients["b"]
        gradients["w"] = gradients["b"] = 0.0

    def eval_step(batch):
        errors = [abs(model.w * x + model.b - y) for x, y in batch]
        return {"loss": sum(e * e for e in errors) / len(errors), "abs_errors": errors}

    def metrics_fn(outputs):
        errors = [e for output in outputs for e in output["abs_errors"]]
        return {"mae": sum(errors) / len(errors)}

    args = LoopArguments(
        output_dir=output_dir,
        num_train_epochs=6,
        per_device_train_batch_size=8,
        logging_steps=5,
        eval_strategy="epoch",
        save_strategy="epoch",
        save_total_limit=2,
        load_best_model_at_end=True,
        metric_for_best_model="mae",
        greater_is_better=False,  # the default is True for any name not ending in "loss"
        disable_tqdm=True,
    )
    trainer = LightweightTrainer(
        args,
        train_step=train_step,
        train_data=make_batches(10, 8, seed=1),
        eval_data=make_batches(3, 8, seed=2),
        eval_step=eval_step,
        metrics_fn=metrics_fn,
        model=model,
        optimizer_step_fn=optimizer_step,
        learning_rate_fn=lambda: learning_rate,
        callbacks=[StepTimer(), AddWeights(model), StopWhenGoodEnough()],
    )
    output = trainer.train()
    print(f"trained {output.global_step} steps; best checkpoint {trainer.state.best_model_checkpoint}")
    print(f"model: w={model.w:.3f} b={model.b:.3f} (truth: w=2, b=3)")


if __name__ == "__main__":
    main()
