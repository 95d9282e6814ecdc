"""This rank's average: fp32 buffers beside the tensors training changes on this rank, no gather.

The tensors are `runtime.engines.local_tensors` without the buffers: this rank's ZeRO fp32 master
partitions (ZeRO-1/2/3), its FSDP1 flat shards, its FSDP2 DTensor shards, the trainable
parameters otherwise (one process, DDP: whole, like ``restore_best``). So an average costs
``4 * P / W`` bytes per buffer on each of ``W`` ranks of a model of ``P`` trainable parameters
sharded by the engine, a LoRA adapter's size for a LoRA model, and no collective per update.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, Optional

from ...runtime.engines import copy_local, layout, load_local, local_tensors, sharding_engine, zero_optimizer
from .rules import BEMA, Rule

__all__ = ["LocalAverage", "per_rank"]


def per_rank(model: Any, optimizer: Any) -> bool:
    """Whether each rank holds its own part (sharded parameters, or ZeRO's master partitions)
    rather than the whole trainable state (one process, DDP)."""
    return sharding_engine(model) is not None or zero_optimizer(optimizer) is not None


def trained_tensors(model: Any, optimizer: Any) -> dict[str, Any]:
    """`local_tensors` less the buffers: this rank's part of the trainable parameters."""
    buffers = {name for name, _ in model.named_buffers()} if callable(getattr(model, "named_buffers", None)) \
        else set()
    return {name: tensor for name, tensor in local_tensors(model, optimizer).items() if name not in buffers}


class LocalAverage:
    """The buffers of a `Rule` over this rank's trained tensors.

    Args:
        rule: `EMA` or `BEMA`.
        device: Where the buffers live: None for beside the tensors, ``"cpu"`` for the host.
    """

    def __init__(self, rule: Rule, device: Optional[str] = None) -> None:
        self.rule, self.device = rule, device
        self.buffers: dict[str, dict[str, Any]] = {}
        self._live: dict[str, Any] = {}

    def attach(self, model: Any, optimizer: Any) -> dict[str, Any]:
        """Find this rank's trained tensors (called at train begin and after each swap)."""
        self._live = trained_tensors(model, optimizer)
        return self._live

    @property
    def nbytes(self) -> int:
        """Bytes of every buffer on this rank."""
        return sum(t.numel() * t.element_size() for buffer in self.buffers.values() for t in buffer.values())

    def _weights(self, like: dict[str, Any]) -> list[Any]:
        """The live tensors as the buffers hold them (fp32, on the buffers' device)."""
        return [tensor.detach().to(device=like[name].device, dtype=like[name].dtype)
                for name, tensor in self._live.items()]

    def reset(self) -> None:
        """Every buffer becomes the current weights (the start, and each step of the burn-in)."""
        import torch

        with torch.no_grad():
            if not self.buffers:
                self.buffers = {
                    buffer: {name: tensor.detach().to(device=self.device or tensor.device,
                                                      dtype=torch.float32, copy=True)
                             for name, tensor in self._live.items()}
                    for buffer in self.rule.buffers}
                return
            for buffer in self.buffers.values():
                torch._foreach_copy_(list(buffer.values()), self._weights(buffer))

    def update(self, t: int) -> None:
        """One update at ``t``: ``lerp`` toward the weights (and BEMA's correction), fused over the shard."""
        import torch

        with torch.no_grad():
            if isinstance(self.rule, BEMA) and self.rule.bias_power is not None:
                ema, origin, average = (list(self.buffers[name].values())
                                        for name in ("ema", "origin", "average"))
                weights = self._weights(self.buffers["ema"])
                torch._foreach_lerp_(ema, weights, self.rule.weight(t))
                torch._foreach_copy_(average, weights)  # average = ema + alpha * (weights - origin)
                torch._foreach_sub_(average, origin)
                torch._foreach_mul_(average, self.rule.correction(t))
                torch._foreach_add_(average, ema)
            else:
                average = list(self.buffers["average"].values())
                torch._foreach_lerp_(average, self._weights(self.buffers["average"]), self.rule.weight(t))

    # -- files --------------------------------------------------------------------------------
    def flat(self) -> dict[str, Any]:
        """``{"<buffer>/<key>": tensor}`` on the CPU, for a file."""
        return {f"{buffer}/{name}": tensor.detach().cpu().contiguous()
                for buffer, tensors in self.buffers.items() for name, tensor in tensors.items()}

    def save(self, path: str, metadata: dict[str, str]) -> None:
        """Write the buffers to ``path`` (a temporary file renamed over it: whole or absent)."""
        from safetensors.torch import save_file

        partial = f"{path}.{os.getpid()}.partial"
        try:
            save_file(self.flat(), partial, metadata=metadata)
            os.replace(partial, path)
        finally:
            if os.path.exists(partial):
                os.remove(partial)

    def load(self, path: str) -> dict[str, str]:
        """Read the buffers from ``path``; returns its metadata.

        Raises:
            ValueError: The file holds other buffers or another sharding than this rank's.
        """
        import torch
        from safetensors import safe_open

        with safe_open(path, framework="pt", device="cpu") as handle:
            metadata = handle.metadata() or {}
            flat = {key: handle.get_tensor(key) for key in handle.keys()}
        expected = {f"{buffer}/{name}": (tuple(t.shape), "float32")
                    for buffer in self.rule.buffers for name, t in self._live.items()}
        if layout(flat) != expected:
            differ = sorted(set(layout(flat).items()) ^ set(expected.items()))[:4]
            raise ValueError(f"WeightAveraging: {path} was written for another model, rule or sharding "
                             "(world "
                             f"size {metadata.get('world_size')}); first differences: {differ}.")
        self.buffers = {buffer: {name: flat[f"{buffer}/{name}"].to(self.device or self._live[name].device,
                                                                  dtype=torch.float32)
                                 for name in self._live} for buffer in self.rule.buffers}
        return metadata

    # -- the average in the model -------------------------------------------------------------
    def put_in(self, model: Any, optimizer: Any) -> None:
        """Load the average into the model (and ZeRO's masters): `load_local`, a collective under ZeRO."""
        live = local_tensors(model, optimizer)
        average = self.buffers["average"]
        load_local(model, optimizer, {name: average[name].to(tensor.dtype) if name in average else tensor
                                      for name, tensor in live.items()})
        self.attach(model, optimizer)

    @contextlib.contextmanager
    def swapped_in(self, model: Any, optimizer: Any) -> Iterator[None]:
        """Within the block the model holds the average; after it, the training weights, bit for bit
        (a copy of them, one shard on the host, is put back with `load_local`)."""
        trained = copy_local(model, optimizer)
        self.put_in(model, optimizer)
        try:
            yield
        finally:
            load_local(model, optimizer, trained)
            self.attach(model, optimizer)
