"""A kit for testing callbacks: event traces, trace diffs, W&B offline run readers."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EventRecorder": "hf_callbacks_plus.testing.recorder",
    "TraceEvent": "hf_callbacks_plus.testing.recorder",
    "diff_traces": "hf_callbacks_plus.testing.recorder",
    "read_wandb_run": "hf_callbacks_plus.testing.wandb_reader",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hf_callbacks_plus.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
