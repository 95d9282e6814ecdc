"""The write-ahead log's own failure modes, each with real processes, real files, a real full file
system and a real MLflow sqlite store read back with ``MlflowClient``:

- a training that waits for the log while another process (a second training resuming the same
  checkpoint) holds it, then deletes it: the waiting training writes the file the path names, never
  the deleted one;
- a full disk (a real 1 MiB tmpfs): only the records it refused are lost, counted, and the file named;
  no torn line merges with the next record; the sender goes on when space returns;
- a store that keeps up: the log holds only what is not acknowledged, so a small disk suffices;
- another run's log left in the folder is sent in the background, after this run's own records;
- ``flush`` returns True only once the store has the record;
- ``replay`` locks the log through a descriptor open for writing (NFS refuses an exclusive lock on
  a read-only one).

Fault injection, named as such: ``FaultInjectingBackend`` (a store that fails or hangs on a gate).
A spy on ``fcntl.flock`` tells the test when a training found the log held, or how ``replay`` opened it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hf_callbacks_plus.cli import main as cli  # noqa: E402
from hf_callbacks_plus.core.callback import TrainerCallback  # noqa: E402
from hf_callbacks_plus.loggers import wal as wal_module  # noqa: E402
from hf_callbacks_plus.loggers.mlflow import MLflowBackend, MLflowLogger  # noqa: E402
from tests.loggers.faults import FaultInjectingBackend, train_in_loop  # noqa: E402
from tests.loggers.test_wal import AtStep, Extras  # noqa: E402

pytestmark = pytest.mark.mlflow


def points(client, run_id) -> Counter:
    return Counter((key, m.step) for key in client.get_run(run_id).data.metrics
                   for m in client.get_metric_history(run_id, key))


def loss_steps(client, run_id) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, "train/loss"))


class FlockSpy:
    """Stands in for the ``fcntl`` module in wal.py: the real ``flock``, and ``on_call(fd, operation)``,
    ``on_held()`` when the lock was held by another process."""

    LOCK_EX, LOCK_NB, LOCK_UN = fcntl.LOCK_EX, fcntl.LOCK_NB, fcntl.LOCK_UN

    def __init__(self, on_held=lambda: None, on_call=lambda fd, operation: None) -> None:
        self.on_held, self.on_call = on_held, on_call

    def flock(self, fd: int, operation: int) -> None:
        self.on_call(fd, operation)
        try:
            fcntl.flock(fd, operation)
        except BlockingIOError:
            self.on_held()
            raise


def wait_until(condition, seconds: float = 120.0) -> bool:
    end = time.monotonic() + seconds
    while not condition() and time.monotonic() < end:
        time.sleep(0.01)
    return condition()


def held_by_another_process(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


@pytest.mark.second_tier  # in one process (threads), with real locks and files: test_wal.py
def test_a_training_waiting_for_the_log_never_writes_a_file_another_process_deleted(tmp_path, sqlite_uri,
                                                                                     monkeypatch):
    """Two trainings resume checkpoint-6 of one run: the first (a process of its own) holds the log,
    the second waits for it; the first ends (steps 7-9), removes the log and lets go; the second then
    writes the file the path names (steps 10-12 arrive), not the deleted one."""
    first = MLflowLogger(tracking_uri=sqlite_uri)
    train_in_loop(tmp_path, [first], 6, save_steps=6)
    gate, log = tmp_path / "gate", tmp_path / ".mlflow_wal" / f"{first.run_key}.jsonl"
    script = str(Path(__file__).with_name("wal_resume_script.py"))
    holder = subprocess.Popen([sys.executable, script, str(tmp_path), sqlite_uri, "9", str(gate)],
                              stderr=subprocess.PIPE, text=True)
    try:
        assert wait_until(lambda: held_by_another_process(log) or holder.poll() is not None)
        assert holder.poll() is None, holder.stderr.read()[-3000:]
        monkeypatch.setattr(wal_module, "fcntl", FlockSpy(on_held=gate.touch))  # the holder goes on
        second = MLflowLogger(tracking_uri=sqlite_uri, flush_timeout=120.0)
        train_in_loop(tmp_path, [second], 12, save_steps=6, resume_from=str(tmp_path / "checkpoint-6"))
    finally:
        gate.touch()
        assert holder.wait(120) == 0, holder.stderr.read()[-3000:]
    client = MlflowClient(sqlite_uri)
    assert second.run_id == first.run_id and gate.exists()
    run_points = points(client, first.run_id)
    assert loss_steps(client, first.run_id) == list(range(1, 13)) and max(run_points.values()) == 1
    assert client.get_run(first.run_id).info.status == "FINISHED"
    assert list(log.parent.iterdir()) == []


@pytest.fixture
def small_disk(tmpfs):
    """A real 1 MiB file system: writes beyond it fail with ENOSPC."""
    return tmpfs("1m")


def fill(disk: Path) -> None:
    """Take every free byte of ``disk``."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    for size in (1 << 16, 1 << 12, 1 << 8, 1 << 4, 1):
        try:
            while True:
                os.write(fd, b"\0" * size)
        except OSError:
            pass
    os.close(fd)


