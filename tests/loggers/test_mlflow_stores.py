"""No path of ours leaves a store or a run the next training cannot use, and every message at the end
counts what is really left; ``replay`` says where it sends.

- Others using a new store while MLflowLogger makes it lose nothing and break nothing, and nobody is
  told anything: in this process the user's own ``MlflowClient`` or fluent calls on the training
  thread, or a second logger (MLflow's migrations use alembic, whose state is process-wide: two at once
  broke both and the store); in another process a training of ours, or MLflow making the same store
  in place (slowed, so that ours overlaps it: fault injection). A store another process makes at the
  place while ours is being made is used, never replaced.
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
from contextlib import closing
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hf_callbacks_plus.cli import main as cli  # noqa: E402
from hf_callbacks_plus.loggers.mlflow import RUN_KEY_TAG, MLflowLogger  # noqa: E402
from tests.loggers.faults import FaultInjectingBackend, train_in_loop  # noqa: E402
from tests.loggers.test_wal import AtStep  # noqa: E402

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


def assert_whole(db: Path) -> None:
    """A whole MLflow sqlite store: its schema at MLflow's head, no migration's leftovers."""
    from mlflow.store.db.utils import _get_latest_schema_revision

    with closing(sqlite3.connect(db)) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
        version = connection.execute("SELECT version_num FROM alembic_version").fetchall()
    assert version == [(_get_latest_schema_revision(),)], version
    assert not [name for name in tables if name.startswith("_alembic_tmp_")], tables


def wait_for_draft(place: Path) -> None:
    """Until a logger's making of the store at ``place`` has begun (its draft is there; a file store's
    draft may be moved there before it is seen)."""
    end = time.monotonic() + 300
    while not (place.exists() or list(place.parent.glob(f"{place.name}.creating-*"))):
        assert time.monotonic() < end, "no logger began to make the store"
        time.sleep(0.005)


def users_client(uri: str) -> None:
    MlflowClient(uri).search_experiments()


def users_fluent_run(uri: str) -> None:
    mlflow.set_tracking_uri(uri)
    try:
        with mlflow.start_run(run_name="mine"):
            mlflow.log_param("mine", "1")
    finally:
        mlflow.set_tracking_uri(None)


@pytest.mark.parametrize(("store", "other"), [
    ("sqlite", "client"),
    pytest.param("sqlite", "fluent", marks=pytest.mark.second_tier),
    pytest.param("sqlite", "second logger", marks=pytest.mark.second_tier),
    pytest.param("file store", "client", marks=pytest.mark.second_tier),
])
def test_others_in_this_process_using_a_new_store_while_the_logger_makes_it_lose_nothing(
        tmp_path, monkeypatch, caplog, store, other):
    """The issue's script: the user's own MLflow call at step 2 while MLflowLogger makes a new store in
    the background. Before, both failed (``duplicate column name: step``; ``KeyError: 'script'``),
    nothing was delivered and the store was broken; the stock ``MLflowCallback``: 40/40 points."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    place = tmp_path / "store" / ("mlflow.db" if store == "sqlite" else "mlruns")
    uri = f"sqlite:///{place}" if store == "sqlite" else f"file://{place}"
    errors = []

    def users_call():
        wait_for_draft(place)  # the logger is making it now
        try:
            (users_fluent_run if other == "fluent" else users_client)(uri)
        except Exception as error:  # the test's verdict, below
            errors.append(error)

    loggers = [MLflowLogger(tracking_uri=uri, experiment_name=name) for name in (
        ("first", "second") if other == "second logger" else (None,))]
    users = [] if other == "second logger" else [AtStep(2, users_call)]
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        train_in_loop(tmp_path / "out", [*users, *loggers], 40)
    assert errors == []
    assert [r.getMessage() for r in caplog.records if r.name.startswith("hf_callbacks_plus")] == []
    client = MlflowClient(uri)
    for logger in loggers:
        assert client.get_run(logger.run_id).info.status == "FINISHED"
        assert loss_steps(client, logger.run_id) == list(range(1, 41))
    if other == "fluent":
        (mine,) = client.search_runs(["0"], filter_string="attributes.run_name = 'mine'")
        assert mine.data.params == {"mine": "1"}
    if store == "sqlite":
        assert_whole(place)
    assert sorted(path.name for path in place.parent.iterdir()) == [place.name]  # no draft left


#: MLflow making a store in place in another process (the user's own script, a stock ``MLflowCallback``
#: training), slowed (fault injection: 3 ms more per SQL statement, of about 1700) so that the logger's
#: creation overlaps it; it begins once the logger's draft is there.
SLOW_MAKER = """
import sys, time
from pathlib import Path
import sqlalchemy
from mlflow.tracking import MlflowClient
place = Path(sys.argv[1])
sqlalchemy.event.listen(sqlalchemy.engine.Engine, "before_cursor_execute", lambda *a: time.sleep(0.003))
while not list(place.parent.glob(place.name + ".creating-*")):
    time.sleep(0.005)
MlflowClient(f"sqlite:///{place}").search_experiments()
"""


