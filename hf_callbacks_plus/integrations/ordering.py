"""Callback ordering for a stock ``transformers.Trainer``: run ours before the integrations.

A stock Trainer builds its callback list as ``[DefaultFlowCallback, <report_to
integrations>, <your callbacks>, <progress/printer>]``, so an ``on_log`` of yours runs
after W&B/TensorBoard/MLflow already sent the record. `run_before_integrations`
moves (or adds) callbacks just ahead of the first integration and installs a
`PreLogBridge` there, which fires our ``on_pre_log`` event from ``on_log``: the
callbacks may then add or fix keys of the record before any integration reads it, and
the bridge copies the change into ``state.log_history`` too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..core.callback import TrainerCallback
from ..core.handler import CallbackHandler

__all__ = [
    "PreLogBridge",
    "bind_trainer",
    "fires_pre_log",
    "is_integration_callback",
    "run_before_integrations",
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


def bind_trainer(callback: Any, trainer: Any) -> None:
    """Give ``callback`` the trainer when it asks for it (it has a ``bind(trainer)`` method)."""
    bind = getattr(callback, "bind", None)
    if callable(bind):
        bind(trainer)


def fires_pre_log(trainer: Any) -> bool:
    """True when the trainer fires ``on_pre_log`` itself: it says so with a class attribute
    ``fires_pre_log = True`` (``TrainerPlus``, ``LightweightTrainer``)."""
    return bool(getattr(trainer, "fires_pre_log", False))


class PreLogBridge(TrainerCallback):
    """Fires ``on_pre_log`` from ``on_log`` in a trainer that does not fire it itself.

    Installed by `run_before_integrations` just ahead of the integrations. When
    ``on_log`` reaches it, it fires ``on_pre_log`` on the trainer's other callbacks that
    define it (in list order, through our `CallbackHandler.on_pre_log`), then makes
    ``state.log_history[-1]`` match the modified record. Callbacks must modify ``logs`` in
    place.

    Args:
        trainer: The trainer whose callbacks receive ``on_pre_log``.
    """

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer
        self._handler = CallbackHandler()  # mirrors the stock handler's callbacks, minus the bridge

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any):
        if not isinstance(logs, dict):
            return None
        handler = self._handler
        others = [cb for cb in self._trainer.callback_handler.callbacks if cb is not self]
        if others != handler.callbacks:
            handler.callbacks = others
        if not handler.has_handlers("on_pre_log"):
            return None
        before = dict(logs)
        control = handler.on_pre_log(args, state, control, logs, **kwargs)
        self.sync_history(state, before, logs)
        return control

    @staticmethod
    def sync_history(state: Any, before: Mapping[str, Any], logs: dict) -> None:
        """Make ``state.log_history[-1]`` (the record ``Trainer.log`` appended from ``before``)
        match ``logs`` after ``on_pre_log`` changed it in place."""
        history = getattr(state, "log_history", None)
        if not history:
            return
        last = history[-1]
        # the record Trainer.log appended is {**logs, "step": ...}: same values, same objects
        if not isinstance(last, dict) or any(last.get(k, last) is not v for k, v in before.items()):
            return
        updated = {**logs, "step": last.get("step", state.global_step)}
        # keys an earlier callback removed from ``logs`` before the bridge ran (transformers'
        # PrinterCallback pops ``total_flos``) stay in the history, as without the bridge
        for key, value in last.items():
            if key not in before and key not in updated:
                updated[key] = value
        history[-1] = updated


def run_before_integrations(trainer: Any, *callbacks: Any) -> Any:
    """Put ``callbacks`` ahead of the trainer's report_to integrations.

    Each callback (instance or class) is moved when already present, added otherwise, to
    the position just before the first integration callback (TensorBoardCallback,
    WandbCallback, MLflowCallback, ..., and ``hf_callbacks_plus`` loggers); without any
    integration they go to the end. Callbacks with a ``bind(trainer)`` method receive the
    trainer. In a trainer that does not fire ``on_pre_log`` itself (a stock
    ``transformers.Trainer``), a `PreLogBridge` is placed first among them so
    their ``on_pre_log`` runs before the integrations' ``on_log``.

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
    ordered = []
    for callback in callbacks:
        instance = callback() if isinstance(callback, type) else callback
        if isinstance(callback, type):
            existing = [cb for cb in handler.callbacks if type(cb) is callback]
            instance = existing[0] if existing else instance
        ordered.append(instance)
    if not fires_pre_log(trainer):
        bridges = [cb for cb in handler.callbacks if isinstance(cb, PreLogBridge)]
        ordered.insert(0, bridges[0] if bridges else PreLogBridge(trainer))
    # remove, then insert as a block before the first integration
    remaining = [cb for cb in handler.callbacks if not any(cb is inst for inst in ordered)]
    position = next((i for i, cb in enumerate(remaining) if is_integration_callback(cb)), len(remaining))
    handler.callbacks = remaining[:position] + ordered + remaining[position:]
    for instance in ordered:
        bind_trainer(instance, trainer)
    return trainer
