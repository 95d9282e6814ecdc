"""Shared by the ThroughputMonitor tests: variable-length rows, a padding collator that records
every batch it builds (the hand count's source, independent of the monitor's hook), the
expected counts of a window counted by hand from those batches, and a simulated clock.

The simulated clock replaces ``time`` in ``hf_callbacks_plus.callbacks.throughput`` (the one
thing faked: wall time is not reproducible on a shared machine). The test advances it by known
amounts where the work happens (building a batch in the data loader, a training forward pass, an
evaluation forward pass, a save, a log), each entry tagged with the trainer's ``global_step`` at
that moment, so the windows' seconds and what is left out of them follow from the trace alone
(`expected_window`): the work done while ``global_step`` is ``g`` belongs to the window that ends
at the first logging step after ``g``.
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
    evaluation batches with it too: those rows say ``split="eval"``). With a ``clock``, building
    a batch takes `LOAD` simulated seconds (a slow data loader)."""

    def __init__(self, mask: bool = True, clock: Any = None) -> None:
        self.mask = mask
        self.clock = clock
        self.batches: list[dict[str, torch.Tensor]] = []

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        if self.clock is not None:
            self.clock.advance(LOAD, "load" if rows[0].get("split", "train") == "train" else "eval-load")
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

    sequences: int = 0
    tokens: int = 0
    non_padding_tokens: int = 0
    loss_tokens: int = 0
    squared_lengths: int = 0
    micro_batches: int = 0

    def add(self, batch: dict[str, torch.Tensor], shifts: bool) -> None:
        ids = batch["input_ids"]
        self.micro_batches += 1
        self.sequences += ids.shape[0]
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
    """A ``time`` stand-in whose ``perf_counter`` the test advances (module docstring).

    ``step`` reads the trainer's ``global_step`` (set once the trainer exists)."""

    now: float = 1000.0
    trace: list[tuple[str, float, int]] = field(default_factory=list)
    step: Any = None

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float, what: str) -> None:
        self.now += seconds
        self.trace.append((what, seconds, int(self.step()) if self.step is not None else 0))

    def follow(self, trainer: Any) -> None:
        """Tag the work with ``trainer.state.global_step`` (the Trainer replaces its state in
        ``train()``: read through the trainer)."""
        self.step = lambda: trainer.state.global_step


#: Simulated seconds of each kind of work: building a batch, a training forward pass, an
#: evaluation forward pass, a save, a log.
LOAD, TRAIN_FORWARD, EVAL_FORWARD, SAVE, LOG = 0.5, 1.0, 100.0, 1000.0, 10.0
#: What each tag of the trace is: training, or one of the monitor's left-out kinds.
KIND_OF = {"load": "training", "train": "training", "log": "logging", "eval": "evaluation",
           "eval-load": "evaluation", "eval-log": "evaluation", "save": "save"}


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
    """A callback that advances ``clock`` by `SAVE` at each save and `LOG` at each log (a
    logger's own work: ``log`` for a training record, ``eval-log`` for an evaluation's)."""
    from transformers import TrainerCallback

    class ClockWork(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            clock.advance(SAVE, "save")

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            clock.advance(LOG, "log" if "loss" in (logs or {}) else "eval-log")

    return ClockWork()


def expected_window(trace: list[tuple[str, float, int]], first: int, last: int) -> dict[str, float]:
    """Seconds of training and of each left-out kind in the window of steps ``first + 1 .. last``:
    the work done while ``global_step`` was ``first .. last - 1`` (the point after step
    ``first`` and the data fetch of step ``first + 1`` on, up to the end of step ``last``)."""
    seconds = {"training": 0.0, "logging": 0.0, "evaluation": 0.0, "save": 0.0}
    for what, amount, step in trace:
        if first <= step < last:
            seconds[KIND_OF[what]] += amount
    return seconds


def assert_window_seconds(record: dict, trace: list[tuple[str, float, int]], first: int) -> None:
    """The record's window and left-out seconds are those of the trace (`expected_window`)."""
    import pytest

    expected = expected_window(trace, first, record["step"])
    assert record["throughput/window_seconds"] == pytest.approx(expected["training"]), record
    for kind in ("logging", "evaluation", "save"):
        assert record[f"throughput/{kind}_seconds"] == pytest.approx(expected[kind]), (kind, record)
    assert record["throughput/left_out_seconds"] == pytest.approx(
        expected["logging"] + expected["evaluation"] + expected["save"])


def throughput_records(history: list[dict]) -> list[dict]:
    """The training records that carry the monitor's figures."""
    return [r for r in history if "throughput/window_seconds" in r]


def assert_counts(record: dict, expected: Counts, *, tokens: bool = True, loss: bool = True) -> None:
    """The record's rates times its seconds are the hand counts (up to float rounding)."""
    seconds = record["throughput/window_seconds"]

    def count(name: str) -> float:
        return record[f"throughput/{name}_per_second"] * seconds

    assert count("sequences") == _approx(expected.sequences)
    # samples_per_second: the 0.2 name of the same figure
    assert record["throughput/samples_per_second"] == record["throughput/sequences_per_second"]
    if tokens:
        assert count("tokens") == _approx(expected.tokens)
        assert count("non_padding_tokens") == _approx(expected.non_padding_tokens)
    if loss:
        assert count("loss_tokens") == _approx(expected.loss_tokens)


def _approx(value: float) -> Any:
    import pytest

    return pytest.approx(value, rel=1e-9, abs=1e-9)
