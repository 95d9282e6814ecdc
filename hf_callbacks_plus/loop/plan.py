"""How many epochs and steps a run has: a port of ``Trainer.set_initial_training_values``."""

from __future__ import annotations

import math
import sys
from typing import Any, NamedTuple

__all__ = ["TrainOutput", "TrainingPlan", "has_length", "plan_training"]


class TrainOutput(NamedTuple):
    """What `LightweightTrainer.train` returns (same fields as transformers')."""

    global_step: int
    training_loss: float
    metrics: dict[str, float]


class TrainingPlan(NamedTuple):
    """The counts that drive the loop.

    Attributes:
        num_epochs: Epochs to iterate (``sys.maxsize`` for unsized data with ``max_steps``).
        steps_per_epoch: Optimizer steps per epoch (the last one may take fewer batches).
        num_samples: Samples of the whole schedule, for ``train_samples_per_second``.
        batches_per_epoch: Batches per epoch (``len(train_data)``).
        max_steps: Optimizer steps of the whole run.
    """

    num_epochs: int
    steps_per_epoch: int
    num_samples: float
    batches_per_epoch: int
    max_steps: int


def has_length(data: Any) -> bool:
    """True when ``len(data)`` works (a sized dataset or dataloader; not a generator)."""
    try:
        len(data)
    except (TypeError, AttributeError, NotImplementedError):
        return False
    return True


def plan_training(args: Any, train_data: Any) -> TrainingPlan:
    """Compute the plan from ``max_steps``/``num_train_epochs`` exactly like transformers 5.x.

    ``max_steps > 0`` wins over ``num_train_epochs``; otherwise ``max_steps`` is
    ``ceil(num_train_epochs * steps_per_epoch)`` and the loop runs ``ceil(num_train_epochs)``
    epochs, stopped at ``max_steps`` by ``DefaultFlowCallback`` (fractional epochs).

    Raises:
        ValueError: ``train_data`` has no length (or is empty) and ``max_steps <= 0``.
    """
    accumulation = args.gradient_accumulation_steps
    max_steps = args.max_steps
    length = len(train_data) if has_length(train_data) else None
    total_batch_size = args.train_batch_size * accumulation
    steps_per_epoch = 0
    if length is not None:
        steps_per_epoch = max(length // accumulation + int(length % accumulation > 0), 1)
        if max_steps < 0:
            max_steps = math.ceil(args.num_train_epochs * steps_per_epoch)
    if length:
        if args.max_steps > 0:
            num_epochs = max_steps // steps_per_epoch + int(max_steps % steps_per_epoch > 0)
            num_samples = max_steps * total_batch_size
        else:
            num_epochs = math.ceil(args.num_train_epochs)
            num_samples = length * args.train_batch_size * args.num_train_epochs
    elif args.max_steps > 0:
        num_epochs = sys.maxsize
        steps_per_epoch = max_steps
        num_samples = args.max_steps * total_batch_size
    else:
        raise ValueError(
            "LightweightTrainer.train: train_data has no length (or is empty), so the number of steps "
            f"cannot be inferred; set args.max_steps > 0 (got max_steps={args.max_steps})."
        )
    batches_per_epoch = length if length is not None else max_steps * accumulation
    return TrainingPlan(num_epochs, steps_per_epoch, num_samples, batches_per_epoch, max_steps)
