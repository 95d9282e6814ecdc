"""Keep and restore the best weights: from a checkpoint when one exists, else from a copy.

Used by ``EarlyStopping(restore_best=True)``. What is kept:

* a CPU copy of **what training changes** only: the parameters with ``requires_grad`` and
  the persistent buffers (for a LoRA model, the adapter: a few thousand elements instead of
  the whole model), taken at each improvement of *our* monitored metric. It is dropped only
  when a checkpoint of that step exists and rotation can never delete it (no
  ``save_total_limit``): transformers' ``best_model_checkpoint``, which rotation protects,
  moves on any improvement (ignoring ``min_delta``), so it cannot protect ours. Every
  checkpoint written while the copy is held also gets it (``best_weights-<key>.safetensors``),
  so a run resumed after the best step, even with the best checkpoint rotated away, still
  restores the best;
* the checkpoint of the best step (full model files, sharded files, a peft adapter
  ``adapter_model.safetensors``, or the ``LightweightTrainer``'s ``model_state.pkl``), used
  when it still exists.

A model that is not a ``torch.nn.Module`` (``LightweightTrainer`` with your own model) needs
``state_dict()`` and ``load_state_dict(state)``: the copy is a deep copy of ``state_dict()``,
kept in memory only (after a resume, the best step's own checkpoint is used). A model
without them is refused at train begin.

Under an engine that shards the weights across processes (DeepSpeed ZeRO-1/2/3, FSDP1, FSDP2;
``runtime/engines.py``) each rank keeps a CPU copy of **its own part** of what training changes,
with no gather: its ZeRO fp32 master partition (ZeRO-1/2/3: the weights ZeRO's optimizer
steps and saves), or its FSDP shards of the trained parameters, plus the persistent buffers. At
the end each rank puts its part back and the engine's parameters follow (ZeRO copies the masters
into them, as after an optimizer step), so the model, whatever saves it next, holds the best
step's weights as the engine saved them at that step. That copy is kept to the end (a
checkpoint's files are the engine's, not loaded here), and every checkpoint written while it is
held also gets each rank's part (``best_weights-<key>-rank<R>.safetensors``) for a resume.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
from typing import Any, Optional

from ...core.checkpoint_folders import checkpoint_folder
from ...runtime.distributed import distributed_rank, distributed_world_size, sum_over_ranks
from ...runtime.engines import copy_local, layout, load_local, local_tensors, sharding_engine, zero_optimizer

__all__ = ["BestWeights", "check_restorable", "load_checkpoint_weights", "step_checkpoint", "trainable_state"]

logger = logging.getLogger("hf_callbacks_plus")

#: ``model_state.pkl`` is what ``LightweightTrainer`` writes without a ``save_model_fn``.
_SINGLE_FILES = ("model.safetensors", "pytorch_model.bin", "model_state.pkl")
_INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
#: What peft's ``save_pretrained`` (and ``Trainer._save`` for a peft model) writes.
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")


def _has_weights(directory: str) -> bool:
    names = _SINGLE_FILES + _INDEX_FILES + ADAPTER_FILES
    return any(os.path.isfile(os.path.join(directory, name)) for name in names)


def _read_file(path: str) -> dict[str, Any]:
    if path.endswith(".pkl"):
        import pickle

        with open(path, "rb") as handle:
            return pickle.load(handle)  # noqa: S301 - a checkpoint written by our own loop
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path, device="cpu")
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def active_adapter(model: Any) -> Optional[str]:
    """The first active adapter of a peft model (``PeftModel`` or a transformers model with
    adapters), or None for a model without adapters."""
    if not callable(getattr(model, "load_adapter", None)) or not getattr(model, "peft_config", None):
        return None
    adapters = getattr(model, "active_adapters", None)
    if callable(adapters):
        adapters = adapters()
    if isinstance(adapters, str):
        return adapters
    if adapters:
        return list(adapters)[0]
    return getattr(model, "active_adapter", None) or None


def is_torch_module(model: Any) -> bool:
    """True for a ``torch.nn.Module`` (or anything with its ``modules``/``named_buffers``)."""
    return callable(getattr(model, "modules", None)) and callable(getattr(model, "named_buffers", None))


def check_restorable(model: Any, owner: str = "EarlyStopping(restore_best=True)") -> None:
    """Refuse, at train begin, a model whose best weights could not be kept or restored.

    Raises:
        ValueError: There is no model (``LightweightTrainer`` without ``model=``).
        TypeError: The model is not a torch module and lacks ``state_dict()`` /
            ``load_state_dict(state)``.
    """
    if model is None:
        raise ValueError(f"{owner} needs the trainer's model, got model=None: pass model=... to the "
                         "trainer (LightweightTrainer(..., model=...)), or restore_best=False.")
    if is_torch_module(model):
        return
    missing = [name for name in ("state_dict", "load_state_dict") if not callable(getattr(model, name, None))]
    if missing:
        raise TypeError(
            f"{owner} cannot keep the weights of a {type(model).__name__}: it is not a torch.nn.Module "
            f"and has no {' / '.join(missing)}() method. Give it state_dict() -> dict and "
            "load_state_dict(state) (the protocol torch modules follow), or use restore_best=False."
        )


def _load_state(model: Any, state_dict: dict[str, Any], directory: str) -> None:
    if not is_torch_module(model):
        model.load_state_dict(state_dict)
        return
    result = model.load_state_dict(state_dict, strict=False)
    if result.unexpected_keys:
        logger.warning("Best checkpoint %s has unexpected keys %s.", directory, result.unexpected_keys[:5])


def load_checkpoint_weights(model: Any, directory: str) -> bool:
    """Load the weights saved in a checkpoint directory into ``model``.

    Handles ``model.safetensors``, ``pytorch_model.bin`` and their sharded variants (an
    ``*.index.json`` next to the shards), as written by ``Trainer._save``, a peft adapter
    (``adapter_model.safetensors``/``.bin``, loaded into the active adapter as
    ``load_best_model_at_end`` does) and the ``model_state.pkl`` of ``LightweightTrainer``.

    Args:
        model: A ``torch.nn.Module`` (a ``PeftModel`` for adapter checkpoints).
        directory: A ``checkpoint-N`` directory.

    Returns:
        True when weights were found and loaded.
    """
    adapter = active_adapter(model)
    if adapter is not None and any(os.path.isfile(os.path.join(directory, n)) for n in ADAPTER_FILES):
        model.load_adapter(directory, adapter_name=adapter, is_trainable=True)
        return True
    state_dict: dict[str, Any] = {}
    for name in _SINGLE_FILES:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            state_dict = _read_file(path)
            break
    else:
        for name in _INDEX_FILES:
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as handle:
                    shards = sorted(set(json.load(handle)["weight_map"].values()))
                for shard in shards:
                    state_dict.update(_read_file(os.path.join(directory, shard)))
                break
    if not state_dict:
        return False
    _load_state(model, state_dict, directory)
    return True


def keeps_shards(model: Any, optimizer: Any = None) -> bool:
    """Whether each rank keeps its own part of the weights (`copy_local`) rather than the whole
    trainable state: the model is sharded (ZeRO-3, FSDP1, FSDP2) or DeepSpeed ZeRO's optimizer
    holds the master weights (ZeRO-1/2 too)."""
    if not is_torch_module(model):
        return False
    return sharding_engine(model) is not None or zero_optimizer(optimizer) is not None


def trainable_state(model: Any) -> dict[str, Any]:
    """CPU copies of what training changes: trainable parameters and persistent buffers
    (a deep copy of ``state_dict()`` for a model that is not a torch module).

    Raises:
        RuntimeError: The parameters are sharded across processes (FSDP, ZeRO-3): a copy
            on one rank would hold only its shard (keep `copy_local` instead).
    """
    if not is_torch_module(model):
        return copy.deepcopy(dict(model.state_dict()))
    engine = sharding_engine(model)
    if engine is not None:
        raise RuntimeError(f"trainable_state: the model is sharded ({engine}); each rank keeps its own part "
                           "with runtime.engines.copy_local instead.")
    buffers = {name for name, _ in model.named_buffers()}
    return {
        key: value.detach().to("cpu", copy=True)
        for key, value in model.state_dict(keep_vars=True).items()
        if getattr(value, "requires_grad", False) or key in buffers
    }


def step_checkpoint(step: int, output_dir: Optional[str], *known: Optional[str]) -> Optional[str]:
    """An existing ``checkpoint-<step>`` directory with weights: one of ``known`` or the one in
    ``output_dir``; None when there is none."""
    candidates = [*known]
    if output_dir:
        candidates.append(checkpoint_folder(output_dir, step))
    for candidate in candidates:
        if (
            candidate
            and os.path.basename(os.path.normpath(candidate)) == f"checkpoint-{step}"
            and os.path.isdir(candidate)
            and _has_weights(candidate)
        ):
            return candidate
    return None


class BestWeights:
    """The best weights of a run: a checkpoint path and/or a CPU copy of the trainable state
    (under a sharding engine: of this rank's part of it, see the module docstring).

    Args:
        key: Tells apart the files of several owners in one checkpoint (e.g. the state key
            of an ``EarlyStopping``). Defaults to ``""``.
    """

    def __init__(self, key: str = "") -> None:
        self.key = key
        self.snapshot: Optional[dict[str, Any]] = None
        self.snapshot_step: Optional[int] = None
        #: True when the copy is this rank's part (set by `take_snapshot` and `on_train_begin`).
        self.per_rank = False
        #: True when the copy holds other weights than a checkpoint of its step (taken during an
        #: evaluation on `WeightAveraging`'s average): kept to the end, in every checkpoint.
        self.averaged = False

    @property
    def file_name(self) -> str:
        """Name of the copy written into checkpoints (``best_weights-<key>.safetensors``)."""
        return f"best_weights-{self._safe_key}.safetensors"

    def rank_file_name(self, rank: int) -> str:
        """Name of rank ``rank``'s part under a sharding engine
        (``best_weights-<key>-rank<R>.safetensors``)."""
        return f"best_weights-{self._safe_key}-rank{rank}.safetensors"

    @property
    def _safe_key(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", self.key).strip("_") or "default"

    def take_snapshot(self, model: Any, step: int, optimizer: Any = None, averaged: bool = False) -> None:
        """Copy the trainable parameters and persistent buffers to CPU (this rank's part of them
        under a sharding engine: no collective); ``averaged``: the model holds an average now."""
        if model is None or not hasattr(model, "state_dict"):
            return
        self.per_rank, self.averaged = keeps_shards(model, optimizer), averaged
        self.snapshot = copy_local(model, optimizer) if self.per_rank else trainable_state(model)
        self.snapshot_step = step

    def drop_snapshot(self) -> None:
        """Free the in-memory copy."""
        self.snapshot = None
        self.snapshot_step = None
        self.averaged = False

    @staticmethod
    def checkpoint_for(step: int, args: Any, state: Any, known: Optional[str]) -> Optional[str]:
        """An existing checkpoint directory holding the weights of ``step``, or None."""
        return step_checkpoint(step, getattr(args, "output_dir", None),
                               known, getattr(state, "best_model_checkpoint", None))

    def after_save(self, args: Any, state: Any, best_step: int) -> Optional[str]:
        """Call after each checkpoint save; returns the best step's checkpoint when this is it.

        The copy is dropped once a checkpoint of the best step exists that rotation can never
        delete: without ``save_total_limit``. With a limit it is kept to the end (the trainer's
        protection of ``best_model_checkpoint`` follows *its* best, which may move on an
        improvement below our ``min_delta`` and let ours be rotated away). While the copy is
        held every new checkpoint also gets it, for a resume after the best step. Under a
        sharding engine the copy is kept to the end and each rank writes its part into every
        checkpoint (the best step's own too).
        """
        path = None
        if state.global_step == best_step:
            path = self.checkpoint_for(best_step, args, state, None)
            if path is not None and getattr(args, "save_total_limit", None) is None and not self.per_rank \
                    and not self.averaged:
                self.drop_snapshot()
                return path
        if self.snapshot is None or self.snapshot_step != best_step:
            return path
        folder = checkpoint_folder(args.output_dir, state.global_step)
        if not os.path.isdir(folder):
            return path
        from safetensors.torch import save_file

        averaged = {"averaged": "1"} if self.averaged else {}
        if self.per_rank:  # every rank owns its file
            rank, world = distributed_rank(), distributed_world_size()
            save_file(self.snapshot, os.path.join(folder, self.rank_file_name(rank)),
                      metadata={"step": str(best_step), "key": self.key, "rank": str(rank),
                                "world_size": str(world), **averaged})
        elif ((state.global_step != best_step or self.averaged)
              and getattr(state, "is_world_process_zero", True)
              and all(hasattr(value, "contiguous") for value in self.snapshot.values())):  # tensors
            save_file(self.snapshot, os.path.join(folder, self.file_name),
                      metadata={"step": str(best_step), "key": self.key, **averaged})
        return path

    def on_train_begin(self, args: Any, state: Any, model: Any, best_step: Optional[int],
                       optimizer: Any = None) -> bool:
        """Refuse a model whose weights cannot be kept (see `check_restorable`); after a
        resume, get back the copy of ``best_step``.

        The copy comes from the model when the checkpoint resumed is the best step's own (the
        trainer loaded its weights, and ZeRO's master weights with the optimizer), else from
        the file saved in the checkpoint being resumed (under a sharding engine, this rank's).

        Returns:
            True when a copy was loaded.

        Raises:
            ValueError: No model. TypeError: a model without ``state_dict``/``load_state_dict``.
            RuntimeError: An engine whose part of the weights this rank cannot copy (ZeRO-3
                without its optimizer, NVMe offload).
        """
        check_restorable(model)
        self.per_rank = keeps_shards(model, optimizer)
        if self.per_rank:
            local_tensors(model, optimizer)  # refuses an engine whose part cannot be copied, now
        if best_step is None or self.snapshot_step == best_step or not getattr(args, "output_dir", None):
            return False
        folder = checkpoint_folder(args.output_dir, state.global_step)
        name = self.rank_file_name(distributed_rank()) if self.per_rank else self.file_name
        path = os.path.join(folder, name)
        if not os.path.isfile(path):  # the checkpoint of the best step itself holds its weights
            if state.global_step == best_step and model is not None:
                self.take_snapshot(model, best_step, optimizer)
                return True
            return False
        from safetensors import safe_open

        with safe_open(path, framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
            if metadata.get("step") != str(best_step):
                return False
            snapshot = {name: handle.get_tensor(name) for name in handle.keys()}
        if self.per_rank:
            world, expected = distributed_world_size(), layout(local_tensors(model, optimizer))
            if metadata.get("world_size") != str(world) or layout(snapshot) != expected:
                logger.warning("EarlyStopping: the copy of the best weights (step %s) in %s was written by "
                               "%s ranks for another sharding than this run's %s ranks; it cannot be put "
                               "back.", best_step, path, metadata.get("world_size"), world)
                return False
        self.snapshot, self.snapshot_step = snapshot, best_step
        self.averaged = metadata.get("averaged") == "1"
        return True

    def restore(self, model: Any, step: int, checkpoint: Optional[str], optimizer: Any = None) -> str:
        """Load the best weights into ``model``; return where they came from.

        Under a sharding engine a collective (every rank calls it): each rank puts its own part
        back, and only when every rank holds its part of ``step``.

        Returns:
            The checkpoint path, ``"memory"``, or ``""`` when nothing could be restored.
        """
        if self.per_rank:
            held = self.snapshot is not None and self.snapshot_step == step
            ranks = sum_over_ranks([1.0 if held else 0.0])[0]
            if ranks < distributed_world_size():
                if held:
                    logger.warning("EarlyStopping: only %d of %d ranks hold their part of the best weights "
                                   "(step %s); none is put back.", int(ranks), distributed_world_size(), step)
                return ""
            load_local(model, optimizer, self.snapshot or {})
            return "memory"
        if checkpoint is not None and not self.averaged and load_checkpoint_weights(model, checkpoint):
            return checkpoint
        if self.snapshot is not None and self.snapshot_step == step:
            _load_state(model, self.snapshot, "memory")
            return "memory"
        return ""
