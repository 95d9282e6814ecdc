"""`Backend.send_interval`: a store that pays per call (MLflow's sqlite store: one commit, 20-30 ms
of CPU, per ``log_batch``) gets the records of about a second in one call, every point still
delivered once; flushing and closing never wait for the interval.

``FaultInjectingBackend`` only counts the real backend's calls here (nothing injected)."""

from __future__ import annotations

import time

import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hf_callbacks_plus.core.callback import TrainerCallback  # noqa: E402
from hf_callbacks_plus.loggers.mlflow import MLflowBackend, MLflowLogger  # noqa: E402
from hf_callbacks_plus.loop.arguments import LoopArguments  # noqa: E402
from hf_callbacks_plus.loop.trainer import LightweightTrainer  # noqa: E402
from tests.loggers.faults import FaultInjectingBackend  # noqa: E402


class PacedSteps(TrainerCallback):
    """Each training step takes ``seconds`` (a model of that speed)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.seconds)


def train(out, logger, steps: int, step_seconds: float) -> None:
    args = LoopArguments(output_dir=str(out), max_steps=steps, logging_steps=1, disable_tqdm=True,
                         save_strategy="no")
    LightweightTrainer(args, train_step=lambda batch: 0.5, train_data=[[1.0]] * steps,
                       callbacks=[PacedSteps(step_seconds), logger], learning_rate_fn=lambda: 0.1).train()


def test_records_of_about_a_second_go_in_one_call_and_every_point_arrives(tmp_path, sqlite_uri):
    assert MLflowBackend.send_interval == 1.0
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    counting = FaultInjectingBackend(logger.backend)
    logger.backend = counting
    train(tmp_path, logger, steps=60, step_seconds=0.05)  # 3 s of training, a record per step
    # one call per step before (60 and the final summary); now about one per second
    assert counting.calls["log"] <= 10, counting.calls
    history = MlflowClient(sqlite_uri).get_metric_history(logger.run_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(1, 61))


def test_flush_and_close_do_not_wait_for_the_interval(tmp_path, sqlite_uri):
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    logger.backend.send_interval = 30.0  # longer than any wait below
    flushes, lingering_at_flush = [], []

    class FlushAtStep6(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 6:
                lingering_at_flush.append(logger.worker.pending > 0)
                start = time.monotonic()
                flushes.append((logger.flush(timeout=20.0), time.monotonic() - start))

    args = LoopArguments(output_dir=str(tmp_path), max_steps=8, logging_steps=1, disable_tqdm=True,
                         save_strategy="no")
    start = time.monotonic()
    LightweightTrainer(args, train_step=lambda batch: 0.5, train_data=[[1.0]] * 8,
                       callbacks=[PacedSteps(0.3), logger, FlushAtStep6()],
                       learning_rate_fn=lambda: 0.1).train()
    assert time.monotonic() - start < 15.0  # the close at train end does not wait 30 s either
    assert lingering_at_flush == [True], "the flush came while no record was waiting: it tests nothing"
    ((delivered, seconds),) = flushes
    assert delivered and seconds < 10.0, flushes
    history = MlflowClient(sqlite_uri).get_metric_history(logger.run_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(1, 9))
