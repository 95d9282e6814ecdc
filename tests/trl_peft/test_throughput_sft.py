"""ThroughputMonitor in trl's SFTTrainer with LoRA: counts by hand from the batches trl's own
collator built, the FLOPs of frozen and trained weights told apart, and trl's extra no-grad
forward pass (label smoothing) not counted twice."""

from __future__ import annotations

from typing import Any

import pytest

from hf_callbacks_plus import run_before_integrations
from hf_callbacks_plus.callbacks.throughput import ThroughputMonitor
from hf_callbacks_plus.callbacks.throughput.flops import training_flops
from tests.callbacks.throughput_helpers import Counts, assert_counts, throughput_records
from tests.trl_peft import runs

pytestmark = pytest.mark.transformers


class Recorder:
    """Wraps trl's collator; keeps a copy of every batch it builds (training only: no evaluation)."""

    def __init__(self, collate: Any) -> None:
        self.collate, self.batches = collate, []

    def __call__(self, rows: Any) -> Any:
        batch = self.collate(rows)
        self.batches.append({k: v.clone() for k, v in batch.items() if hasattr(v, "clone")})
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


def test_sft_extra_no_grad_pass_is_not_counted(tmp_path):
    """With label smoothing trl runs the model twice per micro-batch: once for the logits (with
    gradients, without labels) and once more without gradients for its metrics."""
    trainer, _, recorder = sft(tmp_path, label_smoothing_factor=0.1)
    records = throughput_records(trainer.state.log_history)
    assert len(records) == 3
    start = 1
    for record in records:
        assert_counts(record, window(recorder.batches, start, record["step"]), loss=False)
        assert "throughput/loss_tokens_per_second" not in record  # that pass has no labels
        start = record["step"]
