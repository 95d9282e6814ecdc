"""The callback interface: ``TrainerCallback`` with every event of transformers.Trainer.

Kept apart from the dispatching ``CallbackHandler`` (handler.py): this module is what a
callback author reads.
"""

from __future__ import annotations

import inspect
import weakref
from typing import Any, Callable

from .._compat import TrainerCallbackBase
from .state import TrainerControl, TrainerState

__all__ = ["EVENTS", "TrainerCallback", "bind_trainer", "weak_reference"]

#: Every event a transformers.Trainer fires, in declaration order.
EVENTS = (
    "on_init_end",
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_step_begin",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_substep_end",
    "on_step_end",
    "on_evaluate",
    "on_predict",
    "on_save",
    "on_log",
    "on_prediction_step",
    "on_push_begin",
)


class TrainerCallback(TrainerCallbackBase):
    """Base class for callbacks; every event is a no-op to override.

    Events receive ``args``, ``state`` and ``control`` positionally, and ``model``,
    ``processing_class``, ``optimizer``, ``lr_scheduler``, ``train_dataloader``,
    ``eval_dataloader`` plus event data (``metrics``, ``logs``, ``exception``) as keyword
    arguments. Return ``control`` (or None when unchanged).

    When transformers is installed this class derives from ``transformers.TrainerCallback``,
    so the same callback runs in a stock ``transformers.Trainer``, in ``TrainerPlus`` and in
    `LightweightTrainer`.
    """

    def on_init_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Called at the end of the trainer's ``__init__``."""

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Called at the beginning of training."""

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Called at the end of training."""

    def on_epoch_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Called at the beginning of an epoch."""

    def on_epoch_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Called at the end of an epoch."""

    def on_step_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Called at the beginning of an optimizer step (before its first micro-batch)."""

    def on_pre_optimizer_step(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Called before the optimizer step, after gradient clipping."""

    def on_optimizer_step(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Called after the optimizer step, before gradients are zeroed."""

    def on_substep_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Called after each gradient-accumulation micro-batch except the last of a step."""

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Called at the end of an optimizer step (``state.global_step`` already incremented)."""

    def on_evaluate(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Called after an evaluation, with ``metrics``."""

    def on_predict(
        self, args: Any, state: TrainerState, control: TrainerControl, metrics: Any, **kwargs: Any
    ):
        """Called after a successful prediction, with ``metrics``."""

    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Called after a checkpoint was saved."""

    def on_log(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Called after logging, with ``logs``."""

    def on_prediction_step(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Called after each prediction/evaluation batch."""

    def on_push_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Called before pushing to the hub."""

    def on_exception(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any):
        """Called (by our loop and ``TrainerPlus``) when training raises, with ``exception``.

        The exception is re-raised after every callback ran. A stock transformers.Trainer
        has no such event.
        """


def bind_trainer(callback: Any, trainer: Any) -> None:
    """Give ``callback`` its trainer when it asks for it with a ``bind(trainer)`` method.

    The one binding protocol: every runner (``LightweightTrainer``, ``TrainerPlus``,
    ``run_before_integrations`` for a stock or trl trainer) calls it for each of its callbacks
    at construction and in ``add_callback``. A callback uses it to reach the trainer's key
    grammar (``hf_callbacks_plus.metrics.keys.grammar_for(trainer)``), its datasets or its
    evaluation.

    Args:
        callback: A callback instance.
        trainer: The trainer it runs in.
    """
    bind = getattr(callback, "bind", None)
    if callable(bind) and _takes_one_argument(bind):
        bind(trainer)


def weak_reference(target: Any) -> Callable[[], Any]:
    """A weak reference to ``target`` (the trainer a callback keeps); a plain closure for an object
    that refuses weak references."""
    try:
        return weakref.ref(target)
    except TypeError:
        return lambda: target


def _takes_one_argument(function: Any) -> bool:
    """Our protocol is ``bind(trainer)``; a callback's own ``bind`` with another signature
    (``bind()``) is none of ours and is left alone, as a stock Trainer leaves it."""
    try:
        inspect.signature(function).bind(object())
    except TypeError:
        return False
    except ValueError:  # no signature to read (a builtin): called as before
        return True
    return True
