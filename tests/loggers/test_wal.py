"""MLflow's write-ahead log against a real MLflow sqlite store (read back with ``MlflowClient``):
order and exactly once, outages, a store down until the end, ``hf-callbacks-plus replay``, the
next training sending what an earlier one left, the lock, compaction, pacing.

``FaultInjectingBackend`` (tests/loggers/faults.py) wraps the real backend to make chosen calls
fail or hang on a gate: the only way to make the store fail exactly when a test wants.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter

import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hf_callbacks_plus.cli import main as cli  # noqa: E402
from hf_callbacks_plus.core.callback import TrainerCallback  # noqa: E402
from hf_callbacks_plus.loggers import wal as wal_module  # noqa: E402
from hf_callbacks_plus.loggers.mlflow import MLflowBackend, MLflowLogger  # noqa: E402
from hf_callbacks_plus.loggers.wal import CALL_BATCHES, WriteAheadLog, replay  # noqa: E402
from tests.loggers.faults import FaultInjectingBackend, train_in_loop  # noqa: E402

pytestmark = pytest.mark.mlflow


class AtStep(TrainerCallback):
    """Calls ``action(logger_state)`` once, at the end of step ``step``."""

    def __init__(self, step: int, action) -> None:
        self.step, self.action = step, action

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.action()


class Extras(TrainerCallback):
    """Listed first: ``metrics`` more keys in every training record."""

    def __init__(self, metrics: int) -> None:
        self.metrics = metrics

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "loss" in logs:
            logs.update({f"extra_{k}": float(state.global_step * 1000 + k) for k in range(self.metrics)})


def train(out, callbacks, steps, fail_at=None, metrics=0):
    return train_in_loop(out, [Extras(metrics), *callbacks], steps, fail_at=fail_at)


def points(client, run_id) -> Counter:
    return Counter((key, m.step) for key in client.get_run(run_id).data.metrics
                   for m in client.get_metric_history(run_id, key))


def loss_steps(client, run_id):
    return [m.step for m in client.get_metric_history(run_id, "train/loss")]


def test_every_record_arrives_once_in_order_and_a_clean_close_leaves_no_log(tmp_path, sqlite_uri):
    logger = MLflowLogger(tracking_uri=sqlite_uri)
    train(tmp_path, [logger], 30)
    client = MlflowClient(sqlite_uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.data.params["max_steps"] == "30"
    assert loss_steps(client, logger.run_id) == list(range(1, 31))
    assert max(points(client, logger.run_id).values()) == 1
    assert list((tmp_path / ".mlflow_wal").iterdir()) == []  # everything acknowledged: nothing kept


def test_an_outage_is_told_once_each_way_and_every_record_arrives_once(tmp_path, sqlite_uri, caplog):
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False, backoff=(0.01, 0.05))
    faulty = logger.backend = FaultInjectingBackend(logger.backend, failing=("log",), down=False)

    def down():
        faulty.down = True

    def up():  # back once the sender has failed at least once against the outage
        end = time.monotonic() + 30
        while faulty.calls.get("log", 0) < 2 and time.monotonic() < end:
            logger.flush(0.05)
        faulty.down = False

    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train(tmp_path, [AtStep(5, down), AtStep(25, up), logger], 40)
    client = MlflowClient(sqlite_uri)
    assert loss_steps(client, logger.run_id) == list(range(1, 41))
    assert max(points(client, logger.run_id).values()) == 1
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "unreachable" in m]) == 1, messages
    assert len([m for m in messages if "reachable again" in m]) == 1, messages
    assert client.get_run(logger.run_id).info.status == "FINISHED"


def test_a_store_down_until_the_end_keeps_everything_and_replay_sends_it_once(tmp_path, sqlite_uri, caplog):
    """The run opens, then the store is unreachable until after training: the close deadline holds,
    one warning names the log and the command; replay sends every record once and sets the status.
    A kill between the store's answer and the acknowledgment (the backup copy below, sent again)
    sends nothing twice: MLflow keeps a resent point (same timestamp) once."""
    logger = MLflowLogger(tracking_uri=sqlite_uri, flush_timeout=0.3, backoff=(0.01, 0.05))
    faulty = logger.backend = FaultInjectingBackend(logger.backend, failing=("log", "log_config", "finish"))
    met = []

    def outage_met():  # a gate: the sender has opened the run and met the outage
        end = time.monotonic() + 60
        while not faulty.calls.get("log_config") and time.monotonic() < end:
            time.sleep(0.01)
        met.append(time.monotonic())

    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"), pytest.raises(RuntimeError):
        train(tmp_path, [AtStep(3, outage_met), logger], 12, fail_at=9)
    assert time.monotonic() - met[0] < 5.0
    wal = tmp_path / ".mlflow_wal" / f"{logger.run_key}.jsonl"
    (warning,) = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
    assert "8 log record(s) (24 points, steps 1-8), the params and the final status FAILED" in warning
    assert "unreachable" in warning
    assert f"hf-callbacks-plus replay {wal}" in warning
    client = MlflowClient(sqlite_uri)
    assert client.get_run(logger.run_id).info.status == "RUNNING"
    backup = {wal: wal.read_bytes()}

    assert cli(["replay", str(wal.parent), "--dry-run"]) == 0 and wal.exists()
    assert cli(["replay", str(wal.parent)]) == 0
    run = client.get_run(logger.run_id)
    assert run.info.status == "FAILED" and run.data.params["max_steps"] == "12"
    assert loss_steps(client, logger.run_id) == list(range(1, 9))
    assert not wal.exists()  # sent to its end: removed
    for path, data in backup.items():
        path.write_bytes(data)
    assert cli(["replay", str(wal)]) == 0
    assert loss_steps(client, logger.run_id) == list(range(1, 9))
    assert max(points(client, logger.run_id).values()) == 1


def test_the_next_training_sends_what_an_earlier_one_left_to_its_run(tmp_path, sqlite_uri, caplog):
    """In the background, after its own records: the second training waits (a gate) until it is done."""
    first = MLflowLogger(tracking_uri=sqlite_uri, log_params=False, flush_timeout=0.2, backoff=(0.01, 0.05))
    first.backend = FaultInjectingBackend(first.backend, failing=("log", "finish"))
    train(tmp_path, [first], 6)
    left = first.wal_path
    second = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)

    def earlier_log_sent():
        end = time.monotonic() + 60
        while left.exists() and time.monotonic() < end:
            time.sleep(0.02)

    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train(tmp_path, [AtStep(2, earlier_log_sent), second], 3)
    client = MlflowClient(sqlite_uri)
    assert first.run_id != second.run_id
    assert loss_steps(client, first.run_id) == list(range(1, 7))
    assert client.get_run(first.run_id).info.status == "FINISHED"
    assert loss_steps(client, second.run_id) == [1, 2, 3]
    assert any("an earlier training left" in r.getMessage() for r in caplog.records)
    assert list((tmp_path / ".mlflow_wal").iterdir()) == []


def test_replay_leaves_alone_a_log_a_training_holds(tmp_path, sqlite_uri, capsys):
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    logger.backend = FaultInjectingBackend(logger.backend, gated=("log",))
    held = {}

    def try_replay():
        held["code"] = cli(["replay", str(tmp_path / ".mlflow_wal")])
        logger.backend.gate.set()

    train(tmp_path, [AtStep(3, try_replay), logger], 5)
    assert held["code"] == 1
    assert "NOT sent: RuntimeError" in capsys.readouterr().out  # "... in use by a running training"
    assert loss_steps(MlflowClient(sqlite_uri), logger.run_id) == [1, 2, 3, 4, 5]
    assert list((tmp_path / ".mlflow_wal").iterdir()) == []  # no lock file left either


def test_a_caught_up_log_is_emptied_and_nothing_is_lost(tmp_path, sqlite_uri):
    """Each time the sender has caught up, the file is emptied down to its first line (and a line naming
    the run): it holds what the store has not acknowledged, not what it has."""
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    sizes = []

    def catch_up():
        assert logger.flush(20)
        sizes.append(logger.wal_path.stat().st_size)

    train(tmp_path, [AtStep(60, catch_up), logger], 80, metrics=5)
    assert sizes[0] < 500, sizes  # the target line and a `sent` line
    assert not logger.wal_path.exists()  # everything delivered at the close: removed
    client = MlflowClient(sqlite_uri)
    assert loss_steps(client, logger.run_id) == list(range(1, 81))
    assert max(points(client, logger.run_id).values()) == 1


def test_a_half_written_line_is_dropped_when_the_log_is_reopened(tmp_path):
    wal = WriteAheadLog(tmp_path / "key.jsonl")
    wal.open({"logger": "MLflowLogger", "run_key": "key"}, wait=0)
    wal.append({"kind": "log", "step": 1, "time": 0, "metrics": {"a": 1.0}, "summary": {}})
    wal.close()
    with open(wal.path, "ab") as handle:  # what a SIGKILL in the middle of a write leaves
        handle.write(b'{"kind": "log", "step": 2, "ti')
    reopened = WriteAheadLog(wal.path)
    reopened.open({}, wait=0)
    reopened.append({"kind": "log", "step": 3, "time": 0, "metrics": {"a": 3.0}, "summary": {}})
    entries, end = reopened.read(0, 1000, 100)
    reopened.close()
    assert [entry["step"] for entry in entries] == [1, 3] and end == wal.path.stat().st_size
    kinds = [json.loads(line)["kind"] for line in wal.path.read_text().splitlines()]
    assert kinds == ["target", "log", "log"]


def test_every_value_reads_back_bit_for_bit_and_a_log_of_the_json_form_still_reads(tmp_path):
    """Log entries are packed (names, then float64 bytes): every float comes back with its exact bits,
    whatever the names hold; a line an earlier version wrote (values as JSON) reads the same."""
    import math
    import struct

    values = [0.1 + 0.2, -0.0, 5e-324, 1.7976931348623157e308, math.inf, -math.inf, math.nan, 1 / 3]
    metrics = {f'train/m{i} "q" é\n': value for i, value in enumerate(values)}
    wal = WriteAheadLog(tmp_path / "key.jsonl")
    wal.open({"logger": "MLflowLogger", "run_key": "key"}, wait=0)
    for step in (1, 2):
        wal.append({"kind": "log", "step": step, "time": 0, "metrics": metrics, "summary": {"s": "t"}})
    wal.close()
    with open(wal.path, "ab") as handle:  # a line of the earlier form
        handle.write(b'{"kind": "log", "step": 3, "time": 0, "metrics": {"a": 0.30000000000000004}}\n')
    reader = WriteAheadLog(wal.path)
    reader.inspect()
    entries = [entry for entry, _ in reader.entries(reader.first)]
    reader.close()
    bits = lambda floats: [struct.pack("<d", value) for value in floats]  # noqa: E731
    for entry in entries[:2]:
        assert list(entry["metrics"]) == list(metrics) and entry["summary"] == {"s": "t"}
        assert bits(entry["metrics"].values()) == bits(values)
    assert entries[2]["metrics"] == {"a": 0.30000000000000004}


def test_a_corrupt_line_is_skipped_by_every_reader_of_the_log(tmp_path, caplog):
    """A line that is not JSON (a disk fault), or whose packed values do not match its names, is left
    out, with a warning, by the sender's reads and by the listing of ``hf-callbacks-plus replay
    --dry-run`` (which raised before)."""
    wal = WriteAheadLog(tmp_path / "key.jsonl")
    wal.open({"logger": "MLflowLogger", "run_key": "key"}, wait=0)
    wal.append({"kind": "log", "step": 1, "time": 0, "metrics": {"a": 1.0}, "summary": {}})
    wal.close()
    with open(wal.path, "ab") as handle:
        handle.write(b'{"kind": "log", "st\x00\x00\n')
        handle.write(b'{"kind": "log", "step": 2, "time": 0, "metrics": [["a", "b"], "AAAAAAAA8D8="]}\n')
    listing = WriteAheadLog(wal.path)
    listing.inspect()
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        assert listing.pending(listing.first)["steps"] == [1]
        assert [entry["step"] for entry in listing.read(0, 1000, 100)[0]] == [1]
    listing.close()
    assert any("corrupt line" in record.getMessage() for record in caplog.records)


def test_a_log_deleted_by_its_holder_is_never_written_by_the_one_that_waited(tmp_path, monkeypatch):
    """The holder removes the log and lets go while another opener waits for the lock: the waiter then
    holds and writes the file the path names. (With two processes: test_wal_faults.py.)"""
    from tests.loggers.test_wal_faults import FlockSpy

    target = {"logger": "MLflowLogger", "run_key": "key"}
    holder, waiter, waiting = WriteAheadLog(tmp_path / "key.jsonl"), WriteAheadLog(tmp_path / "key.jsonl"), []
    holder.open(target, wait=0)
    monkeypatch.setattr(wal_module, "fcntl", FlockSpy(on_held=lambda: waiting.append(1)))
    opening = threading.Thread(target=waiter.open, args=(target, 30.0))
    opening.start()
    end = time.monotonic() + 30
    while not waiting and time.monotonic() < end:
        time.sleep(0.01)
    holder.close(delete=True)
    opening.join(30)
    waiter.append({"kind": "log", "step": 1, "time": 0, "metrics": {"a": 1.0}, "summary": {}})
    waiter.close()
    assert waiting and [json.loads(line)["kind"] for line in holder.path.read_text().splitlines()] == [
        "target", "log"]


def test_small_records_go_about_once_a_second_a_full_batch_at_once(tmp_path, sqlite_uri):
    """One ``log_batch`` a second for small records (a sqlite store commits per call); a full call
    (``CALL_BATCHES`` of MLflow's batches of 1000 points) is sent at once, whatever the interval."""

    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    counting = logger.backend = FaultInjectingBackend(logger.backend)
    train(tmp_path / "small", [AtStep(1, lambda: None), logger], 60)
    assert counting.calls["log"] <= 6, counting.calls  # 60 records in well under 6 s
    assert loss_steps(MlflowClient(sqlite_uri), logger.run_id) == list(range(1, 61))

    heavy = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    heavy.backend.send_interval = 60.0
    counting = heavy.backend = FaultInjectingBackend(heavy.backend)
    sent_during_training = []

    def full_batches_went():
        end = time.monotonic() + 20
        while counting.calls.get("log", 0) < 2 and time.monotonic() < end:
            time.sleep(0.02)
        sent_during_training.append(counting.calls.get("log", 0))

    start = time.monotonic()
    steps = 2 * CALL_BATCHES + 6  # records of 1000 points: two full calls by step 2 * CALL_BATCHES
    train(tmp_path / "heavy", [AtStep(steps - 2, full_batches_went), heavy], steps, metrics=1000)
    assert sent_during_training[0] >= 2 and time.monotonic() - start < 30
    assert loss_steps(MlflowClient(sqlite_uri), heavy.run_id) == list(range(1, steps + 1))


def test_a_record_the_store_refuses_is_dropped_alone_with_one_warning(tmp_path, sqlite_uri, caplog):
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    real_log = logger.backend.log

    def refusing_log(records, run_id):  # fault injection: MLflow refusing the record of step 3
        if any(record.step == 3 for record in records):
            raise MlflowException("Got invalid value for metric 'train/loss'",
                                  error_code=INVALID_PARAMETER_VALUE)
        real_log(records, run_id)

    logger.backend.log = refusing_log
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train(tmp_path, [logger], 6)
    assert loss_steps(MlflowClient(sqlite_uri), logger.run_id) == [1, 2, 4, 5, 6]
    (refused,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert "step 3" in refused and "train/loss" in refused


def test_replay_refuses_a_file_that_is_not_a_write_ahead_log(tmp_path, capsys):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"event": "log", "step": 1}) + "\n")
    assert cli(["replay", str(metrics)]) == 1
    assert "not an MLflowLogger write-ahead log" in capsys.readouterr().err
    assert cli(["replay", str(tmp_path / "missing")]) == 1


