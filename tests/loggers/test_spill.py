"""Spilled records carry their run id and are replayed into their own run (real MLflow sqlite store).

``FailingMLflowLogger`` injects an outage around the real MLflow backend: the run is created,
then every send and the final status update raise ``ConnectionError`` until training ends, so
the records end in the spill file (the real killed-server outage is proven in
test_mlflow_server.py; here the outage must last exactly one training).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hf_callbacks_plus.loggers.mlflow import RECOVERED_TAG, MLflowLogger  # noqa: E402
from tests.loggers.faults import FaultInjectingBackend  # noqa: E402
from tests.tiny_models import make_trainer  # noqa: E402

pytestmark = [pytest.mark.mlflow, pytest.mark.transformers]

FAST = {"flush_timeout": 0.3, "backoff": (0.01, 0.05)}
SAVE = {"logging_steps": 2, "save_strategy": "steps", "save_steps": 2}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID", "MLFLOW_TAGS", "RANK"):
        monkeypatch.delenv(name, raising=False)


class FailingMLflowLogger(MLflowLogger):
    """The run opens, then the tracking server is unreachable until the end of training.

    ``outage=False`` makes it a plain MLflowLogger (a resumed Trainer needs the same callback
    class as the checkpoint: transformers keys ``stateful_callbacks`` by class name).
    """

    failing = ("log", "store_config", "set_tags", "finish")

    def __init__(self, *args, outage=True, **kwargs):
        super().__init__(*args, **kwargs)
        self.backend = FaultInjectingBackend(self.backend, self.failing, down=outage)


class FailingFromStartMLflowLogger(FailingMLflowLogger):
    """The tracking server is unreachable for the whole training: the run never opens."""

    failing = ("start", "log", "store_config", "set_tags", "finish")


def steps(client, run_id, key="train/loss"):
    return [m.step for m in client.get_metric_history(run_id, key)]


def assert_each_step_once(client, run_id):
    for key in client.get_run(run_id).data.metrics:
        counts = Counter(m.step for m in client.get_metric_history(run_id, key))
        assert max(counts.values()) == 1, (key, counts)


def test_a_fresh_run_sends_the_old_runs_spilled_records_to_the_old_run(tmp_path, sqlite_uri):
    old = FailingMLflowLogger(tracking_uri=sqlite_uri, **FAST)
    make_trainer(tmp_path, callbacks=[old], logging_steps=2, max_steps=6).train()
    records = [json.loads(line) for line in old.spill_path.read_text().splitlines()]
    assert {record["run_id"] for record in records} == {old.run_id}
    client = MlflowClient(sqlite_uri)
    assert client.get_run(old.run_id).data.metrics == {}

    new = MLflowLogger(tracking_uri=sqlite_uri)
    make_trainer(tmp_path, callbacks=[new], logging_steps=2, max_steps=4).train()
    assert new.run_id != old.run_id
    assert steps(client, old.run_id) == [2, 4, 6]
    assert steps(client, new.run_id) == [2, 4]
    assert "train_summary/runtime" in client.get_run(old.run_id).data.metrics
    assert client.get_run(old.run_id).data.params["max_steps"] == "6"
    assert client.get_run(new.run_id).data.params["max_steps"] == "4"
    for run_id in (old.run_id, new.run_id):
        assert_each_step_once(client, run_id)
    assert client.get_run(new.run_id).info.status == "FINISHED"
    assert not old.spill_path.exists()


def test_a_resumed_run_replays_its_spilled_records_into_the_same_run(tmp_path, sqlite_uri):
    old = FailingMLflowLogger(tracking_uri=sqlite_uri, **FAST)
    make_trainer(tmp_path, callbacks=[old], max_steps=6, **SAVE).train()
    assert old.spill_path.exists()

    new = FailingMLflowLogger(tracking_uri=sqlite_uri, outage=False)
    trainer = make_trainer(tmp_path, callbacks=[new], max_steps=8, **SAVE)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    client = MlflowClient(sqlite_uri)
    assert new.run_id == old.run_id
    assert len(client.search_runs(["0"])) == 1
    assert steps(client, old.run_id) == [2, 4, 6, 8]
    assert_each_step_once(client, old.run_id)
    assert client.get_run(old.run_id).info.status == "FINISHED"
    assert not old.spill_path.exists()


@pytest.mark.parametrize("keyed", [True, False], ids=["with_run_key", "spill_file_without_keys"])
def test_records_of_a_run_that_never_opened_get_a_run_of_their_own(tmp_path, sqlite_uri, keyed):
    """A new training (not a resume) replays them into the run their run key names, created with
    that key: the run a resume of the old training would continue. Spill files written before run
    keys existed get a new run tagged recovered."""
    import json

    from hf_callbacks_plus.loggers.mlflow import RUN_KEY_TAG

    old = FailingFromStartMLflowLogger(tracking_uri=sqlite_uri, **FAST)
    make_trainer(tmp_path, callbacks=[old], logging_steps=2, max_steps=6).train()
    assert old.run_id is None and old.spill_path.exists()
    if not keyed:
        lines = [json.loads(line) for line in old.spill_path.read_text().splitlines()]
        old.spill_path.write_text("".join(json.dumps({k: v for k, v in line.items() if k != "run_key"})
                                          + "\n" for line in lines))

    new = MLflowLogger(tracking_uri=sqlite_uri)
    make_trainer(tmp_path, callbacks=[new], logging_steps=2, max_steps=4).train()
    client = MlflowClient(sqlite_uri)
    runs = client.search_runs(["0"])
    assert len(runs) == 2
    (recovered,) = [run for run in runs if run.info.run_id != new.run_id]
    if keyed:
        assert recovered.data.tags[RUN_KEY_TAG] == old.ledger.run_key
    else:
        assert recovered.data.tags[RECOVERED_TAG] == "true"
    assert recovered.info.status == "FINISHED"
    assert steps(client, recovered.info.run_id) == [2, 4, 6]
    assert steps(client, new.run_id) == [2, 4]
    assert not old.spill_path.exists()
