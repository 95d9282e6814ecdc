"""Shared by the ThroughputMonitor tests: variable-length rows, a padding collator that records
every batch it builds (the hand count's source, independent of the monitor's hook), the
expected counts of a window counted by hand from those batches, and a simulated clock.

The simulated clock replaces ``time`` in ``hf_callbacks_plus.callbacks.throughput`` (the one
thing faked: wall time is not reproducible on a shared machine). The test advances it by known
amounts where the work happens (a training forward pass, an evaluation forward pass, a save, a
log), so the windows' seconds and what is left out of them are known exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

IGNORE = -100


def lm_rows(n: int, seed: int = 0, vocab_size: int = 48, min_length: int = 3, max_length: int = 12,
            split: str = "train") -> list[dict]:
    """``n`` causal-LM rows of random lengths: ``input_ids``, ``labels`` (a prompt of 2 ignored),
    ``split`` (which the collator reads and drops)."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        length = int(torch.randint(min_length, max_length + 1, (1,), generator=generator))
        ids = torch.randint(1, vocab_size, (length,), generator=generator)
        labels = ids.clone()
        labels[:2] = IGNORE
        rows.append({"input_ids": ids, "labels": labels, "split": split})
    return rows


def classifier_rows(n: int, seed: int = 0, vocab_size: int = 48, num_labels: int = 3,
                    split: str = "train") -> list[dict]:
    """``n`` sequence-classification rows of random lengths: ``input_ids``, an int ``labels``, ``split``."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        length = int(torch.randint(3, 13, (1,), generator=generator))
        ids = torch.randint(1, vocab_size, (length,), generator=generator)
        rows.append({"input_ids": ids, "labels": torch.tensor(int(ids[0]) % num_labels), "split": split})
    return rows


def tiny_llama(kind: str = "lm", seed: int = 0, **overrides: Any) -> Any:
    """A seeded 2-layer Llama (hidden 16, 2 heads, 1 key-value head): a causal LM or a 3-label classifier."""
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    torch.manual_seed(seed)
    values = {"vocab_size": 48, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 32,
              "pad_token_id": 0, "num_labels": 3}
    values.update(overrides)
    config = LlamaConfig(**values)
    return LlamaForCausalLM(config) if kind == "lm" else LlamaForSequenceClassification(config)


class RecordingCollator:
    """Pads a list of rows to the longest (``input_ids`` with 0, ``attention_mask`` 0 there,
    ``labels`` with -100) or, with ``mask=False``, truncates them to the shortest (no padding);
    keeps a copy of every training batch it builds, in order (the Trainer collates its
    evaluation batches with it too: those rows say ``split="eval"``)."""

    def __init__(self, mask: bool = True) -> None:
        self.mask = mask
        self.batches: list[dict[str, torch.Tensor]] = []

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        lengths = [len(row["input_ids"]) for row in rows]
        width = max(lengths) if self.mask else min(lengths)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        token_labels = rows[0]["labels"].dim() == 1
        labels = torch.full((len(rows), width), IGNORE, dtype=torch.long) if token_labels else None
        for i, row in enumerate(rows):
            n = min(len(row["input_ids"]), width)
            ids[i, :n] = row["input_ids"][:n]
            mask[i, :n] = 1
            if labels is not None:
                labels[i, :n] = row["labels"][:n]
        if labels is None:
            labels = torch.stack([row["labels"] for row in rows])
        batch = {"input_ids": ids, "labels": labels}
        if self.mask:
            batch["attention_mask"] = mask
        if rows[0].get("split", "train") == "train":
            self.batches.append({k: v.clone() for k, v in batch.items()})
        return batch


@dataclass
class Counts:
    """A window's counts by hand."""

    samples: int = 0
    tokens: int = 0
    non_padding_tokens: int = 0
    loss_tokens: int = 0
    squared_lengths: int = 0
    micro_batches: int = 0

    def add(self, batch: dict[str, torch.Tensor], shifts: bool) -> None:
        ids = batch["input_ids"]
        self.micro_batches += 1
        self.samples += ids.shape[0]
        self.tokens += ids.numel()
        mask = batch.get("attention_mask", torch.ones_like(ids))
        lengths = [int(row.sum()) for row in mask]
        self.non_padding_tokens += sum(lengths)
        self.squared_lengths += sum(length * length for length in lengths)
        labels = batch["labels"]
        if labels.dim() == 2 and shifts:
            labels = labels[:, 1:]
        self.loss_tokens += int((labels != IGNORE).sum())


def step_of_batches(batches_per_epoch: int, accumulation: int, epochs: int) -> list[int]:
    """The optimizer step (1-based) each micro-batch belongs to, in order, as transformers groups
    an epoch's batches into steps of ``accumulation`` (the last step of an epoch may be shorter)."""
    steps_per_epoch = math.ceil(batches_per_epoch / accumulation)
    return [epoch * steps_per_epoch + index // accumulation + 1
            for epoch in range(epochs) for index in range(batches_per_epoch)]


def window_counts(batches: list[dict], steps: list[int], first: int, last: int, shifts: bool) -> Counts:
    """Counts of the micro-batches of steps ``first + 1 .. last``."""
    counts = Counts()
    for batch, step in zip(batches, steps):
        if first < step <= last:
            counts.add(batch, shifts)
    return counts


@dataclass
class SimulatedClock:
    """A ``time`` stand-in whose ``perf_counter`` the test advances (module docstring)."""

    now: float = 1000.0
    trace: list[tuple[str, float]] = field(default_factory=list)

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float, what: str) -> None:
        self.now += seconds
        self.trace.append((what, seconds))


#: Simulated seconds of each kind of work.
TRAIN_FORWARD, EVAL_FORWARD, SAVE, LOG = 1.0, 100.0, 1000.0, 10.0


def drive_clock(clock: SimulatedClock, model: Any) -> Any:
    """Advance ``clock`` on every forward pass of ``model``: a training pass (training mode,
    gradients on) costs `TRAIN_FORWARD`, any other `EVAL_FORWARD`. Returns the hook handle."""

    def on_forward(module: Any, args: Any, kwargs: Any) -> None:
        if module.training and torch.is_grad_enabled():
            clock.advance(TRAIN_FORWARD, "train")
        else:
            clock.advance(EVAL_FORWARD, "eval")

    return model.register_forward_pre_hook(on_forward, with_kwargs=True)


def clock_callback(clock: SimulatedClock) -> Any:
    """A callback that advances ``clock`` by `SAVE` at each save and `LOG` at each log."""
    from transformers import TrainerCallback

    class ClockWork(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            clock.advance(SAVE, "save")

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            clock.advance(LOG, "log")

    return ClockWork()


def throughput_records(history: list[dict]) -> list[dict]:
    """The training records that carry the monitor's figures."""
    return [r for r in history if "throughput/window_seconds" in r]


def assert_counts(record: dict, expected: Counts, *, tokens: bool = True, loss: bool = True) -> None:
    """The record's rates times its seconds are the hand counts (up to float rounding)."""
    seconds = record["throughput/window_seconds"]

    def count(name: str) -> float:
        return record[f"throughput/{name}_per_second"] * seconds

    assert count("samples") == _approx(expected.samples)
    if tokens:
        assert count("tokens") == _approx(expected.tokens)
        assert count("non_padding_tokens") == _approx(expected.non_padding_tokens)
    if loss:
        assert count("loss_tokens") == _approx(expected.loss_tokens)


def _approx(value: float) -> Any:
    import pytest

    return pytest.approx(value, rel=1e-9, abs=1e-9)
