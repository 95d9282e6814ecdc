"""Make every rank take rank 0's decision (when ``torch.distributed`` is initialized)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["broadcast_from_rank0", "distributed_world_size"]


def _dist() -> Any:
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def distributed_world_size() -> int:
    """The number of processes of the default group; 1 when not distributed."""
    dist = _dist()
    return dist.get_world_size() if dist is not None else 1


def broadcast_from_rank0(values: Sequence[float]) -> list[float]:
    """Return rank 0's ``values`` on every rank (unchanged when not distributed).

    Every rank must call this at the same point with a sequence of the same length (a
    collective). Uses a float64 tensor on CPU, or on the current CUDA device for NCCL.
    """
    dist = _dist()
    if dist is None or dist.get_world_size() <= 1:
        return list(values)
    import torch

    device = torch.device("cpu")
    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.broadcast(tensor, src=0)
    return [float(v) for v in tensor.cpu().tolist()]
