"""Swap the stock W&B / MLflow / TensorBoard / trackio callbacks ``report_to`` added for our loggers."""

from __future__ import annotations

import importlib
from typing import Any, Union

from .base import _STOCK_REPORT_TO, TrackerLogger

__all__ = ["replace_report_to_callbacks"]

LoggerChoice = Union[bool, TrackerLogger]


def _build(kind: str, stock_name: str, stock: Any) -> TrackerLogger:
    """Our logger for the stock callback ``stock`` (``loggers/<kind>.py``: ``XCallback`` -> ``XLogger``)."""
    module = importlib.import_module(f"{__package__}.{kind}")
    logger_class = getattr(module, stock_name.replace("Callback", "Logger"))
    if kind == "tensorboard":  # the stock callback's folder
        return logger_class(log_dir=getattr(stock, "logging_dir", None))
    return logger_class()


def replace_report_to_callbacks(trainer: Any, mlflow: LoggerChoice = True, wandb: LoggerChoice = True,
                                tensorboard: LoggerChoice = True,
                                trackio: LoggerChoice = True) -> list[tuple[Any, TrackerLogger]]:
    """Replace the stock MLflow/W&B/TensorBoard/trackio callbacks of ``report_to`` with our loggers, in place.

    Each is swapped for `MLflowLogger` / `WandbLogger` / `TensorBoardLogger` (TensorBoard's keeps the
    stock ``logging_dir``) / `TrackioLogger` (its project and Space from ``TrainingArguments``, as the
    stock one) at the same position, and the new logger is attached to the trainer.

    Args:
        trainer: A ``transformers.Trainer`` (or ``TrainerPlus``) after ``__init__``.
        mlflow: True to build an ``MLflowLogger()``, a logger instance to use it, False to keep the
            stock callback. Defaults to True.
        wandb: The same for W&B. Defaults to True.
        tensorboard: The same for TensorBoard. Defaults to True.
        trackio: The same for trackio. Defaults to True.

    Returns:
        The ``(stock callback, our logger)`` pairs that were swapped.

    Raises:
        TypeError: ``trainer`` has no ``callback_handler``, or a choice is not a bool or a ``TrackerLogger``.
    """
    handler = getattr(trainer, "callback_handler", None)
    if handler is None or not hasattr(handler, "callbacks"):
        raise TypeError(f"trainer must have a callback_handler (a Trainer), got {type(trainer).__name__}")
    choices = {"mlflow": mlflow, "wandb": wandb, "tensorboard": tensorboard, "trackio": trackio}
    for name, choice in choices.items():
        if not isinstance(choice, (bool, TrackerLogger)):
            raise TypeError(f"{name} must be True, False or a TrackerLogger instance, got {choice!r}")
    swapped: list[tuple[Any, TrackerLogger]] = []
    callbacks = handler.callbacks
    try:
        from transformers.integrations import integration_utils
    except ImportError:  # transformers missing or broken: nothing to swap
        return swapped
    for stock_name, kind in _STOCK_REPORT_TO.items():
        stock_class, choice = getattr(integration_utils, stock_name, None), choices[kind]
        if stock_class is None or choice is False:
            continue
        for index, callback in enumerate(list(callbacks)):
            if isinstance(callback, stock_class):
                new = choice if isinstance(choice, TrackerLogger) else _build(kind, stock_name, callback)
                callbacks[index] = new
                if hasattr(new, "attach_trainer"):
                    new.attach_trainer(trainer)
                swapped.append((callback, new))
                break
    return swapped
