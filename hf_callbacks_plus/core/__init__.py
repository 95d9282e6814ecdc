"""The callback protocol every other layer builds on.

State and control (``state``), the callback interface (``callback``), the dispatching
handler (``handler``), the self-restoring stateful-callback base (``stateful``), and what both
runners share about resuming: the pre-flight check (``resume_check``) and the checkpoint
folders (``checkpoint_folders``: names, the newest complete one). Nothing here imports a
trainer (see ``docs/architecture.md``).
"""

from .callback import EVENTS, TrainerCallback
from .handler import CallbackHandler, listens
from .state import ExportableState, TrainerControl, TrainerState
from .stateful import SelfRestoringState

__all__ = [
    "EVENTS",
    "CallbackHandler",
    "ExportableState",
    "SelfRestoringState",
    "TrainerCallback",
    "TrainerControl",
    "TrainerState",
    "listens",
]
