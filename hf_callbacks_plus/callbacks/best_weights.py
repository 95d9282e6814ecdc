"""Keep and restore the best weights: from a checkpoint when one exists, else from memory.

Used by ``EarlyStopping(restore_best=True)``. The in-memory copy is one CPU copy of the
model's ``state_dict`` (as many bytes as the parameters and buffers); it is dropped as soon
as a checkpoint holding the same weights is known to survive checkpoint rotation.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Optional

__all__ = ["BestWeights", "load_checkpoint_weights"]

logger = logging.getLogger("hf_callbacks_plus")

#: ``model_state.pkl`` is what ``LightweightTrainer`` writes without a ``save_model_fn``.
_SINGLE_FILES = ("model.safetensors", "pytorch_model.bin", "model_state.pkl")
_INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _has_weights(directory: str) -> bool:
    return any(os.path.isfile(os.path.join(directory, name)) for name in _SINGLE_FILES + _INDEX_FILES)


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


def load_checkpoint_weights(model: Any, directory: str) -> bool:
    """Load the weights saved in a checkpoint directory into ``model``.

    Handles ``model.safetensors``, ``pytorch_model.bin`` and their sharded variants (an
    ``*.index.json`` next to the shards), as written by ``Trainer._save``, and the
    ``model_state.pkl`` of ``LightweightTrainer``.

    Args:
        model: A ``torch.nn.Module``.
        directory: A ``checkpoint-N`` directory.

    Returns:
        True when weights were found and loaded.
    """
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
    result = model.load_state_dict(state_dict, strict=False)
    if result.unexpected_keys:
        logger.warning("Best checkpoint %s has unexpected keys %s.", directory, result.unexpected_keys[:5])
    return True


class BestWeights:
    """The best weights of a run: a checkpoint path and/or an in-memory CPU copy."""

    def __init__(self) -> None:
        self.snapshot: Optional[dict[str, Any]] = None
        self.snapshot_step: Optional[int] = None

    def take_snapshot(self, model: Any, step: int) -> None:
        """Copy ``model.state_dict()`` to CPU (costs one copy of the weights in RAM)."""
        if model is None or not hasattr(model, "state_dict"):
            return
        state_dict = model.state_dict()
        self.snapshot = {key: value.detach().to("cpu", copy=True) for key, value in state_dict.items()}
        self.snapshot_step = step

    def drop_snapshot(self) -> None:
        """Free the in-memory copy."""
        self.snapshot = None
        self.snapshot_step = None

    @staticmethod
    def checkpoint_for(step: int, args: Any, state: Any, known: Optional[str]) -> Optional[str]:
        """An existing checkpoint directory holding the weights of ``step``, or None."""
        candidates = [known, getattr(state, "best_model_checkpoint", None)]
        output_dir = getattr(args, "output_dir", None)
        if output_dir:
            candidates.append(os.path.join(output_dir, f"checkpoint-{step}"))
        for candidate in candidates:
            if (
                candidate
                and os.path.basename(os.path.normpath(candidate)) == f"checkpoint-{step}"
                and os.path.isdir(candidate)
                and _has_weights(candidate)
            ):
                return candidate
        return None

    def restore(self, model: Any, step: int, checkpoint: Optional[str]) -> str:
        """Load the best weights into ``model``; return where they came from.

        Returns:
            The checkpoint path, ``"memory"``, or ``""`` when nothing could be restored.
        """
        if checkpoint is not None and load_checkpoint_weights(model, checkpoint):
            return checkpoint
        if self.snapshot is not None and self.snapshot_step == step:
            model.load_state_dict(self.snapshot, strict=False)
            return "memory"
        return ""
