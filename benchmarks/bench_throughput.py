"""ThroughputMonitor against tokens counted by hand over wall time measured outside the trainer.

For each case (a causal LM and a sequence classifier; with and without padding; with and without
gradient accumulation), ``--repeats`` times:

* run A: ``Trainer.train()`` for ``W + N + 1`` steps with the monitor (``warmup_steps=W``, windows
  of ``--logging-steps`` covering steps ``W+1 .. W+N``) and transformers' own counter
  (``include_num_input_tokens_seen="all"``); the data collator keeps every batch it builds and
  the time (``perf_counter``) it built it;
* run P: the same on a stock Trainer without either (the paired baseline).

The hand count: tokens (and non-padding tokens) of the batches of steps ``W+1 .. W+N`` from the
collator's copies, over the wall time measured outside the trainer, by the collator: from when
it built the first batch of step ``W+1`` to when it built the first batch of step ``W+N+1``
(``N`` steps apart, whether the data loader builds a batch ahead or not). Printed per case
(medians over the repeats, ranges in brackets): the monitor's tokens/s over the run (all its
counts over all its window seconds) as a ratio to the hand figure, the same for non-padding
tokens, transformers' ``train_tokens_per_second`` of the same run (cumulative since ``train()``
began, padding included) as a ratio to the hand figure, the time spent inside the monitor's own
code (its forward hook and its events, timed around them) per step as a share of a step, the paired
end-to-end ratio A / P, and the largest relative difference between the logged MFU and the MFU
computed by hand (FLOPs from ``training_flops(model)`` and the hand counts, over the record's
``window_seconds``, over the peak given).

With ``--load-ms L`` the collator sleeps ``L`` ms per batch (a slow data loader, whose time is
in the hand figure's wall time and must be in the monitor's windows).

Run: ``.venv/bin/python benchmarks/bench_throughput.py [--steps 100] [--warmup 10]
[--logging-steps 10] [--repeats 3] [--load-ms 0] [--cases lm-padded-ga4,...]``
Timings are wall-clock (``time.perf_counter``) with torch on one thread.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import torch
from transformers import Trainer, TrainingArguments
from transformers.trainer_callback import PrinterCallback

from hf_callbacks_plus.callbacks.throughput import ThroughputMonitor
from hf_callbacks_plus.callbacks.throughput.flops import training_flops
from hf_callbacks_plus.integrations.ordering import run_before_integrations

VOCAB, LENGTH, BATCH = 1024, 64, 8


class TimedMonitor(ThroughputMonitor):
    """ThroughputMonitor, with the time spent in its forward hook and events summed."""

    seconds = 0.0

    def _on_forward(self, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        super()._on_forward(*args, **kwargs)
        self.seconds += time.perf_counter() - start


for _event in ("on_step_begin", "on_step_end", "on_epoch_end", "on_pre_log", "on_log", "on_evaluate",
               "on_save"):
    def _timed(self: TimedMonitor, *args: Any, _name: str = _event, **kwargs: Any) -> None:
        start = time.perf_counter()
        getattr(ThroughputMonitor, _name)(self, *args, **kwargs)
        self.seconds += time.perf_counter() - start

    setattr(TimedMonitor, _event, _timed)


class Collator:
    """Pads to the longest row (``padded``) or takes fixed-length rows; keeps a copy of each batch."""

    def __init__(self, padded: bool, classifier: bool, load_seconds: float = 0.0) -> None:
        self.padded, self.classifier, self.batches, self.times = padded, classifier, [], []
        self.load_seconds = load_seconds

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        self.times.append(time.perf_counter())
        if self.load_seconds:
            time.sleep(self.load_seconds)
        width = max(len(r["input_ids"]) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        for i, row in enumerate(rows):
            n = len(row["input_ids"])
            ids[i, :n], mask[i, :n], labels[i, :n] = row["input_ids"], 1, row["input_ids"]
        batch = {"input_ids": ids}
        if self.padded:
            batch["attention_mask"] = mask
        if self.classifier:
            labels = torch.tensor([int(r["input_ids"][0]) % 4 for r in rows])
        batch["labels"] = labels
        self.batches.append({k: v.clone() for k, v in batch.items()})
        return batch


def model_for(classifier: bool) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=LENGTH,
                         pad_token_id=0, num_labels=4)
    return LlamaForSequenceClassification(config) if classifier else LlamaForCausalLM(config)


def rows(n: int, padded: bool) -> list[dict]:
    generator = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        length = int(torch.randint(LENGTH // 4, LENGTH + 1, (1,), generator=generator)) if padded else LENGTH
        out.append({"input_ids": torch.randint(1, VOCAB, (length,), generator=generator)})
    return out


def run(case: dict, steps: int, warmup: int, logging_steps: int, monitor: bool,
        load_seconds: float = 0.0) -> dict[str, Any]:
    """One ``train()``: its wall time, the collator's batches, the log history, the monitor."""
    collator = Collator(case["padded"], case["classifier"], load_seconds)
    model = model_for(case["classifier"])
    callback = TimedMonitor(warmup_steps=warmup, peak_flops=PEAK) if monitor else None
    with tempfile.TemporaryDirectory() as output_dir:
        args = TrainingArguments(
            output_dir, max_steps=steps, per_device_train_batch_size=BATCH,
            gradient_accumulation_steps=case["accumulation"], logging_steps=logging_steps, report_to="none",
            use_cpu=True, disable_tqdm=True, save_strategy="no", dataloader_num_workers=0,
            remove_unused_columns=False, include_num_input_tokens_seen="all" if monitor else "no",
        )
        trainer = Trainer(model=model, args=args, data_collator=collator,
                          train_dataset=rows(steps * case["accumulation"] * BATCH, case["padded"]),
                          callbacks=[callback] if callback else [])
        trainer.remove_callback(PrinterCallback)  # no log lines on stdout, in every run
        if callback:
            run_before_integrations(trainer)
        start = time.perf_counter()
        trainer.train()
        elapsed = time.perf_counter() - start
    return {"seconds": elapsed, "batches": collator.batches, "times": collator.times,
            "history": trainer.state.log_history, "monitor": callback, "model": model}


