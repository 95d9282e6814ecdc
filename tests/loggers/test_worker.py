"""The background worker: order, retry with backoff, bounded memory, spill file, replay.

``FailingBackend`` is a fake backend: the only way to make a backend fail exactly when a test
wants (the real-server outage is proven in test_mlflow_server.py). Each record is a log record
whose step is its number ``i``.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from hf_callbacks_plus.loggers.backend import Backend
from hf_callbacks_plus.loggers.ledger import StepLedger
from hf_callbacks_plus.loggers.records import LogRecord
from hf_callbacks_plus.loggers.worker import BackgroundWorker


class FailingBackend(Backend):
    """Records what it receives; raises ConnectionError while ``down`` is set."""

    name = "test"

    def __init__(self, down: bool = False, reject=None) -> None:
        self.down = threading.Event()
        if down:
            self.down.set()
        self.reject = reject or (lambda record: False)
        self.received: list[int] = []
        self.other: list[tuple] = []
        self.starts = 0

    def start(self, run_id, resume, run_key=None):
        if self.down.is_set():
            raise ConnectionError("backend down")
        self.starts += 1
        return run_id or "run-new"

    def log(self, records, run_id):
        if self.down.is_set():
            raise ConnectionError("backend down")
        for record in records:
            if self.reject(record):
                raise ValueError("rejected")
        steps = [record.step for record in records]
        if run_id == self.open_run:
            self.received.extend(steps)
        else:
            self.other.append((run_id, steps))

    def finish(self, status, run_id):
        pass

    def is_transient(self, error):
        return isinstance(error, ConnectionError)


class SlowBackend(FailingBackend):
    """Fault injection: a working backend that takes ``delay`` seconds per `log` call."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def log(self, records, run_id):
        time.sleep(self.delay)
        super().log(records, run_id)


def record(i: int) -> LogRecord:
    return LogRecord(i, 0, {"x": float(i)}, {})


def make_worker(sink, tmp_path, run_id=None, **kwargs):
    sink.open_run = run_id or "run-new"
    return BackgroundWorker(sink, StepLedger(run_id), tmp_path / "spill.jsonl", backoff_initial=0.01,
                            backoff_max=0.05, **kwargs)


def test_records_arrive_in_order(tmp_path):
    sink = FailingBackend()
    worker = make_worker(sink, tmp_path)
    for i in range(500):
        worker.submit(record(i))
    assert worker.flush(10)
    assert sink.received == list(range(500))
    assert worker.close(5)


def test_outage_keeps_memory_then_spills_and_replays_in_order(tmp_path, caplog):
    sink = FailingBackend(down=True)
    worker = make_worker(sink, tmp_path, max_memory_records=5)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        for i in range(40):
            worker.submit(record(i))
        time.sleep(0.3)
        assert (tmp_path / "spill.jsonl").exists()
        assert not worker.healthy
        sink.down.clear()
        assert worker.flush(10)
    assert sink.received == list(range(40))
    assert not (tmp_path / "spill.jsonl").exists()
    assert worker.spilled == 35
    unreachable = [r for r in caplog.records if "unreachable" in r.message]
    assert len(unreachable) == 1  # one warning, not one per retry or per record
    assert worker.close(5)


