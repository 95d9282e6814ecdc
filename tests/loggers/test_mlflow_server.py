"""MLflowLogger against a real ``mlflow server`` on 127.0.0.1 (started once per session), through a
TCP proxy the tests cut and restore: the server unreachable in the middle of training, with the
logger's own retry (``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0``) and with MLflow's own HTTP retries,
which keep one call silent for as long as the outage lasts.
"""

from __future__ import annotations

import logging
from collections import Counter

import pytest

pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hf_callbacks_plus.core.callback import TrainerCallback  # noqa: E402
from hf_callbacks_plus.loggers import wal  # noqa: E402
from hf_callbacks_plus.loggers.mlflow import MLflowLogger  # noqa: E402
from tests.tiny_models import make_trainer  # noqa: E402

pytestmark = [pytest.mark.mlflow, pytest.mark.transformers, pytest.mark.slow]

EVERY_STEP = ("train/loss", "train/grad_norm", "train/learning_rate", "train/epoch")
EVAL = ("eval/loss", "eval/mse", "eval/mae", "eval/runtime", "eval/samples_per_second",
        "eval/steps_per_second")
TOTALS = ("train_summary/runtime", "train_summary/samples_per_second", "train_summary/steps_per_second",
          "train_summary/loss", "train_summary/total_flos", "train_summary/epoch")


def test_logs_through_the_server(tmp_path, mlflow_server):
    logger = MLflowLogger(tracking_uri=mlflow_server.uri, experiment_name="server")
    make_trainer(tmp_path, callbacks=[logger], logging_steps=2, eval_strategy="steps", eval_steps=4,
                 max_steps=8, hub_token="hf_" + "Q" * 34).train()
    client = MlflowClient(mlflow_server.uri)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(logger.run_id, "train/loss")] == [2, 4, 6, 8]
    assert [m.step for m in client.get_metric_history(logger.run_id, "eval/mae")] == [4, 8]
    assert run.data.params["hub_token"] == "<redacted>"
    assert not any("QQQQ" in value for value in run.data.params.values())


class CutAt(TrainerCallback):
    """Cuts the proxy at step ``cut`` and restores it at step ``restore`` (None: never)."""

    def __init__(self, proxy, cut: int, restore=None) -> None:
        self.proxy, self.cut, self.restore = proxy, cut, restore

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.cut:
            self.proxy.cut()
        elif state.global_step == self.restore:
            self.proxy.restore()


def assert_every_step_once(client: MlflowClient, run_id: str, steps: int = 40) -> None:
    expected = {**{key: list(range(1, steps + 1)) for key in EVERY_STEP},
                **{key: list(range(5, steps + 1, 5)) for key in EVAL}, **{key: [steps] for key in TOTALS}}
    assert sorted(client.get_run(run_id).data.metrics) == sorted(expected)
    for key, steps_of_key in expected.items():
        got = [m.step for m in client.get_metric_history(run_id, key)]
        assert sorted(got) == steps_of_key and max(Counter(got).values()) == 1, key


def assert_finished_once_and_told(uri: str, run_id: str, caplog, outage: str) -> None:
    """The run FINISHED with every step once; one ``outage`` warning, one "reachable again", nothing
    left undelivered (nor blamed on a slow store)."""
    client = MlflowClient(uri)
    assert client.get_run(run_id).info.status == "FINISHED"
    assert_every_step_once(client, run_id)
    messages = [r.getMessage() for r in caplog.records if r.name == "hf_callbacks_plus"]
    assert len([m for m in messages if outage in m]) == 1, messages
    assert len([m for m in messages if "reachable again" in m]) == 1, messages
    assert not [m for m in messages if "not delivered" in m or "too slow" in m], messages


def test_an_outage_mid_training_is_told_once_each_way_and_every_step_arrives_once(tmp_path, mlflow_proxy,
                                                                                   caplog, monkeypatch):
    """``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`` hands the outage to the logger at once: one warning each
    way, retry with backoff, every step of every metric exactly once."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    logger = MLflowLogger(tracking_uri=mlflow_proxy.uri, experiment_name="outage", backoff=(0.05, 0.2),
                          log_params=False)
    trainer = make_trainer(tmp_path, callbacks=[CutAt(mlflow_proxy, 10, 25), logger], logging_steps=1,
                           eval_strategy="steps", eval_steps=5, max_steps=40, n_train=320)

    class Flush(TrainerCallback):  # at step 24 the sender has met the outage: a flush cannot finish
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 24:
                assert not logger.flush(0.5)

    trainer.add_callback(Flush())
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer.train()
    assert_finished_once_and_told(mlflow_proxy.uri, logger.run_id, caplog, "unreachable")


@pytest.mark.second_tier  # the same messages with a gated call on sqlite: test_wal.py
def test_with_mlflows_own_retries_a_silent_call_is_told_as_an_outage(tmp_path, mlflow_proxy, caplog,
                                                                      monkeypatch):
    """MLflow's own HTTP retries (the default) keep one call waiting through an outage: no error
    reaches the logger. The silence is told ("has not answered") and its end ("reachable again");
    the end summary does not blame a slow store. The proxy is restored once the silence is told."""
    monkeypatch.setattr(wal, "SILENT_CALL_SECONDS", 1.0)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")

    class RestoreWhenTold(logging.Handler):
        def emit(self, record):
            if "has not answered" in record.getMessage():
                mlflow_proxy.restore()

    handler = RestoreWhenTold()
    logging.getLogger("hf_callbacks_plus").addHandler(handler)
    logger = MLflowLogger(tracking_uri=mlflow_proxy.uri, experiment_name="silent", log_params=False)
    try:
        with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
            make_trainer(tmp_path, callbacks=[CutAt(mlflow_proxy, 20), logger], logging_steps=1,
                         eval_strategy="steps", eval_steps=5, max_steps=40, n_train=320).train()
    finally:
        logging.getLogger("hf_callbacks_plus").removeHandler(handler)
    assert_finished_once_and_told(mlflow_proxy.uri, logger.run_id, caplog, "has not answered")


def test_mlflow_url_print_never_shows_the_password(tmp_path, mlflow_server, capfd):
    """MLflow prints 'View run ... at: http://alice:<password>@...' at every set_terminated to a
    server; our client prints the URL masked."""
    uri = mlflow_server.uri.replace("http://", "http://alice:S3cretPW123@")
    logger = MLflowLogger(tracking_uri=uri, experiment_name="masked-url")
    trainer = make_trainer(tmp_path, callbacks=[logger], logging_steps=2, max_steps=4)
    trainer.train()
    trainer.evaluate()  # a second run segment, closed here: set_terminated again
    assert logger.close(timeout=30)
    captured = capfd.readouterr()
    assert "S3cretPW123" not in captured.out + captured.err
    assert "alice:***@" in captured.out or "View run" not in captured.out
