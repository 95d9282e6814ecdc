"""A transformers-free training loop with ``transformers.Trainer``'s exact callback semantics."""

from .arguments import LoopArguments
from .callback import EVENTS, CallbackHandler, TrainerCallback
from .flow import DefaultFlowCallback, PrinterCallback, ProgressCallback
from .state import ExportableState, TrainerControl, TrainerState
from .trainer import LightweightTrainer, TrainOutput

__all__ = [
    "EVENTS",
    "CallbackHandler",
    "DefaultFlowCallback",
    "ExportableState",
    "LightweightTrainer",
    "LoopArguments",
    "PrinterCallback",
    "ProgressCallback",
    "TrainOutput",
    "TrainerCallback",
    "TrainerControl",
    "TrainerState",
]
