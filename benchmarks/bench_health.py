"""SpikeGuard and TrainingHealth: step-time overhead and host reads, side by side with Lightning's
``SpikeDetection`` and a Composer-``OptimizerMonitor``-style per-parameter gradient-norm monitor.

One process, ``TrainerPlus`` on a Llama from a config (``--hidden``, ``--layers``, sequences of ``--seq``
random tokens, ``--batch`` rows; CPU, fp32). For each ``logging_steps`` in ``--logging-steps`` the same
training runs once per variant, in rounds (``--repeats``; the order rotates each round so that a slow
moment of the shared machine does not fall on one variant), and the median seconds per step after the
first ``--warmup`` steps (CPU time of the process: torch on one thread; robust to other processes on a
shared machine) is compared with the baseline of the same round:

* ``baseline``: no callback of ours;
* ``guard-log``, ``guard-skip``: ``SpikeGuard("log")`` / ``("skip")``;
* ``norms``: ``TrainingHealth(memory=False)`` (per-layer gradient, parameter and update norms);
* ``memory``: ``TrainingHealth(norms=False)``;
* ``guard+norms``: ``SpikeGuard("log")`` and ``TrainingHealth()`` together (the issue's goal: <= 1 %
  at ``logging_steps=10``);
* ``lightning-spike``: Lightning's own ``SpikeDetection`` (``lightning.fabric.utilities.spike``, with a
  real ``Fabric``; importable from ``--peers``, a folder where ``pip install --target <folder>
  --no-deps lightning lightning-utilities`` put it), called at each step's end with the step's loss,
  as Lightning's docs show;
* ``composer-style-norms``: what Composer's ``OptimizerMonitor.batch_end`` does each batch, written
  here (not Composer's code, which is not installed): each parameter's gradient norm read to the
  host (``.item()``) and summed, with per-layer names.

Host reads are counted for real: ``torch.Tensor.item``, ``tolist``, ``__bool__``, ``__float__`` and
``cpu`` are wrapped for a separate counting run of each variant (not timed), and the count per step
beyond the baseline's is printed.

Run: ``.venv/bin/python benchmarks/bench_health.py [--steps 60] [--repeats 5] [--logging-steps 1,10]
[--hidden 256] [--layers 4] [--seq 128] [--batch 8] [--peers /tmp/peers]``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from typing import Any

import torch

from hf_callbacks_plus import SpikeGuard, TrainerPlus, TrainingHealth
from hf_callbacks_plus.core.callback import TrainerCallback

VARIANTS = ("baseline", "guard-log", "guard-skip", "norms", "memory", "guard+norms", "lightning-spike",
            "composer-style-norms")


class StepClock(TrainerCallback):
    """CPU time of this process for each step (step begin to step begin): torch runs on one thread in
    this process, so on a machine shared with other work this is the step's own cost, where wall time
    would also count the other processes' turns."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks.append(time.process_time())

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks.append(time.process_time())


class LightningSpike(TrainerCallback):
    """Lightning's SpikeDetection, called as its docs show, with each step's loss (a device tensor)."""

    def __init__(self) -> None:
        from lightning.fabric import Fabric
        from lightning.fabric.utilities.spike import SpikeDetection

        self.fabric = Fabric(accelerator="cpu", devices=1)
        self.detector = SpikeDetection(window=10, warmup=1, exclude_batches_path=tempfile.mkdtemp())
        self.trainer: Any = None
        self.mark: Any = None
        self.index = 0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.mark = self.trainer._tr_loss.detach().clone()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loss = self.trainer._tr_loss.detach() - self.mark
        self.detector.on_train_batch_end(self.fabric, loss, None, self.index)
        self.index += 1


class ComposerStyleNorms(TrainerCallback):
    """Per-parameter gradient norms read to the host each batch, as Composer's OptimizerMonitor does."""

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None,
                              **kwargs: Any) -> None:
        total, layers = 0.0, {}
        for name, parameter in model.named_parameters():
            if parameter.grad is not None and parameter.requires_grad:
                value = parameter.grad.detach().norm(2).item()
                layers[name] = value
                total += value ** 2
        self.last = (math.sqrt(total), layers)


