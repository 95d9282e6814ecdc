"""Train a stock ``transformers.Trainer`` with every logger and raise at step 6, after checkpoint-4:
a stock Trainer has no exception event, so only the loggers' exit hooks can end their runs.

Usage: python crash_script.py OUTPUT_DIR SQLITE_URI (W&B offline from the environment).
Prints ``CRASH <time>`` when it raises.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from transformers import TrainerCallback  # noqa: E402

from tests.loggers.test_crash_at_exit import ARGS, loggers  # noqa: E402
from tests.tiny_models import make_trainer  # noqa: E402


class FailingAtStep6(TrainerCallback):
    """Listed after the loggers: raises once the record of step 6 is logged."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.global_step == 6:
            print("CRASH", time.time(), flush=True)
            raise RuntimeError("boom at step 6")


if __name__ == "__main__":
    make_trainer(sys.argv[1], callbacks=[*loggers(sys.argv[2]), FailingAtStep6()], **ARGS).train()