@pytest.mark.second_tier
def test_mlflow_making_the_same_new_store_in_another_process_is_waited_for(tmp_path):
    """The logger's draft loses the race to the other process's store, which is still being made: the
    logger waits until it is whole (it never migrates a store someone else is making); both log."""
    place = tmp_path / "mlflow.db"
    uri = f"sqlite:///{place}"
    other = subprocess.Popen([sys.executable, "-c", SLOW_MAKER, str(place)], stderr=subprocess.PIPE,
                             text=True)
    logger = MLflowLogger(tracking_uri=uri, flush_timeout=300)
    train_in_loop(tmp_path / "out", [logger], 40)
    assert other.wait(300) == 0, other.stderr.read()[-3000:]
    client = MlflowClient(uri)
    assert client.get_run(logger.run_id).info.status == "FINISHED"
    assert loss_steps(client, logger.run_id) == list(range(1, 41))
    assert_whole(place)


TRAINING = """
import sys
sys.path.insert(0, {repo!r})
from hf_callbacks_plus.loggers.mlflow import MLflowLogger
from tests.loggers.faults import train_in_loop
logger = MLflowLogger(tracking_uri=sys.argv[1])
train_in_loop(sys.argv[2], [logger], 20)
print(logger.run_id)
"""


@pytest.mark.second_tier
@pytest.mark.parametrize("store", ["sqlite", "file store"])
def test_two_trainings_making_one_new_store_at_once_both_log_everything(tmp_path, monkeypatch, store):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    place = tmp_path / ("mlflow.db" if store == "sqlite" else "mlruns")
    uri = f"sqlite:///{place}" if store == "sqlite" else str(place)
    trainings = [subprocess.Popen([sys.executable, "-c", TRAINING.format(repo=str(REPO)), uri,
                                   str(tmp_path / f"out{n}")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for n in (1, 2)]
    run_ids = []
    for training in trainings:
        out, err = training.communicate(timeout=300)
        assert training.returncode == 0 and "not delivered" not in err, err[-3000:]
        run_ids.append(out.split()[-1])
    client = MlflowClient(uri)
    for run_id in run_ids:
        assert client.get_run(run_id).info.status == "FINISHED"
        assert loss_steps(client, run_id) == list(range(1, 21))
    if store == "sqlite":
        assert_whole(place)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([place.name, "out1", "out2"])


@pytest.mark.parametrize(("store", "system"), [
    pytest.param("sqlite", "renameat2", marks=pytest.mark.second_tier),
    pytest.param("sqlite", "no renameat2", marks=pytest.mark.second_tier),
    ("sqlite", "no hard links"), ("file store", "renameat2"), ("file store", "no renameat2")])
def test_a_store_another_process_makes_while_ours_is_made_is_used_never_replaced(tmp_path, monkeypatch,
                                                                                _template_db, store, system):
    """Fault injection: the other process's store (with a run of its own) is put at the place just
    before the logger's draft is moved there; it stays, and the draft is removed. On Linux's
    ``renameat2``; without it (a hard link for a file, a rename for a folder); on a file system without
    hard links (before, the draft replaced the other's store there: its run was lost)."""
    import ctypes
    from types import SimpleNamespace

    from hf_callbacks_plus.loggers import mlflow_helper

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    if system == "no renameat2":
        monkeypatch.setattr(ctypes, "CDLL", lambda *args, **kwargs: SimpleNamespace())
    if system == "no hard links":
        def no_link(source, target):
            raise PermissionError(1, "Operation not permitted", target)

        monkeypatch.setattr(os, "link", no_link)
    place = tmp_path / ("mlflow.db" if store == "sqlite" else "mlruns")
    theirs = tmp_path / "theirs" / place.name
    if store == "sqlite":
        theirs.parent.mkdir()
        shutil.copy(_template_db, theirs)
        uri = f"sqlite:///{theirs}"
    else:
        uri = str(theirs)
    their_run = MlflowClient(uri).create_run("0").info.run_id
    move = mlflow_helper._move_unless_there

    def made_meanwhile(source, target):
        os.rename(theirs, target)
        move(source, target)

    monkeypatch.setattr(mlflow_helper, "_move_unless_there", made_meanwhile)
    store = mlflow_helper.Store.parse(f"sqlite:///{place}" if store == "sqlite" else str(place))
    mlflow_helper.make_store(store)
    assert MlflowClient(store.uri).get_run(their_run).info.run_id == their_run
    assert sorted(path.name for path in tmp_path.iterdir()) == [place.name, "theirs"]


def test_a_process_killed_while_it_creates_a_sqlite_store_leaves_none_or_a_whole_one(tmp_path):
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
        assert_whole(db)

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