def model(hidden: int, layers: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1024, hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=1024)
    return LlamaForCausalLM(config)


def rows(n: int, seq: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 1024, (n, seq), generator=generator)
    return [{"input_ids": row, "labels": row} for row in ids]


def callbacks_for(variant: str) -> list[Any]:
    return {"baseline": [], "guard-log": [SpikeGuard("log")], "guard-skip": [SpikeGuard("skip")],
            "norms": [TrainingHealth(memory=False)], "memory": [TrainingHealth(norms=False)],
            "guard+norms": [SpikeGuard("log"), TrainingHealth()], "lightning-spike": [LightningSpike()],
            "composer-style-norms": [ComposerStyleNorms()]}[variant]


def run(variant: str, options: argparse.Namespace, logging_steps: int) -> list[float]:
    from transformers import TrainingArguments

    clock = StepClock()
    callbacks = callbacks_for(variant)
    with tempfile.TemporaryDirectory() as folder:
        args = TrainingArguments(output_dir=folder, max_steps=options.steps,
                                 per_device_train_batch_size=options.batch, logging_steps=logging_steps,
                                 save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
                                 dataloader_num_workers=0, seed=0)
        trainer = TrainerPlus(model=model(options.hidden, options.layers), args=args,  # no printer: quiet
                              train_dataset=rows(options.batch * options.steps, options.seq),
                              callbacks=[*callbacks, clock])
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)
        for callback in callbacks:
            if isinstance(callback, LightningSpike):
                callback.trainer = trainer
        trainer.train()
    steps = [b - a for a, b in zip(clock.marks, clock.marks[1:])]
    return steps[options.warmup:]


class Counter:
    NAMES = ("item", "tolist", "__bool__", "__float__", "cpu")

    def __enter__(self) -> Counter:
        self.count, self.saved = 0, {}
        for name in self.NAMES:
            original = self.saved[name] = getattr(torch.Tensor, name)

            def counted(tensor: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                self.count += 1
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, counted)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, original in self.saved.items():
            setattr(torch.Tensor, name, original)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--logging-steps", default="1,10")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--peers", default="/tmp/peers")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    options = parser.parse_args(argv)
    torch.set_num_threads(1)
    sys.path.append(options.peers)
    variants = [v for v in options.variants.split(",") if v]
    try:
        import lightning.fabric.utilities.spike  # noqa: F401
    except ImportError:
        print(f"lightning not importable from {options.peers}: lightning-spike left out")
        variants = [v for v in variants if v != "lightning-spike"]
    print(f"TrainerPlus, Llama hidden {options.hidden} x {options.layers} layers, "
          f"{options.batch} x {options.seq} "
          f"tokens, {options.steps} steps (first {options.warmup} left out), {options.repeats} rounds; torch "
          f"{torch.__version__}, 1 thread")
    for logging_steps in [int(x) for x in options.logging_steps.split(",")]:
        ratios: dict[str, list[float]] = {v: [] for v in variants}
        step_seconds: dict[str, list[float]] = {v: [] for v in variants}
        for round_index in range(options.repeats):
            order = variants[round_index % len(variants):] + variants[:round_index % len(variants)]
            medians = {variant: statistics.median(run(variant, options, logging_steps)) for variant in order}
            for variant in variants:
                ratios[variant].append(medians[variant] / medians["baseline"])
                step_seconds[variant].append(medians[variant])
        syncs = {}
        for variant in variants:
            with Counter() as counter:
                run(variant, argparse.Namespace(**{**vars(options), "steps": 20, "warmup": 0}), logging_steps)
            syncs[variant] = counter.count
        print(f"\nlogging_steps={logging_steps}")
        print(f"{'variant':<22}{'s/step':>10}{'ratio to baseline':>20}{'range':>18}{'host reads/step':>18}")
        for variant in variants:
            values = ratios[variant]
            extra = (syncs[variant] - syncs["baseline"]) / 20
            print(f"{variant:<22}{statistics.median(step_seconds[variant]):>10.4f}{statistics.median(values):>20.4f}"
                  f"{f'[{min(values):.3f}, {max(values):.3f}]':>18}{extra:>18.2f}")


if __name__ == "__main__":
    main()
