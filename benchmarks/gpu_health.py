"""One GPU: the CUDA paths of `TrainingHealth` and `SpikeGuard` that a CPU cannot run. Not part of the
test suite (nothing there needs a GPU); not run in the session that wrote it (no GPU was lent).

In one process, ``TrainerPlus`` trains a Llama from a config (bf16, ``--hidden``, ``--layers``, ``--seq``
random tokens, ``--batch`` rows) for ``--steps`` steps with ``logging_steps=--logging-steps``:

1. **baseline** and **ours** (``SpikeGuard("log")`` + ``TrainingHealth(oom_snapshot=<folder>)``): the
   median step time of each (ratio), and the device synchronisations of each counted by torch itself
   (``torch.cuda.set_sync_debug_mode("warn")``: one warning per synchronising call, recorded), per step;
2. **memory**: ``health/memory/peak_allocated_gb/rank0`` of each logging window against
   ``torch.cuda.max_memory_allocated`` read by a callback that resets the counter at the same points,
   and the peak the window saw when a large temporary tensor is allocated in one window only;
3. **out of memory**: an allocation larger than the device during a training step must leave
   ``memory_snapshot-rank0.pickle``, which ``torch.cuda.memory._snapshot``'s format (a dict with
   ``segments`` and ``device_traces``) is checked against.

Run on a GPU machine: ``python benchmarks/gpu_health.py [--hidden 1024] [--layers 8] [--seq 1024]
[--batch 8] [--steps 40] [--logging-steps 10]``. Prints one JSON line per part; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

import torch

from hf_callbacks_plus import SpikeGuard, TrainerPlus, TrainingHealth
from hf_callbacks_plus.core.callback import TrainerCallback


class Clock(TrainerCallback):
    def __init__(self) -> None:
        self.marks: list[float] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        torch.cuda.synchronize()
        self.marks.append(time.perf_counter())


class Spike(TrainerCallback):
    """Allocates a large temporary tensor during step ``at`` (a peak in that window only)."""

    def __init__(self, at: int, megabytes: int) -> None:
        self.at, self.bytes = at, megabytes * 1024 ** 2

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.at:
            block = torch.empty(self.bytes, dtype=torch.uint8, device="cuda")
            del block


class Oom(TrainerCallback):
    """Asks for twice the device's memory during step ``at``: CUDA runs out of memory inside training."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.at:
            torch.empty(torch.cuda.get_device_properties(0).total_memory * 2, dtype=torch.uint8,
                        device="cuda")


def train(options: argparse.Namespace, callbacks: list[Any], folder: str) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=options.hidden, intermediate_size=options.hidden * 4,
                         num_hidden_layers=options.layers, num_attention_heads=16, num_key_value_heads=16)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    ids = torch.randint(0, 32000, (options.batch * options.steps, options.seq))
    rows = [{"input_ids": row, "labels": row} for row in ids]
    args = TrainingArguments(output_dir=folder, max_steps=options.steps,
                             per_device_train_batch_size=options.batch,
                             logging_steps=options.logging_steps, save_strategy="no", report_to="none",
                             bf16=True, disable_tqdm=True)
    trainer = TrainerPlus(model=model, args=args, train_dataset=rows, callbacks=callbacks)
    trainer.train()
    return trainer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in (("hidden", 1024), ("layers", 8), ("seq", 1024), ("batch", 8), ("steps", 40),
                          ("logging-steps", 10)):
        parser.add_argument(f"--{name}", type=int, default=default)
    options = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    failed = False
    with tempfile.TemporaryDirectory() as folder:
        seconds, syncs = {}, {}
        for name in ("baseline", "ours", "baseline", "ours"):
            clock = Clock()
            extra = [] if name == "baseline" else [SpikeGuard("log"), TrainingHealth(oom_snapshot=folder)]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                train(options, [*extra, clock], folder)
                torch.cuda.set_sync_debug_mode("default")
            steps = [b - a for a, b in zip(clock.marks[5:], clock.marks[6:])]
            seconds.setdefault(name, []).append(statistics.median(steps))
            syncs[name] = sum("synchroniz" in str(w.message) for w in caught) / options.steps
        ratio = statistics.median(seconds["ours"]) / statistics.median(seconds["baseline"])
        print(json.dumps({"part": "overhead", "ratio": round(ratio, 4), "syncs_per_step": syncs}))
        health = TrainingHealth(norms=False, reset_peaks=True)
        trainer = train(options, [health, Spike(at=options.logging_steps + 2, megabytes=2048)], folder)
        peaks = [r["health/memory/peak_allocated_gb/rank0"] for r in trainer.state.log_history
                 if "health/memory/peak_allocated_gb/rank0" in r]
        spiked = len(peaks) > 1 and peaks[1] > peaks[0] + 1.5 and all(p < peaks[1] - 1.5 for p in peaks[2:])
        failed |= not spiked
        print(json.dumps({"part": "memory", "window_peaks_gb": peaks, "ok": spiked}))
        try:
            train(options, [TrainingHealth(oom_snapshot=folder), Oom(at=3)], folder)
        except torch.OutOfMemoryError:
            pass
        path = os.path.join(folder, "memory_snapshot-rank0.pickle")
        found = os.path.isfile(path)
        if found:
            with open(path, "rb") as handle:
                snapshot = pickle.load(handle)  # noqa: S301 - written by torch just above
            found = {"segments", "device_traces"} <= set(snapshot)
        failed |= not found
        print(json.dumps({"part": "oom_snapshot", "written": found}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
