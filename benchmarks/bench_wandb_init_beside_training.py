"""What ``wandb.init`` costs beside a running training, against before it (issue 40, item 3).

``WandbLogger`` runs ``wandb.init`` on its sender's thread. Run beside the training thread (training
goes on meanwhile), the two threads trade the interpreter lock at every torch op; run while the
training thread waits (``WandbLogger`` since issue 40, and ``WandbCallback``, which calls it on the
training thread), it runs alone. Each round runs both in fresh processes (W&B offline, the 100 ms
BERT of ``bench_loggers_train.py``, torch on one thread, 40 steps, then ``wandb.init``'s run is left
to exit): the process CPU, the wall time of ``wandb.init`` plus the steps, and ``wandb.init``'s own
thread CPU.

Run: ``.venv/bin/python benchmarks/bench_wandb_init_beside_training.py [--rounds 3] [--steps 40]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def _one(mode: str, steps: int) -> dict:
    os.environ.update(WANDB_MODE="offline", WANDB_DIR=tempfile.mkdtemp(), WANDB_SILENT="true")
    import torch
    import wandb
    from transformers import BertConfig, BertForSequenceClassification

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = BertConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, intermediate_size=1024,
                        vocab_size=1000)
    model = BertForSequenceClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), 1e-4)
    inputs, labels = torch.randint(0, 1000, (8, 64)), torch.randint(0, 2, (8,))

    def train(count: int) -> None:
        for _ in range(count):
            model(input_ids=inputs, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    train(3)  # warm
    wandb.setup()  # the service, started before either variant's clock (WandbLogger does it at train begin)
    usage = resource.getrusage
    cpu, wall, box = usage(resource.RUSAGE_SELF), time.perf_counter(), {}

    def init() -> None:
        start = time.thread_time()
        box["run"] = wandb.init(project="bench")
        box["init_cpu"] = time.thread_time() - start

    if mode == "alone":
        thread = threading.Thread(target=init)
        thread.start()
        thread.join()  # the training thread waits
        train(steps)
    else:
        thread = threading.Thread(target=init)
        thread.start()
        train(steps)  # the training goes on beside it
        thread.join()
    end = usage(resource.RUSAGE_SELF)
    return {"mode": mode, "cpu_s": end.ru_utime + end.ru_stime - cpu.ru_utime - cpu.ru_stime,
            "wall_s": time.perf_counter() - wall, "init_cpu_s": box["init_cpu"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--one", choices=["alone", "beside"], help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.one:
        print(json.dumps(_one(options.one, options.steps)), flush=True)
        os._exit(0)  # the run is left open: W&B's exit is not what is measured
    runs: dict[str, list[dict]] = {"alone": [], "beside": []}
    for round_ in range(options.rounds):
        for mode in (("alone", "beside") if round_ % 2 == 0 else ("beside", "alone")):
            done = subprocess.run([sys.executable, __file__, "--one", mode, "--steps", str(options.steps)],
                                  capture_output=True, text=True, check=True, timeout=600)
            runs[mode].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(runs[mode][-1], flush=True)
    print("\n| wandb.init | process CPU s (median) | wall s (median) | wandb.init's CPU s (median) |")
    print("|---|---:|---:|---:|")
    for mode, label in (("alone", "alone (the training waits)"), ("beside", "beside the training")):
        median = {key: statistics.median(run[key] for run in runs[mode])
                  for key in ("cpu_s", "wall_s", "init_cpu_s")}
        print(f"| {label} | {median['cpu_s']:.2f} | {median['wall_s']:.2f} | {median['init_cpu_s']:.2f} |")


if __name__ == "__main__":
    main()
