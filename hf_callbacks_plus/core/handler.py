"""CallbackHandler: calls the callbacks of every event exactly as transformers' handler does.

Dispatch is transformers' ``CallbackHandler.call_event``: the live ``callbacks`` list is walked
at every event and ``getattr(callback, event)`` is called with ``args, state, control`` and the
keyword arguments ``model=``, ``processing_class=``, ``optimizer=``, ``lr_scheduler=``,
``train_dataloader=``, ``eval_dataloader=`` plus the event's own. Nothing is cached: a
``unittest.mock`` callback, a method patched between runs and a callback added or removed
inside an event behave as they do in a stock ``transformers.Trainer``. With transformers
installed the class derives from ``transformers.trainer_callback.CallbackHandler``.

Extras beyond transformers' handler:

* ``call_event("on_anything", ...)`` dispatches custom events; callbacks without the method
  are skipped.
* ``add_callback(cb, first=True)`` / ``before=`` / ``after=`` control the order.
* ``on_log`` first fires ``on_pre_log`` (the one place that event is fired, in every
  trainer): callbacks may change the record in place before any ``on_log`` reads it, and
  ``state.log_history[-1]`` is updated to match.
* ``on_exception`` is an event our loop and ``TrainerPlus`` fire when training raises.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Iterable, Optional, Union

from .._compat import CallbackHandlerBase, TrainerCallbackBase
from .callback import EVENTS, TrainerCallback
from .state import TrainerControl, TrainerState

__all__ = [
    "EVENTS",
    "EVENT_KWARGS",
    "CallbackHandler",
    "CallbackRef",
    "TrainerCallback",
    "listens",
]

logger = logging.getLogger("hf_callbacks_plus")
#: transformers' handler warns on this logger (silenced by ``transformers.logging.set_verbosity_error``).
_TRANSFORMERS_LOGGER = logging.getLogger("transformers.trainer_callback")

#: The keyword arguments every event receives, in transformers' order.
EVENT_KWARGS = (
    "model",
    "processing_class",
    "optimizer",
    "lr_scheduler",
    "train_dataloader",
    "eval_dataloader",
)


def _base_noops() -> set[Any]:
    """The no-op event functions of the base classes."""
    noops: set[Any] = set()
    for base in (TrainerCallback, *TrainerCallback.__mro__):
        for name, function in vars(base).items():
            if name.startswith("on_"):
                noops.add(function)
    return noops


_NOOPS = _base_noops()


def listens(callback: Any, event: str) -> bool:
    """True when ``callback`` has an ``event`` method other than the base class's no-op.

    Looked up at call time (a method patched on the instance, or any attribute of a
    ``unittest.mock`` object, counts). Used only to skip work an event would need
    (a ``.item()`` sync for ``on_training_loss``, reading a checkpoint for
    ``on_resume_check``), never to skip a callback.
    """
    method = getattr(callback, event, None)
    if method is None or not callable(method):
        return False
    return getattr(method, "__func__", None) not in _NOOPS


#: transformers' own events: their results replace ``control`` exactly as in transformers.
_STANDARD_EVENTS = frozenset(EVENTS)

#: Classes whose instances are callbacks even without a method for every event.
_CALLBACK_BASES = tuple(base for base in (TrainerCallback, TrainerCallbackBase) if base is not object)

#: A callback given as an instance or as a class.
CallbackRef = Union[Any, type]


#: transformers' ``CallbackHandler`` first when it is importable (isinstance checks accept ours).
_HANDLER_BASES: tuple[type, ...] = (
    (TrainerCallback,) if CallbackHandlerBase is object else (CallbackHandlerBase, TrainerCallback)
)


class CallbackHandler(*_HANDLER_BASES):  # type: ignore[misc]
    """Calls the callbacks in order, exactly like ``transformers.trainer_callback.CallbackHandler``.

    Args:
        callbacks: Callback instances or classes (classes are instantiated).
        model: Passed to every event as ``model``. Defaults to None.
        processing_class: Passed as ``processing_class``. Defaults to None.
        optimizer: Passed as ``optimizer``. Defaults to None.
        lr_scheduler: Passed as ``lr_scheduler``. Defaults to None.
        pass_tokenizer: Also pass ``tokenizer=processing_class`` to every event, as
            transformers < 4.46 does. Defaults to False.
    """

    def __init__(
        self,
        callbacks: Iterable[CallbackRef] = (),
        model: Any = None,
        processing_class: Any = None,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        *,
        pass_tokenizer: bool = False,
    ) -> None:
        self.callbacks: list[Any] = []
        for callback in callbacks:
            self.add_callback(callback)
        self.model = model
        self.processing_class = processing_class
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.train_dataloader = None
        self.eval_dataloader = None
        self.pass_tokenizer = pass_tokenizer

    @property
    def tokenizer(self) -> Any:
        """Alias of ``processing_class`` (transformers < 4.46 names it ``tokenizer``)."""
        return self.processing_class

    @tokenizer.setter
    def tokenizer(self, value: Any) -> None:
        self.processing_class = value

    # -- the callback list -------------------------------------------------------------
    def add_callback(
        self,
        callback: CallbackRef,
        *,
        first: bool = False,
        before: Optional[CallbackRef] = None,
        after: Optional[CallbackRef] = None,
    ) -> Any:
        """Add a callback (instance or class), at the end unless told otherwise.

        Args:
            callback: Instance, or class to instantiate without arguments.
            first: Put it ahead of every other callback. Defaults to False.
            before: Put it just before this callback (instance or class). Defaults to None.
            after: Put it just after this callback (instance or class). Defaults to None.

        Returns:
            The added instance.

        Raises:
            ValueError: More than one of ``first``/``before``/``after`` was given, or the
                ``before``/``after`` callback is not in the handler.
        """
        if sum([bool(first), before is not None, after is not None]) > 1:
            raise ValueError(
                "add_callback: pass at most one of first=True, before=..., after=...; "
                f"got first={first!r}, before={before!r}, after={after!r}."
            )
        instance = callback() if isinstance(callback, type) else callback
        cb_class = callback if isinstance(callback, type) else callback.__class__
        if cb_class in [existing.__class__ for existing in self.callbacks]:  # transformers' own warning
            _TRANSFORMERS_LOGGER.warning(
                f"You are adding a {cb_class} to the callbacks of this Trainer, but there is already one. "
                "The current" + "list of callbacks is\n:" + self.callback_list
            )
        if first:
            self.callbacks.insert(0, instance)
        elif before is not None:
            self.callbacks.insert(self._index_of(before, "before"), instance)
        elif after is not None:
            self.callbacks.insert(self._index_of(after, "after") + 1, instance)
        else:
            self.callbacks.append(instance)
        return instance

    def _index_of(self, ref: CallbackRef, argument: str) -> int:
        for index, existing in enumerate(self.callbacks):
            if (isinstance(ref, type) and isinstance(existing, ref)) or existing is ref:
                return index
        raise ValueError(
            f"add_callback: {argument}={ref!r} is not among the callbacks; "
            f"the current callbacks are: {[type(cb).__name__ for cb in self.callbacks]}"
        )

    def pop_callback(self, callback: CallbackRef) -> Any:
        """Remove and return a callback, given as a class (first match) or an instance."""
        for existing in self.callbacks:
            if isinstance(callback, type):
                if isinstance(existing, callback):
                    self.callbacks.remove(existing)
                    return existing
            elif existing == callback:
                self.callbacks.remove(existing)
                return existing
        return None

    def remove_callback(self, callback: CallbackRef) -> None:
        """Remove a callback, given as a class (first match) or an instance."""
        if isinstance(callback, type):
            for existing in self.callbacks:
                if isinstance(existing, callback):
                    self.callbacks.remove(existing)
                    return
        else:
            self.callbacks.remove(callback)

    @property
    def callback_list(self) -> str:
        """The class names of the callbacks, one per line."""
        return "\n".join(cb.__class__.__name__ for cb in self.callbacks)

    def listens(self, event: str) -> bool:
        """True when a callback of this handler implements ``event`` (see `listens`)."""
        return any(listens(callback, event) for callback in self.callbacks)

    # -- dispatch ----------------------------------------------------------------------
    def call_event(
        self, event: str, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """Call ``event`` on every callback, in order, as transformers' handler does.

        The live list is walked (changes made during the event take effect as in
        transformers); callbacks without the method are skipped in a custom event, and in a
        transformers event when they derive from a callback base class (an older transformers'
        base may lack a newer event); any other object raises ``AttributeError`` there, as in
        transformers. A callback
        may return a new ``control`` (None keeps the current one); in a custom event
        (``on_pre_log``, ``on_training_loss``...), only a control object of the same class
        does, so a ``unittest.mock`` callback, which answers every custom event with a mock,
        cannot stop a run that a stock Trainer would not have told it about. Passing one of the
        handler's own keyword arguments (``model=``...) again raises ``TypeError``, as in
        transformers.

        Returns:
            The (possibly replaced) control object.
        """
        if self.pass_tokenizer:
            kwargs = {"tokenizer": self.processing_class, **kwargs}
        custom = event not in _STANDARD_EVENTS
        for callback in self.callbacks:
            method = getattr(callback, event, None)
            if method is None:
                if custom or isinstance(callback, _CALLBACK_BASES):  # (an older transformers' base)
                    continue
                getattr(callback, event)  # not a callback at all: transformers' AttributeError
            result = method(
                args,
                state,
                control,
                model=self.model,
                processing_class=self.processing_class,
                optimizer=self.optimizer,
                lr_scheduler=self.lr_scheduler,
                train_dataloader=self.train_dataloader,
                eval_dataloader=self.eval_dataloader,
                **kwargs,
            )
            if result is not None and (not custom or isinstance(result, type(control))):
                control = result
        return control

    def on_init_end(self, args, state, control, **kwargs):
        return self.call_event("on_init_end", args, state, control, **kwargs)

    def on_train_begin(self, args, state, control, **kwargs):
        control.should_training_stop = False
        return self.call_event("on_train_begin", args, state, control, **kwargs)

    def on_train_end(self, args, state, control, **kwargs):
        return self.call_event("on_train_end", args, state, control, **kwargs)

    def on_epoch_begin(self, args, state, control, **kwargs):
        control.should_epoch_stop = False
        return self.call_event("on_epoch_begin", args, state, control, **kwargs)

    def on_epoch_end(self, args, state, control, **kwargs):
        return self.call_event("on_epoch_end", args, state, control, **kwargs)

    def on_step_begin(self, args, state, control, **kwargs):
        control.should_log = False
        control.should_evaluate = False
        control.should_save = False
        return self.call_event("on_step_begin", args, state, control, **kwargs)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        return self.call_event("on_pre_optimizer_step", args, state, control, **kwargs)

    def on_optimizer_step(self, args, state, control, **kwargs):
        return self.call_event("on_optimizer_step", args, state, control, **kwargs)

    def on_substep_end(self, args, state, control, **kwargs):
        return self.call_event("on_substep_end", args, state, control, **kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        return self.call_event("on_step_end", args, state, control, **kwargs)

    def on_evaluate(self, args, state, control, metrics, **kwargs):
        control.should_evaluate = False
        return self.call_event("on_evaluate", args, state, control, metrics=metrics, **kwargs)

    def on_predict(self, args, state, control, metrics, **kwargs):
        return self.call_event("on_predict", args, state, control, metrics=metrics, **kwargs)

    def on_save(self, args, state, control, **kwargs):
        control.should_save = False
        return self.call_event("on_save", args, state, control, **kwargs)

    def on_log(self, args, state, control, logs, **kwargs):
        """Fire ``on_pre_log`` (callbacks may change ``logs`` in place; the record the trainer
        appended to ``state.log_history`` is updated to match), then ``on_log``.

        This is the one place ``on_pre_log`` fires, in every trainer whose handler this is
        (``LightweightTrainer``, ``TrainerPlus``, a stock or trl trainer after
        ``run_before_integrations``): it runs when the record reaches ``on_log``, after a
        trainer's own ``log`` override (trl's) added its metrics, and before any callback's
        ``on_log`` (report_to integrations, the progress bar and printer) reads it.
        """
        control.should_log = False
        if isinstance(logs, dict):
            before = dict(logs)
            control = self.call_event("on_pre_log", args, state, control, logs=logs, **kwargs)
            if logs != before or any(logs[key] is not value for key, value in before.items()):
                sync_history(state, before, logs)
        return self.call_event("on_log", args, state, control, logs=logs, **kwargs)

    def on_prediction_step(self, args, state, control, **kwargs):
        return self.call_event("on_prediction_step", args, state, control, **kwargs)

    def on_push_begin(self, args, state, control, **kwargs):
        return self.call_event("on_push_begin", args, state, control, **kwargs)

    def on_exception(self, args, state, control, exception: BaseException, **kwargs):
        """Fire ``on_exception``; a callback that fails here is logged, not raised."""
        for callback in list(self.callbacks):
            method = getattr(callback, "on_exception", None)
            if method is None:
                continue
            try:
                method(
                    args, state, control, model=self.model, processing_class=self.processing_class,
                    optimizer=self.optimizer, lr_scheduler=self.lr_scheduler,
                    train_dataloader=self.train_dataloader, eval_dataloader=self.eval_dataloader,
                    exception=exception, **kwargs,
                )
            except Exception:  # the original exception matters more
                logger.exception("A callback failed in on_exception")
        return control


def sync_history(state: Any, before: Mapping[str, Any], logs: dict) -> None:
    """Make ``state.log_history[-1]`` (the record the trainer appended from ``before``) match
    ``logs`` after ``on_pre_log`` changed it in place."""
    history = getattr(state, "log_history", None)
    if not history:
        return
    last = history[-1]
    # the record Trainer.log appended is {**logs, "step": ...}: same values, same objects
    if not isinstance(last, dict) or any(last.get(k, last) is not v for k, v in before.items()):
        return
    updated = {**logs, "step": last.get("step", getattr(state, "global_step", 0))}
    # keys removed from ``logs`` before on_log (transformers' PrinterCallback pops
    # ``total_flos``) stay in the history, as without on_pre_log
    for key, value in last.items():
        if key not in before and key not in updated:
            updated[key] = value
    history[-1] = updated
