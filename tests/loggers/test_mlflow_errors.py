"""MLflow errors: only errors known to be transient are retried, an
unusable run is an error at its first start, MLflow's own limits, no process-wide side effects,
batches cut once.

Real exception objects (raised by mlflow, requests, urllib3, sqlite where it can be done on
demand), a real sqlite store, a real ``mlflow server``. Fault injection, named as such:
``FaultInjectingBackend(error=...)`` makes the backend's ``log`` raise a bug of ours (TypeError).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time

import pytest

mlflow = pytest.importorskip("mlflow")
import requests  # noqa: E402
import urllib3  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from hf_callbacks_plus.loggers import mlflow_helper  # noqa: E402
from hf_callbacks_plus.loggers.base import LogRecord  # noqa: E402
from hf_callbacks_plus.loggers.mlflow import (  # noqa: E402
    MLflowBackend,
    MLflowLogger,
    UnusableRunError,
    is_transient_mlflow_error,
)
from hf_callbacks_plus.loop.arguments import LoopArguments  # noqa: E402
from hf_callbacks_plus.loop.trainer import LightweightTrainer  # noqa: E402
from tests.loggers.faults import FaultInjectingBackend  # noqa: E402

pytestmark = pytest.mark.mlflow


def train(out, callbacks, steps):
    args = LoopArguments(output_dir=str(out), max_steps=steps, logging_steps=1, disable_tqdm=True,
                         save_strategy="no")
    return LightweightTrainer(args, train_step=lambda batch: 0.5, train_data=[[1.0]] * steps,
                              callbacks=callbacks, learning_rate_fn=lambda: 0.1).train()


def rest_error(status: int, body: str = "<html>proxy error</html>") -> MlflowException:
    """What mlflow raises for a non-JSON HTTP answer (e.g. from a proxy in front of the server)."""
    from mlflow.utils.rest_utils import verify_rest_response

    response = requests.Response()
    response.status_code = status
    response._content = body.encode()
    with pytest.raises(MlflowException) as caught:
        verify_rest_response(response, "/api/2.0/mlflow/runs/get")
    return caught.value


def caused_by(cause: BaseException, error: BaseException) -> BaseException:
    try:
        raise error from cause
    except BaseException as raised:  # noqa: BLE001 - the chained object itself is the point
        return raised


def sqlalchemy_locked() -> BaseException:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    return sqlalchemy.exc.OperationalError("INSERT ...", {}, sqlite3.OperationalError("database is locked"))


TABLE = [
    # connection and timeout errors
    ("ConnectionError", lambda: ConnectionError("refused"), True),
    ("ConnectionRefusedError", lambda: ConnectionRefusedError(111, "Connection refused"), True),
    ("TimeoutError", lambda: TimeoutError("timed out"), True),
    ("requests ConnectionError", lambda: requests.exceptions.ConnectionError("refused"), True),
    ("requests ReadTimeout", lambda: requests.exceptions.ReadTimeout("read timed out"), True),
    ("urllib3 MaxRetryError", lambda: urllib3.exceptions.MaxRetryError(None, "/api", None), True),
    ("urllib3 NewConnectionError", lambda: urllib3.exceptions.NewConnectionError(None, "refused"), True),
    ("urllib3 ProtocolError", lambda: urllib3.exceptions.ProtocolError("connection aborted"), True),
    # MLflow error codes
    ("TEMPORARILY_UNAVAILABLE", lambda: MlflowException("busy", error_code=mlflow.protos.databricks_pb2
                                                        .TEMPORARILY_UNAVAILABLE), True),
    ("REQUEST_LIMIT_EXCEEDED", lambda: MlflowException("slow down", error_code=mlflow.protos.databricks_pb2
                                                       .REQUEST_LIMIT_EXCEEDED), True),
    ("INTERNAL_ERROR (mlflow's default)", lambda: MlflowException("API request to http://h failed with "
                                                                   "exception boom"), True),
    ("DEADLINE_EXCEEDED", lambda: MlflowException("late", error_code=mlflow.protos.databricks_pb2
                                                  .DEADLINE_EXCEEDED), True),
    ("HTTP 502 from a proxy", lambda: rest_error(502), True),
    ("HTTP 503", lambda: rest_error(503), True),
    ("HTTP 429", lambda: rest_error(429), True),
    ("HTTP 404 (no such endpoint)", lambda: rest_error(404), False),
    ("HTTP 401", lambda: rest_error(401), False),
    ("retries exhausted, in the message", lambda: MlflowException(
        "API request to http://h/api/2.0/mlflow/runs/create failed with exception "
        "HTTPConnectionPool(host='h', port=5000): Max retries exceeded with url",
        error_code=mlflow.protos.databricks_pb2.BAD_REQUEST), True),
    ("INVALID_PARAMETER_VALUE", lambda: MlflowException("bad value", error_code=mlflow.protos.databricks_pb2
                                                        .INVALID_PARAMETER_VALUE), False),
    ("RESOURCE_DOES_NOT_EXIST", lambda: MlflowException("no run", error_code=mlflow.protos.databricks_pb2
                                                        .RESOURCE_DOES_NOT_EXIST), False),
    ("PERMISSION_DENIED", lambda: MlflowException("no", error_code=mlflow.protos.databricks_pb2
                                                  .PERMISSION_DENIED), False),
    # sqlite
    ("sqlite database is locked", lambda: sqlite3.OperationalError("database is locked"), True),
    ("sqlalchemy database is locked", sqlalchemy_locked, True),
    ("sqlite no such table", lambda: sqlite3.OperationalError("no such table: runs"), False),
    # bugs of ours and misconfigurations
    ("TypeError", lambda: TypeError("unsupported operand type(s)"), False),
    ("AttributeError", lambda: AttributeError("'NoneType' object has no attribute 'info'"), False),
    ("KeyError", lambda: KeyError("run_id"), False),
    ("ValueError", lambda: ValueError("bad"), False),
    ("UnusableRunError", lambda: UnusableRunError("run 'x' is deleted"), False),
    ("RuntimeError caused by a ConnectionError", lambda: caused_by(ConnectionError("reset"),
                                                                   RuntimeError("send failed")), True),
    ("TypeError caused by a TypeError", lambda: caused_by(TypeError("a"), TypeError("b")), False),
]


@pytest.mark.parametrize(("case", "make", "transient"), TABLE, ids=[case for case, _, _ in TABLE])
def test_is_transient_table(case, make, transient):
    error = make()
    assert is_transient_mlflow_error(error) is transient, (case, type(error), error)


def test_real_errors_of_a_dead_server_and_of_a_missing_run(sqlite_uri, monkeypatch):
    """What MlflowClient really raises: a server that is not there (transient), a run id the store
    does not know (permanent)."""
    from tests.loggers.conftest import free_port

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # this test's own client only gives up at once
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    with pytest.raises(Exception) as dead:
        MlflowClient(f"http://127.0.0.1:{free_port()}").get_run("0" * 32)
    assert is_transient_mlflow_error(dead.value), repr(dead.value)
    with pytest.raises(Exception) as missing:
        MlflowClient(sqlite_uri).get_run("0" * 32)
    assert not is_transient_mlflow_error(missing.value), repr(missing.value)


def test_a_bug_in_log_is_not_retried_training_ends_quickly_with_a_warning_naming_it(tmp_path, sqlite_uri,
                                                                                     caplog):
    """A bug (a TypeError on every record) is no outage: each record is refused alone, a few are
    listed, then one error says it looks like a fault of ours; nothing is kept for a replay."""
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False, flush_timeout=10.0)
    logger.backend = FaultInjectingBackend(logger.backend, failing=("log",),
                                           error=lambda name: TypeError(f"injected bug in {name}"))
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        start = time.monotonic()
        train(tmp_path, [logger], 20)
        elapsed = time.monotonic() - start
    assert elapsed < 5.0, elapsed
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "unreachable" in m], messages
    rejected = [m for m in messages if "TypeError" in m and "injected bug in log" in m]
    assert rejected, messages
    # a few records listed, then one error saying it looks like a fault of ours, not of the records
    assert len(rejected) <= 6, len(rejected)
    assert len([m for m in rejected if "looks like a fault" in m]) == 1, rejected
    assert not list((tmp_path / ".mlflow_wal").iterdir())
    assert MlflowClient(sqlite_uri).get_run(logger.run_id).info.status == "FINISHED"


def test_a_deleted_run_is_an_error_at_its_first_start_not_retried(tmp_path, sqlite_uri, monkeypatch, caplog):
    client = MlflowClient(sqlite_uri)
    run_id = client.create_run("0").info.run_id
    client.delete_run(run_id)
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False, backoff=(0.01, 0.05))
    logger.backend = FaultInjectingBackend(logger.backend)  # counts the calls, injects nothing
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train(tmp_path, [logger], 5)
    assert logger.backend.calls.get("start") == 1  # not retried
    errors = [r.getMessage() for r in caplog.records if "could not start the run" in r.getMessage()]
    assert len(errors) == 1, [r.getMessage() for r in caplog.records]
    assert run_id in errors[0] and "is deleted" in errors[0] and "UnusableRunError" in errors[0]
    assert "MLFLOW_RUN_ID" in errors[0] and "restore_run" in errors[0]
    assert client.get_run(run_id).info.lifecycle_stage == "deleted"  # left as it was


@pytest.mark.slow
def test_a_run_id_the_server_does_not_know_is_an_error_at_its_first_start(tmp_path, mlflow_server,
                                                                          monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_RUN_ID", "f" * 32)
    logger = MLflowLogger(tracking_uri=mlflow_server.uri, log_params=False, backoff=(0.01, 0.05))
    logger.backend = FaultInjectingBackend(logger.backend)  # counts the calls, injects nothing
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train(tmp_path, [logger], 3)
    assert logger.backend.calls.get("start") == 1
    errors = [r.getMessage() for r in caplog.records if "could not start the run" in r.getMessage()]
    assert len(errors) == 1 and "f" * 32 in errors[0] and "does not exist" in errors[0], errors
    assert mlflow_server.uri in errors[0]


def test_limits_are_mlflows_own():
    from mlflow.utils import validation

    logger = MLflowLogger(tracking_uri="sqlite:///unused.db")
    assert logger.max_param_length == validation.MAX_PARAM_VAL_LENGTH
    assert logger.max_name_length == validation.MAX_ENTITY_KEY_LENGTH
    assert logger.backend.max_tag_length == validation.MAX_TAG_VAL_LENGTH
    assert logger.backend.max_metrics_per_batch == validation.MAX_METRICS_PER_BATCH


@pytest.mark.parametrize("helper", [True, False], ids=["helper process", "this process"])
def test_one_record_beyond_mlflows_batch_limits_is_logged_whole(sqlite_uri, helper, monkeypatch):
    """1500 metrics and 150 text values in one record: one ``log_batch`` call of ours (to the helper
    process or from this one), which MlflowClient splits into requests within MLflow's limits (the
    backend no longer cuts them)."""
    monkeypatch.setattr(mlflow_helper, "START_AFTER_SECONDS", 0.0)  # the helper takes the first call
    backend = MLflowBackend(sqlite_uri, None, helper=helper)
    run_id = backend.start(None, "ab" * 16, False)
    calls = []
    owner = backend.helper if helper and backend.helper.start() else backend.client  # up: it takes the call
    original = owner.log_batch
    owner.log_batch = lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs)
    metrics = {f"m/{i}": float(i) for i in range(1500)}
    texts = {f"t/{i}": f"value {i}" for i in range(150)}
    backend.log([LogRecord(3, 1_700_000_000_000, metrics, texts)], run_id)
    backend.finish("FINISHED", run_id)
    backend.close()
    run = MlflowClient(sqlite_uri).get_run(run_id)
    assert len(calls) == 1
    assert run.data.metrics == metrics
    assert {key: value for key, value in run.data.tags.items() if key.startswith("t/")} == texts


@pytest.mark.slow
@pytest.mark.transformers
def test_a_run_against_the_server_leaves_the_environment_as_it_was(tmp_path, mlflow_server, monkeypatch):
    """MLflow's HTTP settings are the user's: nothing of the logger changes them for the process."""
    from tests.tiny_models import make_trainer

    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):  # as a new process
        monkeypatch.delenv(name, raising=False)
    before = {key: value for key, value in os.environ.items() if key.startswith("MLFLOW_HTTP_REQUEST_")}
    logger = MLflowLogger(tracking_uri=mlflow_server.uri, experiment_name="environment")
    make_trainer(tmp_path, callbacks=[logger], max_steps=2, logging_steps=1).train()
    after = {key: value for key, value in os.environ.items() if key.startswith("MLFLOW_HTTP_REQUEST_")}
    assert after == before
    assert MlflowClient(mlflow_server.uri).get_run(logger.run_id).info.status == "FINISHED"
