"""Value normalization, name sanitizing and config flattening for the loggers (secrets: `secrets`).

Pure functions and small stateful helpers, no threads and no backend: the training thread
uses them (cheaply) before a record is handed to the background worker.

Policies (documented in ``docs/loggers.md``):

* Numbers: ``bool`` -> 1.0/0.0; ints, floats, numpy scalars and 0-d / one-element tensors
  (anything with ``.item()`` returning a number) -> ``float``.
* Strings (and other non-numbers such as ``None`` or lists) are not dropped silently: a string
  goes to the run summary (MLflow: a tag), anything else is dropped with one warning per key.
* NaN and +/-Inf are logged as they are (``nonfinite="keep"``, the default: a diverging loss
  is information) or dropped with one warning per key (``nonfinite="drop"``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, Callable, Optional

__all__ = [
    "NONFINITE_POLICIES",
    "NameSanitizer",
    "flatten_config",
    "normalize_value",
    "truncate",
]

logger = logging.getLogger("hf_callbacks_plus")

#: Accepted values of the ``nonfinite`` argument of the loggers.
NONFINITE_POLICIES = ("keep", "drop")

def normalize_value(value: Any) -> tuple[str, Any]:
    """Classify and convert one logged value.

    Args:
        value: Anything a ``logs`` dict may hold.

    Returns:
        ``("number", float)``, ``("text", str)`` or ``("drop", original)``.

    Example:
        >>> normalize_value(True)
        ('number', 1.0)
        >>> normalize_value("early")
        ('text', 'early')
    """
    if isinstance(value, bool):
        return "number", 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        return "number", float(value)
    if isinstance(value, str):
        return "text", value
    item = getattr(value, "item", None)
    if callable(item):
        size = getattr(value, "size", None)
        numel = getattr(value, "numel", None)
        count = numel() if callable(numel) else size if isinstance(size, int) else 1
        if count == 1:
            try:
                scalar = item()
            except (TypeError, ValueError, RuntimeError):
                return "drop", value
            if isinstance(scalar, bool):
                return "number", 1.0 if scalar else 0.0
            if isinstance(scalar, (int, float)):
                return "number", float(scalar)
            if isinstance(scalar, str):
                return "text", scalar
    return "drop", value


def is_finite(value: float) -> bool:
    """True for a finite float."""
    return not (math.isnan(value) or math.isinf(value))


def truncate(text: str, limit: Optional[int]) -> str:
    """Cut ``text`` to ``limit`` characters, marking the cut with ``...``."""
    if limit is None or len(text) <= limit:
        return text
    return text[: max(0, limit - 3)] + "..."


def flatten_config(config: Mapping[str, Any], prefix: str = "", separator: str = ".") -> dict[str, Any]:
    """Flatten nested dicts (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``); other values are kept."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{separator}{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, name, separator))
        else:
            flat[name] = value
    return flat


class NameSanitizer:
    """Maps rendered metric names to names a backend accepts, detecting collisions.

    Args:
        clean: Function turning one name into an accepted one (e.g. replacing forbidden
            characters with ``_``).
        max_length: Longest accepted name, or None. Defaults to None.

    Two different names that clean to the same string keep distinct names: the later one
    gets a ``_2``, ``_3``... suffix, with one warning per name.
    """

    def __init__(self, clean: Callable[[str], str], max_length: Optional[int] = None) -> None:
        self._clean = clean
        self._max_length = max_length
        self._mapping: dict[str, str] = {}
        self._owner: dict[str, str] = {}

    def __call__(self, name: str) -> str:
        """Return the backend name of ``name`` (stable for the life of the logger)."""
        known = self._mapping.get(name)
        if known is not None:
            return known
        cleaned = self._clean(name)
        if self._max_length is not None:
            cleaned = cleaned[: self._max_length]
        candidate = cleaned
        counter = 2
        while candidate in self._owner and self._owner[candidate] != name:
            candidate = f"{cleaned}_{counter}"
            counter += 1
        if candidate != name:
            if candidate != cleaned:
                logger.warning(
                    "Metric names %r and %r both become %r for this backend; logging %r as %r.",
                    self._owner[cleaned], name, cleaned, name, candidate,
                )
            else:
                logger.debug("Metric name %r sanitized to %r.", name, candidate)
        self._mapping[name] = candidate
        self._owner[candidate] = name
        return candidate


class WarnOnce:
    """Emit a warning once per key."""

    def __init__(self) -> None:
        self._seen: set[Any] = set()

    def __call__(self, key: Any, message: str, *args: Any) -> None:
        """Log ``message % args`` as a warning the first time ``key`` is seen."""
        if key in self._seen:
            return
        self._seen.add(key)
        logger.warning(message, *args)
