"""KeepBestCheckpoints under each sharding engine: disk of a kept folder against its checkpoint, and
the time of our ``on_save`` against the trainer's own save, on 2 CPU ranks.

Every engine of the test harness (``tests/sharded.py``: DDP, DeepSpeed ZeRO-1/2/3, FSDP2 and
FSDP1 with both state-dict types; its CPU patches are test-only, hence a benchmark that borrows
them) trains the tests' tiny Llama for 8 steps, saving every 2 (``save_total_limit=1``), with
``KeepBestCheckpoints("loss", k=2)`` (the model only) and a second instance with
``resumable=True``. Printed per engine (rank 0): the bytes of the last checkpoint, of a model-only
and of a resumable kept folder (and their ratio to the checkpoint), the mean time of the trainer's
``_save_checkpoint`` and of our two ``on_save`` (a keep on every save here: k=2 of 4 saves).

Run: ``torchrun --standalone --nproc_per_node 2 benchmarks/bench_best_checkpoints_sharded.py``
(from the repository root; ``DS_ACCELERATOR=cpu`` is set here).
"""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def size(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def timed(function, times: list):
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            times.append(time.perf_counter() - started)
    return wrapper


def run(engine: str, root: Path) -> dict:
    from hf_callbacks_plus.callbacks.best_checkpoints import KeepBestCheckpoints
    from tests import sharded

    model_only = KeepBestCheckpoints("loss", k=2, mode="min", dirname="best_model", verbose=False)
    resumable = KeepBestCheckpoints("loss", k=2, mode="min", dirname="best_resumable", resumable=True,
                                    verbose=False)
    saves, keeps, keeps_resumable = [], [], []
    model_only.on_save, resumable.on_save = timed(model_only.on_save, keeps), timed(resumable.on_save,
                                                                                  keeps_resumable)
    with sharded.sharded_on_cpu():
        trainer = sharded.make_trainer(engine, root / engine, callbacks=[model_only, resumable], max_steps=8,
                                       save_strategy="steps", save_steps=2, save_total_limit=1)
        trainer._save_checkpoint = timed(trainer._save_checkpoint, saves)
        trainer.train()
        step = model_only.entries[0].step
        result = {"checkpoint": size(root / engine / "checkpoint-8"),
                  "model": size(root / engine / "best_model" / f"checkpoint-{step}"),
                  "resumable": size(root / engine / "best_resumable" / f"checkpoint-{step}"),
                  "save_ms": 1000 * sum(saves) / len(saves), "keep_ms": 1000 * sum(keeps) / len(keeps),
                  "keep_resumable_ms": 1000 * sum(keeps_resumable) / len(keeps_resumable)}
        del trainer
        gc.collect()
    return result


def main() -> None:
    from transformers.utils import logging as hf_logging

    from tests import sharded

    hf_logging.set_verbosity_error()
    rank = int(os.environ.get("RANK", "0"))
    # one folder for both ranks (the checkpoints of a sharded run are shared): the launch's id
    launch = os.environ.get("TORCHELASTIC_RUN_ID", "local")
    root = Path(tempfile.gettempdir()) / f"bench-best-checkpoints-{launch}"
    if rank == 0:
        print(f"{'engine':14} {'checkpoint':>11} {'model only':>17} {'resumable':>17} {'save ms':>8} "
              f"{'keep ms':>8} {'keep (resumable) ms':>20}")
    for engine in sharded.ENGINES:
        environ = dict(os.environ)  # TrainingArguments sets accelerate's engine flags in it
        try:
            result = run(engine, root)
        finally:
            os.environ.clear()
            os.environ.update(environ)
        if rank == 0:
            kib, c = 1024, result["checkpoint"]
            print(f"{engine:14} {c / kib:8.1f} KiB {result['model'] / kib:8.1f} KiB "
                  f"({result['model'] / c:.2f}) "
                  f"{result['resumable'] / kib:8.1f} KiB ({result['resumable'] / c:.2f}) "
                  f"{result['save_ms']:8.1f} {result['keep_ms']:8.1f} {result['keep_resumable_ms']:20.1f}",
                  flush=True)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        if rank == 0:
            shutil.rmtree(root, ignore_errors=True)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
