"""A transformers-free training loop with ``transformers.Trainer``'s exact callback semantics."""

from .callback import EVENTS, CallbackHandler, TrainerCallback
from .state import ExportableState, TrainerControl, TrainerState

__all__ = [
    "EVENTS",
    "CallbackHandler",
    "ExportableState",
    "TrainerCallback",
    "TrainerControl",
    "TrainerState",
]
