"""Wrap a method of one object (a trainer, a callback) once, holding the object weakly.

Several parts put a wrapper in front of a method of an object they do not own (the trainer's
``evaluate`` or evaluation loop, a printer's ``on_log``, the notebook's ``on_evaluate``): each
is an attribute of that object alone, set at most once per owner, that calls the method the
object had. `wrap_method` is the one way it is done.
"""

from __future__ import annotations

from typing import Any, Callable

from .callback import weak_reference

__all__ = ["wrap_method"]


def wrap_method(target: Any, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]], *,
                marker: str, owner: Any = True) -> bool:
    """Give ``target`` an attribute ``name`` of its own: ``wrap(call)``, where ``call`` runs what
    ``target.<name>`` was.

    When that was the class's method, ``call`` runs it on ``target`` through a weak reference
    (the wrapper stored on ``target`` makes no reference cycle); a callable set on the instance
    by someone else is kept as it is. The wrapper carries ``marker`` (with value ``owner``), so a
    second call with the same marker and owner wraps nothing.

    Args:
        target: The object whose method is wrapped.
        name: The method's name.
        wrap: Builds the wrapper from ``call``.
        marker: The attribute set on the wrapper.
        owner: The marker's value: who installed it. Defaults to True (whoever it was: once per
            ``target``).

    Returns:
        True when the wrapper was installed; False when ``target.<name>`` is not callable or is
        already this owner's wrapper.
    """
    current = getattr(target, name, None)
    if not callable(current) or getattr(current, marker, None) is owner:
        return False
    if getattr(current, "__self__", None) is target:  # the class's method, bound to target
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
