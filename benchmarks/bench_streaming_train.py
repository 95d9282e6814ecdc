"""What StreamingMetrics' running training metrics add to ``Trainer.train()``, end to end.

Trains the same model on the same data with a stock ``transformers.Trainer``, with and without
``StreamingMetrics`` (training metrics only: no evaluation), alternating the two ``--repeats``
times, and prints the median ``train()`` time of each and their ratio. Two models:

* ``lm``: a 2-layer Llama (hidden 512, vocabulary 8192), 8 x 128 tokens per step, default metric
  of a causal LM (token accuracy);
* ``classifier``: a 3-layer MLP (width 1024), 64 rows per step, 4 classes, the default
  classification metrics (accuracy, precision/recall/F1 micro and macro, confusion counts).

Run: ``.venv/bin/python benchmarks/bench_streaming_train.py [--steps 30] [--repeats 5]``
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

from hf_callbacks_plus.callbacks.streaming_metrics import StreamingMetrics
from hf_callbacks_plus.integrations.ordering import run_before_integrations


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


def run(kind: str, steps: int, streaming: bool) -> float:
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
                StreamingMetrics(
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
        if streaming:
            run_before_integrations(trainer)
        start = time.perf_counter()
        trainer.train()
        elapsed = time.perf_counter() - start
        if streaming and not any("accuracy" in r or "token_accuracy" in r for r in trainer.state.log_history):
            raise SystemExit("no training metric was logged: the benchmark measures nothing")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default="lm,classifier")
    options = parser.parse_args()
    torch.set_num_threads(1)
    print("| model | stock train() s | with StreamingMetrics s | ratio | per step, ms (stock) |")
    print("|---|---|---|---|---|")
    for kind in options.models.split(","):
        run(kind, 5, True)  # warm-up: imports, allocator
        stock, ours = [], []
        for _ in range(options.repeats):
            stock.append(run(kind, options.steps, False))
            ours.append(run(kind, options.steps, True))
        s, o = statistics.median(stock), statistics.median(ours)
        print(f"| {kind} | {s:.2f} | {o:.2f} | {o / s:.3f} | {1000 * s / options.steps:.0f} |")


if __name__ == "__main__":
    main()
