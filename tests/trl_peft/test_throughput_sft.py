"""ThroughputMonitor in trl's SFTTrainer with LoRA: counts by hand from the batches trl's own
collator built, the FLOPs of frozen and trained weights told apart, trl's extra no-grad forward
pass (label smoothing) not counted twice and its missing labels said; the sequences of
padding-free and packed batches against the examples trl collated and transformers' own
``train_samples_per_second``; the windows against a simulated clock with a slow loader."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest

from hf_callbacks_plus import run_before_integrations
from hf_callbacks_plus.callbacks import throughput
from hf_callbacks_plus.callbacks.throughput import ThroughputMonitor
from hf_callbacks_plus.callbacks.throughput.flops import training_flops
from tests.callbacks.test_batch_counts import EXAMPLES, assert_counts_the_examples
from tests.callbacks.throughput_helpers import (
    LOAD,
    Counts,
    SimulatedClock,
    assert_counts,
    assert_window_seconds,
    clock_callback,
    drive_clock,
    throughput_records,
)
from tests.trl_peft import runs

pytestmark = pytest.mark.transformers


class Recorder:
    """Wraps trl's collator; keeps a copy of every batch it builds and the number of sequences it
    was given (an example, or each of the ``seq_lengths`` of a packed one); with a ``clock``,
    building a batch takes `LOAD` simulated seconds."""

    def __init__(self, collate: Any, clock: Any = None, what: str = "load") -> None:
        self.collate, self.batches, self.sequences = collate, [], []
        self.clock, self.what = clock, what

    def __call__(self, rows: Any) -> Any:
        if self.clock is not None:
            self.clock.advance(LOAD, self.what)
        batch = self.collate(rows)
        self.batches.append({k: v.clone() for k, v in batch.items() if hasattr(v, "clone")})
        self.sequences.append(sum(len(row["seq_lengths"]) if "seq_lengths" in row else 1 for row in rows))
        return batch


def sft(tmp_path, **overrides):
    monitor = ThroughputMonitor()
    trainer = runs.trainer("sft", tmp_path, peft=True, with_subset_eval=False, callbacks=[monitor],
                           eval_strategy="no", max_steps=6, logging_steps=2, per_device_train_batch_size=4,
                           gradient_accumulation_steps=2, **overrides)
    run_before_integrations(trainer)
    recorder = Recorder(trainer.data_collator)
    trainer.data_collator = recorder
    trainer.train()
    return trainer, monitor, recorder


def window(batches: list, first: int, last: int) -> Counts:
    counts = Counts()
    for batch in batches[2 * first:2 * last]:  # 2 micro-batches a step
        counts.add(batch, shifts=True)
    return counts


def test_sft_lora_counts_and_trainable_aware_flops(tmp_path):
    trainer, monitor, recorder = sft(tmp_path)
    assert len(recorder.batches) >= 12  # the data loader builds one batch ahead
    records = throughput_records(trainer.state.log_history)
    assert [(r["step"], r["throughput/window_steps"]) for r in records] == [(2, 1), (4, 2), (6, 2)]
    start = 1
    for record in records:
        assert_counts(record, window(recorder.batches, start, record["step"]))
        start = record["step"]
    trainable, _ = trainer.model.get_nb_trainable_parameters()
    frozen = training_flops(trainer.model.get_base_model()).parameters - trainable  # the base's products
    assert monitor.flops.trained_parameters == trainable
    assert monitor.flops.per_token == 4 * (frozen + trainable) + 2 * trainable
    assert trainable < frozen / 10  # LoRA: the weight gradients are a small part


def test_sft_extra_no_grad_pass_is_not_counted(tmp_path, caplog):
    """With label smoothing trl runs the model twice per micro-batch: once for the logits (with
    gradients, without labels) and once more without gradients for its metrics; the loss tokens
    are unknown, and one warning says so and why."""
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer, _, recorder = sft(tmp_path, label_smoothing_factor=0.1)
    records = throughput_records(trainer.state.log_history)
    assert len(records) == 3
    start = 1
    for record in records:
        assert_counts(record, window(recorder.batches, start, record["step"]), loss=False)
        assert "throughput/loss_tokens_per_second" not in record  # that pass has no labels
        start = record["step"]
    said = [r.getMessage() for r in caplog.records if "loss_tokens_per_second" in r.getMessage()]
    assert len(said) == 1, said
    assert "no labels" in said[0] and "input_ids" in said[0] and "label smoothing" in said[0]


def test_trl_flattening_collator_counts_its_examples():
    """trl's padding-free collator, on the examples of tests/callbacks/test_batch_counts.py, and
    on the same examples packed into 2 rows (``seq_lengths``, as trl's packing writes them)."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    assert_counts_the_examples(collate(EXAMPLES))
    packed = [{"input_ids": sum((e["input_ids"] for e in part), []),
               "seq_lengths": [len(e["input_ids"]) for e in part]} for part in (EXAMPLES[:3], EXAMPLES[3:])]
    assert_counts_the_examples(collate(packed))


@pytest.mark.parametrize("layout", ["padded", "padding_free", "packing"])
def test_sft_sequences_against_the_examples_and_transformers_count(layout, tmp_path):
    """Sequences are the examples trl collated: a padding-free micro-batch is one row of 4
    examples, a packed one a row of many documents (before: 1 per micro-batch, 4x-20x too low).
    transformers' ``train_samples_per_second`` counts dataset rows: the examples when padding
    free, the packed rows (fewer than the documents) when packing."""
    options = {"padded": {}, "padding_free": {"padding_free": True, "max_length": None},
               "packing": {"packing": True, "max_length": 64}}[layout]
    monitor = ThroughputMonitor(warmup_steps=0)
    trainer = runs.trainer("sft", tmp_path, with_subset_eval=False, callbacks=[monitor], eval_strategy="no",
                           max_steps=4, logging_steps=2, per_device_train_batch_size=4,
                           gradient_accumulation_steps=2, **options)
    run_before_integrations(trainer)
    recorder = Recorder(trainer.data_collator)
    trainer.data_collator = recorder
    trainer.train()
    records = throughput_records(trainer.state.log_history)
    ours = sum(r["throughput/sequences_per_second"] * r["throughput/window_seconds"] for r in records)
    trained = recorder.sequences[:4 * 2]  # the loader builds one batch ahead
    assert ours == pytest.approx(sum(trained))
    summary = trainer.state.log_history[-1]
    transformers = summary["train_samples_per_second"] * summary["train_runtime"]  # rounded by transformers
    rows = 4 * 2 * 4  # max_steps x accumulation x batch
    assert transformers == pytest.approx(rows, rel=0.01)
    if layout == "packing":
        assert sum(trained) > 2 * rows  # documents: several per packed row
    else:
        assert sum(trained) == rows
    rows_per_pass = {len(batch["input_ids"]) for batch in recorder.batches}
    assert rows_per_pass == ({4} if layout == "padded" else {1})  # what the monitor counted before


class ClockedSFT:
    """trl's SFTTrainer whose evaluation batches go through their own recorder (tagged
    ``eval-load``), so that the training recorder sees training batches only."""

    @staticmethod
    def make(clock: Any) -> Any:
        import trl

        class Clocked(trl.SFTTrainer):
            def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
                training = self.data_collator
                self.data_collator = Recorder(training.collate, clock, "eval-load")
                try:
                    return super().get_eval_dataloader(eval_dataset)
                finally:
                    self.data_collator = training

        return Clocked


def test_sft_windows_count_loading_and_leave_out_the_points(tmp_path, monkeypatch):
    """The windows of an SFTTrainer (trl's own log and loss) hold training and data loading and
    leave out logging, evaluation and saving, as transformers' loop runs them."""
    clock = SimulatedClock()
    monkeypatch.setattr(throughput, "time", clock)
    monitor = ThroughputMonitor()
    trainer = runs.trainer("sft", tmp_path, base=ClockedSFT.make(clock), peft=True, with_subset_eval=False,
                           callbacks=[monitor, clock_callback(clock)], eval_strategy="steps", eval_steps=3,
                           save_strategy="steps", save_steps=4, max_steps=8, logging_steps=2,
                           per_device_train_batch_size=4, gradient_accumulation_steps=2,
                           dataloader_drop_last=True)
    run_before_integrations(trainer)
    recorder = Recorder(trainer.data_collator, clock)
    trainer.data_collator = recorder
    clock.follow(trainer)
    drive_clock(clock, trainer.model)
    trainer.train()
    assert trainer.callback_handler.callbacks[-1] is monitor
    records = throughput_records(trainer.state.log_history)
    assert [r["step"] for r in records] == [2, 4, 6, 8]
    start = 1
    for record in records:
        assert_window_seconds(record, clock.trace, start)
        assert_counts(record, window(recorder.batches, start, record["step"]))
        start = record["step"]
    assert any(r["throughput/evaluation_seconds"] for r in records)
    assert any(r["throughput/save_seconds"] for r in records)
    assert math.isclose(sum(s for what, s, _ in clock.trace if what == "load"), LOAD * len(recorder.batches))
