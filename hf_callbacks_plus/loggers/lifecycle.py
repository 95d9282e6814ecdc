"""Process-level concerns of the tracker loggers: which process logs, closing at exit.

* `is_main_process`: only world rank 0 logs (``state.is_world_process_zero`` and the
  ``RANK`` environment variable, checked at call time);
* every open logger is in `LIVE`; an ``atexit`` hook closes them, FAILED when
  training was still running (a stock ``transformers.Trainer`` has no exception event, so
  this is how a crashed run gets its status), else FINISHED.
"""

from __future__ import annotations

import atexit
import logging
import os
import weakref
from typing import Any

__all__ = ["FAILED", "FINISHED", "LIVE", "is_main_process"]

logger = logging.getLogger("hf_callbacks_plus")

FINISHED = "FINISHED"
FAILED = "FAILED"

#: The loggers with an open run (``TrackerLogger`` instances).
LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def _close_all_at_exit() -> None:
    for tracker in list(LIVE):
        try:
            tracker.close(FAILED if tracker.training else FINISHED)
        except Exception as error:  # never raise at interpreter exit
            logger.warning("%s: could not close at exit: %s", type(tracker).__name__, error)


atexit.register(_close_all_at_exit)


def is_main_process(state: Any = None) -> bool:
    """True on the process that should log: world rank 0 (``state`` and env ``RANK``)."""
    if os.environ.get("RANK", "0").strip() not in ("", "0"):
        return False
    return bool(getattr(state, "is_world_process_zero", True)) if state is not None else True
