"""ThroughputMonitor's cost under each sharding engine, at world size 1 (one gloo rank).

Each engine replaces the weights it shards even with one rank (DeepSpeed ZeRO-3: placeholders of
shape ``[0]``; FSDP2: DTensors; FSDP1: 1-D flat parameters), so the monitor does there what it
does on many ranks, minus the waiting for peers: the FLOP count from the full shapes at train
begin, its forward hook on every micro-batch, its events, one ``all_reduce`` per window.

For each engine, ``--repeats`` times: a run with the monitor (``TimedMonitor`` of
bench_throughput.py, which sums the time spent in its hook and events) and the same run without
it. Printed per engine (medians, ranges): ms per step, the monitor's own time per step as a share
of a step, the paired end-to-end ratio, the FLOPs per token it counted over the unsharded
model's count (1.0: every engine counts the whole model), and the time of its FLOP count at
train begin.

* ``none``, ``zero2``, ``zero3``: a stock ``transformers.Trainer`` (``deepspeed=`` for ZeRO);
* ``fsdp2``, ``fsdp1``: ``LightweightTrainer`` around a model sharded by hand (``fully_shard``
  per decoder layer and the root; ``FullyShardedDataParallel``), since accelerate 1.15 trains a
  CPU group as DDP (docs/distributed.md).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_throughput_engines.py [--steps 30]
[--repeats 3] [--engines none,zero2,zero3,fsdp2,fsdp1]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.update(MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
os.environ.setdefault("MASTER_PORT", "29641")
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_throughput import BATCH, Collator, TimedMonitor, model_for, rows  # noqa: E402

from hf_callbacks_plus import LightweightTrainer, LoopArguments, run_before_integrations  # noqa: E402
from hf_callbacks_plus.callbacks.throughput.flops import training_flops  # noqa: E402
from hf_callbacks_plus.loop.default_callbacks import PrinterCallback  # noqa: E402

ENGINES = ("none", "zero2", "zero3", "fsdp2", "fsdp1")


def deepspeed_config(stage: int) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": stage}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0
    return {"zero_optimization": zero, "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto", "train_batch_size": "auto"}


def run_trainer(engine: str, steps: int, monitor: Any) -> float:
    from transformers import Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    with tempfile.TemporaryDirectory() as output_dir:
        extra = {"deepspeed": deepspeed_config(int(engine[-1]))} if engine != "none" else {}
        args = TrainingArguments(output_dir, max_steps=steps, per_device_train_batch_size=BATCH,
                                 logging_steps=10, report_to="none", use_cpu=True, disable_tqdm=True,
                                 save_strategy="no", remove_unused_columns=False, learning_rate=1e-3, **extra)
        trainer = Trainer(model=model_for(False), args=args, data_collator=Collator(True, False),
                          train_dataset=rows(steps * BATCH, True), callbacks=[monitor] if monitor else [])
        trainer.remove_callback(PrinterCallback)
        run_before_integrations(trainer)
        start = time.perf_counter()
        trainer.train()
        return time.perf_counter() - start


def run_fsdp(engine: str, steps: int, monitor: Any) -> float:
    model = model_for(False)
    if engine == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (1,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel

        model = FullyShardedDataParallel(model, device_id=torch.device("cpu"), sync_module_states=False)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    collator = Collator(True, False)
    data = torch.utils.data.DataLoader(rows(steps * BATCH, True), batch_size=BATCH, collate_fn=collator)

    def train_step(batch: dict) -> Any:
        loss = model(**batch).loss
        loss.backward()
        return loss.detach()

    with tempfile.TemporaryDirectory() as output_dir:
        trainer = LightweightTrainer(
            LoopArguments(output_dir=output_dir, max_steps=steps, logging_steps=10, save_strategy="no",
                          disable_tqdm=True),
            train_step=train_step, train_data=data, model=model, optimizer=optimizer,
            callbacks=[monitor] if monitor else [])
        trainer.remove_callback(PrinterCallback)
        start = time.perf_counter()
        trainer.train()
        return time.perf_counter() - start


class CountTimedMonitor(TimedMonitor):
    """TimedMonitor that also notes how long its FLOP count at train begin took."""

    begin_seconds = 0.0

    def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        super().on_train_begin(*args, **kwargs)
        self.begin_seconds = time.perf_counter() - start


def fmt(values: list[float], digits: int = 3) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> None:
    import torch.distributed as dist

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engines", default=",".join(ENGINES))
    options = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    unsharded = training_flops(model_for(False)).per_token
    print(f"{options.steps} steps, batches of {BATCH} rows (16-64 tokens, padded), a 2-layer Llama "
          f"(hidden 128), world size 1, torch on 1 thread; medians (ranges) of {options.repeats} repeats")
    print()
    print("| engine | ms per step | inside the monitor, % of a step | with monitor / without, train() | "
          "FLOPs per token / unsharded | FLOP count at train begin, ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for engine in options.engines.split(","):
        run = run_trainer if engine in ("none", "zero2", "zero3") else run_fsdp
        run(engine, 3, None)  # warm-up: imports, DeepSpeed's set-up
        per_step, inside, paired, ratio, begin = [], [], [], [], []
        for _ in range(options.repeats):
            monitor = CountTimedMonitor(warmup_steps=1)
            with_monitor = run(engine, options.steps, monitor)
            without = run(engine, options.steps, None)
            per_step.append(1000 * with_monitor / options.steps)
            inside.append(100 * monitor.seconds / with_monitor)
            paired.append(with_monitor / without)
            ratio.append(monitor.flops.per_token / unsharded)
            begin.append(1000 * monitor.begin_seconds)
        print(f"| {engine} | {statistics.median(per_step):.1f} | {fmt(inside, 2)} % | {fmt(paired)} | "
              f"{fmt(ratio)} | {fmt(begin, 1)} |", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
