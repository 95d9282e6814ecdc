"""Disk and time cost of KeepBestCheckpoints against the stock Trainer with the same save_total_limit.

One run per variant, same model, data and scripted metric (a noisy decreasing eval_score, so
rotation deletes best checkpoints along the way):

* ``stock``: ``save_total_limit`` alone (keeps the newest and nothing by metric);
* ``ours``: the same plus ``KeepBestCheckpoints(k)``: each kept checkpoint a durable copy
  (``fsync``'d; copy-on-write where the file system can);
* ``ours, resumable``: ``resumable=True`` (optimizer, scheduler and RNG states kept too);
* ``no limit``: ``save_total_limit=None``, the stock way to be sure the best are kept.

Disk usage after every save (rotation done) and at the end: like ``du`` (allocated blocks of
every file under ``output_dir``, each inode once), or, with ``--where`` on a file system of its
own (a loop-mounted XFS with reflinks, say), the blocks that file system reports used, which
counts blocks shared copy-on-write once. Time: our ``on_save`` against the trainer's own
``_save_checkpoint`` of the same save.

Run: ``.venv/bin/python benchmarks/bench_best_checkpoints.py [--steps 100] [--every 5] [--k 3] [--limit 2]
[--where DIR]``
"""

from __future__ import annotations

import argparse
import math
import os
import random
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments
from transformers.utils import logging as hf_logging

from hf_callbacks_plus.callbacks.best_checkpoints import KeepBestCheckpoints


def disk_usage(root: Path) -> int:
    """Bytes allocated under ``root``, each inode once (as ``du``)."""
    seen, total = set(), 0
    for folder, _, files in os.walk(root):
        for name in files:
            info = os.lstat(os.path.join(folder, name))
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
    return total


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int = 32, vocab: int = 4096, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (n, length), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def file_system_used(root: Path) -> int:
    """Bytes the file system holding ``root`` reports used (blocks shared copy-on-write once), after
    a sync (XFS frees the blocks of deleted files in the background)."""
    os.sync()
    info = os.statvfs(root)
    return (info.f_blocks - info.f_bfree) * info.f_frsize


class Measure(TrainerCallback):
    """Disk usage after each save (listed after ours: rotation and our copies are done)."""

    def __init__(self, root: Path, whole_file_system: bool) -> None:
        self.root, self.usage, self.whole = root, [], whole_file_system
        self.base = file_system_used(root.parent) if whole_file_system else 0

    def measure(self) -> int:
        return file_system_used(self.root) - self.base if self.whole else disk_usage(self.root)

    def on_save(self, args, state, control, **kwargs):
        self.usage.append(self.measure())


def run(variant: str, steps: int, every: int, k: int, limit: int, where: str | None) -> dict:
    scores = [2.0 + math.exp(-i / 6) + random.Random(i).uniform(0, 0.6) for i in range(steps // every + 1)]
    with tempfile.TemporaryDirectory(dir=where) as root:
        out = Path(root) / "run"
        keeper = KeepBestCheckpoints("eval_score", k=k, mode="min", verbose=False,
                                     resumable="resumable" in variant)
        measure = Measure(out, whole_file_system=where is not None)
        holder: dict = {}
        args = TrainingArguments(str(out), max_steps=steps, eval_strategy="steps", eval_steps=every,
                                 save_strategy="steps", save_steps=every, logging_steps=every,
                                 save_total_limit=None if variant == "no limit" else limit,
                                 per_device_train_batch_size=4, report_to="none", use_cpu=True,
                                 disable_tqdm=True, learning_rate=1e-3, seed=0)
        config = LlamaConfig(vocab_size=4096, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
        torch.manual_seed(0)
        callbacks = [keeper, measure] if variant.startswith("ours") else [measure]
        trainer = Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=Tokens(256),
                          eval_dataset=Tokens(8, seed=1), callbacks=callbacks,
                          compute_metrics=lambda _: {"score": scores[holder["t"].state.global_step // every]})
        holder["t"] = trainer
        save_times, keep_times = [], []
        original_save, original_on_save = trainer._save_checkpoint, keeper.on_save

        def timed_save(*a, **kw):
            started = time.perf_counter()
            original_save(*a, **kw)
            save_times.append(time.perf_counter() - started)

        def timed_on_save(*a, **kw):
            started = time.perf_counter()
            original_on_save(*a, **kw)
            keep_times.append(time.perf_counter() - started)

        trainer._save_checkpoint, keeper.on_save = timed_save, timed_on_save
        trainer.train()
        checkpoint = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        model_bytes = os.lstat(checkpoint / "model.safetensors").st_blocks * 512
        return {"variant": variant, "end": measure.measure(), "usage": measure.usage,
                "checkpoint": disk_usage(checkpoint), "model": model_bytes,
                "save_ms": 1000 * sum(save_times) / len(save_times),
                "keep_ms": 1000 * sum(keep_times) / len(keep_times) if keep_times else 0.0,
                "kept": len(list((out / "best_checkpoints").glob("checkpoint-*")))
                if (out / "best_checkpoints").exists() else 0}


def main() -> None:
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--limit", type=int, default=2)
    parser.add_argument("--where", default=None, help="a folder on a file system of its own: disk use is "
                        "what that file system reports used (counts copy-on-write sharing)")
    options = parser.parse_args()
    results = [run(variant, options.steps, options.every, options.k, options.limit, options.where)
               for variant in ("stock", "ours", "ours, resumable", "no limit")]
    stock = results[0]
    mib = 1024 * 1024
    where = options.where or tempfile.gettempdir()
    print(f"in {where} ({'file system used' if options.where else 'du'}); "
          f"{options.steps // options.every} saves, save_total_limit={options.limit}, k={options.k}; one "
          f"checkpoint {stock['checkpoint'] / mib:.1f} MiB, of which model.safetensors "
          f"{stock['model'] / mib:.1f} MiB")
    print("after every save (rotation done): the most and the mean disk used beyond the stock run at the "
          "same save; at the end: the total")
    print(f"{'variant':16} {'max extra MiB':>14} {'mean extra MiB':>15} {'end MiB':>8} {'end / stock':>12} "
          f"{'kept':>5} {'save ms':>8} {'our on_save ms':>15}")
    for result in results:
        extra = [ours - theirs for ours, theirs in zip(result["usage"], stock["usage"])]
        print(f"{result['variant']:16} {max(extra) / mib:14.1f} {sum(extra) / len(extra) / mib:15.1f} "
              f"{result['end'] / mib:8.1f} {result['end'] / stock['end']:12.2f} {result['kept']:5d} "
              f"{result['save_ms']:8.1f} {result['keep_ms']:15.2f}")


if __name__ == "__main__":
    main()
