"""What StreamingMetrics' running training metrics add to ``Trainer.train()``, end to end.

Trains the same model on the same data with a stock ``transformers.Trainer``, with and without
``StreamingMetrics`` (training metrics only: no evaluation), ``--repeats`` pairs of runs (the
order inside a pair alternates), and prints per model: the median ``train()`` time of each (and
the range), the ratio of the medians, the median and range of the paired ratios, and the time
spent inside StreamingMetrics' own code (the training forward hook and the per-log compute,
timed with ``perf_counter`` around them) as a share of ``train()``: the overhead measured
directly, which the neighbours of a shared machine disturb far less than the end-to-end ratio.
Two models:

* ``lm``: a 2-layer Llama (hidden 512, vocabulary 8192), 8 x 128 tokens per step, default metric
  of a causal LM (token accuracy);
* ``classifier``: a 3-layer MLP (width 1024), 64 rows per step, 4 classes, the default
  classification metrics (accuracy, precision/recall/F1 micro and macro, confusion counts).

Run: ``.venv/bin/python benchmarks/bench_streaming_train.py [--steps 30] [--repeats 5]
[--models lm,classifier]``
Timings are wall-clock (``time.perf_counter``) with torch on one thread.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from torch import nn
from transformers import Trainer, TrainingArguments
from transformers.trainer_callback import PrinterCallback

from hf_callbacks_plus.callbacks.streaming_metrics import StreamingMetrics
from hf_callbacks_plus.integrations.ordering import run_before_integrations


class TimedStreamingMetrics(StreamingMetrics):
    """StreamingMetrics, with the time spent in its training-forward hook and per-log compute summed."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seconds = 0.0

    def _on_forward(self, *args, **kwargs) -> None:
        start = time.perf_counter()
        super()._on_forward(*args, **kwargs)
        self.seconds += time.perf_counter() - start

    def on_pre_log(self, *args, **kwargs) -> None:
        start = time.perf_counter()
        super().on_pre_log(*args, **kwargs)
        self.seconds += time.perf_counter() - start


class MLP(nn.Module):
    def __init__(self, width: int = 1024) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4)
        )

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"logits": logits, "loss": nn.functional.cross_entropy(logits, labels)}


def lm_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=8192,
            hidden_size=512,
            intermediate_size=1024,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
        )
    )


def rows(kind: str, n: int):
    generator = torch.Generator().manual_seed(0)
    if kind == "lm":
        ids = torch.randint(0, 8192, (n, 128), generator=generator)
        return [{"input_ids": ids[i], "labels": ids[i]} for i in range(n)]
    x = torch.randn(n, 64, generator=generator)
    y = torch.randint(0, 4, (n,), generator=generator)
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def run(kind: str, steps: int, streaming: bool) -> tuple[float, float]:
    """One ``train()``: its wall time, and the time inside StreamingMetrics (0 without it)."""
    batch = 8 if kind == "lm" else 64
    model = lm_model() if kind == "lm" else MLP()
    with tempfile.TemporaryDirectory() as output_dir:
        args = TrainingArguments(
            output_dir,
            max_steps=steps,
            per_device_train_batch_size=batch,
            logging_steps=5,
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
            save_strategy="no",
            dataloader_num_workers=0,
        )
        callbacks = (
            [
                TimedStreamingMetrics(
                    task="causal_lm" if kind == "lm" else "classification",
                    num_classes=None if kind == "lm" else 4,
                )
            ]
            if streaming
            else []
        )
        trainer = Trainer(
            model=model, args=args, train_dataset=rows(kind, steps * batch), callbacks=callbacks
        )
        trainer.remove_callback(PrinterCallback)  # no log lines on stdout, in both variants
        if streaming:
            run_before_integrations(trainer)
        start = time.perf_counter()
        trainer.train()
        elapsed = time.perf_counter() - start
        if streaming and not any("accuracy" in r or "token_accuracy" in r for r in trainer.state.log_history):
            raise SystemExit("no training metric was logged: the benchmark measures nothing")
    return elapsed, callbacks[0].seconds if streaming else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5, help="pairs of runs (stock, streaming) per model")
    parser.add_argument("--models", default="lm,classifier")
    options = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{options.steps} steps per train(), {options.repeats} pairs of runs per model, torch on 1 thread")
    print()
    print("| model | per step, ms (stock) | stock train() s, median (range) | with StreamingMetrics s, "
          "median (range) | ratio of medians | paired ratios, median (range) | time inside StreamingMetrics, "
          "% of train() (median, range) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind in options.models.split(","):
        run(kind, 5, False)  # warm-up: imports, allocator
        run(kind, 5, True)
        stock, ours, inside = [], [], []
        for repeat in range(options.repeats):
            for streaming in (False, True) if repeat % 2 == 0 else (True, False):
                elapsed, seconds = run(kind, options.steps, streaming)
                if streaming:
                    ours.append(elapsed)
                    inside.append(100 * seconds / elapsed)
                else:
                    stock.append(elapsed)
        s, o = statistics.median(stock), statistics.median(ours)
        ratios = [b / a for a, b in zip(stock, ours)]
        print(
            f"| {kind} | {1000 * s / options.steps:.0f} | {s:.2f} ({min(stock):.2f}-{max(stock):.2f}) | "
            f"{o:.2f} ({min(ours):.2f}-{max(ours):.2f}) | {o / s:.3f} | {statistics.median(ratios):.3f} "
            f"({min(ratios):.3f}-{max(ratios):.3f}) | {statistics.median(inside):.2f} % "
            f"({min(inside):.2f}-{max(inside):.2f}) |",
            flush=True,
        )


if __name__ == "__main__":
    main()
