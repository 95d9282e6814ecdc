"""Value normalization, name sanitizing and config flattening/redaction for the loggers.

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
import re
from collections.abc import Mapping
from typing import Any, Callable, Optional

__all__ = [
    "NONFINITE_POLICIES",
    "REDACTED",
    "NameSanitizer",
    "flatten_config",
    "command_line_has_secret",
    "is_secret_key",
    "looks_like_secret",
    "normalize_value",
    "redact_config",
    "truncate",
]

logger = logging.getLogger("hf_callbacks_plus")

#: Accepted values of the ``nonfinite`` argument of the loggers.
NONFINITE_POLICIES = ("keep", "drop")

#: What a secret value is replaced with before it reaches a backend.
REDACTED = "<redacted>"

# A key "names a secret" when one of its words (split on "_", "-", "." and camelCase) is one of
# these; ``*_token_id(s)`` (tokenizer ids) and counters such as ``num_tokens`` are not secrets.
_SECRET_WORDS = re.compile(
    r"(?:^|_)(token|secret|secrets|password|passwd|pwd|apikey|api_key|access_key|private_key|"
    r"credential|credentials|auth)(?:_|$)"
)
_NOT_SECRET_SUFFIXES = ("_id", "_ids", "_type", "_length", "_len")
# Values that look like secrets whatever their key (Hugging Face and W&B style tokens).
_SECRET_VALUE = re.compile(r"^(hf_[A-Za-z0-9]{20,}|[0-9a-f]{40})$")


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


def is_secret_key(key: str) -> bool:
    """Tell whether a config key names a secret (token, secret, password, api key...).

    Args:
        key: A config key, possibly dotted (``"args.hub_token"``); only the last part counts.

    Returns:
        True for ``hub_token``, ``api_key``, ``WANDB_API_KEY``, ``db_password``...; False for
        ``pad_token_id`` or ``include_num_input_tokens_seen``.
    """
    last = re.split(r"[./]", key)[-1]
    last = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", last).lower().replace("-", "_")
    if last.endswith(_NOT_SECRET_SUFFIXES):
        return False
    return bool(_SECRET_WORDS.search(last))


def looks_like_secret(key: str, value: Any) -> bool:
    """True when a string ``value`` must not reach a backend: its key names a secret
    (`is_secret_key`) or the value looks like an access token (``hf_...``, 40 hex digits).

    Example:
        >>> looks_like_secret("train/hub_token", "hf_x"), looks_like_secret("train/note", "hello")
        (True, False)
    """
    if not isinstance(value, str) or value == "":
        return False
    return is_secret_key(key) or bool(_SECRET_VALUE.match(value.strip()))


def command_line_has_secret(argv: list[str]) -> bool:
    """True when a command line passes a secret: ``--hub_token X``, ``--api-key=X``, or a value
    that looks like an access token.

    Example:
        >>> command_line_has_secret(["--hub_token", "hf_x"]), command_line_has_secret(["--lr", "0.1"])
        (True, False)
    """
    for index, arg in enumerate(argv):
        if _SECRET_VALUE.match(arg.strip()):
            return True
        if arg.startswith("-"):
            flag, _, inline = arg.lstrip("-").partition("=")
            if is_secret_key(flag.replace("-", "_")):
                value = inline if inline else (argv[index + 1] if index + 1 < len(argv) else "")
                if value and not value.startswith("-"):
                    return True
    return False


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


def redact_config(config: Mapping[str, Any]) -> dict[str, str]:
    """Turn a flat config into strings, replacing every secret with ``<redacted>``.

    A value is redacted when its key names a secret (`is_secret_key`) or when the value
    itself looks like an access token (``hf_...``, 40 hex digits). Nested containers are turned
    into their ``repr``; a secret nested inside a list is caught by the value pattern only, so
    keep secrets in top-level fields.
    """
    out: dict[str, str] = {}
    for key, value in config.items():
        text = value if isinstance(value, str) else str(value)
        if is_secret_key(key) and value not in (None, "", False):
            text = REDACTED
        elif isinstance(value, str) and _SECRET_VALUE.match(value.strip()):
            text = REDACTED
        out[key] = text
    return out


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
