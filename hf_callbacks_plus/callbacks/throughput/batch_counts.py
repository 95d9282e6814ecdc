"""What the training forward passes of a window held, counted without waiting for the device.

`BatchCounts.add` reads the keyword arguments of one forward pass (one micro-batch) and adds:

* **sequences**: the sequences the model trains on, where the batch tells them apart: the
  documents of a padding-free or packed row (``cu_seq_lens_q`` from trl's collator or
  ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)``; else the resets of
  ``position_ids`` in a batch without a 2-D attention mask: a sequence starts where a position is
  not the previous one plus 1, whatever the first position is); else the rows of the batch (the
  first dimension of ``input_ids``, ``inputs_embeds`` or the first tensor argument);
* **tokens**: every position of ``input_ids`` (or ``inputs_embeds``), padding included;
* **non-padding tokens**: the ones of ``attention_mask`` (all tokens without a 2-D mask: a
  padding-free batch has no padding);
* **loss tokens**: the labels the loss counts: ``shift_labels`` as given, else ``labels`` other
  than ``ignore_index``, from the second position on when the model shifts them (a causal LM,
  transformers' own rule, as in ``Trainer._get_num_items_in_batch``); float labels (regression)
  all count;
* **squared lengths**: ``Σ S²`` over the sequences, for the attention FLOPs (``S`` from the
  attention mask's rows; for packed sequences from ``cu_seq_lens_q`` or from the position of
  each token in its sequence, ``r = 0..S-1``, since ``Σ (2r + 1) = S²``; else the padded length).

A micro-batch with neither ``input_ids`` nor ``inputs_embeds`` counts no tokens (its rows are its
sequences); the names of its arguments are kept (`BatchCounts.untokenized`) so that the monitor
can say which figures are missing and why.

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
    "sequences",
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
        #: The argument names of the first micro-batch counted without tokens (None: none was).
        self.untokenized: Optional[tuple[str, ...]] = None
        #: The argument names of the first micro-batch counted without labels (None: none was).
        self.unlabelled: Optional[tuple[str, ...]] = None

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
        if tokens is not None:
            self._count_tokens(tokens, kwargs)
        else:
            self._add("sequences", int(first.shape[0]) if first.dim() else 1)
            if self.untokenized is None:
                self.untokenized = _names(kwargs, args)
        if not self._count_labels(kwargs) and self.unlabelled is None:
            self.unlabelled = _names(kwargs, args)

    def _count_tokens(self, tokens: Any, kwargs: Mapping[str, Any]) -> None:
        import torch

        count = tokens.numel()
        rows = int(tokens.shape[0]) if tokens.dim() == 2 else 1
        self._add("token_batches", 1)
        self._add("tokens", count)
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape == tokens.shape:
            self._add("sequences", rows)
            self._lengths.append(mask.sum(dim=-1, dtype=torch.int64))
            return
        self._add("non_padding_tokens", count)
        boundaries = kwargs.get("cu_seq_lens_q")
        positions = kwargs.get("position_ids")
        if isinstance(boundaries, torch.Tensor) and boundaries.dim() == 1 and boundaries.numel() >= 2:
            self._add("sequences", boundaries.numel() - 1)  # from the shape: no device read
            lengths = boundaries.diff().to(torch.int64)
            self._add("squared_lengths", (lengths * lengths).sum())
        elif isinstance(positions, torch.Tensor) and positions.shape == tokens.shape and tokens.dim() >= 1:
            sequences, squared = _packed_sequences(positions)
            self._add("sequences", sequences)
            self._add("squared_lengths", squared)
        else:
            self._add("sequences", rows)
            width = int(tokens.shape[-1]) if tokens.dim() else 1
            self._add("squared_lengths", count * width)

    def _count_labels(self, kwargs: Mapping[str, Any]) -> bool:
        """Count the loss tokens; False when the pass has no labels."""
        import torch

        labels = kwargs.get("shift_labels")
        shift = False
        if not isinstance(labels, torch.Tensor):
            labels, shift = kwargs.get("labels"), self.shifts_labels
        if not isinstance(labels, torch.Tensor):
            return False
        self._add("label_batches", 1)
        if labels.is_floating_point():
            self._add("loss_tokens", labels.numel())
            return True
        if shift and labels.dim() >= 2:
            labels = labels[..., 1:]
        self._add("loss_tokens", (labels != self.ignore_index).sum())
        return True

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


def _packed_sequences(positions: Any) -> tuple[Any, Any]:
    """The number of sequences in rows of packed ``positions`` and ``Σ S²`` over them, as 0-d
    tensors on the positions' device (no read): a sequence starts at each row's first token and
    wherever a position is not the previous one plus 1; a token ``r`` places into its sequence
    adds ``2r + 1``."""
    import torch

    positions = positions.to(torch.int64)
    starts = torch.ones_like(positions, dtype=torch.bool)
    starts[..., 1:] = positions[..., 1:] != positions[..., :-1] + 1
    index = torch.arange(positions.shape[-1], device=positions.device).expand_as(positions)
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=-1).values
    return starts.sum(), (2 * (index - first) + 1).sum()


def _names(kwargs: Mapping[str, Any], args: Sequence[Any]) -> tuple[str, ...]:
    """The names of a forward pass's arguments (``<positional>`` for each positional one)."""
    return (*("<positional>" for _ in args), *(str(name) for name in kwargs))


def _first_tensor(kwargs: Mapping[str, Any], args: Sequence[Any]) -> Optional[Any]:
    import torch

    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None
