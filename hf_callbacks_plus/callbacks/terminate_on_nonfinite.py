"""TerminateOnNonFinite: stop (or raise) as soon as the loss or a watched metric is NaN/Inf.

What each trainer lets it see:

* ``TrainerPlus`` and ``LightweightTrainer`` fire ``on_training_loss`` with the raw loss of
  every micro-batch, before ``logging_nan_inf_filter`` hides it: the first NaN/Inf loss is
  caught at the step where it happens.
* A stock ``transformers.Trainer`` has no such event. With ``logging_nan_inf_filter=True``
  (its default) a NaN/Inf step loss is replaced by the running average before it is
  logged, so the logged ``loss`` stays finite and the callback cannot see it (the model's
  weights may already be NaN; an evaluation loss, if watched, shows it at the next
  evaluation). With ``logging_nan_inf_filter=False`` the logged ``loss`` becomes NaN/Inf and
  the callback stops at the next logging step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any, Optional, Union

from ..core.checks import check_bool, check_choice, check_names
from ..metrics.monitor import Monitor
from ..metrics.numbers import to_float
from ..runtime.console import tell
from .monitoring import MonitoringCallback

__all__ = ["NonFiniteError", "TerminateOnNonFinite"]

logger = logging.getLogger("hf_callbacks_plus")

ACTIONS = ("stop", "raise")


class NonFiniteError(RuntimeError):
    """Raised by ``TerminateOnNonFinite(action="raise")``; names the key, the value and the step."""


class TerminateOnNonFinite(MonitoringCallback):
    """Stop or raise when the training loss or a watched metric becomes NaN or infinite.

    Args:
        action: ``"stop"`` sets ``control.should_training_stop`` (the trainer then finishes
            normally, saving what it is configured to save); ``"raise"`` raises
            `NonFiniteError` from the event. Defaults to ``"stop"``.
        monitor: Extra metrics to watch (a key or a list of keys, resolved through the key
            grammar, e.g. ``"eval_loss"``), or ``"*"`` for every numeric value logged or
            evaluated. Defaults to None (the training loss only).
        check_training_loss: Watch the training loss (``on_training_loss`` and the logged
            ``loss``). Defaults to True.
        verbose: Print one line to stderr when it stops training and a summary at train end,
            on the main process only (also logged at DEBUG). False: the line is logged as a
            WARNING only. Defaults to True.

    Raises:
        ValueError: ``action`` is not one of ``["stop", "raise"]``; a watched metric the run can
            never produce (at train begin, as `EarlyStopping`'s monitor).
        TypeError: ``monitor`` or ``check_training_loss`` has the wrong type.
        RuntimeError: A watched metric missing from the first record that should hold it (after
            the trainer saved that step; the message names the checkpoint).

    Example:
        >>> guard = TerminateOnNonFinite(action="raise", monitor="eval_loss")
        >>> guard.triggered is None
        True
    """

    def __init__(self, action: str = "stop", monitor: Union[str, Iterable[str], None] = None,
                 check_training_loss: bool = True, verbose: bool = True) -> None:
        owner = "TerminateOnNonFinite"
        self.action = check_choice(owner, "action", action, ACTIONS)
        if isinstance(monitor, Iterable) and not isinstance(monitor, str):
            monitor = list(monitor)
        self.monitor = () if monitor is None else (monitor,) if isinstance(monitor, str) else check_names(
            owner, "monitor", monitor, "None, a metric name, a list of names or '*'")
        self.check_training_loss = check_bool(owner, "check_training_loss", check_training_loss)
        self.verbose = check_bool(owner, "verbose", verbose)
        super().__init__()
        self._monitors = [Monitor(name, "min", grammar=self.grammar, owner=owner) for name in self.monitor
                          if name != "*"]
        #: ``(step, key, value)`` of the first non-finite value seen, else None.
        self.triggered: Optional[tuple[int, str, float]] = None

    def _trigger(self, state: Any, control: Any, key: str, value: float, where: str, ahead: int = 0) -> None:
        step = int(getattr(state, "global_step", 0)) + ahead
        if self.triggered is None:
            self.triggered = (step, key, value)
        message = (f"TerminateOnNonFinite: {key} is {value!r} at step {step} ({where}); "
                   f"{'raising' if self.action == 'raise' else 'stopping training'}.")
        if self.action == "raise":
            raise NonFiniteError(message)
        if not control.should_training_stop:
            tell(message, state, verbose=self.verbose, level=logging.WARNING)
        control.should_training_stop = True

    def _check(self, values: Any, state: Any, control: Any, where: str) -> None:
        if not isinstance(values, dict):
            return
        self.check_record(values, where == "evaluation", state, control)
        if "*" in self.monitor:
            items = list(values.items())
        else:
            found = (monitor.lookup(values) for monitor in self._monitors)  # a bare name: any record's key
            items = [(key, raw) for key, raw in found if key is not None]
        if self.check_training_loss and "loss" in values and "train_runtime" not in values:
            items.append(("loss", values["loss"]))
        for key, raw in items:
            value = to_float(raw)
            if value is not None and not math.isfinite(value):
                self._trigger(state, control, key, value, where)
                return

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Forget a previous trigger; check the run can produce every watched metric."""
        self.triggered = None
        self.watch_begin(args, state)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """(verbose) Say at the end that this callback stopped the run, and why."""
        self.watch_end(args, state)
        if self.verbose and self.triggered is not None and self.action == "stop":
            step, key, value = self.triggered
            tell(f"TerminateOnNonFinite summary: stopped training at step {step} because {key} was "
                 f"{value!r}; the run ended at step {int(getattr(state, 'global_step', 0))}.", state,
                 verbose=True)

    def on_training_loss(self, args: Any, state: Any, control: Any, loss: Any = None, **kwargs: Any) -> None:
        """(TrainerPlus / LightweightTrainer) the raw loss of one micro-batch."""
        if not self.check_training_loss:
            return
        value = to_float(loss)
        if value is not None and not math.isfinite(value):
            # fired before global_step is incremented: the loss belongs to the next step
            self._trigger(state, control, "training loss", value, "raw micro-batch loss", ahead=1)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """Check the logged record (the loss here is filtered by ``logging_nan_inf_filter``)."""
        self._check(logs, state, control, "logged")

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        """Check watched evaluation metrics."""
        if self.monitor:
            values = {k: v for k, v in (metrics or {}).items() if k != "loss"}
            self._check(values, state, control, "evaluation")
