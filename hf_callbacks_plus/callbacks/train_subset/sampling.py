"""Choosing a fixed, seeded (optionally stratified) subset of a training set.

Used by `TrainSubsetEvaluation`. Works on a
``datasets.Dataset`` (``select``), any map-style dataset (``torch.utils.data.Subset``), a
``torch`` DataLoader (a new loader over the subset with the same collate function) and, for
``LightweightTrainer``, a sequence of batches.
"""

from __future__ import annotations

import difflib
import logging
import numbers
import random
from collections.abc import Sequence
from typing import Any, Optional, Union

__all__ = ["choose_indices", "subset_size", "take_subset"]

logger = logging.getLogger("hf_callbacks_plus")


def subset_size(size: Union[int, float], total: int) -> int:
    """Number of items for ``size`` (a count, or a fraction of ``total``), at least 1, at most ``total``."""
    if isinstance(size, numbers.Integral):
        if size > total:
            logger.warning(
                "TrainSubsetEvaluation: size=%d exceeds the %d training items; using all.", size, total
            )
        return max(0, min(int(size), total))
    return max(1, min(total, round(float(size) * total))) if total else 0


def choose_indices(
    total: int, size: Union[int, float], seed: int, labels: Optional[Sequence[Any]] = None
) -> list[int]:
    """Pick a sorted list of indices in ``range(total)``, reproducibly.

    Args:
        total: Number of items.
        size: A count (int) or a fraction of ``total`` (float).
        seed: Seed of the choice.
        labels: One label per item: the subset keeps the class proportions (largest
            remainder allocation). Defaults to None (uniform sampling).

    Returns:
        Sorted indices.
    """
    k = subset_size(size, total)
    rng = random.Random(seed)
    if labels is None:
        return sorted(rng.sample(range(total), k))
    groups: dict[Any, list[int]] = {}
    for index, label in enumerate(labels):
        groups.setdefault(_hashable(label), []).append(index)
    quotas = {label: k * len(members) / total for label, members in groups.items()}
    counts = {label: int(quota) for label, quota in quotas.items()}
    by_remainder = sorted(
        groups, key=lambda label: (quotas[label] - counts[label], len(groups[label])), reverse=True
    )
    for label in by_remainder[: k - sum(counts.values())]:
        counts[label] += 1
    chosen: list[int] = []
    for label in sorted(groups, key=repr):  # deterministic order, independent of dict order
        chosen.extend(rng.sample(groups[label], counts[label]))
    return sorted(chosen)


def _hashable(label: Any) -> Any:
    item = getattr(label, "item", None)
    if callable(item) and getattr(label, "ndim", 0) == 0:
        label = item()
    try:
        hash(label)
    except TypeError:
        return repr(label)
    return label


def _labels(source: Any, column: str) -> list[Any]:
    if hasattr(source, "column_names"):  # datasets.Dataset: one columnar read
        if column not in source.column_names:
            close = difflib.get_close_matches(column, list(source.column_names), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"TrainSubsetEvaluation: stratify_by={column!r} is not a column of the training "
                f"dataset; columns: {source.column_names}.{hint}"
            )
        return list(source[column])
    labels = []
    for index in range(len(source)):
        sample = source[index]
        try:
            labels.append(sample[column])
        except (KeyError, IndexError, TypeError):
            keys = list(sample) if isinstance(sample, dict) else []
            close = difflib.get_close_matches(column, [str(k) for k in keys], n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"TrainSubsetEvaluation: stratify_by={column!r} is not a key of the training samples "
                f"(sample {index} is a {type(sample).__name__}"
                f"{' with keys ' + repr(keys) if keys else ''}).{hint}"
            ) from None
    return labels


def take_subset(
    source: Any,
    size: Union[int, float],
    seed: int,
    stratify_by: Optional[str] = None,
    batches_of: Optional[int] = None,
) -> tuple[list[int], Any]:
    """Build the subset of ``source``.

    Args:
        source: The training data.
        size: A count or a fraction.
        seed: Seed of the choice.
        stratify_by: Label column. Defaults to None.
        batches_of: Eval batch size when the consumer iterates batches
            (``LightweightTrainer``); None for a ``transformers.Trainer`` (which builds its
            own eval dataloader). Defaults to None.

    Returns:
        ``(indices, subset)``.

    Raises:
        TypeError: ``source`` has no length.
        ValueError: ``stratify_by`` is used on batches, or names no column.
    """
    loader_dataset = getattr(source, "dataset", None) if hasattr(source, "collate_fn") else None
    data = loader_dataset if loader_dataset is not None else source
    if not hasattr(data, "__len__") or not hasattr(data, "__getitem__"):
        raise TypeError(
            "TrainSubsetEvaluation: the training data must be sized and indexable (a dataset, a "
            f"DataLoader over one, or a list of batches), got {type(source).__name__} (an iterable "
            "dataset has no fixed rows to pick a subset from); pass dataset=<a map-style dataset of "
            "training rows>, e.g. datasets.Dataset.from_list(list(itertools.islice(train, 512)))."
        )
    if batches_of is not None and loader_dataset is None and stratify_by is not None:
        raise ValueError(
            "TrainSubsetEvaluation: stratify_by needs samples, but the trainer's train_data is a "
            "sequence of batches; pass a DataLoader or dataset=... instead."
        )
    labels = _labels(data, stratify_by) if stratify_by is not None else None
    indices = choose_indices(len(data), size, seed, labels)
    if hasattr(data, "select") and hasattr(data, "column_names"):
        subset: Any = data.select(indices)
    elif batches_of is not None and loader_dataset is None:
        return indices, [data[i] for i in indices]  # LightweightTrainer: a list of batches
    else:
        import torch.utils.data

        subset = torch.utils.data.Subset(data, indices)
    if batches_of is not None and loader_dataset is not None:
        import torch.utils.data

        subset = torch.utils.data.DataLoader(
            subset, batch_size=batches_of, shuffle=False, collate_fn=source.collate_fn
        )
    return indices, subset