def hand_counts(batches: list[dict], first: int, accumulation: int) -> dict[str, float]:
    """Tokens and non-padding tokens of the micro-batches from step ``first + 1`` on."""
    chosen = batches[first * accumulation:]
    tokens = sum(b["input_ids"].numel() for b in chosen)
    masks = [b.get("attention_mask", torch.ones_like(b["input_ids"])) for b in chosen]
    lengths = [int(n) for mask in masks for n in mask.sum(-1)]
    return {"tokens": tokens, "non_padding": sum(lengths), "squared": sum(n * n for n in lengths)}


def mfu_error(result: dict, warmup: int, logging_steps: int, accumulation: int) -> float:
    """The largest relative difference, over the windows, of the logged MFU from the MFU by hand."""
    flops = training_flops(result["model"])
    worst = 0.0
    for record in (r for r in result["history"] if "throughput/mfu" in r):
        end = record["step"]
        first = end - int(record["throughput/window_steps"])
        window = result["batches"][first * accumulation:end * accumulation]
        counts = hand_counts(window, 0, accumulation)
        by_hand = (flops.per_token * counts["non_padding"] + flops.per_squared_length * counts["squared"]) / (
            record["throughput/window_seconds"] * PEAK)
        worst = max(worst, abs(record["throughput/mfu"] - by_hand) / by_hand)
    return worst


CASES = {
    "lm-unpadded-ga1": {"classifier": False, "padded": False, "accumulation": 1},
    "lm-padded-ga1": {"classifier": False, "padded": True, "accumulation": 1},
    "lm-unpadded-ga4": {"classifier": False, "padded": False, "accumulation": 4},
    "lm-padded-ga4": {"classifier": False, "padded": True, "accumulation": 4},
    "classifier-unpadded-ga1": {"classifier": True, "padded": False, "accumulation": 1},
    "classifier-padded-ga1": {"classifier": True, "padded": True, "accumulation": 1},
    "classifier-unpadded-ga4": {"classifier": True, "padded": False, "accumulation": 4},
    "classifier-padded-ga4": {"classifier": True, "padded": True, "accumulation": 4},
}
PEAK = 1e11  # "one device" for the MFU (a CPU has no table entry)


