"""Which file of a ``checkpoint-N`` is what, under each engine: the one place that knows.

A checkpoint folder holds the files the trainer and its engine wrote (transformers 5.23,
accelerate 1.15, DeepSpeed 0.19; verified file by file on 2 ranks, ``tests/test_sharded_engines.py``):

================  =====================================================================================
engine            files
================  =====================================================================================
one process, DDP  ``model.safetensors`` (or a peft adapter), ``optimizer.pt``, ``scheduler.pt``,
                  ``rng_state*.pth``, ``trainer_state.json``, config/tokenizer/``training_args.bin``
DeepSpeed ZeRO    ``latest``, ``zero_to_fp32.py``, ``global_stepN/``: ``*_optim_states.pt`` (one per rank:
                  its optimizer partition *and* its fp32 master weights), ``*_model_states.pt`` (ZeRO-1/2:
                  the module's weights again, rank 0; ZeRO-3: one per rank, shapes only). Consolidated
                  ``model.safetensors`` too, except under ZeRO-3 without
                  ``stage3_gather_16bit_weights_on_model_save``, where the weights exist only in the
                  optimizer files.
FSDP, full        ``model.safetensors`` *and* ``pytorch_model_fsdp.bin`` (the same weights twice: the
                  second is what a resume reads), ``optimizer.bin``
FSDP, sharded     ``pytorch_model_fsdp_0/`` and ``optimizer_0/``: torch distributed checkpoints
                  (``__<rank>_0.distcp`` per rank, ``.metadata``); no consolidated weights, no config
================  =====================================================================================

`classify` names each file's `Kind`; `kept_entries` chooses what a kept copy of the checkpoint
holds (the model only, in the form a user loads when the trainer wrote it, else the engine's own;
or exactly what a resume reads), never a file twice; `owner` says which rank wrote a file (the
rank that copies it); `resume_problem` says why a folder cannot be resumed from. Pure: names
and a folder listing, no trainer.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from typing import Optional

from .checkpoint_folders import incomplete_reason

__all__ = ["Entry", "Kind", "classify", "kept_entries", "list_files", "owner", "resume_problem"]


class Kind:
    """What a checkpoint file is (string constants)."""

    #: ``trainer_state.json``: where a resume starts, and what the run logged.
    STATE = "state"
    #: The model in the form a user loads (``from_pretrained``): ``model*.safetensors``,
    #: ``pytorch_model*.bin`` (and their index), a peft adapter, `LightweightTrainer`'s pickle.
    WEIGHTS = "weights"
    #: The model in an engine's own form, what its resume reads: ``pytorch_model_fsdp*.bin``,
    #: ``pytorch_model_fsdp_*/``, DeepSpeed's ``*_model_states.pt``.
    ENGINE_WEIGHTS = "engine weights"
    #: Optimizer state: ``optimizer.pt``/``.bin``, ``optimizer_*/``, DeepSpeed's
    #: ``*_optim_states.pt`` (which also hold the fp32 master weights).
    OPTIMIZER = "optimizer"
    #: What only a resume needs besides: ``scheduler.pt``, ``scaler.pt``, ``rng_state*.pth``,
    #: `EarlyStopping(restore_best=True)`'s ``best_weights-*.safetensors``.
    RESUME = "resume"
    #: `WeightAveraging`'s average (``weight_average-<label>[-rank<R>].safetensors``): kept with every
    #: copy, the weights a ranking on the averaged evaluation refers to, and what a resume reads.
    AVERAGE = "average"
    #: DeepSpeed's ``latest`` and its conversion scripts: needed with its other files only.
    ENGINE_INDEX = "engine index"
    #: Everything else: config, generation config, tokenizer files, ``training_args.bin``, README.
    METADATA = "metadata"


_PATTERNS = (
    (Kind.STATE, ("trainer_state.json",)),
    (Kind.WEIGHTS, ("model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json",
                    "pytorch_model.bin", "pytorch_model-*-of-*.bin", "pytorch_model.bin.index.json",
                    "adapter_model.safetensors", "adapter_model.bin", "*/adapter_model.safetensors",
                    "*/adapter_model.bin", "model_state.pkl")),
    (Kind.ENGINE_WEIGHTS, ("pytorch_model_fsdp.bin", "pytorch_model_fsdp_*.bin", "pytorch_model_fsdp_*/*",
                           "global_step*/*model_states.pt")),
    (Kind.OPTIMIZER, ("optimizer.pt", "optimizer.bin", "optimizer_*.bin", "optimizer_*/*",
                      "global_step*/*optim_states.pt")),
    (Kind.RESUME, ("scheduler.pt", "scaler.pt", "rng_state*.pth", "best_weights-*.safetensors")),
    (Kind.ENGINE_INDEX, ("latest", "zero_to_fp32.py", "zero_to_torch.py")),
    (Kind.AVERAGE, ("weight_average-*.safetensors",)),
)
_OWNERS = (re.compile(r"(?:^|/)rng_state_(\d+)\.pth$"), re.compile(r"(?:^|/)zero_pp_rank_(\d+)_[^/]*$"),
           re.compile(r"/__(\d+)_\d+\.distcp$"),
           re.compile(r"(?:^|/)best_weights-.*-rank(\d+)\.safetensors$"),
           re.compile(r"(?:^|/)weight_average-.*-rank(\d+)\.safetensors$"))
_ZERO_OPTIMIZER = "global_step*/*optim_states.pt"


def classify(path: str) -> str:
    """The `Kind` of the file at ``path`` (relative to the checkpoint, ``/``-separated)."""
    for kind, patterns in _PATTERNS:
        if any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns):
            return kind
    return Kind.METADATA


def owner(path: str, world_size: int = 1) -> int:
    """The rank that wrote ``path``: its own RNG state, ZeRO partition, distributed-checkpoint
    shard, `EarlyStopping(restore_best=True)`'s copy of its shard of the best weights or its part of
    `WeightAveraging`'s average; rank 0
    for everything else (and for a rank this run does not have)."""
    for pattern in _OWNERS:
        match = pattern.search(path)
        if match is not None and int(match.group(1)) < world_size:
            return int(match.group(1))
    return 0


def list_files(folder: str) -> list[str]:
    """Every file under ``folder``, relative and ``/``-separated, sorted."""
    found = []
    for root, _, names in os.walk(folder):
        relative = os.path.relpath(root, folder)
        for name in names:
            found.append(name if relative == "." else f"{relative}/{name}".replace(os.sep, "/"))
    return sorted(found)


@dataclass(frozen=True)
class Entry:
    """One file of a kept copy: its ``path`` (relative), the rank that copies it (``owner``), and
    ``weights_only``: a DeepSpeed optimizer partition reduced to its fp32 master weights (the
    optimizer's moments left out), under its own name so DeepSpeed's ``zero_to_fp32.py`` reads it."""

    path: str
    owner: int = 0
    weights_only: bool = False


def kept_entries(folder: str, resumable: bool, world_size: int = 1) -> list[Entry]:
    """What a kept copy of the checkpoint ``folder`` holds.

    * Always: ``trainer_state.json``, the metadata (config, tokenizer, ``training_args.bin``) and
      `WeightAveraging`'s average.
    * The model only (``resumable=False``): the weights in the form a user loads, when the
      trainer wrote them (one process, DDP, ZeRO-1/2, ZeRO-3 with 16-bit gathering, FSDP full, any
      peft adapter), and nothing of the engine's; else the engine's weights: FSDP's sharded
      ``pytorch_model_fsdp_0/``, or under ZeRO-3 each rank's optimizer partition reduced to its
      fp32 master weights with ``latest``, the ``*_model_states.pt`` and ``zero_to_fp32.py``
      (which consolidates the kept folder). Never an optimizer state, a scheduler or an RNG state.
    * Resumable: exactly what the trainer's resume reads: the engine's files when there is an
      engine (its weights, optimizer, ``latest``), else the weights and ``optimizer.pt``; the
      scheduler, scaler and RNG states. The consolidated weights an engine also wrote are left
      out: its resume reads its own (no file is kept twice).

    Args:
        folder: The checkpoint.
        resumable: Keep what a resume needs, not the model only.
        world_size: The ranks of this run (files of other ranks are copied by rank 0).

    Returns:
        The `Entry` s, by path.
    """
    paths = list_files(folder)
    kinds = {path: classify(path) for path in paths}
    user_weights = Kind.WEIGHTS in kinds.values()
    engine = any(kind in (Kind.ENGINE_WEIGHTS, Kind.ENGINE_INDEX) for kind in kinds.values())
    entries = []
    for path, kind in kinds.items():
        weights_only = False
        if kind in (Kind.STATE, Kind.METADATA, Kind.AVERAGE):
            keep = True
        elif resumable:
            keep = kind != Kind.WEIGHTS or not engine
        elif kind == Kind.WEIGHTS:
            keep = True
        elif user_weights:
            keep = False
        elif kind == Kind.OPTIMIZER:
            keep = weights_only = fnmatch.fnmatchcase(path, _ZERO_OPTIMIZER)
        else:
            keep = kind in (Kind.ENGINE_WEIGHTS, Kind.ENGINE_INDEX)
        if keep:
            entries.append(Entry(path, owner(path, world_size), weights_only))
    return entries


def resume_problem(folder: str) -> Optional[str]:
    """Why the trainer could not resume from ``folder`` exactly, or None: its state must read, and
    the RNG states, the weights, the optimizer state and (under DeepSpeed) the ``latest`` step
    folder its engine's resume reads must be there.

    A quick check of names and presence (what a killed save or a model-only copy lacks), not of
    the files' content.
    """
    reason = incomplete_reason(folder)
    if reason is not None:
        return reason
    paths = list_files(folder)
    kinds = {path: classify(path) for path in paths}
    if not any(path.startswith("rng_state") for path in paths):
        return "no RNG state (rng_state*.pth): a model-only copy, or an interrupted save"
    if "latest" in kinds or any(path.startswith("global_step") for path in paths):
        try:
            with open(os.path.join(folder, "latest"), encoding="utf-8") as handle:
                tag = handle.read().strip()
        except OSError:
            return "no DeepSpeed 'latest' file"
        optimizer = [p for p in paths if p.startswith(f"{tag}/") and p.endswith("optim_states.pt")]
        model = [p for p in paths if p.startswith(f"{tag}/") and p.endswith("model_states.pt")]
        if not optimizer or not model:
            return f"DeepSpeed step folder {tag!r} lacks its model or optimizer states"
        return None
    if any(path.startswith("pytorch_model_fsdp") for path in paths):
        if not any(kinds[path] == Kind.OPTIMIZER for path in paths):
            return "no FSDP optimizer state (optimizer.bin or optimizer_0/)"
        return None
    if not any(kind == Kind.WEIGHTS for kind in kinds.values()):
        return "no model weights"
    if not any(kind == Kind.OPTIMIZER for kind in kinds.values()):
        return "no optimizer state (saved with save_only_model=True, or a model-only copy)"
    return None
