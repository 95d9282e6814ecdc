"""Shared helpers for the KeepBestCheckpoints tests: a real Trainer whose monitored metrics are
scripted by step, what a run leaves on disk, and the ranking computed independently."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from transformers import TrainerCallback

from tests.tiny_models import make_trainer

KEPT = "best_checkpoints"


class ScriptedMetrics:
    """``compute_metrics`` returning ``{name: script[name][global_step]}`` (the trainer's step, so a
    resumed run gets the same values as the uninterrupted one)."""

    def __init__(self, **scripts: Mapping[int, float]) -> None:
        self.scripts = scripts
        self.trainer: Any = None

    def __call__(self, eval_pred: Any) -> dict[str, float]:
        step = self.trainer.state.global_step
        return {name: float(script[step]) for name, script in self.scripts.items() if step in script}


class WeightsAtSave(TrainerCallback):
    """The tiny model's (a, b) at every save: what a kept checkpoint of that step must hold."""

    def __init__(self) -> None:
        self.weights: dict[int, tuple[float, float]] = {}

    def on_save(self, args, state, control, model=None, **kwargs):
        self.weights[state.global_step] = (model.a.item(), model.b.item())


def scripted_run(output_dir: Any, callbacks: Sequence[Any] = (), trainer_class: Any = None,
                 **scripts_and_args: Any):
    """A stock Trainer (or ``trainer_class``) evaluating and saving every 2 steps, whose metrics
    are the scripts given as ``eval_<name>={step: value}``-style keyword ``<name>={...}``."""
    scripts = {key: value for key, value in scripts_and_args.items() if isinstance(value, Mapping)}
    args = {key: value for key, value in scripts_and_args.items() if key not in scripts}
    metrics = ScriptedMetrics(**scripts)
    defaults: dict[str, Any] = {"eval_strategy": "steps", "eval_steps": 2, "save_strategy": "steps",
                                "save_steps": 2, "logging_steps": 2, "max_steps": 16, "learning_rate": 0.01}
    defaults.update(args)
    trainer = make_trainer(output_dir, callbacks=list(callbacks), compute_metrics=metrics,
                           trainer_class=trainer_class, **defaults)
    metrics.trainer = trainer
    return trainer


def kept_steps(output_dir: Any, dirname: str = KEPT) -> list[int]:
    """Steps of the kept folders, ascending."""
    folder = Path(output_dir) / dirname
    if not folder.is_dir():
        return []
    return sorted(int(p.name.split("-")[1]) for p in folder.glob("checkpoint-*") if p.is_dir())


def checkpoint_steps(output_dir: Any) -> list[int]:
    """Steps of the trainer's own ``checkpoint-N`` folders, ascending."""
    return sorted(int(p.name.split("-")[1]) for p in Path(output_dir).glob("checkpoint-*") if p.is_dir())


def manifest(output_dir: Any, dirname: str = KEPT) -> dict[str, Any]:
    return json.loads((Path(output_dir) / dirname / "manifest.json").read_text())


def kept_weights(folder: Any) -> tuple[float, float]:
    """(a, b) saved in a checkpoint folder's ``model.safetensors``."""
    from safetensors.torch import load_file

    state = load_file(str(Path(folder) / "model.safetensors"))
    return float(state["a"]), float(state["b"])


def expected_ranking(scripts: Mapping[str, Mapping[int, float]], specs: Sequence[tuple[str, int, str]],
                     saved: Sequence[int]) -> dict[str, list[int]]:
    """The ground truth: for each (metric, k, mode), sort the saved steps' values that rank (ties by
    step) and take k. A value ranks when numpy's comparison puts it ahead of the worst infinity, as
    ``load_best_model_at_end``'s first comparison does: NaN and the worst infinity never, the best
    infinity first."""
    out = {}
    for name, k, mode in specs:
        script = scripts[name]
        better, worst = (np.less, math.inf) if mode == "min" else (np.greater, -math.inf)
        ranked = [(script[s], s) for s in saved if s in script and better(script[s], worst)]
        ordered = sorted(ranked, key=lambda pair: (pair[0] if mode == "min" else -pair[0], pair[1]))
        out[f"eval_{name}"] = [step for _, step in ordered[:k]]
    return out


def tree_snapshot(root: Any) -> dict[str, tuple[int, int, int]]:
    """Every file under ``root``: (size, mtime_ns, inode), to show a run left them untouched."""
    snapshot = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            info = os.stat(path)
            snapshot[os.path.relpath(path, root)] = (info.st_size, info.st_mtime_ns, info.st_ino)
    return snapshot


def tree_hashes(root: Any) -> dict[str, str]:
    """Every file under ``root``: the sha256 of its bytes."""
    import hashlib

    hashes = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as handle:
                hashes[os.path.relpath(path, root)] = hashlib.sha256(handle.read()).hexdigest()
    return hashes
