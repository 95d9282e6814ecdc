"""The ground truth of the streaming-metrics tests: a plain ``compute_metrics`` over every
prediction at once, written with scikit-learn and numpy as a user would write it, and
independent of ``hf_callbacks_plus.metrics.streaming``."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support


def labelled(logits: Any, labels: Any, task: str) -> tuple[np.ndarray, np.ndarray]:
    """Flatten to ``(scores [n, classes], labels [n])`` of labelled positions (causal LM shifted)."""
    logits = np.asarray(logits[0] if isinstance(logits, tuple) else logits, dtype=np.float64)
    labels = np.asarray(labels)
    if task == "causal_lm":
        logits, labels = logits[:, :-1], labels[:, 1:]
    logits, labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    keep = labels != -100
    return logits[keep], labels[keep]


def reference_values(logits: Any, labels: Any, task: str, num_classes: int | None = None) -> dict[str, float]:
    """What a user's non-streaming ``compute_metrics`` returns for these predictions."""
    scores, target = labelled(logits, labels, task)
    predicted = scores.argmax(axis=-1)
    if task == "causal_lm":
        shifted = scores - scores.max(axis=-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
        nll = -log_probs[np.arange(len(target)), target]
        return {
            "token_accuracy": float(np.mean(predicted == target)),
            "perplexity": math.exp(float(nll.mean())),
        }
    out = {"accuracy": float(accuracy_score(target, predicted))}
    for average in ("micro", "macro"):
        precision, recall, f1, _ = precision_recall_fscore_support(
            target, predicted, average=average, zero_division=0
        )
        out.update(
            {
                f"precision_{average}": float(precision),
                f"recall_{average}": float(recall),
                f"f1_{average}": float(f1),
            }
        )
    counts = confusion_matrix(target, predicted, labels=list(range(num_classes)))
    for label in range(num_classes):
        for prediction in range(num_classes):
            out[f"confusion_{label}_{prediction}"] = float(counts[label, prediction])
    return out


def reference_compute_metrics(task: str, num_classes: int | None = None) -> Callable[[Any], dict[str, float]]:
    """A stock ``compute_metrics`` (every logit at once) for ``task``."""

    def compute_metrics(eval_pred: Any) -> dict[str, float]:
        return reference_values(eval_pred.predictions, eval_pred.label_ids, task, num_classes)

    return compute_metrics


def assert_same_metrics(ours: dict[str, Any], reference: dict[str, Any], prefix: str = "eval") -> None:
    """Every reference metric is in ``ours`` under ``<prefix>_``: equal, and for the perplexity (a
    float64 sum in another order) within 1e-12 relative."""
    for name, value in reference.items():
        key = f"{prefix}_{name}" if prefix else name
        assert key in ours, f"{key} missing from {sorted(ours)}"
        if name == "perplexity":
            assert math.isclose(ours[key], value, rel_tol=1e-12), (key, ours[key], value)
        else:
            assert ours[key] == value, (key, ours[key], value)
