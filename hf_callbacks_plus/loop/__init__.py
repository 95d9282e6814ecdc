"""A transformers-free training loop with ``transformers.Trainer``'s exact callback semantics."""

from ..core.callback import EVENTS, TrainerCallback
from ..core.handler import CallbackHandler
from ..core.state import ExportableState, TrainerControl, TrainerState
from .arguments import LoopArguments
from .default_callbacks import DefaultFlowCallback, PrinterCallback, ProgressCallback
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
