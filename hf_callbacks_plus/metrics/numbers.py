"""Logged values as numbers: the one conversion every part of the package uses.

A ``logs``/``metrics`` dict may hold Python numbers, numpy scalars, 0-d or one-element
tensors and arrays, bools, strings or anything else. `to_float` turns the numeric ones
into a ``float``; what happens to the rest is the caller's explicit choice:

* ``to_float(value)`` returns None (``EarlyStopping`` and ``TerminateOnNonFinite`` then
  say which metric is not a number);
* ``to_float(value, strict=True, what=...)`` raises a ``TypeError`` naming ``what`` and the
  value (the lightweight loop, for what ``train_step`` and friends return);
* ``accept_bool=True`` reads ``True``/``False`` as 1.0/0.0 (loggers plot a flag as a
  curve); otherwise a bool is not a number (``EarlyStopping`` must not compare flags).
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["to_float"]


def _single_item(value: Any) -> tuple[bool, Any]:
    """``(True, scalar)`` for numpy scalars and one-element tensors/arrays, else ``(False, None)``."""
    item = getattr(value, "item", None)
    if not callable(item) or isinstance(value, (str, bytes)):
        return False, None
    numel = getattr(value, "numel", None)
    size = getattr(value, "size", None)
    count = numel() if callable(numel) else size if isinstance(size, int) else 1
    if count != 1:
        return False, None
    try:
        return True, item()
    except (TypeError, ValueError, RuntimeError):
        return False, None


def to_float(value: Any, *, strict: bool = False, accept_bool: bool = False,
             what: str = "value") -> Optional[float]:
    """Convert a logged value to ``float``.

    Numbers are ``int``/``float``, numpy scalars, tensors and arrays holding exactly one
    element (``torch.tensor(0.5)``, ``torch.tensor([0.5])``) and objects defining
    ``__float__`` (``Decimal``, ``Fraction``). Strings are never numbers, even ``"0.5"``.
    NaN and infinities are returned as they are: finiteness is the caller's rule.

    Args:
        value: The value to convert.
        strict: Raise instead of returning None when ``value`` is not a number.
            Defaults to False.
        accept_bool: Read a bool (also a one-element bool tensor) as 1.0/0.0. Defaults to
            False (a bool is not a number).
        what: Names the value in the error message. Defaults to ``"value"``.

    Returns:
        The float, or None when ``value`` is not a number and ``strict`` is False.

    Raises:
        TypeError: ``strict=True`` and ``value`` is not a number.

    Example:
        >>> to_float(3), to_float(True), to_float(True, accept_bool=True), to_float("0.5")
        (3.0, None, 1.0, None)
    """
    result = _convert(value, accept_bool)
    if result is None and strict:
        raise TypeError(f"{what} must be a number (int, float, or a one-element tensor/array), got "
                        f"{value!r} ({type(value).__name__}).")
    return result


def _convert(value: Any, accept_bool: bool) -> Optional[float]:
    if isinstance(value, bool):
        return float(value) if accept_bool else None
    if isinstance(value, (int, float)):
        return float(value)
    if value is None or isinstance(value, (str, bytes)):
        return None
    found, scalar = _single_item(value)
    if found:
        if isinstance(scalar, bool):
            return float(scalar) if accept_bool else None
        return float(scalar) if isinstance(scalar, (int, float)) else None
    if hasattr(value, "__float__"):
        try:
            return float(value)
        except (TypeError, ValueError, OverflowError):
            return None
    return None
