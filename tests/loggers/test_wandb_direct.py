"""``WandbLogger`` hands W&B its records from a thread of ours fed by the run's write-ahead log:
``wandb.init`` and ``run.finish`` run on the sender's thread (training waits for ``wandb.init`` at most
``flush_timeout``), the training thread appends a line and hands it to ``run.log`` when nothing waits,
records wait in the file (never in memory) while ``wandb.init`` runs, and closing is bounded by
``flush_timeout``.

Real W&B offline runs read back from their run files. ``SlowInitWandb`` and ``FailingInitWandb``
(``tests/loggers/faults.py``) are fault injection: a ``wandb.init`` held until the test releases
it, or that raises (W&B offline cannot be made slow or unreachable for real).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from hf_callbacks_plus.core.callback import TrainerCallback
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


class ReleaseAtLastStep(TrainerCallback):
    """Listed after the logger: ``wandb.init`` may return once the last step is logged."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == STEPS:
            self.gate.set()


def train(tmp_path: Path, logger, metrics: int = 0, before=(), after=()) -> list[float]:
    """A loop training of ``STEPS`` steps logging every step; returns when each step began."""
    began: list[float] = []

    def step(batch):
        began.append(time.monotonic())
        return 0.5

    args = LoopArguments(output_dir=str(tmp_path / "out"), max_steps=STEPS, logging_steps=1,
                         disable_tqdm=True)
    LightweightTrainer(args, train_step=step, train_data=[[1.0]] * STEPS,
                       callbacks=[*before, Extras(metrics), logger, *after],
                       learning_rate_fn=lambda: 0.1).train()
    return began


@pytest.fixture
def wandb_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from tests.loggers.wandb_helpers import offline_env

    return offline_env(monkeypatch, tmp_path / "wandb_root")


def test_training_starts_once_wandb_init_returned_on_the_senders_thread(tmp_path, wandb_root):
    """As with ``WandbCallback``, the first step waits for ``wandb.init`` (made to take 0.5 s), which runs
    on the sender's thread while the training thread waits: beside a running training it costs more CPU
    (the GIL changes hands at every torch op; docs/benchmarks.md). Then every step reaches the run."""
    from tests.loggers.wandb_helpers import fast_logger, runs

    opened: list[tuple[float, str]] = []

    class InitSeen(SlowInitWandb):
        def init(self, *args, **kwargs):
            run = super().init(*args, **kwargs)
            opened.append((time.monotonic(), threading.current_thread().name))
            return run

    logger = fast_logger(project="waits", log_config=False)
    logger.backend._wandb = InitSeen(logger.backend._wandb, delay=0.5)
    began = train(tmp_path, logger)
    logger.close()
    ((returned, thread),) = opened
    assert thread == "hf-callbacks-plus-WandbLogger" and began[0] > returned, (thread, began[0] - returned)
    (run,) = runs(wandb_root)
    assert run.steps("train/loss") == list(range(1, STEPS + 1)) and run.exit_code == 0


