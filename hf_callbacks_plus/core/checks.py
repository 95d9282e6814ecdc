"""Argument checks with one message shape: the callback, the argument, the value, what is valid.

``EarlyStopping: patience must be an int >= 0 (evaluations without improvement before
stopping), got 2.5 (float).`` A wrong type raises ``TypeError``; a value out of range or not
among the choices, ``ValueError``. ``owner`` (the class the user built) starts every message;
each check returns the value.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any, Optional

__all__ = ["check_bool", "check_choice", "check_int", "check_name", "check_names", "check_number"]


def _got(value: Any) -> str:
    return f"got {value!r} ({type(value).__name__})"


def check_bool(owner: str, name: str, value: Any) -> bool:
    """True or False (not 0/1, not a string)."""
    if not isinstance(value, bool):
        raise TypeError(f"{owner}: {name} must be True or False, got {value!r}.")
    return value


def check_choice(owner: str, name: str, value: Any, choices: Iterable[Any]) -> Any:
    """One of ``choices``."""
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"{owner}: {name} must be one of {choices}, got {value!r}.")
    return value


def check_int(owner: str, name: str, value: Any, minimum: Optional[int] = None, meaning: str = "") -> int:
    """An integral number (not a bool), at least ``minimum``; ``meaning`` says what it counts."""
    wanted = f"an int >= {minimum}" if minimum is not None else "an int"
    wanted += f" ({meaning})" if meaning else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: {name} must be {wanted}, {_got(value)}.")
    if minimum is not None and value < minimum:
        raise ValueError(f"{owner}: {name} must be {wanted}, got {value!r}.")
    return value


def check_number(owner: str, name: str, value: Any, *, allow_none: bool = False,
                 minimum: Optional[float] = None) -> Optional[float]:
    """A finite real number (not a bool), at least ``minimum``; or None when ``allow_none``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {name} must be {'a number or None' if allow_none else 'a number'}, "
                        f"{_got(value)}.")
    if not math.isfinite(value):
        raise ValueError(f"{owner}: {name} must be finite, got {value!r}.")
    if minimum is not None and value < minimum:
        raise ValueError(f"{owner}: {name} must be >= {minimum}, got {value!r}.")
    return float(value)


def check_name(owner: str, name: str, value: Any, *, example: str = "", none: str = "") -> Optional[str]:
    """A non-empty string; or None when ``none`` says what None means. ``example``: a valid value."""
    if (value is None and none) or (isinstance(value, str) and value):
        return value
    example = f" (e.g. {example!r})" if example else ""
    alternative = f" or None ({none})" if none else ""
    raise TypeError(f"{owner}: {name} must be a non-empty string{example}{alternative}, got {value!r}.")


def check_names(owner: str, name: str, value: Any,
                what: str = "a list of non-empty strings") -> tuple[str, ...]:
    """A sequence of non-empty strings (a bare string gets "did you mean [it]?"); ``what`` says so."""
    if isinstance(value, Sequence) and not isinstance(value, str) \
            and all(isinstance(item, str) and item for item in value):
        return tuple(value)
    hint = f"; did you mean [{value!r}]?" if isinstance(value, str) else "."
    raise TypeError(f"{owner}: {name} must be {what}, got {value!r}{hint}")
