"""A local store's large calls are written from a helper process (loggers/mlflow_helper.py): the same
points as from this process; a helper that cannot start, is killed, or dies after writing loses
nothing and is told once; its errors keep their verdict; no helper outlives its run or its training
process. Real sqlite store, real helper processes, real signals; fault injection only where a death
must fall between the helper's write and its answer."""

from __future__ import annotations

import logging
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter

import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hf_callbacks_plus.cli import main as cli  # noqa: E402
from hf_callbacks_plus.core.callback import TrainerCallback  # noqa: E402
from hf_callbacks_plus.loggers import mlflow_helper  # noqa: E402
from hf_callbacks_plus.loggers.base import LogRecord  # noqa: E402
from hf_callbacks_plus.loggers.mlflow import MLflowBackend, MLflowLogger  # noqa: E402
from hf_callbacks_plus.loggers.mlflow_helper import (  # noqa: E402
    Store,
    StoreCallFailed,  # noqa: E402
    StoreHelper,
)
from tests.loggers.faults import FaultInjectingBackend, train_in_loop  # noqa: E402

pytestmark = [pytest.mark.mlflow, pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")]

METRICS, STEPS = 100, 40  # 4,000 points: calls of a full batch (1000) and more


def ended(pid: int, wait: float = 0.0) -> bool:
    """The process is gone (or a zombie nobody reaped yet), within ``wait`` seconds."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                gone = stat.read().rsplit(")", 1)[1].split()[0] == "Z"
        except FileNotFoundError:
            gone = True
        if gone or time.monotonic() >= deadline:
            return gone
        time.sleep(0.05)


class Extras(TrainerCallback):
    """Listed first: ``metrics`` keys in every training record. At the end of step ``up_at``, once the
    store acknowledged everything logged so far (calls of thousands of points: the helper is started),
    waits until the helper is up, so later large calls go to it; at the end of step ``at``, the same
    flush, then ``then(logger)``."""

    def __init__(self, logger: MLflowLogger, at: int = -1, then=None, metrics: int = METRICS,
                 up_at: int = 5) -> None:
        self.logger, self.at, self.then, self.metrics, self.up_at = logger, at, then, metrics, up_at

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "loss" in logs:
            logs.update({f"extra_{k}": float(state.global_step * 1000 + k) for k in range(self.metrics)})

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in (self.at, self.up_at):
            assert self.logger.flush(120)
        if state.global_step == self.up_at:
            assert self.logger.backend.helper.start()
        if state.global_step == self.at:
            self.then(self.logger)


def points(client: MlflowClient, run_id: str) -> Counter:
    """How often each (key, step) is in the run."""
    return Counter((key, m.step) for key in client.get_run(run_id).data.metrics
                   for m in client.get_metric_history(run_id, key))


def assert_every_point_once(client: MlflowClient, run_id: str, metrics: int = METRICS) -> None:
    counts = points(client, run_id)
    extras = {key: step for key, step in counts if key.startswith("train/extra_")}
    assert len(extras) == metrics and max(counts.values()) == 1, counts.most_common(3)
    assert sum(1 for key, _ in counts if key.startswith("train/extra_")) == metrics * STEPS
    assert client.get_run(run_id).info.status == "FINISHED"


@pytest.fixture(autouse=True)
def helper_at_once(monkeypatch):
    """The helper takes every call of a full batch from the first (its start rule has its own tests)."""
    monkeypatch.setattr(mlflow_helper, "START_AFTER_SECONDS", 0.0)


@pytest.fixture
def calls(monkeypatch):
    """Every ``log_batch`` call in order: ``("here", points)`` from this process, ``("helper", points)``."""
    made = []

    def counted(where, original):
        def call(self, run_id, metrics=(), *args, **kwargs):
            made.append((where, len(metrics)))
            return original(self, run_id, metrics, *args, **kwargs)
        return call

    monkeypatch.setattr(MlflowClient, "log_batch", counted("here", MlflowClient.log_batch))
    monkeypatch.setattr(StoreHelper, "log_batch", counted("helper", StoreHelper.log_batch))
    return made


@pytest.mark.parametrize("store", ["sqlite", "file store"])
def test_the_helper_writes_what_this_process_writes(sqlite_uri, tmp_path, monkeypatch, store):
    """Side by side: the same records, large enough for the helper, written through it and from this
    process, read back equal (NaN, infinities, a unicode key, text values as tags), in each kind of
    store MLflow writes in the calling process that runs here."""
    uri = sqlite_uri
    if store == "file store":
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the helper inherits it
        uri = (tmp_path / "mlruns").as_uri()
    numbers = [0.5, math.nan, math.inf, -math.inf, 3.0, -1e-300]
    records = [LogRecord(step, 1_700_000_000_000 + step,
                         {**{f"train/m{k}": numbers[(k + step) % len(numbers)] for k in range(600)},
                          "eval/größe": float(step)},
                         {"train/total_flos": 7.0 * step, "note": f"text {step}"}) for step in (1, 2)]
    read = {}
    for helper, run_key in ((True, "ab" * 16), (False, "cd" * 16)):
        backend = MLflowBackend(uri, None, helper=helper)
        run_id = backend.start(None, run_key, False)
        if helper:
            assert backend.helper.start()  # up: the record goes to it
        backend.log(records, run_id)
        pid = backend.helper.pid if helper else None
        backend.finish("FINISHED", run_id)
        backend.close()
        client = MlflowClient(uri)
        run = client.get_run(run_id)
        history = {key: client.get_metric_history(run_id, key) for key in run.data.metrics}
        read[helper] = ({key: [(m.step, m.timestamp, repr(m.value)) for m in points]
                         for key, points in history.items()},
                        {key: value for key, value in run.data.tags.items() if not key.startswith("mlflow.")
                         and key != "hf_callbacks_plus.run_key"})
        if helper:
            assert pid is not None and pid != os.getpid() and ended(pid, wait=10)
    assert len(read[True][0]) == 602 and read[True][1] == {"note": "text 2"}
    assert read[True] == read[False]


def test_a_training_writes_its_large_calls_from_one_helper_that_ends_with_the_run(tmp_path, sqlite_uri,
                                                                                   calls):
    """At 100 metrics a step, once the helper is up every call of a full batch or more goes to it (this
    process makes only the smaller ones); it is one process for the run, gone once ``train()`` returns."""
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    pids = []
    look = Extras(logger, at=30, then=lambda it: pids.append(it.backend.helper.pid))
    train_in_loop(tmp_path, [look, logger], STEPS)
    assert pids[0] is not None and pids[0] != os.getpid()
    assert ended(pids[0], wait=10) and logger.backend.helper.pid is None
    first = next(index for index, (where, _) in enumerate(calls) if where == "helper")
    assert all(size >= 1000 for where, size in calls if where == "helper")
    assert all(size < 1000 for where, size in calls[first:] if where == "here"), calls
    assert_every_point_once(MlflowClient(sqlite_uri), logger.run_id)


def test_a_run_that_logs_little_never_starts_a_helper(tmp_path, sqlite_uri, monkeypatch, calls):
    """The helper's start (mlflow's import, about 2.5 s of CPU) is paid only once this process has
    spent `START_AFTER_SECONDS` in the calls it would take: never, for 2,000 points over 40 steps,
    although some of their calls are large."""
    monkeypatch.setattr(mlflow_helper, "START_AFTER_SECONDS", 1.0)
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    pids = []
    look = Extras(logger, at=30, then=lambda it: pids.append(it.backend.helper.pid), metrics=50, up_at=-1)
    train_in_loop(tmp_path, [look, logger], STEPS)
    assert any(size >= 1000 for _, size in calls) and {where for where, _ in calls} == {"here"}
    assert pids == [None] and logger.backend.helper.seconds_here < 1.0
    assert_every_point_once(MlflowClient(sqlite_uri), logger.run_id, metrics=50)


def test_a_call_never_waits_for_the_helper_to_start(sqlite_uri):
    """Due, the helper is started and the call stays here while it imports mlflow; once up it takes
    the large calls; one still starting at the close is stopped."""
    helper = StoreHelper(sqlite_uri)
    assert not helper.takes(1000) and helper.pid is not None  # started, not up: the call stays here
    assert helper.start() and helper.takes(1000) and not helper.takes(999)
    helper.close()
    starting = StoreHelper(sqlite_uri)
    assert not starting.takes(1000)
    pid = starting.pid
    starting.close()
    assert ended(pid, wait=10) and starting.pid is None


def test_the_helper_starts_in_the_background_once_the_large_calls_took_their_time(tmp_path, sqlite_uri,
                                                                                  monkeypatch, calls):
    """Past `START_AFTER_SECONDS` the helper is started and the calls stay here until it is up (never
    waiting for it); one still starting at the close is stopped."""
    monkeypatch.setattr(mlflow_helper, "START_AFTER_SECONDS", 0.02)
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    pids = []
    look = Extras(logger, at=30, then=lambda it: pids.append(it.backend.helper.pid), up_at=-1, metrics=500)
    train_in_loop(tmp_path, [look, logger], STEPS)  # 500 metrics: several large calls before step 30
    assert pids[0] is not None and logger.backend.helper.seconds_here >= 0.02
    assert ended(pids[0], wait=10)
    first = next((index for index, (where, _) in enumerate(calls) if where == "helper"), len(calls))
    assert any(size >= 1000 for _, size in calls[:first])  # the first large calls: here, while it starts
    assert_every_point_once(MlflowClient(sqlite_uri), logger.run_id, metrics=500)


def kill_helper(logger: MLflowLogger) -> None:
    pid = logger.backend.helper.pid
    os.kill(pid, signal.SIGKILL)
    assert ended(pid, wait=10)


@pytest.mark.parametrize("fault", ["killed between calls", "dies after writing, before answering",
                                   "cannot start"])
def test_a_helper_that_fails_is_told_once_and_loses_nothing(tmp_path, sqlite_uri, monkeypatch, caplog, fault):
    """The calls go on from this process; every (key, step) is in the run once, even the batch the
    helper wrote but did not acknowledge (MLflow keeps a point sent twice once)."""
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    extras = Extras(logger)
    if fault == "killed between calls":
        extras.at, extras.then = 20, kill_helper
    elif fault == "cannot start":  # fault injection: no Python where sys.executable says
        extras.up_at = -1
        monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    else:
        real_read = mlflow_helper._read

        def answer_lost(stream):
            """Fault injection: read the helper's answer (its batch is in the store), then kill it."""
            answer = real_read(stream)
            if answer is None and stream is not None:
                monkeypatch.setattr(mlflow_helper, "_read", real_read)
                os.kill(logger.backend.helper.pid, signal.SIGKILL)
                raise EOFError("injected: the helper died before its answer arrived")
            return answer

        monkeypatch.setattr(mlflow_helper, "_read", answer_lost)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train_in_loop(tmp_path, [extras, logger], STEPS)
    told = [record.getMessage() for record in caplog.records if "helper process" in record.getMessage()]
    assert len(told) == 1, told
    assert "written from the training process from now on (nothing is lost)" in told[0]
    assert ("did not start" if fault == "cannot start" else "ended (exit code") in told[0]
    assert_every_point_once(MlflowClient(sqlite_uri), logger.run_id)