def test_unsent_records_go_to_the_spill_file_and_the_next_run_replays_them_first(tmp_path):
    sink = FailingBackend(down=True)
    worker = make_worker(sink, tmp_path, run_id="run-a", max_memory_records=3)
    for i in range(10):
        worker.submit(record(i))
    assert not worker.close(0.3)
    lines = [json.loads(line) for line in (tmp_path / "spill.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if line["kind"] == "log"] == list(range(10))
    assert lines[-1] == {"kind": "finish", "status": "FINISHED", "run_id": "run-a", "run_key": None,
                         "session": lines[0]["session"]}  # the final status could not be set: kept

    sink.down.clear()
    worker = make_worker(sink, tmp_path, run_id="run-a")  # the same run, resumed
    for i in range(10, 15):
        worker.submit(record(i))
    assert worker.flush(10)
    assert sink.received == list(range(15))
    assert worker.close(5)


def test_a_rejected_record_is_dropped_alone_with_one_warning(tmp_path, caplog):
    sink = FailingBackend(reject=lambda record: record.step in (3, 7))
    worker = make_worker(sink, tmp_path)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        for i in range(10):
            worker.submit(record(i))
        assert worker.flush(10)
    assert sink.received == [0, 1, 2, 4, 5, 6, 8, 9]
    assert worker.dropped == 2
    assert len([r for r in caplog.records if "rejected" in r.message]) == 1
    worker.close(5)


def test_submit_never_blocks_while_the_backend_hangs(tmp_path):
    release = threading.Event()

    class FailingHang(FailingBackend):
        def log(self, records, run_id):
            release.wait(10)
            super().log(records, run_id)

    sink = FailingHang()
    worker = make_worker(sink, tmp_path)
    start = time.perf_counter()
    for i in range(1000):
        worker.submit(record(i))
    assert time.perf_counter() - start < 0.5
    release.set()
    assert worker.flush(10)
    assert sink.received == list(range(1000))
    worker.close(5)


def test_start_is_retried_until_the_backend_answers(tmp_path):
    sink = FailingBackend(down=True)
    worker = make_worker(sink, tmp_path)
    worker.submit(record(0))
    time.sleep(0.2)
    sink.down.clear()
    assert worker.flush(10)
    assert sink.starts == 1 and sink.received == [0]
    worker.close(5)


def test_send_other_receives_each_runs_records(tmp_path):
    sink = FailingBackend(down=True)
    worker = make_worker(sink, tmp_path, run_id="run-a")
    worker.submit(record(0))
    assert not worker.close(0.2)
    sink.down.clear()
    worker = make_worker(sink, tmp_path, run_id="run-b")
    worker.submit(record(1))
    assert worker.flush(10) and worker.close(5)
    assert sink.other == [("run-a", [0])] and sink.received == [1]


def test_memory_is_bounded_in_metric_points_with_a_slow_backend(tmp_path):
    """500 metrics per record and a backend slower than the training: the backlog in memory stays
    under ``max_memory_points``, the overflow waits on disk, and everything arrives in order."""

    sink = SlowBackend(delay=0.01)
    worker = make_worker(sink, tmp_path, max_memory_points=20_000)
    for i in range(400):
        worker.submit(LogRecord(i, 0, {f"m{k}": float(k) for k in range(500)}, {}))
    assert worker.flush(60)
    assert sink.received == list(range(400))
    assert 0 < worker.peak_points <= 20_000 and worker.spilled > 0
    assert worker.close(5)


def burst(tmp_path, records: int, delay: float, max_memory_points: int):
    """A started worker on a `SlowBackend` (1000 metrics per call) that was just handed
    ``records`` records of 500 metrics at once."""
    sink = SlowBackend(delay=delay)
    sink.max_metrics_per_batch = 1000
    worker = make_worker(sink, tmp_path, run_id="run-a", max_memory_points=max_memory_points)
    assert worker.wait_started(10)
    for i in range(records):
        worker.submit(LogRecord(i, 0, {f"m{k}": float(k) for k in range(500)}, {}))
    return sink, worker


def test_a_burst_to_a_healthy_backend_waits_in_the_queue_not_on_disk(tmp_path):
    """100 heavy records queued at once, a working (slow) backend, room for 40 in memory: the
    worker takes in what fits and goes back to sending; 40 more wait in the queue (bounded by
    ``max_memory_points`` too) and only the 20 beyond both bounds are spilled. (It used to render
    and spill the whole burst before its first send: 60 spilled, read back from disk.)"""

    sink, worker = burst(tmp_path, records=100, delay=0.01, max_memory_points=20_000)
    assert worker.flush(60)
    assert sink.received == list(range(100))
    assert worker.spilled <= 25, worker.spilled
    assert worker.peak_points <= 20_000
    assert worker.close(5)


def test_a_burst_closed_early_loses_nothing_and_keeps_the_order(tmp_path):
    """The training thread queues 600 heavy records at once and closes after 0.3 s: what the
    (slow) backend did not take is in the spill file, in step order, with nothing lost."""

    sink, worker = burst(tmp_path, records=600, delay=0.02, max_memory_points=5_000)
    start = time.monotonic()
    assert not worker.close(0.3)
    assert time.monotonic() - start < 15.0  # 0.3 s, one call in flight, writing the rest
    kept = [json.loads(line) for line in (tmp_path / "spill.jsonl").read_text().splitlines()]
    steps = [line["step"] for line in kept if line["kind"] == "log"]
    assert sink.received + steps == list(range(600)), (len(sink.received), len(steps))


def test_only_the_training_thread_counts_submitted_records(tmp_path):
    """``_submitted`` is read-modify-written by ``submit`` on the training thread; the worker used
    to add the halves of a rejected record to it from its own thread (``+=`` from two threads can
    lose an update: a flush then returns early or waits out its timeout). Splits are counted in a
    counter of the worker's own; ``pending`` and ``flush`` still count them."""
    writers: list[str] = []

    class WatchedWorker(BackgroundWorker):
        def __setattr__(self, name, value):
            if name == "_submitted" and getattr(self, "_thread", None) is not None:
                writers.append(threading.current_thread().name)
            super().__setattr__(name, value)

    two_keys = LogRecord(1, 0, {"good": 1.0, "bad": 2.0}, {})
    sink = FailingBackend(reject=lambda record: "bad" in record.metrics)
    sink.open_run = "run-new"
    worker = WatchedWorker(sink, StepLedger(), tmp_path / "spill.jsonl", backoff_initial=0.01,
                           backoff_max=0.05)
    worker.submit(two_keys)
    worker.submit(record(2))
    assert worker.flush(10) and worker.pending == 0
    assert sink.received == [1, 2] and worker.dropped == 1  # "good" delivered, "bad" dropped alone
    assert set(writers) == {threading.current_thread().name}, writers
    assert worker.close(5)
