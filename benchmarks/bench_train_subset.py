"""Benchmark TrainSubsetEvaluation against transformers' own ``Trainer.evaluate``.

Prints, from one run on the same model and data:

1. the time of a train-subset evaluation over the time of a full evaluation of the
   training set (``trainer.evaluate(train_dataset)``), next to the size ratio: they should
   match within 10 %;
2. the per-sample throughput of the subset evaluation over ``trainer.evaluate`` on the
   very same samples: should be >= 0.95;
3. the cost of an attached TrainSubsetEvaluation when it does not run (no evaluation
   scheduled) over training without it: should be ~1.00.

Run: ``.venv/bin/python benchmarks/bench_train_subset.py [--train 4096] [--fraction 0.25]``
Timings are process CPU time (``time.process_time``, torch on one thread), the minimum of
``--repeats`` runs: on a shared machine wall-clock time mostly measures the neighbours.
``--wall`` uses wall-clock time instead.
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

from hf_callbacks_plus.callbacks.train_subset import TrainSubsetEvaluation
from hf_callbacks_plus.integrations.ordering import run_before_integrations


class MLP(nn.Module):
    def __init__(self, width: int = 1024) -> None:
        super().__init__()
        # wide enough that per-sample compute, not per-evaluation setup, dominates
        self.net = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                 nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4))

    def forward(self, x, labels=None):
        logits = self.net(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


class Blobs(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 64, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def accuracy(eval_pred):
    logits, labels = eval_pred
    return {"accuracy": float((torch.as_tensor(logits).argmax(-1) == torch.as_tensor(labels)).float().mean())}


def make(output_dir: str, n_train: int, **overrides) -> Trainer:
    args = dict(output_dir=output_dir, per_device_eval_batch_size=128, per_device_train_batch_size=32,
                report_to="none", use_cpu=True, disable_tqdm=True, save_strategy="no", eval_strategy="no")
    args.update(overrides)
    trainer = Trainer(model=MLP(), args=TrainingArguments(**args), train_dataset=Blobs(n_train),
                      eval_dataset=Blobs(256, seed=1), compute_metrics=accuracy)
    trainer.remove_callback(PrinterCallback)
    return trainer


CLOCK = time.process_time


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = CLOCK()
        fn()
        times.append(CLOCK() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=8192, help="training set size")
    parser.add_argument("--fraction", type=float, default=0.25, help="subset fraction")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40, help="training steps for the zero-cost check")
    parser.add_argument("--wall", action="store_true", help="measure wall-clock instead of CPU time")
    options = parser.parse_args()
    global CLOCK
    CLOCK = time.perf_counter if options.wall else time.process_time
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = make(tmp, options.train)
        callback = TrainSubsetEvaluation(size=options.fraction, seed=0)
        run_before_integrations(trainer, callback)
        subset = callback.subset()
        n_sub = len(subset)
        callback.compute()  # warm-up
        trainer.evaluate(trainer.train_dataset)

        train_set = trainer.train_dataset
        t_full = best(lambda: trainer.evaluate(train_set, metric_key_prefix="full"), options.repeats)
        t_sub = best(callback.compute, options.repeats)
        t_same = best(lambda: trainer.evaluate(subset, metric_key_prefix="same"), options.repeats)

        size_ratio = n_sub / options.train
        time_ratio = t_sub / t_full
        throughput_ratio = (n_sub / t_sub) / (n_sub / t_same)
        print(f"training set {options.train} samples, subset {n_sub} ({size_ratio:.3f})")
        print(f"full eval of the training set (trainer.evaluate): {t_full * 1000:8.1f} ms")
        print(f"train-subset evaluation (TrainSubsetEvaluation):  {t_sub * 1000:8.1f} ms")
        print(f"trainer.evaluate on the same subset:              {t_same * 1000:8.1f} ms")
        print(f"time ratio subset/full = {time_ratio:.3f} vs size ratio {size_ratio:.3f} "
              f"-> off by {abs(time_ratio / size_ratio - 1) * 100:.1f} % (target <= 10 %)")
        print(f"per-sample throughput ours/trainer.evaluate = {throughput_ratio:.3f} (target >= 0.95)")

        def train(with_callback: bool) -> float:
            t = make(tmp, 512, max_steps=options.steps, logging_steps=1000)
            if with_callback:
                run_before_integrations(t, TrainSubsetEvaluation(size=0.25))
            start = CLOCK()
            t.train()
            return CLOCK() - start

        train(False)
        pairs = [(train(False), train(True)) for _ in range(options.repeats)]
        base = min(p[0] for p in pairs)
        attached = min(p[1] for p in pairs)
        print(f"training {options.steps} steps without the callback: {base * 1000:8.1f} ms")
        print(f"training {options.steps} steps with it attached (not scheduled): {attached * 1000:8.1f} ms")
        print(f"cost when disabled = {attached / base:.3f} (target ~1.00; median of pair ratios "
              f"{statistics.median(b / a for a, b in pairs):.3f})")


if __name__ == "__main__":
    main()
