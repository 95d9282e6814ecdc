"""The lines a stopping callback shows the user (``verbose=True``), once, on the main process.

Python's logging shows nothing below WARNING when the application configured no handler, so a
stop logged at INFO went unseen. A ``verbose`` callback writes its line to stderr itself
(through ``tqdm.write`` when tqdm is loaded, so a progress bar stays intact), only on the world
main process (``state.is_world_process_zero``: one line under DDP), and logs the same text at
DEBUG for log files. With ``verbose=False`` the line goes to the ``hf_callbacks_plus`` logger at
the given level instead.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = ["tell"]

logger = logging.getLogger("hf_callbacks_plus")


def tell(message: str, state: Any, *, verbose: bool, level: int = logging.INFO, file: Any = None) -> None:
    """Show ``message`` to the user once.

    Args:
        message: One line.
        state: The trainer state (``is_world_process_zero`` decides who speaks; absent = yes).
        verbose: Write the line to ``file`` (DEBUG in the log); else log it at ``level``.
        level: Logging level used when not ``verbose``. Defaults to INFO.
        file: Where a verbose line goes. Defaults to None: ``sys.stderr``.
    """
    if not verbose:
        logger.log(level, message)
        return
    logger.debug(message)
    if not getattr(state, "is_world_process_zero", True):
        return
    file = sys.stderr if file is None else file
    bar_class = getattr(sys.modules.get("tqdm"), "tqdm", None)  # loaded by a progress bar, if any
    write = getattr(bar_class, "write", None)
    if callable(write):
        write(message, file=file)
    else:
        print(message, file=file, flush=True)
