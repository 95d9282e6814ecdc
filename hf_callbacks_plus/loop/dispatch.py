"""Building blocks of `CallbackHandler`'s cheap dispatch.

* ``_CallbackList``: the callback list, which tells the handler when it changes (so the
  per-event dispatch tables are rebuilt and ``handler.revision`` moves on).
* The six keyword arguments every event receives (``model``, ``processing_class``, ...),
  kept in one place instead of being gathered at each event.
* `ignores_event_kwargs`: marks an event method that is called without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable

if TYPE_CHECKING:
    from .callback import CallbackHandler

__all__ = ["ignores_event_kwargs"]


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
_EVENT_KWARGS = (
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