def test_replay_lists_then_sends_a_log_and_removes_it(tmp_path, sqlite_uri, capsys):
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False, flush_timeout=0.2, backoff=(0.01, 0.05))
    logger.backend = FaultInjectingBackend(logger.backend, failing=("log", "finish"))
    train(tmp_path, [logger], 4)
    path = tmp_path / ".mlflow_wal" / f"{logger.run_key}.jsonl"
    capsys.readouterr()
    assert cli(["replay", str(path), "--dry-run"]) == 0 and path.exists()
    listed = capsys.readouterr().out
    assert f"would send {path}: run {logger.run_id}, 5 log record(s) (" in listed
    assert "steps 1-4) and the final status FINISHED to the store at " in listed
    assert f"experiment Default, run {logger.run_id}" in listed
    sender = replay(path, MLflowBackend.for_target)
    assert sender.run_id == logger.run_id and sender.sent == 6 and not path.exists()


def test_a_call_silent_for_long_is_told_as_an_outage_and_its_end_too(tmp_path, sqlite_uri, caplog,
                                                                     monkeypatch):
    """MLflow's own HTTP retries keep a call waiting through an outage without an error: a call
    silent for ``SILENT_CALL_SECONDS`` is told (from ``on_log``, or while closing), and so is its end.
    (Through a real server and MLflow's real retries: test_mlflow_server.py, second tier.)"""
    monkeypatch.setattr(wal_module, "SILENT_CALL_SECONDS", 0.2)
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    silent = logger.backend = FaultInjectingBackend(logger.backend, gated=("log",))

    def told_then_answer():
        assert silent.entered.wait(30)
        state = type("State", (), {"global_step": 3, "is_world_process_zero": True})()
        end = time.monotonic() + 30
        while "has not answered" not in caplog.text and time.monotonic() < end:  # records, as training logs
            logger.on_log(None, state, None, logs={"probe": time.monotonic()})
            time.sleep(0.05)
        silent.gate.set()

    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train(tmp_path, [AtStep(3, told_then_answer), logger], 6)
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "has not answered a call" in m]) == 1, messages
    assert len([m for m in messages if "reachable again" in m]) == 1, messages
    assert not [m for m in messages if "not delivered" in m]
    assert loss_steps(MlflowClient(sqlite_uri), logger.run_id) == list(range(1, 7))
