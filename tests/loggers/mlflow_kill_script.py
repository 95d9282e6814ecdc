"""Train a stock ``transformers.Trainer`` with ``MLflowLogger`` and SIGKILL itself right after the
logger took the record of step ``KILL_AT`` (checkpoints every 20 steps, an evaluation every 10).

Usage: python mlflow_kill_script.py OUTPUT_DIR TRACKING_URI EXPERIMENT KILL_AT HANG_AFTER

``HANG_AFTER``: fault injection: the store answers that many ``log`` calls, then every later call
hangs, so the records after them are in flight (written to the log, never acknowledged) at the kill.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from transformers import TrainerCallback  # noqa: E402

from hf_callbacks_plus.loggers.mlflow import MLflowLogger  # noqa: E402
from tests.loggers.faults import FaultInjectingBackend  # noqa: E402
from tests.tiny_models import make_trainer  # noqa: E402

ARGS = dict(max_steps=60, logging_steps=1, eval_strategy="steps", eval_steps=10, save_strategy="steps",
            save_steps=20, n_train=120)


class HangAfter(FaultInjectingBackend):
    """Fault injection: ``log`` answers ``count`` calls, then hangs."""

    def __init__(self, backend, count: int) -> None:
        super().__init__(backend)
        self.count = count
        self.answered = threading.Event()

    def log(self, records, run_id):
        self.count -= 1
        if self.count < 0:
            self.entered.set()
            self.gate.wait()
        self.wrapped.log(records, run_id)
        self.answered.set()


class KillAfterLog(TrainerCallback):
    """Listed after the logger: at step 20, waits until the store answered a ``log`` call (so some
    records are acknowledged before the kill); SIGKILL once the record of step ``step`` is logged and
    the store hangs."""

    def __init__(self, step: int, hanging: HangAfter) -> None:
        self.step, self.hanging = step, hanging

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.global_step == 20 and "loss" in (logs or {}):
            self.hanging.answered.wait(120)
        if state.global_step == self.step and "loss" in (logs or {}):
            self.hanging.entered.wait(120)  # the records after the answered calls are in flight
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    output_dir, uri, experiment, kill_at, hang_after = sys.argv[1:6]
    logger = MLflowLogger(tracking_uri=uri, experiment_name=experiment)
    hanging = logger.backend = HangAfter(logger.backend, int(hang_after))
    make_trainer(output_dir, callbacks=[logger, KillAfterLog(int(kill_at), hanging)], **ARGS).train()


if __name__ == "__main__":
    main()
