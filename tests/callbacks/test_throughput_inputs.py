"""ThroughputMonitor on models without token ids (issue 32, item 6): ``inputs_embeds`` are tokens;
image inputs (or any other) log their rows as sequences, and one warning says which figures are
missing and why."""

from __future__ import annotations

import logging

import pytest
import torch

from hf_callbacks_plus import run_before_integrations
from hf_callbacks_plus.callbacks.throughput import ThroughputMonitor
from tests.callbacks.throughput_helpers import lm_rows, throughput_records, tiny_llama
from tests.tiny_models import TinyClassifier, classification_rows, training_args

pytestmark = pytest.mark.transformers


class PixelModel(torch.nn.Module):
    """A model whose inputs are images (``pixel_values``), no token ids."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head = torch.nn.Linear(12, 3)

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        logits = self.head(pixel_values.flatten(1))
        loss = torch.nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


def pixel_rows(n: int) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    return [{"pixel_values": torch.randn(3, 2, 2, generator=generator), "labels": torch.tensor(i % 3)}
            for i in range(n)]


@pytest.mark.parametrize(("model", "rows", "inputs"), [
    (TinyClassifier, classification_rows, "features, labels"),
    (PixelModel, pixel_rows, "pixel_values, labels"),
])
def test_no_token_inputs_log_rows_and_say_which_figures_are_missing(model, rows, inputs, tmp_path, caplog):
    from transformers import Trainer

    trainer = Trainer(model=model(), args=training_args(tmp_path, max_steps=6, logging_steps=2),
                      train_dataset=rows(48), callbacks=[ThroughputMonitor(peak_flops=1e12)])
    run_before_integrations(trainer)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer.train()
    records = throughput_records(trainer.state.log_history)
    assert len(records) == 3
    for record in records:
        rows_trained, seconds = 8 * record["throughput/window_steps"], record["throughput/window_seconds"]
        assert record["throughput/sequences_per_second"] * seconds == pytest.approx(rows_trained)
        assert record["throughput/loss_tokens_per_second"] * seconds == pytest.approx(rows_trained)
        assert not any(k in record for k in ("throughput/tokens_per_second", "throughput/mfu"))
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ThroughputMonitor")]
    # the FLOP count of the linear head exists, the tokens it is per do not
    assert said == [
        "ThroughputMonitor: throughput/tokens_per_second, throughput/non_padding_tokens_per_second, "
        "throughput/tflops_per_second, throughput/mfu are not logged: 1 of 1 training forward passes of a "
        f"window had no input_ids or inputs_embeds (a pass got {inputs}), so their tokens are unknown; "
        "sequences_per_second counts their rows."], said


def test_inputs_embeds_are_tokens(tmp_path):
    """A model trained on ``inputs_embeds`` (no ``input_ids``) has one token per position."""
    from transformers import Trainer

    model = tiny_llama()

    class Embedded(torch.utils.data.Dataset):
        def __init__(self) -> None:
            self.rows = lm_rows(24, seed=1, min_length=6, max_length=6)

        def __len__(self) -> int:
            return len(self.rows)

        def __getitem__(self, index: int) -> dict:
            row = self.rows[index]
            with torch.no_grad():
                embeds = model.get_input_embeddings()(row["input_ids"])
            return {"inputs_embeds": embeds, "labels": row["labels"]}

    args = training_args(tmp_path, max_steps=4, logging_steps=2, per_device_train_batch_size=4,
                         remove_unused_columns=False)
    trainer = Trainer(model=model, args=args, train_dataset=Embedded(), callbacks=[ThroughputMonitor()])
    run_before_integrations(trainer)
    trainer.train()
    for record in throughput_records(trainer.state.log_history):
        seconds = record["throughput/window_seconds"]
        assert record["throughput/tokens_per_second"] * seconds == pytest.approx(
            4 * 6 * record["throughput/window_steps"])
        assert record["throughput/tflops_per_second"] > 0
