"""Train a stock ``transformers.Trainer`` with one tracker logger, make the tracker's writer slow, and
SIGKILL the training (alone, or with its whole process group) after a checkpoint; or resume it.

Usage: python tracker_kill_script.py OUTPUT_DIR TRACKER KILL_AT SLOW_FROM KILL

* ``TRACKER``: ``wandb`` (offline, from the environment), ``tensorboard``, ``trackio`` or ``jsonl``;
* ``KILL_AT``: ``N``: SIGKILL right after the record of step N was handed to the logger; ``sN``: in the
  save of step N, once the checkpoint is complete and before the logger hears of the save (the killing
  callback is listed first); ``0``: resume from the newest checkpoint instead and train to the end;
* ``SLOW_FROM``: from that step on, the tracker's own writer is slow (fault injection): W&B's service
  process is stopped (SIGSTOP), TensorBoard's writer thread and trackio's writer thread sleep 0.5 s
  before each write;
* ``KILL``: ``process`` (the training process only; a stopped W&B service is continued after it, so
  it may write what it holds) or ``group`` (the whole process group, and W&B's service, which runs in
  a session of its own, as a cluster ends a job).

Checkpoints every 20 steps, an evaluation every 10, 80 steps.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from transformers import TrainerCallback  # noqa: E402

from tests.tiny_models import make_trainer  # noqa: E402

ARGS = dict(max_steps=80, logging_steps=1, eval_strategy="steps", eval_steps=10, save_strategy="steps",
            save_steps=20, n_train=160)
SLOW_SECONDS = 0.5


def children_named(name: str) -> list[int]:
    """The pids of this process's descendants whose command line holds ``name``."""
    found, parents = [], {os.getpid()}
    for _ in range(3):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) in parents:
                parents.add(int(entry))
                if name in command and int(entry) not in found:
                    found.append(int(entry))
    return found


def slow_down(tracker: str, logger) -> list[int]:
    """Fault injection: make the tracker's own writer slow from now on; the pids stopped."""
    if tracker == "wandb":
        stopped = children_named("wandb-core")
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        return stopped
    if tracker == "tensorboard":
        writer = logger.backend._writer._get_file_writer().event_writer._async_writer._writer
        write = writer.write
        writer.write = lambda data: (time.sleep(SLOW_SECONDS), write(data))[1]
    if tracker == "trackio":
        from trackio.sqlite_storage import SQLiteStorage

        bulk_log = SQLiteStorage.bulk_log
        slow = lambda *a, **k: (time.sleep(SLOW_SECONDS), bulk_log(*a, **k))[1]  # noqa: E731
        SQLiteStorage.bulk_log = staticmethod(slow)
    return []


class SlowThenKill(TrainerCallback):
    """Listed before the logger: slows the tracker's writer at ``slow_from``; SIGKILLs at ``kill_at``."""

    def __init__(self, tracker: str, logger, kill_at: str, slow_from: int, kill: str) -> None:
        self.tracker, self.logger, self.kill_at, self.slow_from = tracker, logger, kill_at, slow_from
        self.kill = kill
        self.stopped: list[int] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.global_step == self.slow_from and "loss" in (logs or {}) and not self.stopped:
            self.stopped = slow_down(self.tracker, self.logger) or [0]
        if f"{state.global_step}" == self.kill_at and "loss" in (logs or {}):
            self.die(state)

    def on_save(self, args, state, control, **kwargs):
        if f"s{state.global_step}" == self.kill_at:
            self.die(state)

    def die(self, state) -> None:
        print("KILL", state.global_step, flush=True)
        if self.kill == "group":  # as a cluster ends a job: W&B's service (its own session) too
            for pid in children_named("wandb-core"):
                os.kill(pid, signal.SIGKILL)
            os.killpg(os.getpgrp(), signal.SIGKILL)
        if os.fork() == 0:  # continue the stopped service once this process is gone
            time.sleep(0.5)
            for stopped in self.stopped:
                if stopped:
                    try:
                        os.kill(stopped, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
            os._exit(0)
        os.kill(os.getpid(), signal.SIGKILL)


def make_logger(tracker: str, out: Path):
    if tracker == "wandb":
        from tests.loggers.wandb_helpers import fast_logger

        return fast_logger(project="kill", flush_timeout=300.0)  # a loaded machine: W&B starts slowly
    if tracker == "tensorboard":
        from hf_callbacks_plus.loggers.tensorboard import TensorBoardLogger

        return TensorBoardLogger(log_dir=str(out / "tb"))
    if tracker == "trackio":
        from hf_callbacks_plus.loggers.trackio import TrackioLogger

        return TrackioLogger(project=os.environ["KILL_TEST_TRACKIO_PROJECT"])
    from hf_callbacks_plus.loggers.jsonl import JsonlLogger

    return JsonlLogger(str(out / "log.jsonl"))


if __name__ == "__main__":
    out, tracker, kill_at, slow_from, kill = Path(sys.argv[1]), *sys.argv[2:4], int(sys.argv[4]), sys.argv[5]
    logger = make_logger(tracker, out)
    killer = SlowThenKill(tracker, logger, kill_at, slow_from, kill)
    callbacks = [killer, logger] if kill_at != "0" else [logger]
    trainer = make_trainer(out, callbacks=callbacks, **ARGS)
    trainer.train(resume_from_checkpoint=None if kill_at != "0" else True)
    if tracker == "wandb":
        logger.close()
