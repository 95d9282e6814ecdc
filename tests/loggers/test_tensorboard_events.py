"""``TensorBoardLogger`` events: one event per record, no flush per batch.

Read back with TensorBoard's own readers: the raw event file (``EventFileLoader``) and
``EventAccumulator``. The reference for "the same tags and values as before" is the former
writing (``add_scalar`` per metric, a flush per batch), kept here as `log_one_event_per_scalar`.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.bench_tensorboard_logger import old_log
from hf_callbacks_plus.loggers.base import LogRecord
from hf_callbacks_plus.loggers.tensorboard import TensorBoardBackend, TensorBoardLogger, summary_writer_class
from hf_callbacks_plus.loggers.wal import WriteAheadLog
from tests.tiny_models import make_trainer

pytestmark = pytest.mark.transformers
pytest.importorskip("tensorboard")


#: The former ``TensorBoardBackend.log``: ``add_scalar`` per value and a flush per batch (the
#: benchmark's reference too).
log_one_event_per_scalar = old_log


def raw_events(directory: Path) -> list:
    """Every Event of every event file under ``directory``, in file order."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return [event for path in sorted(Path(directory).rglob("events.out.tfevents.*"))
            for event in EventFileLoader(str(path)).Load()]


def accumulated_points(directory: Path) -> Counter:
    """``(tag, step, value)`` of every scalar ``EventAccumulator`` reads (NaN written as "nan")."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    accumulator.Reload()
    return Counter((tag, event.step, "nan" if math.isnan(event.value) else event.value)
                   for tag in accumulator.Tags()["scalars"] for event in accumulator.Scalars(tag))


def test_one_record_with_many_metrics_is_one_event(tmp_path):
    """500 metrics in one record are one event (not one ``add_scalar`` event per metric)."""
    backend = TensorBoardBackend(summary_writer_class(), lambda run_id: str(tmp_path / run_id))
    run_id = backend.start(None, "key", resume=False)
    metrics = {f"train/metric_{index}": index / 7 for index in range(50)}
    backend.log([LogRecord(3, 1_700_000_000_000, metrics, {"train_summary/loss": 0.5})], run_id)
    backend.finish("FINISHED", run_id)
    summaries = [event for event in raw_events(tmp_path) if event.HasField("summary")
                 and not event.summary.value[0].tag.startswith("status")]
    assert len(summaries) == 1, f"{len(summaries)} events for one record"
    event = summaries[0]
    assert event.step == 3 and event.wall_time == pytest.approx(1_700_000_000.0)
    assert len(event.summary.value) == 51
    assert [value.tag for value in event.summary.value] == [*metrics, "train_summary/loss"]


def test_event_file_reads_back_as_add_scalar_wrote_it(tmp_path):
    """Same (tag, step, value) set in ``EventAccumulator`` as one ``add_scalar`` per value wrote,
    including NaN/inf, repeated steps, texts beside numbers and ints."""
    records = [
        LogRecord(1, 1_700_000_000_000, {"train/loss": 0.25, "train/nan": math.nan, "train/inf": math.inf,
                                          "train/minus_inf": -math.inf}, {}),
        LogRecord(2, 1_700_000_001_000, {"train/loss": 0.125, "eval/loss": 1e-30},
                  {"early_stopping/why": "wait"}),
        LogRecord(2, 1_700_000_002_000, {"eval/loss": 3.0}, {"train_summary/steps": 2.0}),
    ]
    writer_class = summary_writer_class()
    backend = TensorBoardBackend(writer_class, lambda run_id: str(tmp_path / "new"))
    run_id = backend.start(None, "key", resume=False)
    backend.log(records, run_id)
    backend.finish("FINISHED", run_id)
    reference = writer_class(log_dir=str(tmp_path / "old"))
    log_one_event_per_scalar(reference, records)
    reference.close()
    expected = accumulated_points(tmp_path / "old")
    assert expected and accumulated_points(tmp_path / "new") == expected
    assert ("train/inf", 1, math.inf) in expected and ("train/nan", 1, "nan") in expected


def non_finite_and_wide():
    """A callback, ahead of the logger, adding 40 metrics, NaN and +-inf to every training log."""
    from transformers import TrainerCallback

    class NonFiniteAndWide(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs is not None and "loss" in logs:
                logs.update({f"wide_{index}": state.global_step + index / 8 for index in range(40)})
                logs.update({"diverged": math.nan, "exploded": math.inf, "sunk": -math.inf})

    return NonFiniteAndWide()


@pytest.mark.parametrize("key_names", ["sections", "stock"])
def test_trainer_run_reads_back_as_with_add_scalar(tmp_path, key_names):
    """A real Trainer run (evaluation, NaN/inf kept, ``key_names`` both ways): ``EventAccumulator``
    reads back from our events exactly what ``add_scalar`` per value writes from the same records."""
    logger = TensorBoardLogger(nonfinite="keep", key_names=key_names)
    reference = summary_writer_class()(log_dir=str(tmp_path / "reference"))
    write = logger.backend.log

    def log_both(records, run_id):
        write(records, run_id)
        log_one_event_per_scalar(reference, records)

    logger.backend.log = log_both
    trainer = make_trainer(tmp_path, callbacks=[non_finite_and_wide(), logger], max_steps=4,
                           logging_steps=1, eval_strategy="steps", eval_steps=2)
    trainer.train()
    reference.close()
    ours = accumulated_points(tmp_path / "runs" / logger.run_id)
    assert ours == accumulated_points(tmp_path / "reference")
    assert {"train/loss", "train/wide_3", "eval/loss"} <= {tag for tag, _, _ in ours}
    assert {step for tag, step, _ in ours if tag == "train/wide_3"} == {1, 2, 3, 4}
    assert ("train/wide_3", 2, 2.375) in ours
    assert {(tag, step) for tag, step, value in ours if value == "nan"} == {("train/diverged", step)
                                                                           for step in range(1, 5)}
    assert Counter(value for tag, _, value in ours if tag == "train/exploded") == Counter({math.inf: 4})
    # one event per record: far fewer summary events than scalar points
    events = [event for event in raw_events(tmp_path / "runs" / logger.run_id) if event.HasField("summary")]
    assert len(events) < sum(ours.values()) / 10


def test_at_a_checkpoint_save_every_event_is_on_disk_in_the_event_file_or_the_write_ahead_log(tmp_path):
    """No flush per batch and none at the save (the training never waits for the writer, whose writing
    lags behind), yet every step logged before a checkpoint is on disk when the checkpoint is saved:
    in the event file, or in the run's write-ahead log until the writer has written it."""

    from transformers import TrainerCallback

    logger = TensorBoardLogger()
    write = logger.backend.log

    def slow_log(records, run_id):  # writing lags behind the training
        time.sleep(0.2)
        write(records, run_id)

    logger.backend.log = slow_log
    seen: dict[int, tuple[set[int], set[int]]] = {}

    class ReadAtSave(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            # the log first: a step leaves it only once the event file holds it
            journal = WriteAheadLog(logger.wal_path)
            journal.inspect()
            in_log = {entry["step"] for entry, _ in journal.entries(journal.first)
                      if "train/loss" in entry.get("metrics", {})}
            journal.close()
            directory = Path(logger.backend.directory)
            in_events = {event.step for event in raw_events(directory)
                         if any(value.tag == "train/loss" for value in event.summary.value)}
            seen[state.global_step] = (in_events, in_log)

    trainer = make_trainer(tmp_path, callbacks=[logger, ReadAtSave()], max_steps=8, logging_steps=1,
                           save_strategy="steps", save_steps=4)
    trainer.train()
    assert {step: events | log for step, (events, log) in seen.items()} == {4: {1, 2, 3, 4},
                                                                             8: set(range(1, 9))}
    assert seen[8][1]  # the writer lagged: the last steps were on disk only in the write-ahead log