def test_records_logged_while_a_wandb_init_longer_than_flush_timeout_runs_reach_the_run_in_order(
        tmp_path, wandb_root):
    """``wandb.init`` returns only after the last step: training waited for it ``flush_timeout`` (1 s), then
    every step ran meanwhile, and every record logged meanwhile (102 points each) is in the run once, in
    order; they waited in the write-ahead log, and the sender's thread carried them."""
    from tests.loggers.wandb_helpers import fast_logger, runs

    logger = fast_logger(project="direct", log_config=False, flush_timeout=1.0)
    slow = logger.backend._wandb = SlowInitWandb(logger.backend._wandb)
    threads: set[str] = set()
    waiting: list[int] = []

    class SeeTheThreadsAndTheLog(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            threads.update(thread.name for thread in threading.enumerate())
            waiting.append(logger._wal.pending(logger._wal.first)["log"])

    started = time.monotonic()
    began = train(tmp_path, logger, metrics=99, before=[SeeTheThreadsAndTheLog()],
                  after=[ReleaseAtLastStep(slow.gate)])
    assert 1.0 <= began[0] - started < 3.0, began[0] - started
    assert "hf-callbacks-plus-WandbLogger" in threads
    assert waiting[1:] == list(range(1, STEPS))  # every record logged so far waits in the file
    logger.close(timeout=60.0)
    (run,) = runs(wandb_root)
    assert run.steps("train/loss") == list(range(1, STEPS + 1)) and len(run.history[0]) > 100
    assert run.exit_code == 0 and run.run_id == logger.run_id


def test_a_run_that_cannot_open_is_told_and_its_records_are_kept_for_a_resume(tmp_path, wandb_root, caplog):
    """``wandb.init`` raises: one error when it does, one warning at the end counting the records not in
    W&B and naming the file that keeps them; training ends normally, quickly, nothing is retried."""
    from tests.loggers.wandb_helpers import fast_logger

    logger = fast_logger(project="unreachable", log_config=False, flush_timeout=10.0)
    failing = logger.backend._wandb = FailingInitWandb(logger.backend._wandb)
    failing.gate.set()
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train(tmp_path, logger)
    assert time.monotonic() - started < 5.0
    told = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert any("could not start the run" in message and "unreachable (injected)" in message
               for message in told), told
    kept = [message for message in told if "were not delivered" in message]
    assert len(kept) == 1 and f"{STEPS + 1} log record(s)" in kept[0] and ".tracker_journal" in kept[0], kept
    assert not list(wandb_root.rglob("*.wandb"))
    (journal,) = (tmp_path / "out" / ".tracker_journal").glob("*.jsonl")
    assert journal.read_text().count('"kind": "log"') == STEPS + 1


def test_a_wandb_init_longer_than_the_close_deadline_holds_training_at_most_flush_timeout(
        tmp_path, wandb_root, caplog):
    """``wandb.init`` has not returned when training ends: training waited for it ``flush_timeout`` (1 s)
    at its start only, ``train()`` returns at once (the run stays open after training, the records wait
    for it); closing it (``flush_timeout`` 1 s, as at exit)
    ends at that deadline and the 5 s grace of a call in flight, with one warning counting the records
    kept; the run opening later is finished at once, FAILED (it is nobody's)."""
    from tests.loggers.wandb_helpers import fast_logger, runs

    logger = fast_logger(project="late", log_config=False, flush_timeout=1.0)
    slow = logger.backend._wandb = SlowInitWandb(logger.backend._wandb)
    try:
        with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
            started = time.monotonic()
            began = train(tmp_path, logger)
            ended = time.monotonic()
            assert not logger.close()
            closed = time.monotonic()
    finally:
        slow.gate.set()
    assert 1.0 <= began[0] - started < 3.0, began[0] - started
    assert ended - began[-1] < 1.0 and 5.5 < closed - ended < 7.5, (ended - began[-1], closed - ended)
    told = [record.getMessage() for record in caplog.records if "were not delivered" in record.getMessage()]
    assert len(told) == 1 and f"{STEPS + 1} log record(s)" in told[0] and "had not answered" in told[0], told
    for thread in threading.enumerate():  # the run opening after the release is finished by the sender
        if thread.name == "hf-callbacks-plus-WandbLogger":
            thread.join(60)
    (run,) = runs(wandb_root)
    assert run.exit_code == 1 and not run.history


def test_a_finish_longer_than_the_deadline_is_left_to_the_library_and_told(tmp_path, wandb_root, caplog):
    """``run.finish`` hangs (fault injection: W&B's service still uploading): closing ends at its
    deadline (0.5 s, and 1 s for the call in flight when the run failed), with one warning; the run is
    finished in the background, every record in it."""
    from tests.loggers.wandb_helpers import fast_logger, runs

    logger = fast_logger(project="slow-finish", log_config=False)
    released = threading.Event()
    closing: list[float] = []

    class CloseWithAShortDeadline(TrainerCallback):
        """Listed before the logger: closes it as ``on_train_end`` would, with a short deadline, once
        the run is open and its ``finish`` hangs (the logger's own ``on_train_end`` then has nothing
        left to close)."""

        def on_train_end(self, args, state, control, **kwargs):
            assert logger.flush(60)
            run = logger.backend.run
            real_finish = run.finish

            def hanging_finish(**kwargs):
                released.wait(30)
                real_finish(**kwargs)

            run.finish = hanging_finish
            start = time.monotonic()
            closed = logger.close("FAILED", timeout=0.5)
            closing.append(time.monotonic() - start)
            assert not closed

    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train(tmp_path, logger, before=[CloseWithAShortDeadline()])
    released.set()
    assert closing[0] < 4.0, closing  # the deadline and the call in flight, not the 30 s finish
    told = [record.getMessage() for record in caplog.records if "had not answered" in record.getMessage()]
    assert len(told) == 1 and ".tracker_journal" in told[0], told
    (run,) = runs(wandb_root)
    assert run.steps("train/loss") == list(range(1, STEPS + 1)) and run.exit_code == 1
