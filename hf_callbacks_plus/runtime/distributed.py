"""The collectives callbacks use (when ``torch.distributed`` is initialized): rank 0's decision on
every rank, a sum over ranks (on the default group, or on a CPU group that never waits for an
accelerator's queue), and every rank's small Python value on every rank."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable, TypeVar

__all__ = ["all_gather_objects", "cpu_group", "distributed_rank",
           "distributed_world_size", "from_rank0", "sum_over_ranks"]

T = TypeVar("T")


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


def distributed_rank() -> int:
    """This process's rank in the default group; 0 when not distributed."""
    dist = _dist()
    return dist.get_rank() if dist is not None else 0


def all_gather_objects(value: T) -> list[T]:
    """Every rank's ``value``, rank 0's first, on every rank (``[value]`` when not distributed).

    A collective (every rank calls it at the same point); the values travel pickled
    (``all_gather_object``, as accelerate's ``gather_object``): for small values such as a few
    generated texts.
    """
    dist = _dist()
    if dist is None or dist.get_world_size() <= 1:
        return [value]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


#: The gloo group made by `cpu_group`, per default group (a new process group gets a new one).
_CPU_GROUPS: dict[int, Any] = {}


def cpu_group() -> Any:
    """A group of every rank whose collectives run on CPU tensors (gloo): the default group when
    its backend is gloo, else a gloo group made once per default group.

    A collective on a CPU tensor never waits for the work queued on an accelerator (an NCCL
    collective on a CUDA tensor read back with ``.item()`` would wait for the whole step). Making
    the group is a collective itself the first time: every rank calls this at the same point. None
    when not distributed.
    """
    dist = _dist()
    if dist is None:
        return None
    if "gloo" in str(dist.get_backend()):  # "gloo", or a default group such as "cpu:gloo,cuda:nccl"
        return dist.group.WORLD
    key = id(dist.group.WORLD)
    if key not in _CPU_GROUPS:
        _CPU_GROUPS[key] = dist.new_group(backend="gloo")
    return _CPU_GROUPS[key]


def _tensor(dist: Any, values: Sequence[float], group: Any = None) -> Any:
    """``values`` as a float64 tensor on CPU, or on the current CUDA device for NCCL."""
    import torch

    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl" and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return torch.tensor(list(values), dtype=torch.float64, device=device)


def from_rank0(compute: Callable[[], T]) -> T:
    """Run ``compute()`` on rank 0 only and return its result on every rank (a collective: every
    rank calls it at the same point). Not distributed: ``compute()``.

    The result travels pickled (``broadcast_object_list``). When ``compute`` raises on rank 0,
    rank 0 raises it and the other ranks raise a RuntimeError quoting it, instead of waiting.
    """
    dist = _dist()
    if dist is None or dist.get_world_size() <= 1:
        return compute()
    box: list[Any] = [None]
    error: Any = None
    if dist.get_rank() == 0:
        try:
            box[0] = ("value", compute())
        except Exception as raised:  # noqa: BLE001 - handed to every rank below
            error, box[0] = raised, ("error", f"{type(raised).__name__}: {raised}")
    dist.broadcast_object_list(box, src=0)
    if error is not None:
        raise error
    kind, value = box[0]
    if kind == "error":
        raise RuntimeError(f"rank 0 failed: {value}")
    return value


def sum_over_ranks(values: Sequence[float], group: Any = None) -> list[float]:
    """Return the element-wise sum of every rank's ``values`` (unchanged when not distributed).

    A collective (every rank calls it at the same point): one ``all_reduce`` of one small tensor, on
    ``group`` (e.g. `cpu_group`) or the default group.
    """
    dist = _dist()
    if dist is None or dist.get_world_size() <= 1:
        return list(values)
    tensor = _tensor(dist, values, group)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return [float(v) for v in tensor.cpu().tolist()]
