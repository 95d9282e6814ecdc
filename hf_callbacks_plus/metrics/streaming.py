"""Streaming metrics: exact metrics from one batch at a time.

A `MetricSet` holds named metric objects with ``update``/``compute``/``reset`` (torchmetrics
metrics, or your own), feeds them one batch of ``(scores, target)`` at a time and returns plain
floats. `scored_pairs` turns a batch of logits and labels into those pairs for a task
(classification, token classification, causal LM), dropping ignored positions; `labelled_blocks`
gives the same rows in blocks, mostly views of the logits. The metrics keep
exact sufficient statistics (counts, confusion matrices, sums of log-probabilities), so the
result over many batches equals the one ``compute_metrics`` gets from every logit at once, and
nothing grows with the number of samples.

`standard_metrics` builds the usual set with torchmetrics (``pip install
'hf-callbacks-plus[metrics]'``).

Memory: beyond the batch's own logits, at most one float32 copy of them (`labelled_blocks`
copies only the rows of short runs of labelled positions) and a float64 block of
`CHUNK_ELEMENTS` values at a time.

This module knows no trainer: `hf_callbacks_plus.callbacks.streaming_metrics.StreamingMetrics`
connects it to one.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator, Mapping
from typing import Any, Optional

from .._compat import require

__all__ = [
    "CHUNK_ELEMENTS",
    "IGNORE_INDEX",
    "TASKS",
    "VIEW_ELEMENTS",
    "MetricSet",
    "classification_scores",
    "labelled_blocks",
    "log_normalizers",
    "predicted_classes",
    "rank",
    "scored_pairs",
    "standard_metrics",
    "top_classes",
    "world_size",
]

#: The tasks `scored_pairs` knows, with what the model's logits and the labels look like.
TASKS = {
    "classification": "logits [batch, classes], labels [batch]",
    "token_classification": "logits [batch, tokens, classes], labels [batch, tokens]",
    "causal_lm": "logits [batch, tokens, vocabulary], labels [batch, tokens] (the model shifts them)",
}

#: The label of positions no metric counts (transformers' padding and prompt label).
IGNORE_INDEX = -100

#: A run of labelled positions with at least this many scores reaches the metrics as a view of the
#: logits (`labelled_blocks`); shorter runs are copied together, since a metric update per short run
#: costs more than the copy.
VIEW_ELEMENTS = 2**16

#: Scores turned into float64 at a time (2 MiB), so a float64 result never costs a float64 copy of a
#: batch's logits (a vocabulary of 32k x 256 tokens x 8 rows: 500 MB each).
CHUNK_ELEMENTS = 2**18


def check_task(task: Any, owner: str) -> str:
    """Return ``task`` or raise a ValueError naming the valid tasks."""
    if task not in TASKS:
        raise ValueError(f"{owner}: task must be one of {sorted(TASKS)}, got {task!r}.")
    return task


def _as_tensor(values: Any) -> Any:
    import torch

    if isinstance(values, (tuple, list)):  # a model returning (logits, hidden states, ...)
        values = values[0]
    if isinstance(values, torch.Tensor):
        return values.detach()
    return torch.as_tensor(values)


def _flat_pairs(logits: Any, labels: Any, task: str, ignore_index: int) -> tuple[Any, Any]:
    """``(scores [positions, classes], target [positions])`` of every position, ignored ones
    included (causal LM: the target shifted, the last position ignored); the scores a view of the
    logits when they are contiguous."""
    import torch

    scores, target = _as_tensor(logits), _as_tensor(labels)
    if task == "classification":
        if scores.ndim != 2 or target.ndim != 1 or scores.shape[0] != target.shape[0]:
            raise ValueError(
                f"task='classification' needs logits [batch, classes] and labels [batch]; got "
                f"logits {tuple(scores.shape)} and labels {tuple(target.shape)}."
            )
        return scores, target
    if scores.ndim != 3 or target.ndim != 2 or tuple(scores.shape[:2]) != tuple(target.shape):
        raise ValueError(
            f"task={task!r} needs logits [batch, tokens, classes] and labels [batch, tokens]; "
            f"got logits {tuple(scores.shape)} and labels {tuple(target.shape)}."
        )
    if task == "causal_lm":  # position t predicts label t + 1: compare without copying the logits
        target = torch.cat([target[:, 1:], torch.full_like(target[:, :1], ignore_index)], dim=1)
    return scores.reshape(-1, scores.shape[-1]), target.reshape(-1)


def scored_pairs(logits: Any, labels: Any, task: str, ignore_index: int = IGNORE_INDEX) -> tuple[Any, Any]:
    """One row of class scores per labelled position, and its label, in the positions' order.

    Args:
        logits: The model's logits (a tensor or array; of a tuple, the first element).
        labels: The labels, as the model receives them.
        task: One of `TASKS`. ``"causal_lm"`` predicts position ``t + 1`` from ``t``, as the
            model's own loss does.
        ignore_index: Label of positions to leave out. Defaults to -100.

    Returns:
        ``(scores [n, classes], target [n])``: tensors of the labelled positions only (a copy of
        their scores when a position is left out; `labelled_blocks` copies less).

    Raises:
        ValueError: The shapes do not fit the task.
    """
    scores, target = _flat_pairs(logits, labels, task, ignore_index)
    keep = target != ignore_index
    if not bool(keep.all()):
        rows = keep.nonzero().squeeze(1)
        scores, target = scores.index_select(0, rows), target.index_select(0, rows)
    return scores, target.long()


def labelled_blocks(
    logits: Any, labels: Any, task: str, ignore_index: int = IGNORE_INDEX
) -> list[tuple[Any, Any]]:
    """The rows of `scored_pairs` in blocks, most of them views of the logits (no copy).

    A run of consecutive labelled positions with at least `VIEW_ELEMENTS` scores (a causal LM's
    row, a response) is a block of its own, a view; the positions of the shorter runs are copied
    together into one more block. A metric whose result does not depend on how its rows are
    split into ``update`` calls (counts and sums, as every metric of `standard_metrics`) gives
    the same result from the blocks as from `scored_pairs`.

    Args:
        logits: As for `scored_pairs`.
        labels: As for `scored_pairs`.
        task: As for `scored_pairs`.
        ignore_index: As for `scored_pairs`. Defaults to -100.

    Returns:
        ``[(scores [n, classes], target [n]), ...]``; empty when no position is labelled.

    Raises:
        ValueError: The shapes do not fit the task.
    """
    import torch

    scores, target = _flat_pairs(logits, labels, task, ignore_index)
    keep = target != ignore_index
    if bool(keep.all()):
        return [(scores, target.long())] if len(target) else []
    rows = keep.nonzero().squeeze(1)
    if not len(rows):
        return []
    starts_run = torch.ones_like(rows, dtype=torch.bool)
    starts_run[1:] = rows[1:] != rows[:-1] + 1
    run = starts_run.cumsum(0) - 1  # each labelled position's run
    lengths = torch.bincount(run)
    long = lengths * scores.shape[-1] >= VIEW_ELEMENTS
    blocks = [
        (scores[start : start + length], target[start : start + length].long())
        for start, length in zip(rows[starts_run][long].tolist(), lengths[long].tolist())
    ]
    short = rows[~long[run]]
    if len(short):  # one copy, of the short runs' rows only
        blocks.append((scores.index_select(0, short), target.index_select(0, short).long()))
    return blocks


def _to_floats(name: str, value: Any) -> dict[str, float]:
    """A metric result as named floats: a scalar as ``name``, a vector as ``name_<i>``, a matrix
    as ``name_<i>_<j>``; a dict result (one metric computing several) by its own keys."""
    if isinstance(value, Mapping):
        out: dict[str, float] = {}
        for key, item in value.items():
            out.update(_to_floats(str(key), item))
        return out
    tolist = getattr(value, "tolist", None)
    value = tolist() if tolist is not None else value
    if isinstance(value, (list, tuple)):
        out = {}
        for index, item in enumerate(value):
            out.update(_to_floats(f"{name}_{index}", item))
        return out
    return {name: float(value)}


class MetricSet:
    """Named metrics fed batch by batch; `compute` gives plain floats.

    Args:
        metrics: A mapping ``{name: metric}``, a torchmetrics ``MetricCollection``, or one
            metric (named after its class in snake case). Each metric needs ``update(scores,
            target)``, ``compute()`` and ``reset()``.

    Raises:
        TypeError: A metric lacks one of the three methods, or a name is not a string.
        ValueError: No metric was given.
    """

    def __init__(self, metrics: Any) -> None:
        if hasattr(metrics, "items") and callable(metrics.items):
            named = dict(metrics.items())
        elif metrics is None:
            named = {}
        else:
            named = {_snake(type(metrics).__name__): metrics}
        if not named:
            raise ValueError("MetricSet: metrics must hold at least one metric, got none.")
        for name, metric in named.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"MetricSet: metric names must be non-empty strings, got {name!r}.")
            missing = [m for m in ("update", "compute", "reset") if not callable(getattr(metric, m, None))]
            if missing:
                raise TypeError(
                    f"MetricSet: metric {name!r} ({type(metric).__name__}) has no {', '.join(missing)}; "
                    "pass torchmetrics metrics or objects with update(scores, target), compute() and reset()."
                )
        self.metrics: dict[str, Any] = named
        self.updates = 0

    @property
    def names(self) -> list[str]:
        """The metric names, in order."""
        return list(self.metrics)

    def copy(self) -> MetricSet:
        """An independent set with the same metrics, reset."""
        twin = MetricSet(copy.deepcopy(self.metrics))
        twin.reset()
        return twin

    def update(self, scores: Any, target: Any) -> None:
        """Add one batch (``scores [n, classes]``, ``target [n]``; n may be 0).

        Args:
            scores: Class scores (logits or probabilities), one row per labelled position.
            target: The labels.
        """
        if len(target) == 0:
            return
        for metric in self.metrics.values():
            metric.update(scores, target)
        self.updates += 1

    def compute(self, *, sync: bool = True) -> dict[str, float]:
        """Every metric's value as floats (see `_to_floats` for vectors and matrices).

        Args:
            sync: Combine the states of every rank of a distributed run (torchmetrics'
                synchronisation), when each rank saw its own batches (training). False when
                every rank already saw every batch (the Trainer's gathered evaluation batches):
                each rank then computes from its own state, which holds everything, whatever
                the kind of state (sums, lists, maxima). Defaults to True.

        Returns:
            The values; empty when no rank had a batch (every rank then agrees).
        """
        if sync and world_size() > 1 and not self._align_empty_lists():
            return {}
        out: dict[str, float] = {}
        for name, metric in self.metrics.items():
            with _synchronised(metric, sync):
                value = metric.compute()
            out.update(_to_floats(name, value))
        return out

    def _align_empty_lists(self) -> bool:
        """Before a synchronised compute: gather every rank's update count and the shape and
        dtype of its list states (one small collective), and give this rank's empty list states
        an empty tensor of that shape and dtype: torchmetrics puts a 1-d float tensor there,
        which its gather cannot combine with ``[n, classes]`` scores or integer labels.

        Returns:
            Whether any rank had a batch.
        """
        import torch
        import torch.distributed as dist

        shapes: dict[tuple[str, str], tuple[tuple[int, ...], str]] = {}
        for name, metric in self.metrics.items():
            for state in getattr(metric, "_defaults", {}):
                value = getattr(metric, state)
                if isinstance(value, list) and value and hasattr(value[0], "shape"):
                    shapes[(name, state)] = (tuple(value[0].shape[1:]), str(value[0].dtype))
        every_rank: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every_rank, (self.updates, shapes))
        if sum(updates for updates, _ in every_rank) == 0:
            return False
        padded: set[int] = set()  # a MetricCollection's compute group shares one list
        for _, rank_shapes in every_rank:
            for (name, state), (trailing, dtype) in rank_shapes.items():
                value = getattr(self.metrics[name], state)
                if not value and id(value) not in padded:
                    padded.add(id(value))
                    value.append(torch.empty((0, *trailing), dtype=getattr(torch, dtype.split(".")[-1]),
                                             device=self.metrics[name].device))
        return True

    def reset(self) -> None:
        """Forget every batch."""
        for metric in self.metrics.values():
            metric.reset()
        self.updates = 0


@contextlib.contextmanager
def _synchronised(metric: Any, sync: bool) -> Iterator[None]:
    """Within the block, a torchmetrics metric's ``compute()`` synchronises across ranks only if
    ``sync`` (its public ``distributed_available_fn`` says "not distributed" otherwise)."""
    if sync or not hasattr(metric, "distributed_available_fn"):
        yield
        return
    saved = metric.distributed_available_fn
    metric.distributed_available_fn = _not_distributed
    try:
        yield
    finally:
        metric.distributed_available_fn = saved


def _not_distributed() -> bool:
    return False


def predicted_classes(scores: Any) -> Any:
    """The predicted class of each row of ``scores [..., classes]``: the arg-max (the first one on
    a tie); with one column (a binary classifier's logit of class 1), 1 where it is > 0 (scikit-learn's
    rule for a decision function, torchmetrics' ``sigmoid > 0.5``)."""
    if scores.shape[-1] == 1:
        return (scores[..., 0] > 0).long()
    return scores.argmax(dim=-1)


def log_normalizers(scores: Any) -> Any:
    """``log(sum(exp(row)))`` of each row of ``scores [n, classes]``, in float64, `CHUNK_ELEMENTS`
    scores at a time (never a float64 copy of them all)."""
    import torch

    rows = max(1, CHUNK_ELEMENTS // max(1, scores.shape[-1]))
    starts = range(0, max(len(scores), 1), rows)  # one (empty) block for no rows
    return torch.cat([torch.logsumexp(scores[start : start + rows].double(), dim=-1) for start in starts])


def top_classes(scores: Any) -> tuple[Any, Any]:
    """Each row's `predicted_classes` and its softmax probability (float64; with one column, the
    sigmoid probability of the predicted class), for ``scores [..., classes]``."""
    import torch

    predicted = predicted_classes(scores)
    if scores.shape[-1] == 1:
        positive = torch.sigmoid(scores[..., 0].double())
        return predicted, torch.where(predicted.bool(), positive, 1 - positive)
    rows = scores.reshape(-1, scores.shape[-1])
    best = rows.gather(1, predicted.reshape(-1, 1)).squeeze(1).double()
    return predicted, torch.exp(best - log_normalizers(rows)).reshape(predicted.shape)


def world_size() -> int:
    """The number of processes in ``torch.distributed`` (1 when not distributed)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return 1
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's rank in ``torch.distributed`` (0 when not distributed)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return 0
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _snake(name: str) -> str:
    out = []
    for index, char in enumerate(name):
        if char.isupper() and index and not name[index - 1].isupper():
            out.append("_")
        out.append(char.lower())
    return "".join(out)


def standard_metrics(task: str, num_classes: Optional[int] = None) -> dict[str, Any]:
    """The usual metrics of a task, as torchmetrics metrics (exact counts, synchronised across ranks).

    Args:
        task: One of `TASKS`.
        num_classes: Number of classes. Required for classification and token
            classification; unused for ``"causal_lm"``. Defaults to None.

    Returns:
        classification and token classification: one metric, ``classification``, whose
        result is `classification_scores` of its confusion matrix (``accuracy``,
        ``precision_micro``/``_macro``, ``recall_micro``/``_macro``, ``f1_micro``/``_macro``,
        ``confusion_<label>_<prediction>``), over labelled positions only; the scores must have
        ``num_classes`` columns, or one with ``num_classes=2`` (see `predicted_classes`). causal LM:
        ``token_accuracy`` (labelled next tokens) and ``perplexity`` (exp of the mean negative
        log-likelihood per labelled token, summed in float64).

    Raises:
        ModuleNotFoundError: torchmetrics is not installed.
        ValueError: ``task`` is unknown, or ``num_classes`` is missing or below 2.
    """
    check_task(task, "standard_metrics")
    require("torchmetrics", "standard_metrics")
    if task == "causal_lm":
        return {
            "token_accuracy": _torchmetrics_classes()["token_accuracy"](),
            "perplexity": _torchmetrics_classes()["perplexity"](),
        }
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 2:
        raise ValueError(
            f"standard_metrics: task={task!r} needs num_classes, an int >= 2, got {num_classes!r}."
        )
    return {"classification": _torchmetrics_classes()["classification"](num_classes)}


def classification_scores(confusion: Any) -> dict[str, float]:
    """Accuracy, precision, recall and F1 (micro and macro) and the counts of a confusion matrix.

    Computed in float64 with scikit-learn's formulas (``f1 = 2 tp / (2 tp + fp + fn)``, 0 on a
    zero division, macro averages over the classes that occur as a label or a prediction), so
    the values equal ``sklearn.metrics`` on the same predictions.

    Args:
        confusion: ``[classes, classes]`` counts, rows labels, columns predictions.

    Returns:
        ``accuracy``, ``precision_micro``, ``precision_macro``, ``recall_micro``,
        ``recall_macro``, ``f1_micro``, ``f1_macro`` and ``confusion_<label>_<prediction>``.
    """
    import numpy as np

    counts = np.asarray(confusion, dtype=np.int64)
    tp = np.diag(counts)
    predicted, actual = counts.sum(axis=0), counts.sum(axis=1)
    present = (predicted + actual) > 0

    def divide(numerator: Any, denominator: Any) -> Any:
        numerator, denominator = np.asarray(numerator, np.float64), np.asarray(denominator, np.float64)
        return np.divide(numerator, denominator, out=np.zeros_like(numerator), where=denominator != 0)

    total = int(counts.sum())
    out = {"accuracy": float(tp.sum() / total) if total else math.nan}
    for name, numerator, denominator in (
        ("precision", tp, predicted),
        ("recall", tp, actual),
        ("f1", 2 * tp, predicted + actual),
    ):
        out[f"{name}_micro"] = float(divide(numerator.sum(), denominator.sum()))
        out[f"{name}_macro"] = (
            float(np.average(divide(numerator, denominator)[present])) if present.any() else math.nan
        )
    for label, row in enumerate(counts):
        for prediction, count in enumerate(row):
            out[f"confusion_{label}_{prediction}"] = float(count)
    return out


_CLASSES: dict[str, Any] = {}


def _torchmetrics_classes() -> dict[str, Any]:
    """Our two torchmetrics metrics, defined on first use (torchmetrics is optional)."""
    if _CLASSES:
        return _CLASSES
    import torch
    from torchmetrics import Metric

    class TokenAccuracy(Metric):
        """Correct labelled tokens / labelled tokens, from exact integer counts."""

        full_state_update = False

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.add_state("correct", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
            self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

        def update(self, scores: Any, target: Any) -> None:
            # arg-max == label, exactly, without an arg-max over every row: the label's score must
            # be the row's maximum (one cheap reduction), and only those rows, where a tie could
            # put an earlier index first, get the arg-max
            if scores.ndim == target.ndim:  # already predictions
                self.correct += (scores == target).sum()
            else:
                hits = (
                    (scores.gather(1, target.unsqueeze(1)).squeeze(1) == scores.amax(dim=-1))
                    .nonzero()
                    .squeeze(1)
                )
                if len(hits):
                    self.correct += (scores.index_select(0, hits).argmax(dim=-1) == target[hits]).sum()
            self.total += target.numel()

        def compute(self) -> Any:
            total = int(self.total)
            return int(self.correct) / total if total else math.nan

    class Perplexity(Metric):
        """exp(sum of -log p(label) / labelled tokens), summed in float64."""

        full_state_update = False

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.add_state("nll", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

        def update(self, scores: Any, target: Any) -> None:
            # -log p(label) = log(sum(exp(row))) - row[label]
            label_scores = scores.gather(1, target.unsqueeze(1)).squeeze(1).double()
            self.nll += (log_normalizers(scores) - label_scores).sum()
            self.total += target.numel()

        def compute(self) -> Any:
            total = int(self.total)
            return math.exp(float(self.nll) / total) if total else math.nan

    class ClassificationCounts(Metric):
        """The confusion matrix (exact counts); `classification_scores` of it as the result."""

        full_state_update = False

        def __init__(self, num_classes: int, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.num_classes = num_classes
            self.add_state(
                "confusion",
                default=torch.zeros(num_classes, num_classes, dtype=torch.long),
                dist_reduce_fx="sum",
            )

        def update(self, scores: Any, target: Any) -> None:
            if scores.ndim == target.ndim + 1:
                self._check_width(scores)
                predicted = predicted_classes(scores)
            else:
                predicted = scores
            for name, values in (("labels", target), ("predictions", predicted)):
                if int(values.max()) >= self.num_classes or int(values.min()) < 0:
                    raise ValueError(
                        f"ClassificationCounts: {name} must be in [0, {self.num_classes}), got "
                        f"{int(values.min())}..{int(values.max())} (num_classes={self.num_classes})."
                    )
            pairs = target.long() * self.num_classes + predicted.long()
            self.confusion += torch.bincount(pairs, minlength=self.num_classes**2).reshape(
                self.num_classes, self.num_classes
            )

        def _check_width(self, scores: Any) -> None:
            width = scores.shape[-1]
            if width != self.num_classes and not (width == 1 and self.num_classes == 2):
                raise ValueError(
                    f"ClassificationCounts: scores {tuple(scores.shape)} (one row per labelled position) "
                    f"have {width} class scores per row, but num_classes={self.num_classes}: the logits' "
                    "last dimension must be num_classes (or 1 with num_classes=2, a binary classifier's "
                    "logit of class 1)."
                )

        def compute(self) -> Any:
            return classification_scores(self.confusion.cpu().numpy())

    _CLASSES.update(token_accuracy=TokenAccuracy, perplexity=Perplexity, classification=ClassificationCounts)
    return _CLASSES
