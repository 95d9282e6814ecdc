"""The background worker: order, retry with backoff, bounded memory, spill file, replay.

``FailingSink`` is a fake backend: the only way to make a backend fail exactly when a test wants
(the real-server outage is proven in test_mlflow_server.py).
"""

from __future__ import annotations

import json
import logging
import threading
import time

from hf_callbacks_plus.loggers.worker import BackgroundWorker


class FailingSink:
    """Records what it receives; raises ConnectionError while ``down`` is set."""

    def __init__(self, down: bool = False, reject=None) -> None:
        self.down = threading.Event()
        if down:
            self.down.set()
        self.reject = reject or (lambda record: False)
        self.received: list[int] = []
        self.starts = 0

    def start(self):
        if self.down.is_set():
            raise ConnectionError("backend down")
        self.starts += 1

    def send(self, batch):
        if self.down.is_set():
            raise ConnectionError("backend down")
        for record in batch:
            if self.reject(record):
                raise ValueError("rejected")
        self.received.extend(record["i"] for record in batch)


def make_worker(sink, tmp_path, **kwargs):
    return BackgroundWorker("test", sink.start, sink.send, tmp_path / "spill.jsonl",
                            is_transient=lambda error: isinstance(error, ConnectionError),
                            backoff_initial=0.01, backoff_max=0.05, **kwargs)


def test_records_arrive_in_order(tmp_path):
    sink = FailingSink()
    worker = make_worker(sink, tmp_path)
    for i in range(500):
        worker.submit({"i": i})
    assert worker.flush(10)
    assert sink.received == list(range(500))
    assert worker.close(5)


def test_outage_keeps_memory_then_spills_and_replays_in_order(tmp_path, caplog):
    sink = FailingSink(down=True)
    worker = make_worker(sink, tmp_path, max_memory_records=5)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        for i in range(40):
            worker.submit({"i": i})
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
    sink = FailingSink(down=True)
    worker = make_worker(sink, tmp_path, max_memory_records=3)
    for i in range(10):
        worker.submit({"i": i})
    assert not worker.close(0.3)
    lines = [json.loads(line)["i"] for line in (tmp_path / "spill.jsonl").read_text().splitlines()]
    assert lines == list(range(10))

    sink.down.clear()
    worker = make_worker(sink, tmp_path)
    for i in range(10, 15):
        worker.submit({"i": i})
    assert worker.flush(10)
    assert sink.received == list(range(15))
    assert worker.close(5)


def test_a_rejected_record_is_dropped_alone_with_one_warning(tmp_path, caplog):
    sink = FailingSink(reject=lambda record: record["i"] in (3, 7))
    worker = make_worker(sink, tmp_path)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        for i in range(10):
            worker.submit({"i": i})
        assert worker.flush(10)
    assert sink.received == [0, 1, 2, 4, 5, 6, 8, 9]
    assert worker.dropped == 2
    assert len([r for r in caplog.records if "rejected" in r.message]) == 1
    worker.close(5)


def test_submit_never_blocks_while_the_backend_hangs(tmp_path):
    release = threading.Event()

    class FailingHang(FailingSink):
        def send(self, batch):
            release.wait(10)
            super().send(batch)

    sink = FailingHang()
    worker = make_worker(sink, tmp_path)
    start = time.perf_counter()
    for i in range(1000):
        worker.submit({"i": i})
    assert time.perf_counter() - start < 0.5
    release.set()
    assert worker.flush(10)
    assert sink.received == list(range(1000))
    worker.close(5)


def test_start_is_retried_until_the_backend_answers(tmp_path):
    sink = FailingSink(down=True)
    worker = make_worker(sink, tmp_path)
    worker.submit({"i": 0})
    time.sleep(0.2)
    sink.down.clear()
    assert worker.flush(10)
    assert sink.starts == 1 and sink.received == [0]
    worker.close(5)


def test_records_of_another_run_are_held_when_the_backend_writes_only_to_its_open_run(tmp_path, caplog):
    sink = FailingSink(down=True)
    worker = make_worker(sink, tmp_path, run_id=lambda: "run-a")
    for i in range(5):
        worker.submit({"i": i})
    assert not worker.close(0.2)
    assert {json.loads(line)["run_id"] for line in (tmp_path / "spill.jsonl").read_text().splitlines()} == {
        "run-a"}

    sink.down.clear()  # a fresh run (W&B: no send_other) must not receive run-a's records
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        worker = make_worker(sink, tmp_path, run_id=lambda: "run-b")
        for i in range(10, 13):
            worker.submit({"i": i})
        assert worker.flush(10)
        assert worker.close(5)
    assert sink.received == [10, 11, 12]
    assert len([r for r in caplog.records if "belong to other run(s) (run-a)" in r.message]) == 1
    assert (tmp_path / "spill.held.jsonl").exists() and not (tmp_path / "spill.jsonl").exists()

    worker = make_worker(sink, tmp_path, run_id=lambda: "run-a")  # run-a resumed: replayed there
    assert worker.flush(10)
    assert worker.close(5)
    assert sink.received == [10, 11, 12, 0, 1, 2, 3, 4]
    assert not (tmp_path / "spill.held.jsonl").exists()


def test_send_other_receives_each_runs_records(tmp_path):
    sink = FailingSink(down=True)
    worker = make_worker(sink, tmp_path, run_id=lambda: "run-a")
    worker.submit({"i": 0})
    assert not worker.close(0.2)
    sink.down.clear()
    other: list = []
    worker = make_worker(sink, tmp_path, run_id=lambda: "run-b",
                         send_other=lambda run_id, records: other.append((run_id, [r["i"] for r in records])))
    worker.submit({"i": 1})
    assert worker.flush(10) and worker.close(5)
    assert other == [("run-a", [0])] and sink.received == [1]