def test_a_full_disk_loses_only_what_it_refused_counts_it_names_the_file_and_the_sender_goes_on(
        tmp_path, sqlite_uri, small_disk, caplog):
    logger = MLflowLogger(tracking_uri=sqlite_uri, wal_dir=str(small_disk), log_params=False)
    full = [AtStep(step, lambda: fill(small_disk)) for step in range(4, 9)]  # filled again each step
    free = AtStep(9, lambda: (small_disk / "filler").unlink())
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train_in_loop(tmp_path, [Extras(300), *full, free, logger], 20)
    client = MlflowClient(sqlite_uri)
    arrived = loss_steps(client, logger.run_id)
    missing = sorted(set(range(1, 21)) - set(arrived))
    assert missing and set(missing) <= set(range(4, 9)), arrived  # lost while full, and only then
    assert max(points(client, logger.run_id).values()) == 1
    assert client.get_run(logger.run_id).info.status == "FINISHED"
    ours = [r.getMessage() for r in caplog.records if r.name == "hf_callbacks_plus"]
    told = [m for m in ours if "could not write to" in m]
    assert len(told) == 1 and str(logger.wal_path) in told[0] and "No space left on device" in told[0], ours
    (end,) = [m for m in ours if "could not be written" in m]
    assert f"{len(missing)} record(s) could not be written to {logger.wal_path}" in end, end
    assert "No space left on device" in end, end
    assert not [m for m in ours if "refused" in m or "unexpected" in m or "not delivered" in m], ours
    assert not logger.wal_path.exists()  # every record it took was delivered


def test_a_full_disk_under_a_background_trackers_log_loses_only_what_it_refused_and_the_sender_goes_on(
        tmp_path, small_disk, caplog):
    """TensorBoard writes in the background: at each checkpoint its log drops what the writer's files
    hold, by rewriting itself. On a full disk the rewrite failed and ended the sender's thread."""
    pytest.importorskip("tensorboard")
    from hf_callbacks_plus.loggers.tensorboard import TensorBoardLogger
    from tests.integrations.tensorboard_events import read_scalars

    out = tmp_path / "out"
    out.mkdir()
    (out / ".tracker_journal").symlink_to(small_disk)  # the log on the small disk, the checkpoints not
    logger = TensorBoardLogger(log_dir=str(tmp_path / "tb"), log_config=False)
    full = [AtStep(step, lambda: fill(small_disk)) for step in range(4, 9)]  # filled again each step
    free = AtStep(9, lambda: (small_disk / "filler").unlink())
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train_in_loop(out, [Extras(300), *full, free, logger], 20, save_steps=2)
    arrived = sorted(read_scalars(tmp_path / "tb")["train/loss"])
    missing = sorted(set(range(1, 21)) - set(arrived))
    assert missing and set(missing) <= set(range(4, 9)), arrived  # lost while full, and only then
    ours = [r.getMessage() for r in caplog.records if r.name == "hf_callbacks_plus"]
    assert not [m for m in ours if "unexpected" in m or "not delivered" in m], ours
    assert list(small_disk.iterdir()) == []  # every record it took was delivered


