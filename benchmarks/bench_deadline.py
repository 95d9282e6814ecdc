"""Deadline: what the ranks' agreement costs per step, and how long from a signal to a complete checkpoint.

Three measurements, each beside the stock equivalent from the same run:

1. **The agreement, alone** (2 ranks under ``torchrun``, gloo, CPU): the one ``all_reduce`` of a few
   floats `Deadline` runs at each check, timed over ``--calls`` calls (``sum_over_ranks`` on
   ``cpu_group()``), against an ``all_reduce`` of one float (the smallest collective there is).
2. **Per step, in training** (2 ranks, a stock ``Trainer`` with DDP on a small Llama): the median
   step time with ``Deadline(check_every=1)`` and with ``check_every=10``, as a ratio to the same
   training without Deadline, alternated ``--repeats`` times.
3. **Signal to complete checkpoint** (one process, the same model): a real ``SIGTERM`` at the start of
   a step; `Deadline` (``signal_to_checkpoint``: from the handler to the end of the save) against
   transformers' ``enable_jit_checkpoint=True`` (from the signal to the end of its
   ``execute_jit_checkpoint``; it waits ``kill_wait=3`` s before it acts). Also on 2 ranks, the
   signal sent to rank 1 only (Deadline; the JIT checkpoint has no agreement to compare).

Run: ``.venv/bin/python benchmarks/bench_deadline.py [--steps 60] [--repeats 3] [--calls 2000]``
(it launches ``torchrun --nproc_per_node 2`` itself). Timings: ``time.perf_counter``, torch on one
thread per process.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VOCAB, LENGTH, BATCH = 512, 64, 4


def model() -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=LENGTH)
    return LlamaForCausalLM(config)


def dataset(n: int) -> list[dict]:
    import torch

    generator = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (LENGTH,), generator=generator)
        mask = torch.ones(LENGTH, dtype=torch.long)
        rows.append({"input_ids": ids, "labels": ids.clone(), "attention_mask": mask})
    return rows


def trainer(out: str, callbacks: list, steps: int, **overrides: Any):
    from transformers import Trainer, TrainingArguments

    values = {"output_dir": out, "max_steps": steps, "per_device_train_batch_size": BATCH,
              "learning_rate": 1e-3, "report_to": "none", "use_cpu": True, "disable_tqdm": True,
              "save_strategy": "no", "logging_steps": 10**6, "seed": 0, "dataloader_num_workers": 0}
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        values["ddp_backend"] = "gloo"
    values.update(overrides)
    return Trainer(model=model(), args=TrainingArguments(**values), train_dataset=dataset(steps * BATCH * 2),
                   callbacks=callbacks)


class StepTimes:
    """Times each step (from one step end to the next) on this process."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        times = self.times = []
        state = {"last": None}

        class Recorder(TrainerCallback):
            def on_step_end(self, args, trainer_state, control, **kwargs):
                now = time.perf_counter()
                if state["last"] is not None:
                    times.append(now - state["last"])
                state["last"] = now

        self.callback = Recorder()


