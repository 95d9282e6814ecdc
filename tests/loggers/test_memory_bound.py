"""MLflowLogger's memory is bounded in every phase: while a call to the store hangs, after it
returns (catching up) and when a log is read back (replay).

What the logger holds is measured with ``tracemalloc`` (traced from step 5 on): the Python
memory still alive that was allocated with ``hf_callbacks_plus/loggers`` in the stack, not by
mlflow or sqlalchemy themselves (the store's own caches), and not the trainer's ``log_history``
(which holds every record too). Three calls' worth of metric points are logged while the store
hangs; the logger may hold one call (``CALL_BATCHES`` of MLflow's batches of 1000 points, 2 here
instead of 8: the bound scales with it) and nothing more. Real MLflow sqlite store;
``FaultInjectingBackend`` makes ``log`` hang on a gate.
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

from hf_callbacks_plus.cli import main as cli  # noqa: E402
from hf_callbacks_plus.core.callback import TrainerCallback  # noqa: E402
from hf_callbacks_plus.loggers import wal  # noqa: E402
from hf_callbacks_plus.loggers.mlflow import MLflowLogger  # noqa: E402
from hf_callbacks_plus.loggers.mlflow_helper import StoreHelper  # noqa: E402
from hf_callbacks_plus.loop.arguments import LoopArguments  # noqa: E402
from hf_callbacks_plus.loop.trainer import LightweightTrainer  # noqa: E402
from tests.loggers.faults import FaultInjectingBackend  # noqa: E402

pytestmark = pytest.mark.mlflow

CALL_BATCHES = 2  # MLflow batches a call (wal.CALL_BATCHES, set by the fixture below)
METRICS, POINTS_PER_CALL = 500, CALL_BATCHES * 1000
STEPS = 3 * POINTS_PER_CALL // METRICS  # three calls' worth of points logged
#: bytes: a point held is about 150-170 B (MLflow's ``Metric``, 113 B, and the log's entry decoded, 37 B: a
#: line of the JSON form was decoded inside ``json``, whose frames are not counted); what is logged, 3x more
BOUND = 200 * POINTS_PER_CALL
NOT_OURS = ("*/mlflow/*", "*/sqlalchemy/*", "*/importlib/*", "<frozen *>", "*/logging/*", "*/threading.py",
            "*/tracemalloc.py", "*/json/*")


def held_by_the_logger() -> int:
    """Bytes alive, allocated with ``hf_callbacks_plus/loggers`` in the stack, not by the store's code
    (after a full collection: garbage and CPython's free lists of tuples are held by nothing)."""
    gc.collect()
    filters = [tracemalloc.Filter(True, "*hf_callbacks_plus/loggers/*", all_frames=True)]
    filters += [tracemalloc.Filter(False, pattern) for pattern in NOT_OURS]
    snapshot = tracemalloc.take_snapshot().filter_traces(filters)
    return sum(stat.size for stat in snapshot.statistics("filename"))


class Metrics(TrainerCallback):
    """Listed first: ``METRICS`` keys in every training record; from step 5 on, Python allocations are
    traced; at step ``measure_at``, what the logger holds is measured, then ``then()`` runs."""

    def __init__(self, measure_at: int = -1, then=None) -> None:
        self.measure_at, self.then, self.seen = measure_at, then, None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "loss" in logs:
            logs.update({f"m{k}": float(state.global_step * 1000 + k) for k in range(METRICS)})

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 5 and self.measure_at > 0:
            tracemalloc.start(6)
        if state.global_step == self.measure_at:
            self.seen = held_by_the_logger()
            self.then()


def train(out, callbacks, steps):
    args = LoopArguments(output_dir=str(out), max_steps=steps, logging_steps=1, disable_tqdm=True,
                         save_strategy="no")
    LightweightTrainer(args, train_step=lambda batch: 0.5, train_data=[[1.0]] * steps, callbacks=callbacks,
                       learning_rate_fn=lambda: 0.1).train()


@pytest.fixture(autouse=True)
def smaller_calls(monkeypatch):
    monkeypatch.setattr(wal, "CALL_BATCHES", CALL_BATCHES)


@pytest.fixture
def in_a_call(monkeypatch):
    """What the logger holds in the first ``log_batch`` call while tracing, in this process or to the
    helper process (its batch is alive then); tracing stops there."""
    seen = []

    def measured(original):
        def call(self, *args, **kwargs):
            if tracemalloc.is_tracing():
                seen.append(held_by_the_logger())
                tracemalloc.stop()
            return original(self, *args, **kwargs)
        return call

    monkeypatch.setattr(MlflowClient, "log_batch", measured(MlflowClient.log_batch))
    monkeypatch.setattr(StoreHelper, "log_batch", measured(StoreHelper.log_batch))
    yield seen
    tracemalloc.stop()


def test_memory_is_bounded_while_a_call_hangs_after_it_returns_and_on_reload(tmp_path, sqlite_uri, in_a_call):
    client = MlflowClient(sqlite_uri)
    logger = MLflowLogger(tracking_uri=sqlite_uri, log_params=False)
    hanging = logger.backend = FaultInjectingBackend(logger.backend, gated=("log",))
    hang = Metrics(measure_at=STEPS, then=hanging.gate.set)
    train(tmp_path / "a", [hang, logger], STEPS + 5)
    assert hanging.entered.is_set() and hang.seen < BOUND, hang.seen  # while the call hangs
    assert len(in_a_call) == 1 and in_a_call[0] < BOUND, in_a_call  # once it returned: catching up
    assert [m.step for m in client.get_metric_history(logger.run_id, "train/m7")] == list(range(1, STEPS + 6))

    # the store never answers within the close deadline; a replay reads the backlog back and sends it
    stuck = MLflowLogger(tracking_uri=sqlite_uri, log_params=False, flush_timeout=0.5)
    stuck.backend = FaultInjectingBackend(stuck.backend, gated=("log",))
    train(tmp_path / "b", [Metrics(), stuck], STEPS)
    in_a_call.clear()
    tracemalloc.start(6)
    assert cli(["replay", str(tmp_path / "b" / ".mlflow_wal")]) == 0
    assert in_a_call and in_a_call[0] < BOUND, in_a_call
    assert [m.step for m in client.get_metric_history(stuck.run_id, "train/m7")] == list(range(1, STEPS + 1))
    # the abandoned call of the stuck logger goes on only now: released before the replay, its own
    # batch was measured with the replay's when both ran together
    stuck.backend.gate.set()
