"""``WandbLogger`` is a thin adapter over W&B's own background machinery (issue 16, design 1): its
records go straight to ``run.log`` (W&B's service process writes and uploads them), nothing of
ours queues, retries or spills them, and ``wandb.init`` / ``run.finish`` run on a thread of
their own, bounded by ``flush_timeout``.

Real W&B offline runs read back from their run files. ``SlowInitWandb`` and ``FailingInitWandb``
(``tests/loggers/faults.py``) are fault injection: a ``wandb.init`` that takes seconds, or that
raises (W&B offline cannot be made slow or unreachable for real).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hf_callbacks_plus.core.callback import TrainerCallback
from hf_callbacks_plus.loggers.inline import InlineWriter
from hf_callbacks_plus.loop.arguments import LoopArguments
from hf_callbacks_plus.loop.trainer import LightweightTrainer
from tests.loggers.faults import FailingInitWandb, SlowInitWandb

pytest.importorskip("wandb")

pytestmark = pytest.mark.wandb

STEPS = 12


class Extras(TrainerCallback):
    """Listed before the logger: ``metrics`` extra keys in every training record."""

    def __init__(self, metrics: int) -> None:
        self.metrics = metrics

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "loss" in logs:
            logs.update({f"extra_{i}": float(i) for i in range(self.metrics)})


def train(tmp_path: Path, logger, step_seconds: float = 0.0, metrics: int = 0, before=()) -> list[float]:
    """A loop training of ``STEPS`` steps logging every step; returns when each step began."""
    began: list[float] = []

    def step(batch):
        began.append(time.monotonic())
        time.sleep(step_seconds)
        return 0.5

    args = LoopArguments(output_dir=str(tmp_path / "out"), max_steps=STEPS, logging_steps=1,
                         disable_tqdm=True)
    LightweightTrainer(args, train_step=step, train_data=[[1.0]] * STEPS,
                       callbacks=[*before, Extras(metrics), logger], learning_rate_fn=lambda: 0.1).train()
    return began


@pytest.fixture
def wandb_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from tests.loggers.wandb_helpers import offline_env

    return offline_env(monkeypatch, tmp_path / "wandb_root")


def test_records_logged_while_wandb_init_runs_reach_the_run_in_order_and_training_never_waits(
        tmp_path, wandb_root):
    """``wandb.init`` takes 2 s; the training does not wait for it, and every step logged meanwhile
    is in the run once, in order. Nothing of ours spills: no spill folder, no worker thread.
    Before: a `BackgroundWorker` (with its spill file) stood in front of W&B's service."""
    from tests.loggers.wandb_helpers import fast_logger, runs

    logger = fast_logger(project="direct", log_config=False)
    logger.backend._wandb = SlowInitWandb(logger.backend._wandb, delay=2.0)
    opened: list[Any] = []
    threads: set[str] = set()

    class SeeTheWriter(TrainerCallback):
        """During training: what carries the records, and the threads alive then."""

        def on_step_end(self, args, state, control, **kwargs):
            opened.append(logger.worker)
            threads.update(thread.name for thread in threading.enumerate())

    started = time.monotonic()
    began = train(tmp_path, logger, step_seconds=0.05, before=[SeeTheWriter()])
    assert began[0] - started < 1.5, began[0] - started  # the training did not wait for wandb.init
    assert began[-1] - started < 2.0  # all steps ran before the run opened
    assert all(isinstance(writer, InlineWriter) for writer in opened), opened
    assert "hf-callbacks-plus-WandbLogger" not in threads, threads  # the worker's thread, before
    assert "hf-callbacks-plus-WandbLogger-open" in threads  # wandb.init's, while it ran
    (run,) = runs(wandb_root)
    assert run.steps("train/loss") == list(range(1, STEPS + 1))
    assert run.exit_code == 0 and run.run_id == logger.run_id


