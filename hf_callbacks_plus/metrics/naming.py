"""Metric-dict helpers of the key grammar: flattening, prefixing, "did you mean".

Re-exported by `hf_callbacks_plus.metrics.keys` (import them from there).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["NESTED_SEPARATOR", "add_prefix", "did_you_mean", "flatten_metrics"]

logger = logging.getLogger("hf_callbacks_plus")

#: Separator used when flattening nested metric dicts.
NESTED_SEPARATOR = "."


def flatten_metrics(metrics: Mapping[str, Any], separator: str = NESTED_SEPARATOR) -> dict[str, Any]:
    """Flatten nested dicts returned by ``compute_metrics``.

    Args:
        metrics: A possibly nested mapping, e.g. ``{"f1": {"macro": 0.5}}``.
        separator: Joins nested names. Defaults to ``"."``.

    Returns:
        A flat dict, e.g. ``{"f1.macro": 0.5}``. When two entries flatten to the same name
        (``{"f1.macro": 1, "f1": {"macro": 2}}``) the later one gets a ``_`` suffix and a
        warning is logged: no value is dropped silently.
    """
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        key = str(key)
        if isinstance(value, Mapping):
            for sub_key, sub_value in flatten_metrics(value, separator).items():
                _put_unique(flat, f"{key}{separator}{sub_key}", sub_value)
        else:
            _put_unique(flat, key, value)
    return flat


def _put_unique(flat: dict[str, Any], key: str, value: Any) -> None:
    if key in flat:
        unique = key + "_"
        while unique in flat:
            unique += "_"
        logger.warning(
            "Nested metrics flatten to the same name %r; logging the later one as %r.", key, unique
        )
        key = unique
    flat[key] = value


def add_prefix(metrics: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """Prefix metric names like ``Trainer.evaluate`` does, never doubling the prefix.

    Args:
        metrics: Metric names to values (nested dicts are flattened).
        prefix: ``"eval"``, ``"train"``, ``"eval_squad"``...

    Returns:
        ``{"<prefix>_<name>": value}``; a name that already starts with ``<prefix>_`` is
        kept as is, so ``eval_eval_loss`` is never produced.
    """
    out: dict[str, Any] = {}
    flat = flatten_metrics(metrics)
    for key, value in flat.items():
        target = key if key.startswith(f"{prefix}_") else f"{prefix}_{key}"
        if target in out or (target != key and target in flat):
            logger.warning(
                "add_prefix: %r and %r both name %r; keeping the value already prefixed.",
                key, target, target,
            )
            continue
        out[target] = value
    return out


def did_you_mean(wanted: str, available: Iterable[str], limit: int = 3) -> list[str]:
    """Return up to ``limit`` keys from ``available`` that look like ``wanted``."""
    available = list(available)
    matches = difflib.get_close_matches(wanted, available, n=limit, cutoff=0.5)
    if not matches:
        tail = wanted.split("_")[-1].split("/")[-1]
        matches = [key for key in available if key.endswith(tail)][:limit]
    return matches
