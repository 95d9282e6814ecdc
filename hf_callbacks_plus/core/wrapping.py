"""The one way to put a wrapper in front of a method of an object we do not own (a trainer's
``evaluate`` or evaluation loop, a printer's ``on_log``, the notebook table's ``on_evaluate``)."""

from __future__ import annotations

from typing import Any, Callable

from .callback import weak_reference

__all__ = ["wrap_method"]


def wrap_method(target: Any, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]], *,
                marker: str, owner: Any = True) -> bool:
    """Give ``target`` an attribute ``name`` of its own, ``wrap(call)``, where ``call`` runs what
    ``target.<name>`` was: the class's method through a weak reference to ``target`` (no reference
    cycle), or a callable set on the instance as it is. The wrapper carries ``marker`` = ``owner``:
    a second call with both the same wraps nothing.

    Returns:
        True when installed; False when ``target.<name>`` is not callable or is this owner's wrapper.
    """
    current = getattr(target, name, None)
    if not callable(current) or getattr(current, marker, None) is owner:
        return False
    if getattr(current, "__self__", None) is target:
        function, reference = current.__func__, weak_reference(target)

        def call(*args: Any, **kwargs: Any) -> Any:
            return function(reference(), *args, **kwargs)
    else:
        call = current
    wrapper = wrap(call)
    wrapper.__doc__ = getattr(current, "__doc__", None)
    setattr(wrapper, marker, owner)
    setattr(target, name, wrapper)
    return True