def test_a_run_that_cannot_open_is_told_with_what_is_lost_and_where_the_data_is(tmp_path, wandb_root,
                                                                               caplog):
    """``wandb.init`` raises: one error when it does, one at the end counting every record not in W&B
    and naming where they still are (the trainer's log history); training ends normally, quickly,
    nothing is retried and nothing spilled. Before: retried as an outage and spilled to our file."""
    from tests.loggers.wandb_helpers import fast_logger

    logger = fast_logger(project="unreachable", log_config=False, flush_timeout=10.0)
    logger.backend._wandb = FailingInitWandb(logger.backend._wandb, delay=0.2)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train(tmp_path, logger, step_seconds=0.05)
    assert time.monotonic() - started < 5.0
    errors = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert any("could not open the run" in message and "unreachable (injected)" in message
               for message in errors), errors
    assert any(f"{STEPS + 1} record(s) could not be written" in message and "log_history" in message
               for message in errors), errors  # 12 training records and the end-of-training totals
    assert not (tmp_path / "out" / ".tracker_spill").exists()
    assert not list(wandb_root.rglob("*.wandb"))


def test_records_beyond_the_memory_bound_while_init_runs_are_counted_and_told(tmp_path, wandb_root, caplog):
    """``wandb.init`` takes 2 s and each training record holds 102 points against a bound of 450: the
    first four wait for the run and reach it, the next eight are counted as lost and told, never
    held without bound; the small end-of-training record fits again and reaches the run."""
    from tests.loggers.wandb_helpers import fast_logger, runs

    logger = fast_logger(project="bounded", log_config=False, max_memory_points=450)
    logger.backend._wandb = SlowInitWandb(logger.backend._wandb, delay=2.0)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train(tmp_path, logger, metrics=99)
    errors = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert any("max_memory_points" in message for message in errors), errors
    assert any(f"{STEPS - 4} record(s) could not be written" in message for message in errors), errors
    (run,) = runs(wandb_root)
    assert run.steps("train/loss") == [1, 2, 3, 4] and run.exit_code == 0
    assert "train_summary/runtime" in run.summary


def test_a_wandb_init_longer_than_the_close_deadline_ends_training_on_time(tmp_path, wandb_root, caplog):
    """``wandb.init`` takes 3 s, ``flush_timeout`` is 1 s: ``train()`` ends about 1 s after its last
    step, with one error counting the records that were waiting. Before the run opened nothing
    could be sent; the run W&B opens afterwards is finished by the test."""
    from tests.loggers.wandb_helpers import fast_logger

    logger = fast_logger(project="late", log_config=False, flush_timeout=1.0)
    logger.backend._wandb = SlowInitWandb(logger.backend._wandb, delay=3.0)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        began = train(tmp_path, logger)
        ended = time.monotonic()
    assert ended - began[-1] < 2.5, ended - began[-1]
    errors = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    assert any("did not open within 1 s" in message and f"{STEPS + 1} record(s)" in message
               for message in errors), errors
    deadline = time.monotonic() + 60
    while logger.backend.run is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if logger.backend.run is not None:
        logger.backend.run.finish()


def test_a_finish_longer_than_the_deadline_is_left_to_the_library_and_told(tmp_path, wandb_root, caplog):
    """``run.finish`` hangs (fault injection: W&B's service still uploading): closing ends at its
    deadline (here 0.5 s + 0.5 s for the call in flight; ``on_train_end`` uses ``flush_timeout`` + 5
    s), with one warning naming the run's folder, where W&B keeps its data; the run is finished in
    the background."""
    from tests.loggers.wandb_helpers import fast_logger, runs

    logger = fast_logger(project="slow-finish", log_config=False)
    real_finish = logger.backend.finish
    released = threading.Event()

    def hanging_finish(status, run_id):
        released.wait(30)
        real_finish(status, run_id)

    logger.backend.finish = hanging_finish
    closing: list[float] = []

    class CloseWithAShortDeadline(TrainerCallback):
        """Listed before the logger: closes it as ``on_train_end`` would, with a short deadline, once
        the run is open (the logger's own ``on_train_end`` then has nothing left to close)."""

        def on_train_end(self, args, state, control, **kwargs):
            assert logger.worker.wait_started(60)
            start = time.monotonic()
            closed = logger.close("FINISHED", timeout=0.5, grace=0.5)
            closing.append(time.monotonic() - start)
            assert not closed

    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train(tmp_path, logger, before=[CloseWithAShortDeadline()])
    released.set()
    assert closing[0] < 3.0, closing  # the deadline, not the 30 s finish
    told = [record.getMessage() for record in caplog.records if "still being finished" in record.getMessage()]
    assert len(told) == 1 and "offline-run-" in told[0] and logger.run_id in told[0], told
    (run,) = runs(wandb_root)
    assert run.steps("train/loss") == list(range(1, STEPS + 1)) and run.exit_code == 0
