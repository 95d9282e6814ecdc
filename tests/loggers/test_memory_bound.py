"""The worker's memory bound holds while a backend call hangs (issue 16, finding 8).

The worker thread is stuck inside the backend call, so it takes nothing out of the queue: the
training thread itself must keep the queue under ``max_memory_points`` by spilling its oldest
items. The backend is the real MLflow backend on a sqlite store (read back with
``MlflowClient``); ``HangingBackend`` (fault injection, around it) makes every ``log`` call hang
until the test releases it, which the real one cannot do on demand.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from hf_callbacks_plus.loggers.ledger import StepLedger
from hf_callbacks_plus.loggers.records import RawLog, RecordRenderer, WarnOnce
from hf_callbacks_plus.loggers.replay import replay_spill
from hf_callbacks_plus.loggers.spill import read_records
from hf_callbacks_plus.loggers.worker import HUNG_CALL_SECONDS, BackgroundWorker
from hf_callbacks_plus.metrics.keys import KeyGrammar
from tests.loggers.faults import FaultInjectingBackend

BOUND = 4_000
RECORDS, METRICS = 100, 200


class HangingBackend(FaultInjectingBackend):
    """Fault injection: every ``log`` call of the wrapped real backend blocks until ``release``."""

    def __init__(self, backend, release: threading.Event) -> None:
        super().__init__(backend)
        self.release = release
        self.log_calls = 0

    def log(self, records, run_id):
        self.log_calls += 1
        self.release.wait(60)
        return self.wrapped.log(records, run_id)


def logged_points(client, run_id):
    """``[(key, step)]`` of every metric point of an MLflow run."""
    return [(key, metric.step) for key in client.get_run(run_id).data.metrics
            for metric in client.get_metric_history(run_id, key)]


def test_the_memory_bound_holds_while_a_backend_call_hangs_and_nothing_is_lost(tmp_path, caplog, sqlite_uri):
    import mlflow
    from mlflow.tracking import MlflowClient

    from hf_callbacks_plus.loggers.mlflow import MLflowBackend

    release = threading.Event()
    backend = HangingBackend(MLflowBackend(mlflow, sqlite_uri, "memory-bound", None, {}, None), release)
    ledger = StepLedger()
    ledger.begin_run(lambda: None)
    worker = BackgroundWorker(backend, ledger, tmp_path / "spill.jsonl", name="MLflowLogger",
                              renderer=RecordRenderer(KeyGrammar(), "keep", WarnOnce(), "MLflowLogger"),
                              max_memory_points=BOUND, backoff_initial=0.01, backoff_max=0.05,
                              target=backend.target())
    assert worker.wait_started(10)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        worker.submit(RawLog({"loss": 0.5}, 0, 0))
        end = time.monotonic() + 10
        while backend.log_calls == 0 and time.monotonic() < end:  # the worker is now stuck in `log`
            time.sleep(0.01)
        assert backend.log_calls == 1
        time.sleep(HUNG_CALL_SECONDS + 0.1)  # a call that hangs, not one that is merely slow
        live_peak = 0
        for step in range(1, RECORDS + 1):
            worker.submit(RawLog({f"m{k}": float(step * 1000 + k) for k in range(METRICS)}, step, 0))
            live_peak = max(live_peak, worker.queued_points + worker.held_points)
        # documented: max_memory_points in the backlog, as many again in the queue
        assert live_peak <= 2 * BOUND, live_peak
        assert worker.queued_points <= BOUND
        assert worker.spilled_by_submit > 0
        slow = [r for r in caplog.records if "slow or unreachable" in r.getMessage()]
        assert len(slow) == 1 and str(worker.spill_path) in slow[0].getMessage()
        release.set()
        assert not worker.close(0.0)  # closed at once: what is not sent stays in the spill file
    assert worker.peak_queued_points <= BOUND and worker.peak_points <= BOUND, (
        worker.peak_queued_points, worker.peak_points)

    client = MlflowClient(sqlite_uri)
    delivered = logged_points(client, ledger.run_id)
    kept = read_records(tmp_path / "spill.jsonl")
    kept_points = sum(len(record.metrics) for record in kept if record.kind == "log")
    assert len(delivered) + kept_points == 1 + RECORDS * METRICS  # every point sent or kept

    replay_spill(tmp_path / "spill.jsonl", report=lambda line: None)
    assert not (tmp_path / "spill.jsonl").exists()
    counts = Counter(logged_points(client, ledger.run_id))
    assert len(counts) == 1 + RECORDS * METRICS and max(counts.values()) == 1  # each point exactly once
