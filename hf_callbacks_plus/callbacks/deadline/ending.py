"""How a training ended, for `Deadline`: the reason, the exit code a job script tests, and the
status file a launcher cannot swallow.

``torchrun`` (and ``accelerate launch``, which runs it) exits with 1 whatever code its workers
returned when one is not 0, and with 1 after forwarding a signal; a single-process ``accelerate
launch`` dies of SIGTERM without telling its child. So the worker's exit code does not reach a job
script through a launcher: rank 0 also writes the ending into a small JSON file, and
``hf-callbacks-plus stop-status <file>`` exits with its code.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Optional, Union

from ...core.state import write_json_atomically

__all__ = ["REQUEUE_EXIT_CODE", "UNFINISHED_EXIT_CODE", "Ending", "EndReason", "read_status", "write_status"]

#: ``EX_TEMPFAIL`` of ``sysexits.h``: a temporary failure, try again (here: resume).
REQUEUE_EXIT_CODE = 75
#: What `read_status` gives for a run that never recorded its end (it crashed or was killed).
UNFINISHED_EXIT_CODE = 1


class EndReason(str, Enum):
    """Why a training ended (what ``deadline/reason`` says in the trackers)."""

    RUNNING = "running"
    COMPLETED = "completed"  # max_steps or the last epoch reached
    STOPPED = "stopped"  # another callback stopped it (EarlyStopping, TerminateOnNonFinite...)
    BUDGET = "budget"  # the total budget across resumes is spent: done, not to be resumed
    DEADLINE = "deadline"  # this process's duration or the absolute time: resume it
    SIGNAL = "signal"  # a signal (SIGTERM, SIGUSR1...): resume it

    @property
    def resumable(self) -> bool:
        """The run is unfinished and meant to be resumed (a job script requeues it)."""
        return self in (EndReason.DEADLINE, EndReason.SIGNAL)


@dataclass
class Ending:
    """The end of one ``train()`` call, as the status file holds it."""

    reason: EndReason = EndReason.RUNNING
    step: int = 0
    signal: Optional[str] = None
    checkpoint: Optional[str] = None
    max_steps: int = 0
    exit_code: int = UNFINISHED_EXIT_CODE
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``"SIGTERM"`` for a signal, else the reason's value."""
        return self.signal if self.reason is EndReason.SIGNAL and self.signal else self.reason.value

    def to_dict(self) -> dict[str, Any]:
        """The JSON payload."""
        data = asdict(self)
        data["reason"] = self.reason.value
        return data


def write_status(path: Union[str, os.PathLike], ending: Ending) -> None:
    """Write ``ending`` to ``path`` atomically (creating its folder)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    write_json_atomically(path, ending.to_dict())


def read_status(path: Union[str, os.PathLike]) -> tuple[int, str]:
    """The exit code and a line about the ending recorded in ``path``.

    A missing or unreadable file, or a run still recorded as running (it crashed, or was killed
    before its end), gives `UNFINISHED_EXIT_CODE`.
    """
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        reason = EndReason(data.get("reason", "running"))
        code = int(data.get("exit_code", UNFINISHED_EXIT_CODE))
    except FileNotFoundError:
        return UNFINISHED_EXIT_CODE, f"{path}: no such file (the training never started, or wrote elsewhere)"
    except (OSError, ValueError, TypeError, AttributeError) as error:
        return UNFINISHED_EXIT_CODE, f"{path}: unreadable ({type(error).__name__}: {error})"
    if reason is EndReason.RUNNING:
        return UNFINISHED_EXIT_CODE, (f"{path}: the training started at step {data.get('step')} and "
                                      "recorded no end: it crashed or was killed")
    return code, str(data.get("message") or f"ended: {reason.value} at step {data.get('step')}")