@pytest.mark.second_tier  # the file emptied at each catch-up, on any disk: test_wal.py
def test_with_a_store_that_keeps_up_the_log_holds_only_what_is_unsent_and_a_small_disk_suffices(
        tmp_path, sqlite_uri, small_disk, caplog):
    """1.4 MB of records through a 1 MiB disk: each time the sender has caught up (a flush every 10
    steps waits for it), the file holds nothing the store has acknowledged."""
    logger = MLflowLogger(tracking_uri=sqlite_uri, wal_dir=str(small_disk), log_params=False)
    sizes = []

    class CatchUp(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % 10 == 0:
                assert logger.flush(120)
                sizes.append(logger.wal_path.stat().st_size)

    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train_in_loop(tmp_path, [Extras(400), CatchUp(), logger], 100)
    client = MlflowClient(sqlite_uri)
    assert loss_steps(client, logger.run_id) == list(range(1, 101))
    assert max(points(client, logger.run_id).values()) == 1
    assert max(sizes) < 1000, sizes  # the first line and a `sent` line
    assert not [r.getMessage() for r in caplog.records if r.name == "hf_callbacks_plus"]


def test_another_runs_log_is_sent_in_the_background_after_this_runs_own(tmp_path, sqlite_uri, monkeypatch,
                                                                        caplog):
    """An earlier run's log waits in the folder; its store calls hang (a gate): this run's records all
    arrive and its run ends FINISHED, nothing blamed on the store; the earlier log keeps what was not
    sent, and ``replay`` sends it, every point once."""
    earlier = MLflowLogger(tracking_uri=sqlite_uri, log_params=False, flush_timeout=0.2, backoff=(0.01, 0.05))
    earlier.backend = FaultInjectingBackend(earlier.backend, failing=("log", "finish"))
    train_in_loop(tmp_path, [Extras(50), earlier], 30)
    hanging = []

    def for_target(target, tracking_uri=None):  # fault injection: the earlier run's calls hang
        hanging.append(FaultInjectingBackend(MLflowBackend(tracking_uri, target.get("experiment_name")),
                                             gated=("log",)))
        return hanging[-1]

    monkeypatch.setattr(MLflowBackend, "for_target", staticmethod(for_target))
    this = MLflowLogger(tracking_uri=sqlite_uri, log_params=False, flush_timeout=10.0)
    sibling_in_flight = AtStep(3, lambda: wait_until(lambda: hanging and hanging[0].entered.is_set()))
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train_in_loop(tmp_path, [sibling_in_flight, this], 10)
    client = MlflowClient(sqlite_uri)
    assert loss_steps(client, this.run_id) == list(range(1, 11))
    assert client.get_run(this.run_id).info.status == "FINISHED"
    assert not [r.getMessage() for r in caplog.records if this.run_key in r.getMessage()]
    monkeypatch.undo()
    hanging[0].gate.set()
    assert wait_until(lambda: not [t for t in threading.enumerate() if t.name.endswith("earlier-runs")])
    assert cli(["replay", str(earlier.wal_path)]) == 0
    assert loss_steps(client, earlier.run_id) == list(range(1, 31))
    assert max(points(client, earlier.run_id).values()) == 1


def test_flush_returns_true_only_once_the_store_has_the_record(tmp_path, sqlite_uri, monkeypatch):
    """150 records, each flushed as it is logged, while the sender keeps emptying the file."""
    monkeypatch.setattr(wal_module, "COMPACT_BYTES", 1, raising=False)  # the earlier design's threshold
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    real_log, received = logger.backend.log, set()

    def log(records, run_id):  # a spy: what the store was given, once it took it
        real_log(records, run_id)
        received.update(record.step for record in records)

    logger.backend.log = log
    early = []

    class FlushEach(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logger.flush(60) and state.global_step not in received:
                early.append(state.global_step)

    train_in_loop(tmp_path, [logger, FlushEach()], 150)
    assert early == []
    assert loss_steps(MlflowClient(sqlite_uri), logger.run_id) == list(range(1, 151))


def test_replay_locks_the_log_through_a_descriptor_open_for_writing(tmp_path, sqlite_uri, monkeypatch):
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False, flush_timeout=0.2, backoff=(0.01, 0.05))
    logger.backend = FaultInjectingBackend(logger.backend, failing=("log", "finish"))
    train_in_loop(tmp_path, [logger], 4)
    modes = []
    monkeypatch.setattr(wal_module, "fcntl", FlockSpy(
        on_call=lambda fd, operation: modes.append(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE)))
    assert cli(["replay", str(logger.wal_path)]) == 0
    assert modes and set(modes) == {os.O_RDWR}, modes
    assert loss_steps(MlflowClient(sqlite_uri), logger.run_id) == [1, 2, 3, 4]
