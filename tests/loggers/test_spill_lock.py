"""``hf-callbacks-plus replay`` and a training appending to the same spill file (issue 16, finding 10).

Replay reads the file, sends its records, then rewrites it with what was not delivered. A
training still running appends to the file meanwhile; without the lock those appends landed
in the file being rewritten and were lost. A thread stands for the training: it appends with
the same `SpillFile` API the worker uses, while replay runs again and again into a real MLflow
sqlite store (read back with ``MlflowClient``).
"""

from __future__ import annotations

import threading
from collections import Counter

from hf_callbacks_plus.loggers.records import LogRecord
from hf_callbacks_plus.loggers.replay import replay_spill
from hf_callbacks_plus.loggers.spill import SpillFile, lock_path, read_records

METRICS = 5


def test_appends_during_replays_are_all_delivered_exactly_once(tmp_path, sqlite_uri):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(sqlite_uri)
    run_id = client.create_run(client.create_experiment("spill-lock")).info.run_id

    def record(step: int) -> LogRecord:
        return LogRecord(step, 0, {f"m{k}": float(step + k) for k in range(METRICS)}, {}, session="s-1",
                         run_id=run_id)

    spill = SpillFile(tmp_path / "spill" / "MLflowLogger.jsonl", "MLflowLogger",
                      target={"logger": "MLflowLogger", "tracking_uri": sqlite_uri,
                              "experiment_name": "spill-lock"})
    spill.append([record(step) for step in range(300)])
    total = 3000
    appended = threading.Event()

    def training() -> None:
        for step in range(300, total):
            spill.append([record(step)])
        appended.set()

    thread = threading.Thread(target=training)
    thread.start()
    replays = 0
    while not appended.is_set() or replays < 3:
        replay_spill(spill.path.parent, report=lambda line: None)
        replays += 1
    thread.join()
    replay_spill(spill.path.parent, report=lambda line: None)  # what the last replays left

    kept = read_records(spill.path)
    counts = Counter(metric.step for metric in client.get_metric_history(run_id, "m0"))
    assert not kept and not spill.path.exists()
    assert sorted(counts) == list(range(total)), (total - len(counts), replays)  # nothing lost
    assert max(counts.values()) == 1  # nothing twice
    assert lock_path(spill.path).exists()  # the lock file stays (never deleted)


def test_a_run_that_spills_nothing_leaves_no_spill_folder(tmp_path):
    """The lock file belongs to a spill file: a run without faults leaves neither (the lock's first
    version created ``<output_dir>/.tracker_spill/<logger>.jsonl.lock`` in every run)."""
    from types import SimpleNamespace

    from hf_callbacks_plus.core.state import TrainerControl, TrainerState
    from hf_callbacks_plus.loggers.jsonl import JsonlLogger

    args = SimpleNamespace(output_dir=str(tmp_path), report_to="none", run_name=None, to_dict=dict)
    logger, state, control = JsonlLogger(log_config=False), TrainerState(), TrainerControl()
    logger.on_train_begin(args, state, control)
    for step in (1, 2, 3):
        state.global_step = step
        logger.on_log(args, state, control, logs={"loss": 1.0 / step})
    logger.state_attributes()
    logger.on_train_end(args, state, control)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["metrics.jsonl"]