def fmt(values: list[float], digits: int = 3) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="N: steps measured")
    parser.add_argument("--warmup", type=int, default=10, help="W: steps before them")
    parser.add_argument("--logging-steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--load-ms", type=float, default=0.0, help="the collator sleeps this long per batch")
    parser.add_argument("--cases", default=",".join(CASES))
    options = parser.parse_args()
    if options.warmup % options.logging_steps or options.steps % options.logging_steps:
        raise SystemExit("--warmup and --steps must be multiples of --logging-steps (windows cover W+1..W+N)")
    torch.set_num_threads(1)
    total = options.warmup + options.steps
    print(f"{options.steps} steps measured after {options.warmup}, windows of {options.logging_steps} steps, "
          f"{options.repeats} repeats, batches of {BATCH} rows of {LENGTH} tokens "
          f"(padded: {LENGTH // 4}-{LENGTH}), {options.load_ms:g} ms to build a batch, "
          "torch on 1 thread; medians (ranges)")
    print()
    print("| case | ms per step | tokens/s by hand | ours / hand | ours / hand, non-padding | "
          "transformers' train_tokens_per_second / hand | inside the monitor, % of a step | "
          "with monitor / stock, train() | MFU logged vs by hand, max rel. diff |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in options.cases.split(","):
        case = CASES[name]
        accumulation = case["accumulation"]
        run(case, 3, 1, 1, True)  # warm-up: imports, allocator
        ratios, padding_ratios, stock_ratios, inside, paired = [], [], [], [], []
        hand_rates, per_step, errors = [], [], []
        for _ in range(options.repeats):
            load = options.load_ms / 1000
            full = run(case, total + 1, options.warmup, options.logging_steps, True, load)
            plain = run(case, total + 1, options.warmup, options.logging_steps, False, load)
            wall = full["times"][total * accumulation] - full["times"][options.warmup * accumulation]
            hand = hand_counts(full["batches"][:total * accumulation], options.warmup, accumulation)
            records = [r for r in full["history"]
                       if "throughput/tokens_per_second" in r and r["step"] <= total]
            seconds = sum(r["throughput/window_seconds"] for r in records)
            ours = sum(r["throughput/tokens_per_second"] * r["throughput/window_seconds"]
                       for r in records) / seconds
            ours_padding = sum(r["throughput/non_padding_tokens_per_second"] * r["throughput/window_seconds"]
                               for r in records) / seconds
            if sum(r["throughput/window_steps"] for r in records) != options.steps:
                raise SystemExit("the windows do not cover the measured steps: nothing is measured")
            hand_rates.append(hand["tokens"] / wall)
            ratios.append(ours / (hand["tokens"] / wall))
            padding_ratios.append(ours_padding / (hand["non_padding"] / wall))
            stock = [r["train_tokens_per_second"] for r in full["history"] if "train_tokens_per_second" in r]
            stock_ratios.append(stock[-1] / (hand["tokens"] / wall))
            per_step.append(1000 * wall / options.steps)
            inside.append(100 * (full["monitor"].seconds / (total + 1)) / (wall / options.steps))
            paired.append(full["seconds"] / plain["seconds"])
            errors.append(mfu_error(full, options.warmup, options.logging_steps, accumulation))
        print(f"| {name} | {statistics.median(per_step):.1f} | {statistics.median(hand_rates):.0f} | "
              f"{fmt(ratios)} | {fmt(padding_ratios)} | {fmt(stock_ratios)} | {fmt(inside, 2)} % | "
              f"{fmt(paired)} | {max(errors):.1e} |", flush=True)


if __name__ == "__main__":
    main()