def test_a_refused_call_in_the_helper_is_permanent_with_mlflows_words(sqlite_uri):
    """A run that does not exist: the verdict and the words this process would give."""
    helper, backend = StoreHelper(sqlite_uri), MLflowBackend(sqlite_uri, None)
    with pytest.raises(StoreCallFailed) as refused:
        helper.log_batch("0" * 32, [("m", 1.0, 0, 0)], [])
    helper.close()
    assert not backend.is_transient(refused.value)
    assert backend.explain(refused.value) == (f"MlflowException: Run with id={'0' * 32} not found", None)


@pytest.mark.second_tier  # MLflow waits 20 s for a locked sqlite database (its busy_timeout)
def test_a_locked_database_in_the_helper_is_transient_and_the_helper_answers_on(sqlite_uri):
    helper, backend = StoreHelper(sqlite_uri), MLflowBackend(sqlite_uri, None, helper=False)
    run_id = backend.start(None, "ef" * 16, False)
    with sqlite3.connect(sqlite_uri[len("sqlite:///"):], timeout=0.1) as lock:
        lock.execute("BEGIN EXCLUSIVE")
        with pytest.raises(StoreCallFailed) as locked:
            helper.log_batch(run_id, [("m", 1.0, 0, 0)], [])
        lock.rollback()
    assert backend.is_transient(locked.value) and "database is locked" in backend.explain(locked.value)[0]
    helper.log_batch(run_id, [("m", 2.0, 0, 1)], [])
    assert [m.value for m in MlflowClient(sqlite_uri).get_metric_history(run_id, "m")] == [2.0]
    helper.close()


