"""Wiring our callbacks into a stock ``transformers.Trainer`` (or a trl trainer).

A stock Trainer builds its callback list as ``[DefaultFlowCallback, <report_to
integrations>, <your callbacks>, <progress/printer>]`` and its handler knows nothing of our
``on_pre_log`` event. `run_before_integrations` gives the trainer our `CallbackHandler`
(a ``transformers.trainer_callback.CallbackHandler`` subclass that dispatches exactly like it,
same callbacks, same order), whose ``on_log`` fires ``on_pre_log`` before any callback's
``on_log``: train-subset, gap and early-stopping values then reach every integration and the
console. It also moves the given callbacks ahead of the integrations and gives them the trainer
(``bind``). ``TrainerPlus`` does the same at construction.
"""

from __future__ import annotations

import logging
from typing import Any

from ..core.callback import bind_trainer
from ..core.handler import CallbackHandler
from .notebook import fit_notebook_table

__all__ = [
    "bind_trainer",
    "fires_pre_log",
    "is_integration_callback",
    "run_before_integrations",
    "use_our_handler",
]

logger = logging.getLogger("hf_callbacks_plus")

#: transformers' package of ``report_to`` integration callbacks (their classes cannot carry our
#: capability attribute, so they are recognised by where they live and by transformers' own table).
TRANSFORMERS_INTEGRATIONS = "transformers.integrations"


def _integration_classes() -> tuple[type, ...]:
    try:
        from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK
    except Exception:  # transformers missing or broken: only module names are used
        return ()
    return tuple(cls for cls in INTEGRATION_TO_CALLBACK.values() if isinstance(cls, type))


def is_integration_callback(callback: Any) -> bool:
    """True for a callback that sends logs out of the process: a ``report_to`` integration
    (TensorBoard, W&B, MLflow, ...) or a class saying so with ``sends_logs_out = True`` (our
    loggers and their subclasses, wherever they are defined).

    Args:
        callback: A callback instance or class.
    """
    cls = callback if isinstance(callback, type) else type(callback)
    if getattr(cls, "sends_logs_out", False) is True:
        return True
    if cls.__module__.startswith(TRANSFORMERS_INTEGRATIONS):
        return True
    return issubclass(cls, _integration_classes())


def fires_pre_log(trainer: Any) -> bool:
    """True when the trainer's handler fires ``on_pre_log``: it is our `CallbackHandler`
    (``LightweightTrainer``, ``TrainerPlus``, a trainer passed to `run_before_integrations`)."""
    return isinstance(getattr(trainer, "callback_handler", None), CallbackHandler)


def use_our_handler(trainer: Any) -> CallbackHandler:
    """Give ``trainer`` our `CallbackHandler` in place of its own (same callbacks, same order,
    same event keyword arguments); a no-op when it already has one. Nothing else changes (the
    notebook table is `fit_notebook_table`'s, which `run_before_integrations` and ``TrainerPlus``
    call).

    Args:
        trainer: A ``transformers.Trainer`` (or subclass).

    Returns:
        The trainer's handler.
    """
    old = trainer.callback_handler
    if isinstance(old, CallbackHandler):
        return old
    processing_class = getattr(old, "processing_class", None)
    legacy_tokenizer = processing_class is None and hasattr(old, "tokenizer")  # transformers < 4.46
    if legacy_tokenizer:
        processing_class = old.tokenizer
    new = CallbackHandler(
        (),
        model=getattr(old, "model", None),
        processing_class=processing_class,
        optimizer=getattr(old, "optimizer", None),
        lr_scheduler=getattr(old, "lr_scheduler", None),
        pass_tokenizer=legacy_tokenizer,
    )
    new.callbacks = list(old.callbacks)  # same instances, same order, no duplicate warnings
    new.train_dataloader = getattr(old, "train_dataloader", None)
    new.eval_dataloader = getattr(old, "eval_dataloader", None)
    trainer.callback_handler = new
    return new


def run_before_integrations(trainer: Any, *callbacks: Any) -> Any:
    """Wire ``callbacks`` into a stock (or trl) trainer: our handler, ahead of the integrations.

    The trainer gets our `CallbackHandler` (see `use_our_handler`), so ``on_pre_log`` fires
    before every ``on_log`` (integrations and console), and in a notebook transformers' table
    shows our values beside the trainer's columns (`fit_notebook_table`). Each callback
    (instance or class) is moved when already present, added otherwise, to the position just
    before the first integration callback (TensorBoardCallback, WandbCallback, MLflowCallback, ..., and
    ``hf_callbacks_plus`` loggers); without any integration they go to the end. Every
    callback of the trainer with a ``bind(trainer)`` method receives the trainer.

    Args:
        trainer: A ``transformers.Trainer`` (or subclass, or ``TrainerPlus``).
        *callbacks: Callbacks to run before the integrations, in this order.

    Returns:
        The trainer, for chaining.

    Raises:
        TypeError: ``trainer`` has no ``callback_handler``.

    Example:
        >>> trainer = Trainer(model, args, train_dataset=train, eval_dataset=val)
        >>> run_before_integrations(trainer, TrainSubsetEvaluation(size=256))
    """
    handler = getattr(trainer, "callback_handler", None)
    if handler is None or not hasattr(handler, "callbacks"):
        raise TypeError(
            f"run_before_integrations: trainer must be a transformers.Trainer-like object with a "
            f"callback_handler, got {type(trainer).__name__}."
        )
    handler = use_our_handler(trainer)
    fit_notebook_table(trainer)
    ordered = []
    for callback in callbacks:
        instance = callback() if isinstance(callback, type) else callback
        if isinstance(callback, type):
            existing = [cb for cb in handler.callbacks if type(cb) is callback]
            instance = existing[0] if existing else instance
        ordered.append(instance)
    # remove, then insert as a block before the first integration
    remaining = [cb for cb in handler.callbacks if not any(cb is inst for inst in ordered)]
    position = next((i for i, cb in enumerate(remaining) if is_integration_callback(cb)), len(remaining))
    handler.callbacks = remaining[:position] + ordered + remaining[position:]
    for instance in list(handler.callbacks):
        bind_trainer(instance, trainer)
    return trainer
