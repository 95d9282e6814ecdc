"""CallbackHandler: calls the callbacks of every event, as in transformers 5.x, plus extras.

Extras beyond transformers' handler:

* ``call_event("on_anything", ...)`` dispatches custom events; callbacks without the
  method are skipped.
* ``add_callback(cb, first=True)`` / ``before=`` / ``after=`` control the order.
* ``on_exception`` is an event our loop fires when training raises (then re-raises).
* Dispatch skips callbacks that do not override an event (measured in
  ``benchmarks/bench_callback_dispatch.py``), instead of calling every no-op.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Optional, Union

from .._compat import TrainerCallbackBase
from .callback import EVENTS, TrainerCallback
from .state import TrainerControl, TrainerState

__all__ = [
    "EVENTS",
    "EVENT_KWARGS",
    "CallbackHandler",
    "CallbackRef",
    "TrainerCallback",
    "ignores_event_kwargs",
]

logger = logging.getLogger("hf_callbacks_plus")


class _CallbackList(list):
    """A list that tells its handler when it changes, so dispatch tables are rebuilt."""

    def __init__(self, items: Iterable[Any], on_change: Callable[[], None]) -> None:
        super().__init__(items)
        self._on_change = on_change

    def _mutator(name: str):  # noqa: N805 - helper to build methods
        original = getattr(list, name)

        def method(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            self._on_change()
            return result

        method.__name__ = name
        return method

    for _name in (
        "append",
        "extend",
        "insert",
        "remove",
        "pop",
        "clear",
        "sort",
        "reverse",
        "__setitem__",
        "__delitem__",
        "__iadd__",
    ):
        locals()[_name] = _mutator(_name)
    del _name, _mutator


#: Marks a method that ignores the event keyword arguments (see `ignores_event_kwargs`).
_KWARGS_FREE = "_hf_callbacks_plus_ignores_event_kwargs"


def ignores_event_kwargs(function: Callable[..., Any]) -> Callable[..., Any]:
    """Mark an event method whose body never reads ``model=``, ``optimizer=``, ``logs=``... .

    `CallbackHandler` then calls it with ``args, state, control`` only, which is
    several times cheaper than passing the keyword arguments. A subclass overriding the
    method gets the keyword arguments again (the mark belongs to this function only).
    """
    setattr(function, _KWARGS_FREE, True)
    return function


#: The keyword arguments every event receives, in transformers' order.
EVENT_KWARGS = (
    "model",
    "processing_class",
    "optimizer",
    "lr_scheduler",
    "train_dataloader",
    "eval_dataloader",
)


def _event_kwarg(name: str) -> property:
    """A handler attribute stored in the shared event keyword arguments (built once, not per event)."""

    def get(self: CallbackHandler) -> Any:
        return self._event_kwargs[name]

    def set(self: CallbackHandler, value: Any) -> None:
        self._event_kwargs[name] = value
        self._event_values = tuple(self._event_kwargs.values())

    return property(get, set, doc=f"Passed to every event as ``{name}``.")



def _base_noops() -> set[Any]:
    """The no-op functions of the base classes: a callback that keeps them is skipped."""
    noops: set[Any] = set()
    for base in (TrainerCallback, TrainerCallbackBase):
        for name, function in vars(base).items():
            if name.startswith("on_"):
                noops.add(function)
    return noops


_NOOPS = _base_noops()

#: A callback given as an instance or as a class.
CallbackRef = Union[Any, type]


class CallbackHandler(TrainerCallback):
    """Calls the callbacks in order, like ``transformers.trainer_callback.CallbackHandler``.

    Args:
        callbacks: Callback instances or classes (classes are instantiated).
        model: Passed to every event as ``model``. Defaults to None.
        processing_class: Passed as ``processing_class``. Defaults to None.
        optimizer: Passed as ``optimizer``. Defaults to None.
        lr_scheduler: Passed as ``lr_scheduler``. Defaults to None.
    """

    def __init__(
        self,
        callbacks: Iterable[CallbackRef] = (),
        model: Any = None,
        processing_class: Any = None,
        optimizer: Any = None,
        lr_scheduler: Any = None,
    ) -> None:
        self._dispatch: dict[str, list[Callable[..., Any]]] = {}
        #: Incremented whenever the callback list changes (cached ``has_handlers`` results expire).
        self.revision = 0
        # The keyword arguments every event receives, kept up to date by the properties below.
        self._event_kwargs: dict[str, Any] = dict.fromkeys(EVENT_KWARGS)
        self._event_values: tuple[Any, ...] = tuple(self._event_kwargs.values())
        self._callbacks = _CallbackList([], self._invalidate)
        for callback in callbacks:
            self.add_callback(callback)
        self.model = model
        self.processing_class = processing_class
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler

    model = _event_kwarg("model")
    processing_class = _event_kwarg("processing_class")
    optimizer = _event_kwarg("optimizer")
    lr_scheduler = _event_kwarg("lr_scheduler")
    train_dataloader = _event_kwarg("train_dataloader")
    eval_dataloader = _event_kwarg("eval_dataloader")

    # -- the callback list -------------------------------------------------------------
    @property
    def callbacks(self) -> list[Any]:
        """The callbacks, in call order. Mutating this list is allowed."""
        return self._callbacks

    @callbacks.setter
    def callbacks(self, value: Iterable[Any]) -> None:
        self._callbacks = _CallbackList(value, self._invalidate)
        self._invalidate()

    def _invalidate(self) -> None:
        self._dispatch.clear()
        self.revision += 1

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
        if cb_class in [existing.__class__ for existing in self._callbacks]:
            logger.warning(
                "You are adding a %s to the callbacks of this trainer, but there is already one. "
                "The current list of callbacks is:\n%s",
                cb_class,
                self.callback_list,
            )
        if first:
            self._callbacks.insert(0, instance)
        elif before is not None:
            self._callbacks.insert(self._index_of(before, "before"), instance)
        elif after is not None:
            self._callbacks.insert(self._index_of(after, "after") + 1, instance)
        else:
            self._callbacks.append(instance)
        return instance

    def _index_of(self, ref: CallbackRef, argument: str) -> int:
        for index, existing in enumerate(self._callbacks):
            if (isinstance(ref, type) and isinstance(existing, ref)) or existing is ref:
                return index
        raise ValueError(
            f"add_callback: {argument}={ref!r} is not among the callbacks; "
            f"the current callbacks are: {[type(cb).__name__ for cb in self._callbacks]}"
        )

    def pop_callback(self, callback: CallbackRef) -> Any:
        """Remove and return a callback, given as a class (first match) or an instance."""
        for existing in self._callbacks:
            if isinstance(callback, type):
                if isinstance(existing, callback):
                    self._callbacks.remove(existing)
                    return existing
            elif existing == callback:
                self._callbacks.remove(existing)
                return existing
        return None

    def remove_callback(self, callback: CallbackRef) -> None:
        """Remove a callback, given as a class (first match) or an instance."""
        if isinstance(callback, type):
            for existing in self._callbacks:
                if isinstance(existing, callback):
                    self._callbacks.remove(existing)
                    return
        else:
            self._callbacks.remove(callback)

    @property
    def callback_list(self) -> str:
        """The class names of the callbacks, one per line."""
        return "\n".join(cb.__class__.__name__ for cb in self._callbacks)

    # -- dispatch ----------------------------------------------------------------------
    def _handlers(self, event: str) -> list[tuple[Callable[..., Any], bool]]:
        """``(bound method, ignores the event keyword arguments)`` of the callbacks implementing ``event``."""
        handlers = self._dispatch.get(event)
        if handlers is None:
            handlers = []
            for callback in self._callbacks:
                if event in getattr(callback, "__dict__", {}):
                    handlers.append((getattr(callback, event), False))
                    continue
                function = getattr(type(callback), event, None)
                if function is None or function in _NOOPS:
                    continue
                handlers.append((getattr(callback, event), getattr(function, _KWARGS_FREE, False)))
            self._dispatch[event] = handlers
        return handlers

    def has_handlers(self, event: str) -> bool:
        """True when at least one callback implements ``event`` (lets callers skip work)."""
        return bool(self._handlers(event))

    def call_event(
        self, event: str, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """Call ``event`` on every callback that defines it, in order.

        Works for any event name, including custom ones; callbacks without the method are
        skipped. A callback may return a new ``control`` (None keeps the current one).

        Returns:
            The (possibly replaced) control object.
        """
        handlers = self._dispatch.get(event)
        if handlers is None:
            handlers = self._handlers(event)
        if not handlers:
            return control
        if kwargs:
            common = {**self._event_kwargs, **kwargs}
            for handler, kwargs_free in handlers:
                if kwargs_free:
                    result = handler(args, state, control)
                else:
                    result = handler(args, state, control, **common)
                if result is not None:
                    control = result
            return control
        # Keywords spelled out: much cheaper than unpacking a dict (see benchmarks/bench_loop.py).
        (model, processing_class, optimizer, lr_scheduler, train_dataloader, eval_dataloader) = (
            self._event_values
        )
        for handler, kwargs_free in handlers:
            if kwargs_free:
                result = handler(args, state, control)
            else:
                result = handler(
                    args,
                    state,
                    control,
                    model=model,
                    processing_class=processing_class,
                    optimizer=optimizer,
                    lr_scheduler=lr_scheduler,
                    train_dataloader=train_dataloader,
                    eval_dataloader=eval_dataloader,
                )
            if result is not None:
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
        control.should_log = False
        return self.call_event("on_log", args, state, control, logs=logs, **kwargs)

    def on_prediction_step(self, args, state, control, **kwargs):
        return self.call_event("on_prediction_step", args, state, control, **kwargs)

    def on_pre_log(self, args, state, control, logs, **kwargs):
        """Fire our ``on_pre_log`` event: callbacks may change ``logs`` in place before the record
        reaches ``state.log_history`` and ``on_log``. The one implementation of the event, used by
        ``LightweightTrainer.log``, ``TrainerPlusMixin.log`` and the stock Trainer's ``PreLogBridge``.
        """
        return self.call_event("on_pre_log", args, state, control, logs=logs, **kwargs)

    def on_push_begin(self, args, state, control, **kwargs):
        return self.call_event("on_push_begin", args, state, control, **kwargs)

    def on_exception(self, args, state, control, exception: BaseException, **kwargs):
        """Fire ``on_exception``; a callback that fails here is logged, not raised."""
        for handler, _ in self._handlers("on_exception"):
            try:
                handler(args, state, control, **self._event_kwargs, exception=exception, **kwargs)
            except Exception:  # the original exception matters more
                logger.exception("A callback failed in on_exception")
        return control
