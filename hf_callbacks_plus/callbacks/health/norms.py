"""Per-layer norms from each rank's share of the weights, with no gather: the squared norm of every
group (a layer, or a group the user names) summed over the rank's own elements (`local_segments`);
one all-reduce of the vector makes it the unsharded model's. See ``docs/health.md``."""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any, Optional, Union

from ...runtime.distributed import distributed_rank, distributed_world_size
from ...runtime.engines import clean_parameter_name, holds_a_share, local_segments

__all__ = ["GroupsArg", "LayerNorms", "check_groups", "layer_of"]

GroupsArg = Optional[Mapping[str, Union[str, list[str], tuple[str, ...]]]]


def layer_of(name: str) -> str:
    """The layer a parameter belongs to: its name up to the first number (``model.layers.3``), else its
    module (``model.embed_tokens``, ``lm_head``)."""
    parts = name.split(".")
    for index, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: index + 1])
    return ".".join(parts[:-1]) or name


def check_groups(groups: GroupsArg) -> Optional[dict[str, tuple[str, ...]]]:
    """``groups`` as ``{name: patterns}`` (construction-time check).

    Raises:
        TypeError: Not a mapping of names to a pattern or a list of patterns.
    """
    if groups is None:
        return None
    if not isinstance(groups, Mapping) or not groups:
        raise TypeError(f"TrainingHealth: groups must be None or a non-empty dict of group name to parameter "
                        f"name pattern(s) (fnmatch, e.g. {{'attention': '*.self_attn.*'}}), got {groups!r}.")
    checked = {}
    for name, patterns in groups.items():
        patterns = (patterns,) if isinstance(patterns, str) else tuple(patterns or ())
        if not isinstance(name, str) or not name or "/" in name or not patterns or \
                not all(isinstance(p, str) and p for p in patterns):
            raise TypeError(f"TrainingHealth: groups[{name!r}] must map a name without '/' to a pattern or a "
                            f"list of patterns, got {patterns!r}.")
        checked[name] = patterns
    return checked


class LayerNorms:
    """The plan of one run: which elements of which local tensor make which group.

    Raises:
        ValueError: A group of ``groups`` matches no trained parameter (the message lists some names).
    """

    def __init__(self, model: Any, optimizer: Any, groups: Optional[dict[str, tuple[str, ...]]]) -> None:
        import torch

        trained = [name for name, parameter in self._named(model) if parameter.requires_grad]
        if groups is None:
            self.names = list(dict.fromkeys(layer_of(name) for name in trained))
            member = {name: [self.names.index(layer_of(name))] for name in trained}
        else:
            self.names = list(groups)
            member = {name: [i for i, patterns in enumerate(groups.values())
                             if any(fnmatch.fnmatchcase(name, p) for p in patterns)] for name in trained}
            empty = [g for i, g in enumerate(self.names) if not any(i in found for found in member.values())]
            if empty:
                raise ValueError(f"TrainingHealth: group(s) {empty} match no trained parameter (patterns "
                                 f"{[groups[g] for g in empty]}); parameter names look like {trained[:6]}.")
        #: key -> (starts, sizes, group index per segment, as a device tensor once used)
        self.plan: dict[str, tuple[list[int], list[int], list[int]]] = {}
        for key, found in local_segments(model, optimizer).items():
            starts, sizes, owners = [], [], []
            for name, start, size in found:
                for group in member.get(name, ()):
                    starts.append(start)
                    sizes.append(size)
                    owners.append(group)
            if owners:
                self.plan[key] = (starts, sizes, owners)
        self.weight = 1.0 if holds_a_share(model, optimizer) or distributed_rank() == 0 else 0.0
        self.world = distributed_world_size()
        self._owners: dict[str, Any] = {}
        self._torch = torch

    @staticmethod
    def _named(model: Any) -> list[tuple[str, Any]]:
        return [(clean_parameter_name(name), parameter) for name, parameter in model.named_parameters()]

    def squares(self, tensors: Mapping[str, Any], factor: float = 1.0) -> Any:
        """The squared norm of every group over this rank's elements of ``tensors`` (a float32 vector;
        zero for a rank whose tensors are whole copies other than rank 0's), times ``factor ** 2``."""
        torch = self._torch
        total: Any = None
        for key, (starts, sizes, owners) in self.plan.items():
            tensor = tensors.get(key)
            if tensor is None:
                continue
            flat = tensor.detach().reshape(-1)
            views = [flat.narrow(0, start, size) for start, size in zip(starts, sizes)]
            norms = torch.stack(torch._foreach_norm(views, 2, dtype=torch.float32))
            if total is None:
                total = torch.zeros(len(self.names), dtype=torch.float32, device=flat.device)
            index = self._owners.get(key)
            if index is None or index.device != flat.device:
                index = self._owners[key] = torch.tensor(owners, device=flat.device)
            total.index_add_(0, index, norms.square())
        if total is None:
            return None
        return total * (self.weight * factor * factor)