class SignalAtStep:
    """Sends a real signal to ``pid`` when step ``step`` begins; keeps the time it was sent."""

    def __init__(self, step: int, pid: Optional[int] = None, sig: int = signal.SIGTERM) -> None:
        from transformers import TrainerCallback

        holder = self

        class Sender(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                if state.global_step + 1 == step and holder.sent is None:
                    holder.sent = time.perf_counter()
                    os.kill(pid or os.getpid(), sig)

        self.sent: Optional[float] = None
        self.callback = Sender()


# -- one process: signal to complete checkpoint ---------------------------------------------------------
def signal_to_checkpoint_deadline(steps: int) -> float:
    from hf_callbacks_plus import Deadline

    deadline = Deadline(margin=0, signals=["SIGTERM"])
    sender = SignalAtStep(steps // 2)
    with tempfile.TemporaryDirectory() as out:
        run = trainer(out, [deadline, sender.callback], steps)
        run.train()
        if deadline.signal_to_checkpoint is None:
            raise RuntimeError("Deadline did not save after the signal")
        return deadline.signal_to_checkpoint


def signal_to_checkpoint_jit(steps: int) -> float:
    from transformers import trainer_jit_checkpoint

    manager = trainer_jit_checkpoint.CheckpointManager
    original, done = manager.execute_jit_checkpoint, []

    def execute(self):
        original(self)
        done.append(time.perf_counter())

    manager.execute_jit_checkpoint = execute
    sender = SignalAtStep(steps // 2)
    try:
        with tempfile.TemporaryDirectory() as out:
            run = trainer(out, [sender.callback], steps + 200, enable_jit_checkpoint=True)
            run.train()
    finally:
        manager.execute_jit_checkpoint = original
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if not done or sender.sent is None:
        raise RuntimeError("the JIT checkpoint did not save after the signal")
    return done[0] - sender.sent


# -- two ranks --------------------------------------------------------------------------------------------
def worker(steps: int, repeats: int, calls: int) -> None:
    import torch.distributed as dist

    from hf_callbacks_plus import Deadline
    from hf_callbacks_plus.runtime.distributed import cpu_group, sum_over_ranks

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    group = cpu_group()
    result: dict[str, Any] = {}
    rounds: dict[str, list[float]] = {"agreement": [], "one_float": []}
    for _ in range(5):  # alternated: the shared machine's load moves
        for name, size in (("agreement", 7), ("one_float", 1)):
            values = [0.0] * size
            for _ in range(20):
                sum_over_ranks(values, group=group)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                sum_over_ranks(values, group=group)
            rounds[name].append((time.perf_counter() - start) / calls * 1e6)
    for name, values in rounds.items():
        result[f"{name}_us"] = statistics.median(values)

    step_times: dict[str, list[float]] = {"stock": [], "every_1": [], "every_10": []}
    for _ in range(repeats):
        for variant in step_times:
            recorder = StepTimes()
            callbacks = [recorder.callback]
            if variant != "stock":
                callbacks.insert(0, Deadline(margin=0, check_every=1 if variant == "every_1" else 10))
            with tempfile.TemporaryDirectory() as out:
                trainer(out, callbacks, steps).train()
            step_times[variant].append(statistics.median(recorder.times[5:]))
    result["step_s"] = {variant: statistics.median(values) for variant, values in step_times.items()}

    deadline = Deadline(margin=0, signals=["SIGTERM"])
    pids = [None, None]
    dist.all_gather_object(pids, os.getpid())
    callbacks: list = [deadline]
    if rank == 0:
        callbacks.append(SignalAtStep(steps // 2, pid=pids[1]).callback)  # to rank 1 only
    with tempfile.TemporaryDirectory() as out:
        out_list = [out]
        dist.broadcast_object_list(out_list, src=0)
        trainer(out_list[0] + f"-{rank}", callbacks, steps).train()
    result["decision_to_checkpoint_s"] = deadline.decision_to_checkpoint
    result["signal_to_checkpoint_s"] = deadline.signal_to_checkpoint
    if rank == 1:
        print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.worker:
        worker(options.steps, options.repeats, options.calls)
        return

    ours = [signal_to_checkpoint_deadline(options.steps) for _ in range(options.repeats)]
    jit = [signal_to_checkpoint_jit(options.steps) for _ in range(options.repeats)]
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", __file__, "--worker",
                           "--steps", str(options.steps), "--repeats", str(options.repeats),
                           "--calls", str(options.calls)],
                          env=env, capture_output=True, text=True, timeout=1800)
    line = next((row for row in done.stdout.splitlines() if row.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"the 2-rank part failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    ranks = json.loads(line[len("RESULT "):])
    steps = ranks["step_s"]

    print(f"2 ranks (gloo, CPU), 5 x {options.calls} calls: the agreement (all_reduce of 7 floats on the CPU "
          f"group) {ranks['agreement_us']:.0f} us per call; an all_reduce of 1 float "
          f"{ranks['one_float_us']:.0f} us (ratio {ranks['agreement_us'] / ranks['one_float_us']:.2f})")
    for variant in ("every_1", "every_10"):
        print(f"2 ranks, median step {steps[variant] * 1e3:.1f} ms with Deadline(check_every="
              f"{variant.split('_')[1]}) vs {steps['stock'] * 1e3:.1f} ms without: ratio "
              f"{steps[variant] / steps['stock']:.3f}; the agreement alone is "
              f"{ranks['agreement_us'] / 1e4 / steps['stock'] / int(variant.split('_')[1]):.2f} % of a step")
    print(f"1 process, SIGTERM to complete checkpoint: Deadline {statistics.median(ours):.2f} s "
          f"[{min(ours):.2f}-{max(ours):.2f}], enable_jit_checkpoint {statistics.median(jit):.2f} s "
          f"[{min(jit):.2f}-{max(jit):.2f}] (ratio {statistics.median(ours) / statistics.median(jit):.2f})")
    print(f"2 ranks, SIGTERM to rank 1 only: its complete checkpoint {ranks['signal_to_checkpoint_s']:.2f} s "
          f"after the signal (the stop decided at the next step end on both ranks; "
          f"{ranks['decision_to_checkpoint_s']:.2f} s from the decision)")


if __name__ == "__main__":
    main()
