"""Loggers under a slow store, at exit, at a save, after an exception, with a run that cannot
start and with an output file or a log folder that cannot be written (real MLflow sqlite store,
real files).

Fault injection, named as such: ``FaultInjectingBackend`` wraps the real MLflow backend to make
chosen calls slow, or raise ``ConnectionError``.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hf_callbacks_plus.cli import main as cli  # noqa: E402
from hf_callbacks_plus.core.callback import TrainerCallback  # noqa: E402
from hf_callbacks_plus.loggers.jsonl import JsonlLogger  # noqa: E402
from hf_callbacks_plus.loggers.mlflow import MLflowLogger  # noqa: E402
from tests.loggers.faults import FaultInjectingBackend, train_in_loop  # noqa: E402

pytestmark = pytest.mark.mlflow


train = train_in_loop


def in_log(logger) -> list[dict]:
    """The entries a logger's write-ahead log holds past its acknowledged offset."""
    from hf_callbacks_plus.loggers.wal import WriteAheadLog

    wal, found = WriteAheadLog(logger.wal_path), []
    wal.inspect()
    offset = wal.recover()[0]
    while True:
        entries, offset = wal.read(offset, 10**6, 10**6)
        if not entries:
            wal.close()
            return found
        found += entries


def loss_steps(client, run_id):
    return [m.step for m in client.get_metric_history(run_id, "train/loss")]


def test_a_slow_store_bounds_the_exit_keeps_the_rest_and_a_checkpoint_never_waits(tmp_path, sqlite_uri,
                                                                                    caplog):
    """200 ms a call, 3000 records: train() returns within the close deadline (1 s + the call in
    flight), one warning says the store was too slow and where the records are; a checkpoint save
    takes no time and names the run by its key; nothing is lost (replay sends the rest)."""
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False, flush_timeout=1.0)
    logger.backend = FaultInjectingBackend(logger.backend, slow=("log",), delay=0.2)
    saves = []

    class TimeSaves(TrainerCallback):
        """Listed after the logger: how long the logger's checkpoint state takes."""

        def on_save(self, args, state, control, **kwargs):
            start = time.monotonic()
            saves.append((logger.state_attributes(), time.monotonic() - start))

    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        start = time.monotonic()
        train(tmp_path, [logger, TimeSaves()], 3000, save_steps=1000)
        elapsed = time.monotonic() - start
    assert elapsed < 15.0, elapsed  # 3000 steps of the loop, then 1 s + one call in flight
    assert len(saves) == 3 and all(seconds < 0.5 for _, seconds in saves), saves
    assert saves[0][0]["run_key"] == logger.run_key and saves[0][0]["run_id"] in (None, logger.run_id)
    client = MlflowClient(sqlite_uri)
    delivered = loss_steps(client, logger.run_id)
    assert 0 < len(delivered) < 3000
    assert client.get_run(logger.run_id).info.status == "FINISHED"  # set at the deadline, out of order
    (warning,) = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
    assert "too slow" in warning and f"hf-callbacks-plus replay {logger.wal_path}" in warning
    assert cli(["replay", str(logger.wal_path)]) == 0
    assert loss_steps(client, logger.run_id) == list(range(1, 3001))


@pytest.mark.parametrize("mlflow_retries", ["0", "mlflow's default"])
def test_an_exception_with_the_server_down_re_raises_at_once_and_keeps_the_failed_status(tmp_path,
                                                                                        monkeypatch,
                                                                                        mlflow_retries):
    from tests.loggers.conftest import free_port

    # MLflow's own HTTP retries (7, with backoff: minutes per call) are the user's to set; the logger
    # does not turn them off process-wide. With them on, the first call never returns within the
    # close deadline: the exception waits at most MLflowBackend.exception_start_wait (3 s) for the
    # run to open, then the close deadline (2 s + 1 s), never the 20 s a W&B run may take.
    if mlflow_retries == "0":
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    else:
        monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    logger = MLflowLogger(tracking_uri=f"http://127.0.0.1:{free_port()}", log_params=False,
                          backoff=(0.05, 0.1))
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="user code failed"):
        train(tmp_path, [logger], 20, fail_at=10)
    assert time.monotonic() - start < 8.0  # flush_timeout is 30 s: the exception does not wait for it
    records = in_log(logger)
    assert [r["step"] for r in records if r["kind"] == "log" and "train/loss" in r["metrics"]] == list(
        range(1, 10))
    assert records[-1] == {"kind": "finish", "status": "FAILED"}


