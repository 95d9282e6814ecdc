"""One GPU: the callbacks under DeepSpeed ZeRO-3 and FSDP2 in bf16, with the MFU against the
accelerator's peak from the package's table. Not part of the test suite (nothing there needs a GPU).

For each engine, one ``torchrun --nproc_per_node 1`` launch (ZeRO-3 and FSDP2 shard even on one
rank: ZeRO-3's parameters become ``[0]`` placeholders with their partition in ``ds_tensor``, FSDP2's
DTensors; the callbacks then do what they do on many ranks, without peers to wait for) trains a
Llama from a config (``--hidden``, ``--layers``, sequences of ``--seq`` random tokens, ``--batch``
per step, bf16) through a stock ``transformers.Trainer``, twice:

* **baseline**: no callback of ours;
* **ours**: ``ThroughputMonitor()`` (MFU from ``PEAK_FLOPS`` for ``torch.cuda.get_device_name()``),
  ``GenerationSamples`` (``--prompts`` prompts, ``--max-new-tokens``) and
  ``EarlyStopping("eval_loss", mode="max", restore_best=True)`` (the best is the first
  evaluation: the copy is taken then and put back at the end), evaluating every ``--every`` steps.

Measured in each run, on the same timeline (a callback that synchronises the device at the start
of step ``--warmup + 1`` and at the end of the last step): tokens/s, TFLOP/s and the MFU by hand
(``training_flops`` of the unsharded model, before the engine wraps it: ``4P + 2P_t`` per token
plus attention, times the tokens, over the seconds, over the peak), the peak GPU memory
(``torch.cuda.max_memory_allocated``), and in the ours run: the monitor's own ``throughput/mfu``
(median of its windows; the hand figure counts evaluation and generation time in its window, the
monitor leaves them out), the generation's seconds per evaluation, the copy's bytes (host
memory) and the time to take and to put it back. Printed per engine, with ours / baseline ratios.

Run on a GPU machine: ``python benchmarks/gpu_sharded.py [--engines zero3,fsdp2] [--hidden 2048]
[--layers 16] [--seq 1024] [--batch 8] [--steps 40] [--every 20]``.
Smoke check on CPU (tiny sizes, gloo; FSDP made to shard on a CPU group by the test harness,
``tests/sharded.py``; no peak in the table: ``--peak-tflops`` stands in):
``python benchmarks/gpu_sharded.py --cpu``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("zero3", "fsdp2")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="peak bf16 TFLOP/s of the device when the package's table lacks it (CPU)")
    parser.add_argument("--cpu", action="store_true", help="a smoke check on CPU with tiny sizes")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # engine:out.json, under torchrun
    options = parser.parse_args(argv)
    if options.cpu:
        options.hidden, options.layers, options.seq, options.batch = 64, 2, 32, 4
        options.steps, options.warmup, options.every = 6, 1, 3
        options.prompts, options.max_new_tokens = 3, 4
        options.peak_tflops = options.peak_tflops or 1.0
    return options


def config_of(engine: str) -> dict[str, Any]:
    """``TrainingArguments`` keywords of the engine (bf16)."""
    if engine == "zero3":
        return {"deepspeed": {"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"},
                              "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
                              "train_batch_size": "auto", "gradient_clipping": "auto"}}
    if engine == "fsdp2":
        return {"fsdp": "full_shard auto_wrap",
                "fsdp_config": {"version": 2, "state_dict_type": "SHARDED_STATE_DICT",
                                "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}}
    raise ValueError(f"engine={engine!r}: expected one of {ENGINES}")


class Clock:
    """Synchronises the device at the start of step ``warmup + 1`` and at the end of the last step."""

    def __init__(self, warmup: int, device: Any) -> None:
        self.warmup, self.device, self.start, self.seconds = warmup, device, None, None

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.warmup:
            self._sync()
            self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == state.max_steps and self.start is not None:
            self._sync()
            self.seconds = time.perf_counter() - self.start


def worker(options: argparse.Namespace) -> None:
    """One engine, one rank: the baseline run and ours; rank 0 writes the figures."""
    import torch
    from transformers import LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    sys.path.insert(0, str(ROOT))
    from hf_callbacks_plus import GenerationSamples, ThroughputMonitor
    from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
    from hf_callbacks_plus.callbacks.throughput.flops import peak_flops, training_flops
    from hf_callbacks_plus.runtime.engines import sharding_engine
    from tests.trl_peft import tiny_lm

    engine, out = options.worker.split(":", 1)
    tokenizer = tiny_lm.tokenizer()
    device = torch.device("cpu" if options.cpu else "cuda", 0)
    name = "cpu" if options.cpu else torch.cuda.get_device_name(0)
    peak = options.peak_tflops * 1e12 if options.peak_tflops else peak_flops(name, "bf16")
    heads = max(1, options.hidden // 64)
    config = tiny_lm.llama_config(len(tokenizer), hidden_size=options.hidden,
                                  intermediate_size=4 * options.hidden, num_hidden_layers=options.layers,
                                  num_attention_heads=heads, num_key_value_heads=heads,
                                  max_position_embeddings=options.seq + 64)
    generator = torch.Generator().manual_seed(0)

    def rows(n: int) -> list[dict[str, list[int]]]:
        ids = torch.randint(4, len(tokenizer), (n, options.seq), generator=generator).tolist()
        return [{"input_ids": row, "attention_mask": [1] * options.seq, "labels": row} for row in ids]

    train, evaluation = rows(options.batch * options.steps), rows(options.batch)
    texts = tiny_lm.texts()[2000:2000 + options.prompts]
    prompts = [" ".join(text.split()[:4]) for text in texts]

    def run(ours: bool, scratch: str) -> dict[str, Any]:
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        flops = training_flops(model)  # the unsharded model's count
        clock = type("ClockCallback", (Clock, TrainerCallback), {})(options.warmup, device)
        callbacks: list[Any] = [clock]
        stopper = samples = None
        timings: dict[str, list[float]] = {"snapshot": [], "restore": [], "generation": []}
        if ours:
            stopper = EarlyStopping("eval_loss", mode="max", patience=10_000, restore_best=True,
                                    report=False, verbose=False)
            samples = GenerationSamples(prompts, max_new_tokens=options.max_new_tokens,
                                        batch_size=options.prompts)
            for owner, method, key in ((stopper._best_weights, "take_snapshot", "snapshot"),
                                       (stopper._best_weights, "restore", "restore"),
                                       (samples, "on_evaluate", "generation")):
                setattr(owner, method, timed(getattr(owner, method), timings[key], device))
            callbacks = [ThroughputMonitor(peak_flops=peak), samples, stopper, *callbacks]
        args = TrainingArguments(output_dir=scratch, bf16=True, use_cpu=options.cpu, max_steps=options.steps,
                                 per_device_train_batch_size=options.batch,
                                 per_device_eval_batch_size=options.batch,
                                 eval_strategy="steps", eval_steps=options.every, logging_steps=options.every,
                                 save_strategy="no", report_to="none", disable_tqdm=True, learning_rate=1e-4,
                                 ddp_backend="gloo" if options.cpu else None, dataloader_num_workers=0,
                                 **config_of(engine))
        trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=evaluation,
                          processing_class=tokenizer, callbacks=callbacks)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        trainer.train()
        tokens = options.batch * options.seq * (options.steps - options.warmup)
        total = flops.flops(tokens, (options.steps - options.warmup) * options.batch * options.seq ** 2)
        figures: dict[str, Any] = {
            "sharding": sharding_engine(trainer.model), "seconds": clock.seconds,
            "tokens_per_second": tokens / clock.seconds, "tflops_per_second": total / clock.seconds / 1e12,
            "mfu": total / clock.seconds / peak if peak else None,
            "peak_memory_gib": (torch.cuda.max_memory_allocated(device) / 2 ** 30
                                if device.type == "cuda" else None),
        }
        if ours:
            monitor = [record["throughput/mfu"] for record in trainer.state.log_history
                       if "throughput/mfu" in record]
            copy = stopper._best_weights.snapshot or {}
            figures.update(monitor_mfu=statistics.median(monitor) if monitor else None,
                           copy_bytes=sum(t.numel() * t.element_size() for t in copy.values()),
                           trained_fp32_bytes=4 * sum(p.numel() for p in model.parameters()),
                           best_step=stopper.best_step, generated=[path.name for path in samples.files],
                           **{key: statistics.median(values) if values else None
                              for key, values in timings.items()})
        return figures

    context: Any
    if options.cpu:
        from tests import sharded

        context = sharded.sharded_on_cpu()
    else:
        import contextlib

        context = contextlib.nullcontext()
    with context, tempfile.TemporaryDirectory() as scratch:
        result = {"engine": engine, "device": name, "peak_flops": peak,
                  "baseline": run(False, scratch + "/baseline"), "ours": run(True, scratch + "/ours")}
    Path(out).write_text(json.dumps(result), encoding="utf-8")
    os._exit(0)  # gloo's teardown can abort after everything is written (pytorch#190489)


def timed(function: Any, into: list[float], device: Any) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        import torch

        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            into.append(time.perf_counter() - start)
    return call


def launch(engine: str, options: argparse.Namespace, folder: Path) -> dict[str, Any]:
    out = folder / f"{engine}.json"
    names = ("hidden", "layers", "seq", "batch", "steps", "warmup", "every", "prompts", "max_new_tokens")
    argv = [f"--{name.replace('_', '-')}={getattr(options, name)}" for name in names]
    if options.peak_tflops:
        argv.append(f"--peak-tflops={options.peak_tflops}")
    if options.cpu:
        argv.append("--cpu")
    command = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node", "1",
               __file__, *argv, "--worker", f"{engine}:{out}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    if options.cpu:
        env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if not out.is_file():
        raise RuntimeError(f"{engine}: no figures (exit {result.returncode})\n{result.stdout[-4000:]}"
                           f"\n{result.stderr[-4000:]}")
    return json.loads(out.read_text())


def number(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}"


def ratio(ours: Any, baseline: Any) -> str:
    return f"{ours / baseline:.3f}" if ours and baseline else "-"


def main(argv: list[str] | None = None) -> None:
    options = parse(argv)
    if options.worker:
        worker(options)
        return
    with tempfile.TemporaryDirectory() as folder:
        results = [launch(engine, options, Path(folder)) for engine in options.engines.split(",")]
    print(f"{results[0]['device']}: peak bf16 {results[0]['peak_flops'] or 0:.3g} FLOP/s; Llama hidden "
          f"{options.hidden}, {options.layers} layers, {options.batch} x {options.seq} tokens per step, "
          f"{options.steps} steps ({options.warmup} warm-up), evaluation every {options.every}")
    for result in results:
        base, ours = result["baseline"], result["ours"]
        print(f"\n{result['engine']} (the model as the engine holds it: {ours['sharding']})")
        for key, label in (("tokens_per_second", "tokens/s"), ("tflops_per_second", "TFLOP/s (by hand)"),
                           ("mfu", "MFU (by hand)"), ("peak_memory_gib", "peak GPU memory GiB")):
            b, o = base[key], ours[key]
            print(f"  {label:<24}{number(b):>12}{number(o):>12}   ours/baseline {ratio(o, b)}")
        print(f"  ThroughputMonitor mfu (median of its windows): {number(ours['monitor_mfu'])}")
        print(f"  GenerationSamples: {ours['generation']:.3f} s per evaluation ({options.prompts} prompts x "
              f"{options.max_new_tokens} tokens); files {ours['generated']}")
        print(f"  restore_best: best step {ours['best_step']}; copy {ours['copy_bytes']:,} B of host memory "
              f"(the model in fp32: {ours['trained_fp32_bytes']:,} B); "
              f"take {1000 * ours['snapshot']:.1f} ms, put back {1000 * ours['restore']:.1f} ms")


if __name__ == "__main__":
    main()