def test_the_helper_ignores_the_signals_of_a_stop_and_ends_when_its_pipe_closes(sqlite_uri):
    """SIGINT (Ctrl-C's process group) and SIGTERM (a scheduler's) leave it answering: the training
    decides when to stop, and closes the pipe."""
    helper, backend = StoreHelper(sqlite_uri), MLflowBackend(sqlite_uri, None, helper=False)
    run_id = backend.start(None, "12" * 16, False)
    helper.log_batch(run_id, [("m", 1.0, 0, 1)], [])
    pid = helper.pid
    for each in (signal.SIGINT, signal.SIGTERM):
        os.kill(pid, each)
    helper.log_batch(run_id, [("m", 2.0, 0, 2)], [])
    assert helper.pid == pid and not ended(pid)
    helper.close()
    assert ended(pid, wait=10) and helper.pid is None


def test_a_killed_training_leaves_no_helper_behind(tmp_path, sqlite_uri):
    """SIGKILL of the training process: the helper reads the end of its pipe and ends."""
    client = MlflowClient(sqlite_uri)
    run_id = client.create_run(client.create_experiment("killed")).info.run_id
    script = (f"from hf_callbacks_plus.loggers.mlflow_helper import StoreHelper; import time\n"
              f"helper = StoreHelper({sqlite_uri!r})\n"
              f"helper.log_batch({run_id!r}, [('m', 1.0, 0, 1)], [])\n"
              f"print(helper.pid, flush=True); time.sleep(120)\n")
    training = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pid = int(training.stdout.readline())
    training.kill()
    training.wait(10)
    assert ended(pid, wait=10)
    assert [m.value for m in client.get_metric_history(run_id, "m")] == [1.0]