def test_a_run_that_cannot_start_says_so_once_and_keeps_the_records(tmp_path, sqlite_uri, caplog):
    errors = []
    previous = threading.excepthook
    threading.excepthook = lambda info: errors.append(info.exc_value)
    try:
        with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
            logger = MLflowLogger(tracking_uri=sqlite_uri, run_id="0123456789abcdef0123456789abcdef",
                                  log_params=False)
            start = time.monotonic()
            train(tmp_path, [logger], 5)
            elapsed = time.monotonic() - start
    finally:
        threading.excepthook = previous
    assert not errors, errors  # the worker thread never dies
    assert elapsed < 10.0
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "could not start the run" in m]) == 1, messages
    assert not [m for m in messages if "unreachable" in m]
    assert "0123456789abcdef0123456789abcdef" in next(m for m in messages if "could not start" in m)
    assert [r["step"] for r in in_log(logger) if "train/loss" in r.get("metrics", {})] == [1, 2, 3, 4, 5]


def test_a_deleted_experiment_says_so_once(tmp_path, sqlite_uri, caplog):
    client = MlflowClient(sqlite_uri)
    client.delete_experiment(client.create_experiment("gone"))
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        logger = MLflowLogger(tracking_uri=sqlite_uri, experiment_name="gone", log_params=False)
        train(tmp_path, [logger], 3)
    messages = [r.getMessage() for r in caplog.records if "could not start the run" in r.getMessage()]
    assert len(messages) == 1 and "deleted" in messages[0].lower(), messages


def test_an_unwritable_log_folder_is_an_error_at_train_begin(tmp_path, sqlite_uri):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the log folder should be")
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False, wal_dir=str(blocker / "wal"))
    with pytest.raises(OSError, match=r"MLflowLogger: cannot write the run to .*not_a_dir/wal"):
        train(tmp_path / "out", [logger], 3)


def test_jsonl_on_an_unwritable_path_is_an_error_at_train_begin(tmp_path, caplog):
    """A file that cannot be written is refused when ``train()`` starts, naming it."""
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("x")
    logger = JsonlLogger(path=str(blocker / "metrics.jsonl"))
    start = time.monotonic()
    with pytest.raises(OSError, match=r"JsonlLogger: cannot write the run to .*not_a_dir/metrics.jsonl"):
        train(tmp_path / "out", [logger], 4)
    assert time.monotonic() - start < 5.0


def test_the_replay_hint_shows_the_real_path_under_the_cwd(tmp_path, sqlite_uri, monkeypatch, caplog):
    """``PWD`` holds the working directory, not a password: paths under it are not masked."""
    from hf_callbacks_plus.loggers.secrets import install_log_filter, mask_secrets

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PWD", str(tmp_path))
    assert mask_secrets(f"{tmp_path}/out") == f"{tmp_path}/out"
    install_log_filter()
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False, flush_timeout=0.2, backoff=(0.01, 0.05))
    logger.backend = FaultInjectingBackend(logger.backend, failing=("log",))
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train(tmp_path / "out", [logger], 2)
    (warning,) = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
    assert f"hf-callbacks-plus replay {logger.wal_path}" in warning and str(tmp_path) in warning


def test_jsonl_tells_what_a_full_disk_lost_and_training_goes_on(tmp_path, caplog):
    """A write that fails during training (``ENOSPC``) is told at once and counted at the end, with
    the file; training is not interrupted. The failing ``log`` is fault injection around the real
    JSONL backend (the disk cannot be filled on demand)."""
    import errno

    logger = JsonlLogger()

    def disk_full(records, run_id):
        raise OSError(errno.ENOSPC, "No space left on device")

    logger.backend.log = disk_full
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train(tmp_path, [logger], 3)
    messages = [r.getMessage() for r in caplog.records]
    (first,) = [m for m in messages if "could not write to" in m]
    assert "No space left on device" in first and str(tmp_path / "metrics.jsonl") in first
    (count,) = [m for m in messages if "could not be written to" in m]
    assert "4 record(s)" in count and str(tmp_path / "metrics.jsonl") in count  # 3 steps + the totals
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["event"] for line in lines] == ["start", "params", "finish"]
