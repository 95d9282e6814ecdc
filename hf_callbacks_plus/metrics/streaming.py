"""Streaming metrics: exact metrics from one batch at a time.

A `MetricSet` holds named metric objects with ``update``/``compute``/``reset`` (torchmetrics
metrics, or your own), feeds them one batch of ``(scores, target)`` at a time and returns plain
floats. `scored_pairs` turns a batch of logits and labels into those pairs for a task
(classification, token classification, causal LM), dropping ignored positions. The metrics keep
exact sufficient statistics (counts, confusion matrices, sums of log-probabilities), so the
result over many batches equals the one ``compute_metrics`` gets from every logit at once, and
nothing grows with the number of samples.

`standard_metrics` builds the usual set with torchmetrics (``pip install
'hf-callbacks-plus[metrics]'``).

This module knows no trainer: `hf_callbacks_plus.callbacks.streaming_metrics.StreamingMetrics`
connects it to one.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any, Optional

from .._compat import require

__all__ = [
    "IGNORE_INDEX",
    "TASKS",
    "MetricSet",
    "classification_scores",
    "rank",
    "scored_pairs",
    "standard_metrics",
]

#: The tasks `scored_pairs` knows, with what the model's logits and the labels look like.
TASKS = {
    "classification": "logits [batch, classes], labels [batch]",
    "token_classification": "logits [batch, tokens, classes], labels [batch, tokens]",
    "causal_lm": "logits [batch, tokens, vocabulary], labels [batch, tokens] (the model shifts them)",
}

#: The label of positions no metric counts (transformers' padding and prompt label).
IGNORE_INDEX = -100


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


def scored_pairs(logits: Any, labels: Any, task: str, ignore_index: int = IGNORE_INDEX) -> tuple[Any, Any]:
    """One row of class scores per labelled position, and its label.

    Args:
        logits: The model's logits (a tensor or array; of a tuple, the first element).
        labels: The labels, as the model receives them.
        task: One of `TASKS`. ``"causal_lm"`` predicts position ``t + 1`` from ``t``, as the
            model's own loss does.
        ignore_index: Label of positions to leave out. Defaults to -100.

    Returns:
        ``(scores [n, classes], target [n])``: tensors of the labelled positions only.

    Raises:
        ValueError: The shapes do not fit the task.
    """
    import torch

    scores, target = _as_tensor(logits), _as_tensor(labels)
    if task == "classification":
        if scores.ndim != 2 or target.ndim != 1 or scores.shape[0] != target.shape[0]:
            raise ValueError(
                f"task='classification' needs logits [batch, classes] and labels [batch]; got "
                f"logits {tuple(scores.shape)} and labels {tuple(target.shape)}."
            )
    else:
        if scores.ndim != 3 or target.ndim != 2 or tuple(scores.shape[:2]) != tuple(target.shape):
            raise ValueError(
                f"task={task!r} needs logits [batch, tokens, classes] and labels [batch, tokens]; "
                f"got logits {tuple(scores.shape)} and labels {tuple(target.shape)}."
            )
        if task == "causal_lm":  # position t predicts label t + 1: compare without copying the logits
            target = torch.cat([target[:, 1:], torch.full_like(target[:, :1], ignore_index)], dim=1)
        scores, target = scores.reshape(-1, scores.shape[-1]), target.reshape(-1)
    keep = target != ignore_index
    if not bool(keep.all()):  # one copy, of the labelled rows only
        rows = keep.nonzero().squeeze(1)
        scores, target = scores.index_select(0, rows), target.index_select(0, rows)
    return scores, target.long()


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

    def update(self, scores: Any, target: Any, *, replicated: bool = False) -> None:
        """Add one batch (``scores [n, classes]``, ``target [n]``; n may be 0).

        Args:
            scores: Class scores (logits or probabilities), one row per labelled position.
            target: The labels.
            replicated: Every rank of a distributed run holds this same batch (the Trainer's
                gathered evaluation batch). Then only rank 0 counts it in the metrics that
                synchronise across ranks (torchmetrics), so their totals count it once; the
                others count it on every rank. Defaults to False (each rank its own batch).
        """
        if len(target) == 0:
            return
        skip_synced = replicated and rank() != 0
        for metric in self.metrics.values():
            if not (skip_synced and _synchronises(metric)):
                metric.update(scores, target)
        self.updates += 1

    def compute(self) -> dict[str, float]:
        """Every metric's value as floats (see `_to_floats` for vectors and matrices)."""
        out: dict[str, float] = {}
        for name, metric in self.metrics.items():
            out.update(_to_floats(name, metric.compute()))
        return out

    def reset(self) -> None:
        """Forget every batch."""
        for metric in self.metrics.values():
            metric.reset()
        self.updates = 0


def _synchronises(metric: Any) -> bool:
    """A torchmetrics metric: ``compute()`` sums its state over the ranks."""
    return callable(getattr(metric, "sync", None)) and hasattr(metric, "dist_sync_fn")


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
        ``confusion_<label>_<prediction>``), over labelled positions only. causal LM:
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
            log_probs = torch.log_softmax(scores.double(), dim=-1)
            self.nll += -log_probs.gather(1, target.unsqueeze(1)).sum()
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
            predicted = scores.argmax(dim=-1) if scores.ndim == target.ndim + 1 else scores
            if int(target.max()) >= self.num_classes or int(target.min()) < 0:
                raise ValueError(
                    f"ClassificationCounts: labels must be in [0, {self.num_classes}), got "
                    f"{int(target.min())}..{int(target.max())} (num_classes={self.num_classes})."
                )
            pairs = target.long() * self.num_classes + predicted.long()
            self.confusion += torch.bincount(pairs, minlength=self.num_classes**2).reshape(
                self.num_classes, self.num_classes
            )

        def compute(self) -> Any:
            return classification_scores(self.confusion.cpu().numpy())

    _CLASSES.update(token_accuracy=TokenAccuracy, perplexity=Perplexity, classification=ClassificationCounts)
    return _CLASSES
