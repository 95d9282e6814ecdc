"""No path of ours leaves a store or a run the next training cannot use, and every message at the end
counts what is really left; ``replay`` says where it sends.

- A process killed while MLflowLogger creates a new sqlite store (a real ``SIGKILL`` while MLflow's
  migrations run) leaves no store or a whole one, never a half-made one; the next training logs.
- A store another process left half-made (a leftover ``_alembic_tmp_`` table, what an interrupted
  migration leaves; the file is made by hand here: fault injection) is refused when the logger is
  built, naming the file, the table and the repair; after the repair the training logs.
- An answer to the run's creation lost on the way back (the server made the run, then the connection
  died: a real ``mlflow server`` behind a proxy that drops that answer) leaves one run.
- The end message counts the params and the final status it could not send, not only log records.
- ``replay`` of a copied run folder prints the store it sends to first; ``--tracking-uri`` takes another.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hf_callbacks_plus.cli import main as cli  # noqa: E402
from hf_callbacks_plus.loggers.mlflow import RUN_KEY_TAG, MLflowLogger  # noqa: E402
from tests.loggers.faults import FaultInjectingBackend, train_in_loop  # noqa: E402

pytestmark = pytest.mark.mlflow

REPO = Path(__file__).resolve().parents[2]

#: A training whose user code waits at step 1 (it is killed there) while the sender creates the store.
WAITING_TRAINING = """
import sys, time
sys.path.insert(0, {repo!r})
from hf_callbacks_plus.loggers.mlflow import MLflowLogger
from tests.loggers.faults import train_in_loop
from tests.loggers.test_wal import AtStep
train_in_loop({out!r}, [AtStep(1, lambda: time.sleep(600)), MLflowLogger(tracking_uri={uri!r})], 3)
"""


def loss_steps(client, run_id) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, "train/loss"))


def test_a_process_killed_while_it_creates_a_sqlite_store_leaves_none_or_a_whole_one(tmp_path):
    from mlflow.store.db.utils import _get_latest_schema_revision

    db = tmp_path / "store" / "mlflow.db"
    uri = f"sqlite:///{db}"
    script = WAITING_TRAINING.format(repo=str(REPO), out=str(tmp_path / "out"), uri=uri)
    process = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
    end = time.monotonic() + 300
    while time.monotonic() < end and process.poll() is None:  # the kill lands while the store is made
        if any(path.stat().st_size for path in db.parent.glob("mlflow.db*")) if db.parent.exists() else 0:
            break
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(60) == -signal.SIGKILL, process.stderr.read()[-2000:]
    if db.exists():  # made whole, or not at all
        with sqlite3.connect(db) as connection:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
            version = connection.execute("SELECT version_num FROM alembic_version").fetchall()
        assert version == [(_get_latest_schema_revision(),)], version
        assert not [name for name in tables if name.startswith("_alembic_tmp_")], tables

    logger = MLflowLogger(tracking_uri=uri)
    train_in_loop(tmp_path / "next", [logger], 5)
    client = MlflowClient(uri)
    assert client.get_run(logger.run_id).info.status == "FINISHED"
    assert loss_steps(client, logger.run_id) == [1, 2, 3, 4, 5]
    assert sorted(path.name for path in db.parent.iterdir()) == ["mlflow.db"]  # the killed one's draft: gone


def test_a_new_file_store_is_made_beside_its_place_and_moved_there_whole(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    root = tmp_path / "mlruns"
    logger = MLflowLogger(tracking_uri=f"file://{root}")
    train_in_loop(tmp_path / "out", [logger], 3)
    client = MlflowClient(f"file://{root}")
    assert client.get_run(logger.run_id).info.status == "FINISHED"
    assert loss_steps(client, logger.run_id) == [1, 2, 3]
    assert client.get_experiment("0").artifact_location == f"file://{root}/0"  # not the draft's path
    assert sorted(path.name for path in tmp_path.iterdir()) == ["mlruns", "out"]


def test_a_half_made_sqlite_store_is_refused_at_construction_with_its_repair(tmp_path):
    db = tmp_path / "mlflow.db"
    with sqlite3.connect(db) as connection:  # fault injection: what a migration killed midway leaves
        connection.execute("CREATE TABLE _alembic_tmp_experiments (experiment_id INTEGER)")
    uri = f"sqlite:///{db}"
    opened = subprocess.run([sys.executable, "-c", "import sys; from mlflow.tracking import MlflowClient; "
                             "MlflowClient(sys.argv[1]).search_experiments()", uri],
                            capture_output=True, text=True)
    assert "table _alembic_tmp_experiments already exists" in opened.stderr  # MLflow itself cannot open it
    with pytest.raises(ValueError) as refused:
        MLflowLogger(tracking_uri=uri)
    message = str(refused.value)
    assert str(db) in message and "_alembic_tmp_experiments left over" in message, message
    assert "it holds no runs: delete the file and MLflowLogger creates it again" in message, message

    db.unlink()  # the repair the message gives
    logger = MLflowLogger(tracking_uri=uri)
    train_in_loop(tmp_path / "out", [logger], 3)
    assert MlflowClient(uri).get_run(logger.run_id).info.status == "FINISHED"


@pytest.mark.slow
@pytest.mark.parametrize("retries", ["0", None], ids=["our-retry", "mlflows-retry"])
def test_a_lost_answer_to_the_run_creation_leaves_one_run(tmp_path, mlflow_proxy, monkeypatch, retries):
    """The server created the run, its answer was lost: whoever retries (the logger, or MLflow's own
    HTTP retry) must not leave a second, empty run RUNNING beside the real one."""
    if retries is not None:
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", retries)
    experiment = f"lost-answer-{retries}-{os.getpid()}-{time.monotonic_ns()}"
    mlflow_proxy.lose_answers[b"/api/2.0/mlflow/runs/create"] = 1
    logger = MLflowLogger(tracking_uri=mlflow_proxy.uri, experiment_name=experiment, backoff=(0.05, 0.2))
    train_in_loop(tmp_path, [logger], 5)
    assert mlflow_proxy.lose_answers[b"/api/2.0/mlflow/runs/create"] == 0  # an answer was lost
    client = MlflowClient(mlflow_proxy.uri)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert run.info.run_id == logger.run_id and run.info.status == "FINISHED"
    assert run.data.tags[RUN_KEY_TAG] == logger.run_key
    assert loss_steps(client, run.info.run_id) == [1, 2, 3, 4, 5]


def test_the_end_message_counts_the_params_and_the_status_not_only_log_records(tmp_path, sqlite_uri, caplog):
    logger = MLflowLogger(tracking_uri=sqlite_uri, flush_timeout=0.5, backoff=(0.01, 0.05))
    logger.backend = FaultInjectingBackend(logger.backend, failing=("start",))  # the run never opens
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train_in_loop(tmp_path, [logger], 3)
    (end,) = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
    assert "4 log record(s) (15 points, steps 1-3), the params and the final status FINISHED" in end, end
    assert "is unreachable: ConnectionError: injected fault: start" in end, end


def test_replay_of_a_copied_run_folder_says_where_it_sends_and_takes_another_store(tmp_path, _template_db,
                                                                                   monkeypatch, capsys):
    original, copy = tmp_path / "original", tmp_path / "copy"
    original.mkdir()
    shutil.copy(_template_db, original / "mlflow.db")
    monkeypatch.chdir(original)  # a relative sqlite path, as the docs' example
    logger = MLflowLogger(tracking_uri="sqlite:///mlflow.db", log_params=False, flush_timeout=0.2,
                          backoff=(0.01, 0.05))
    logger.backend = FaultInjectingBackend(logger.backend, failing=("log", "finish"))
    train_in_loop(original / "out", [logger], 4)
    shutil.copytree(original, copy)
    monkeypatch.chdir(copy)
    folder = copy / "out" / ".mlflow_wal"
    capsys.readouterr()

    assert cli(["replay", str(folder), "--dry-run"]) == 0  # the recorded store: the original's, absolute
    assert f"to the store at sqlite:///{original / 'mlflow.db'}, experiment Default, run {logger.run_id}" in (
        capsys.readouterr().out)
    assert cli(["replay", str(folder), "--tracking-uri", f"sqlite:///{copy / 'mlflow.db'}"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("sending ") and printed[0].endswith(
        f"to the store at sqlite:///{copy / 'mlflow.db'}, experiment Default, run {logger.run_id}"), printed
    copied = MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")  # the copy's store got the run's records
    assert loss_steps(copied, logger.run_id) == [1, 2, 3, 4]
    assert copied.get_run(logger.run_id).info.status == "FINISHED"
    untouched = MlflowClient(f"sqlite:///{original / 'mlflow.db'}")
    assert not untouched.get_metric_history(logger.run_id, "train/loss")


@pytest.mark.parametrize(("uri", "recorded"), [
    ("sqlite:///mlflow.db", "sqlite:///{cwd}/mlflow.db"),
    ("sqlite:////data/mlflow.db?timeout=20", "sqlite:////data/mlflow.db?timeout=20"),
    ("sqlite+pysqlite:///runs/m.db", "sqlite+pysqlite:///{cwd}/runs/m.db"),
    ("sqlite:///:memory:", "sqlite:///:memory:"),
    ("./mlruns", "{cwd}/mlruns"),
    ("file:///data/mlruns", "/data/mlruns"),
    ("http://user:pw@host:5000", "http://user:***@host:5000"),
    ("databricks", "databricks"),
])
def test_the_log_records_a_uri_that_reaches_the_same_store_from_any_folder(tmp_path, monkeypatch, uri,
                                                                           recorded):
    from hf_callbacks_plus.loggers.mlflow import MLflowBackend

    monkeypatch.chdir(tmp_path)
    target = MLflowBackend(uri, "e").target("key")
    assert target["tracking_uri"] == recorded.format(cwd=tmp_path) and target["run_key"] == "key"


def test_a_relative_sqlite_uri_is_the_store_of_the_working_directory_when_the_logger_is_made(
        tmp_path, _template_db, monkeypatch):
    """Two trainings in one process (a notebook), each in its own folder with the docs' relative
    ``sqlite:///mlflow.db``: each run is in its own folder's store. MLflow caches a store per URI
    string, so the second run went to the first folder's database."""
    runs = {}
    for name in ("first", "second"):
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(_template_db, folder / "mlflow.db")
        monkeypatch.chdir(folder)
        logger = MLflowLogger(tracking_uri="sqlite:///mlflow.db", log_params=False)
        train_in_loop(folder / "out", [logger], 2)
        runs[name] = logger.run_id
    for name, run_id in runs.items():
        assert loss_steps(MlflowClient(f"sqlite:///{tmp_path / name / 'mlflow.db'}"), run_id) == [1, 2], name
