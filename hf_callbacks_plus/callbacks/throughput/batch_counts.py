"""What the training forward passes of a window held, counted without waiting for the device.

`BatchCounts.add` reads the keyword arguments of one forward pass (one micro-batch) and adds:

* **samples**: rows of the batch (the first dimension of ``input_ids``, ``inputs_embeds`` or the
  first tensor argument);
* **tokens**: every position of ``input_ids`` (or ``inputs_embeds``), padding included;
* **non-padding tokens**: the ones of ``attention_mask`` (all tokens without a 2-D mask: a
  padding-free batch has no padding);
* **loss tokens**: the labels the loss counts: ``shift_labels`` as given, else ``labels`` other
  than ``ignore_index``, from the second position on when the model shifts them (a causal LM,
  transformers' own rule, as in ``Trainer._get_num_items_in_batch``); float labels (regression)
  all count;
* **squared lengths**: ``Σ S²`` over the sequences, for the attention FLOPs (``S`` from the
  attention mask's rows; from ``position_ids`` for packed sequences, where a sequence of ``S``
  tokens has positions ``0..S-1`` and ``Σ (2p + 1) = S²``; else the padded length).

Counts read from shapes are Python integers; counts that need the tensors' values stay on the
device, as the rows' lengths (one reduction of the mask) and 0-d tensors, kept in lists and
added up only by `totals`, so `add` never synchronises and launches as few device operations as
it can (two or three for a padded batch with labels). `totals` reads them (one
synchronisation, at a logging step, where the trainer synchronises for the loss anyway).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Optional

__all__ = ["COUNTS", "BatchCounts"]

#: The counts of `BatchCounts.totals`, in order.
COUNTS = (
    "micro_batches",
    "samples",
    "token_batches",
    "tokens",
    "non_padding_tokens",
    "label_batches",
    "loss_tokens",
    "squared_lengths",
)


class BatchCounts:
    """Running counts of the micro-batches of one window (module docstring).

    Args:
        shifts_labels: The model's loss shifts its labels (a causal LM). Defaults to False.
        ignore_index: Label of positions the loss ignores. Defaults to -100.
    """

    def __init__(self, shifts_labels: bool = False, ignore_index: int = -100) -> None:
        self.shifts_labels = shifts_labels
        self.ignore_index = ignore_index
        self.reset()

    def reset(self) -> None:
        """Forget everything counted."""
        self._host = dict.fromkeys(COUNTS, 0)
        self._device: dict[str, list[Any]] = {name: [] for name in COUNTS}
        self._lengths: list[Any] = []  # each padded batch's row lengths: non-padding tokens and Σ S²

    def _add(self, name: str, value: Any) -> None:
        if isinstance(value, int):
            self._host[name] += value
        else:
            self._device[name].append(value)

    def add(self, kwargs: Mapping[str, Any], args: Sequence[Any] = ()) -> None:
        """Count one forward pass given its keyword (and positional) arguments."""
        import torch

        tokens = kwargs.get("input_ids")
        if not isinstance(tokens, torch.Tensor) and args and isinstance(args[0], torch.Tensor):
            tokens = args[0] if not args[0].is_floating_point() else None
        if not isinstance(tokens, torch.Tensor):
            embeds = kwargs.get("inputs_embeds")
            tokens = embeds[..., 0] if isinstance(embeds, torch.Tensor) and embeds.dim() >= 2 else None
        first = tokens if tokens is not None else _first_tensor(kwargs, args)
        if first is None:
            return
        self._add("micro_batches", 1)
        self._add("samples", int(first.shape[0]) if first.dim() else 1)
        if tokens is not None:
            self._count_tokens(tokens, kwargs)
        self._count_labels(kwargs)

    def _count_tokens(self, tokens: Any, kwargs: Mapping[str, Any]) -> None:
        import torch

        count = tokens.numel()
        self._add("token_batches", 1)
        self._add("tokens", count)
        mask = kwargs.get("attention_mask")
        positions = kwargs.get("position_ids")
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape == tokens.shape:
            self._lengths.append(mask.sum(dim=-1, dtype=torch.int64))
            return
        self._add("non_padding_tokens", count)
        if isinstance(positions, torch.Tensor) and positions.shape == tokens.shape:
            self._add("squared_lengths", (2 * positions.to(torch.int64) + 1).sum())
        elif tokens.dim() == 2:
            self._add("squared_lengths", int(tokens.shape[0]) * int(tokens.shape[1]) ** 2)
        else:
            self._add("squared_lengths", count * count)

    def _count_labels(self, kwargs: Mapping[str, Any]) -> None:
        import torch

        labels = kwargs.get("shift_labels")
        shift = False
        if not isinstance(labels, torch.Tensor):
            labels, shift = kwargs.get("labels"), self.shifts_labels
        if not isinstance(labels, torch.Tensor):
            return
        self._add("label_batches", 1)
        if labels.is_floating_point():
            self._add("loss_tokens", labels.numel())
            return
        if shift and labels.dim() >= 2:
            labels = labels[..., 1:]
        self._add("loss_tokens", (labels != self.ignore_index).sum())

    def totals(self) -> list[float]:
        """The counts, in the order of `COUNTS`, as floats (reads the device counts)."""
        import torch

        totals = {name: float(count) for name, count in self._host.items()}
        for name, parts in self._device.items():
            if parts:
                totals[name] += float(torch.stack([part.to(parts[0].device) for part in parts]).sum().item())
        if self._lengths:
            lengths = torch.cat([part.to(self._lengths[0].device) for part in self._lengths])
            totals["non_padding_tokens"] += float(lengths.sum().item())
            totals["squared_lengths"] += float((lengths * lengths).sum().item())
        return [totals[name] for name in COUNTS]


def _first_tensor(kwargs: Mapping[str, Any], args: Sequence[Any]) -> Optional[Any]:
    import torch

    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None
