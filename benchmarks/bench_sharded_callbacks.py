"""GenerationSamples and EarlyStopping(restore_best=True) under each sharding engine, on 2 CPU ranks.

For each engine (DDP, the reference; DeepSpeed ZeRO-1/2/3; FSDP2; FSDP1), one ``torchrun
--nproc_per_node 2`` launch trains a Llama from a config (``--hidden``, ``--layers``; the test
suite's word-level tokenizer) through a stock ``transformers.Trainer``, made to shard for real on
CPU by the test harness (``tests/sharded.py``: the accelerate patch FSDP needs on a CPU group,
DeepSpeed's CPU accelerator), evaluating every ``--every`` steps, with

* ``EarlyStopping("eval_loss", mode="max", restore_best=True)``: the best is the first
  evaluation, so the copy is taken once and put back at the end; timed around ``take_snapshot``
  and ``restore``; its size on each rank is measured (the bytes of the CPU copy);
* ``GenerationSamples`` on ``--prompts`` prompts, ``--max-new-tokens`` each, batches of
  ``--batch``: each evaluation's generation timed (rank 0's wall time of ``on_evaluate``, which
  every rank runs together under sharding).

Printed per engine: the copy per rank (largest of the 2 ranks) against the trained weights in
fp32 (what a whole copy on one rank would hold), the time to take and to put back the copy, the
generation's seconds per evaluation (median) and its ratio to DDP's (each rank generating its
share on its whole model: the unsharded baseline of the same run).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_sharded_callbacks.py [--engines
ddp,zero1,zero2,zero3,fsdp2,fsdp1_full] [--hidden 256] [--layers 4] [--steps 6] [--every 2]
[--prompts 8] [--max-new-tokens 16] [--batch 4]`` (needs deepspeed; times are wall-clock on CPU
over gloo: orders of magnitude, not a GPU's figures; see ``benchmarks/gpu_sharded.py``).
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
ENGINES = ("ddp", "zero1", "zero2", "zero3", "fsdp2", "fsdp1_full")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # engine:out.json, under torchrun
    return parser.parse_args(argv)


def worker(options: argparse.Namespace) -> None:
    """One engine on this rank: train, time, write rank 0's figures."""
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT))
    from hf_callbacks_plus import GenerationSamples
    from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
    from tests import sharded
    from tests.trl_peft import tiny_lm

    engine, out = options.worker.split(":", 1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    timings: dict[str, list[float]] = {"snapshot": [], "restore": [], "generation": []}

    def timed(name: str, function: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                timings[name].append(time.perf_counter() - start)
        return call

    stopper = EarlyStopping("eval_loss", mode="max", patience=1000, restore_best=True, report=False,
                            verbose=False)
    stopper._best_weights.take_snapshot = timed("snapshot", stopper._best_weights.take_snapshot)
    stopper._best_weights.restore = timed("restore", stopper._best_weights.restore)
    texts = tiny_lm.texts()[2000:2000 + options.prompts]
    prompts = [" ".join(text.split()[:2 + index % 5]) for index, text in enumerate(texts)]
    samples = GenerationSamples(prompts, max_new_tokens=options.max_new_tokens, batch_size=options.batch)
    samples.on_evaluate = timed("generation", samples.on_evaluate)
    heads = max(1, options.hidden // 32)
    config = tiny_lm.llama_config(len(sharded.tokenizer()), hidden_size=options.hidden,
                                  intermediate_size=2 * options.hidden, num_hidden_layers=options.layers,
                                  num_attention_heads=heads, num_key_value_heads=heads)
    from transformers import LlamaForCausalLM, Trainer

    with sharded.sharded_on_cpu(), tempfile.TemporaryDirectory() as scratch:
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        trained = 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
        args = sharded.engine_args(engine, scratch, max_steps=options.steps, eval_strategy="steps",
                                   eval_steps=options.every, logging_steps=options.steps)
        trainer = Trainer(model=model, args=args, train_dataset=sharded.lm_rows(0, 8 * options.steps),
                          eval_dataset=sharded.lm_rows(1000, 8), processing_class=sharded.tokenizer(),
                          callbacks=[stopper, samples])
        trainer.train()
    copy = stopper._best_weights.snapshot or {}
    mine = sum(t.numel() * t.element_size() for t in copy.values())
    sizes: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(sizes, mine)
    if rank == 0:
        Path(out).write_text(json.dumps({"engine": engine, "trained_bytes": trained, "copy_bytes": sizes,
                                         **timings}), encoding="utf-8")
    dist.barrier()
    os._exit(0)  # gloo's teardown can abort after everything is written (pytorch#190489)


def launch(engine: str, options: argparse.Namespace, folder: Path) -> dict[str, Any]:
    out = folder / f"{engine}.json"
    argv = [f"--{name.replace('_', '-')}={getattr(options, name)}"
            for name in ("hidden", "layers", "steps", "every", "prompts", "max_new_tokens", "batch")]
    command = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node", "2",
               __file__, *argv, "--worker", f"{engine}:{out}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
           "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    if not out.is_file():
        raise RuntimeError(f"{engine}: no figures (exit {result.returncode})\n{result.stdout[-3000:]}"
                           f"\n{result.stderr[-3000:]}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> None:
    options = parse(argv)
    if options.worker:
        worker(options)
        return
    engines = options.engines.split(",")
    figures = {}
    with tempfile.TemporaryDirectory() as folder:
        for engine in engines:
            figures[engine] = launch(engine, options, Path(folder))
    reference = statistics.median(figures["ddp"]["generation"]) if "ddp" in figures else None
    print(f"Llama hidden {options.hidden}, {options.layers} layers, 2 CPU ranks (gloo); "
          f"{options.prompts} prompts x {options.max_new_tokens} tokens, batches of {options.batch}")
    print(f"{'engine':<12}{'copy/rank':>12}{'trained fp32':>14}{'share':>8}{'take ms':>10}{'restore ms':>12}"
          f"{'gen s/eval':>12}{'vs ddp':>8}")
    for engine, got in figures.items():
        copy = max(got["copy_bytes"])
        generation = statistics.median(got["generation"])
        ratio = f"{generation / reference:.2f}" if reference else "-"
        print(f"{engine:<12}{copy:>12,}{got['trained_bytes']:>14,}{copy / got['trained_bytes']:>8.2f}"
              f"{1000 * statistics.median(got['snapshot']):>10.1f}"
              f"{1000 * statistics.median(got['restore']):>12.1f}"
              f"{generation:>12.3f}{ratio:>8}")


if __name__ == "__main__":
    main()