@pytest.mark.parametrize(("uri", "kind"), [
    ("sqlite:////tmp/x.db", "sqlite"), ("sqlite+pysqlite:///x.db?timeout=20", "sqlite"),
    ("/tmp/mlruns", "file"), ("mlruns", "file"), ("file:///tmp/mlruns", "file"), ("C:\\mlruns", "file"),
    ("postgresql://u@h/db", "database"), ("postgresql+psycopg2://u@h/db", "database"),
    ("mysql+pymysql://u@h/db", "database"),
    ("mssql://h/db", "database"), ("sqlite:///:memory:", "memory"), ("sqlite://", "memory"),
    ("http://127.0.0.1:5000", "remote"), ("https://mlflow.example.com", "remote"), ("databricks", "remote"),
    ("databricks://profile", "remote"), ("databricks-uc", "remote"), ("uc:databricks", "remote")])
def test_a_tracking_uri_is_parsed_once_and_only_a_store_mlflow_writes_here_gets_a_helper(uri, kind):
    """Before, ``databricks`` was refused as a file store, and an in-memory sqlite store got a helper (which
    wrote the large calls to a database of its own)."""
    assert Store.parse(uri).kind == kind
    assert (MLflowBackend(uri, None).helper is not None) == (kind in ("sqlite", "file", "database"))
    if kind != "file":  # accepted (a file store needs MLFLOW_ALLOW_FILE_STORE: test_misconfiguration.py)
        assert MLflowLogger(tracking_uri=uri).tracking_uri == uri


def test_replay_sends_from_its_own_process(tmp_path, sqlite_uri, monkeypatch):
    """``replay`` does nothing else while it sends: no helper, every point once."""
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False, flush_timeout=0.5)
    logger.backend = FaultInjectingBackend(logger.backend, failing=("log", "finish"))
    train_in_loop(tmp_path, [Extras(logger, up_at=-1), logger], STEPS)
    monkeypatch.setattr(StoreHelper, "start", lambda self, timeout=None: pytest.fail("a helper started"))
    assert cli(["replay", str(tmp_path / ".mlflow_wal")]) == 0
    assert_every_point_once(MlflowClient(sqlite_uri), logger.run_id)
