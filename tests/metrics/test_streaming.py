"""hf_callbacks_plus.metrics.streaming without a trainer: exact against scikit-learn and numpy
over every batch split, the shapes each task takes, the errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchmetrics")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hf_callbacks_plus.metrics.streaming import (  # noqa: E402
    CHUNK_ELEMENTS,
    MetricSet,
    classification_scores,
    log_normalizers,
    scored_pairs,
    standard_metrics,
    top_classes,
)
from tests.streaming_reference import reference_values  # noqa: E402


def streamed(task, logits, labels, splits, num_classes=None):
    """The metrics of `standard_metrics` fed in the given batch splits."""
    metrics = MetricSet(standard_metrics(task, num_classes))
    start = 0
    for end in [*splits, len(labels)]:
        if end > start:
            metrics.update(
                *scored_pairs(torch.as_tensor(logits[start:end]), torch.as_tensor(labels[start:end]), task)
            )
        start = end
    return metrics.compute()


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 60),
    classes=st.integers(2, 6),
    cuts=st.lists(st.integers(0, 60), max_size=5),
)
def test_classification_equals_sklearn_for_any_batch_split(seed, n, classes, cuts):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, classes)).astype(np.float32)
    labels = rng.integers(0, classes, size=n)
    if seed % 3 == 0:  # some classes never predicted, some never labelled: zero divisions
        logits[:, 0] -= 10
        labels[labels == classes - 1] = 0
    ours = streamed("classification", logits, labels, sorted(c for c in cuts if c < n), classes)
    assert ours == reference_values(logits, labels, "classification", classes)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 12),
    length=st.integers(2, 7),
    cuts=st.lists(st.integers(0, 12), max_size=3),
)
def test_token_tasks_equal_numpy_for_any_batch_split(seed, n, length, cuts):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 5, size=(n, length))
    labels[rng.random(size=labels.shape) < 0.3] = -100
    logits = rng.normal(size=(n, length, 5)).astype(np.float32)
    splits = sorted(c for c in cuts if c < n)
    tagging = streamed("token_classification", logits, labels, splits, 5)
    if (labels == -100).all():  # nothing labelled: no value, said as NaN (sklearn refuses empty input)
        assert math.isnan(tagging["accuracy"]) and tagging["confusion_0_0"] == 0.0
        return
    assert tagging == reference_values(logits, labels, "token_classification", 5)
    lm = streamed("causal_lm", logits, labels, splits)
    expected = reference_values(logits, labels, "causal_lm")
    if math.isnan(lm["token_accuracy"]):  # no labelled next token at all
        assert (labels[:, 1:] == -100).all()
        return
    assert lm["token_accuracy"] == expected["token_accuracy"]
    assert math.isclose(lm["perplexity"], expected["perplexity"], rel_tol=1e-12)


def test_classification_scores_by_hand():
    # rows labels, columns predictions: class 2 is never labelled nor predicted (left out of macro)
    scores = classification_scores([[3, 1, 0], [2, 4, 0], [0, 0, 0]])
    assert scores["accuracy"] == 7 / 10
    assert scores["precision_macro"] == (3 / 5 + 4 / 5) / 2
    assert scores["recall_macro"] == (3 / 4 + 4 / 6) / 2
    assert scores["f1_macro"] == (6 / 9 + 8 / 11) / 2
    assert scores["f1_micro"] == scores["accuracy"]
    assert scores["confusion_1_0"] == 2.0


def test_scored_pairs_shapes_and_ignored_positions():
    logits = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    labels = torch.tensor([[1, -100, 2], [0, 3, -100]])
    scores, target = scored_pairs(logits, labels, "token_classification")
    assert target.tolist() == [1, 2, 0, 3] and scores.shape == (4, 4)
    scores, target = scored_pairs(logits, labels, "causal_lm")  # position t predicts t + 1
    assert target.tolist() == [2, 3] and torch.equal(scores, torch.stack([logits[0, 1], logits[1, 0]]))
    scores, target = scored_pairs(
        (torch.zeros(2, 3), "hidden states"), torch.tensor([0, 2]), "classification"
    )
    assert scores.shape == (2, 3)
    with pytest.raises(ValueError, match=r"task='classification' needs logits \[batch, classes\]"):
        scored_pairs(logits, labels, "classification")
    with pytest.raises(ValueError, match=r"task='causal_lm' needs logits \[batch, tokens, classes\]"):
        scored_pairs(torch.zeros(2, 3), torch.tensor([0, 1]), "causal_lm")


def test_metric_set_errors_and_names():
    with pytest.raises(ValueError, match="at least one metric"):
        MetricSet({})
    with pytest.raises(TypeError, match="metric 'f1' .* has no update"):
        MetricSet({"f1": object()})
    with pytest.raises(ValueError, match="needs num_classes, an int >= 2, got 1"):
        standard_metrics("classification", 1)
    with pytest.raises(ValueError, match="labels must be in \\[0, 3\\)"):
        MetricSet(standard_metrics("classification", 3)).update(torch.zeros(1, 3), torch.tensor([3]))
    from torchmetrics.classification import MulticlassAUROC

    single = MetricSet(MulticlassAUROC(num_classes=3))
    assert single.names == ["multiclass_auroc"]


def test_token_accuracy_breaks_ties_like_argmax():
    """Integer logits tie often: a label that shares the maximum with an earlier index is wrong,
    as ``argmax`` (first maximum) says, and right when it is the first maximum."""
    rng = np.random.default_rng(0)
    logits = rng.integers(0, 3, size=(6, 20, 7)).astype(np.float32)
    labels = rng.integers(0, 7, size=(6, 20))
    ours = streamed("causal_lm", logits, labels, [2, 3])
    assert ours["token_accuracy"] == reference_values(logits, labels, "causal_lm")["token_accuracy"]
    scores = torch.tensor([[1.0, 1.0, 0.0], [0.0, 2.0, 2.0]])
    metrics = MetricSet({"acc": standard_metrics("causal_lm")["token_accuracy"]})
    metrics.update(scores, torch.tensor([1, 1]))  # row 0: tie, first max is 0 -> wrong; row 1: right
    assert metrics.compute() == {"acc": 0.5}


def test_float64_results_block_by_block_equal_numpy():
    """log-normalisers and top-class probabilities over rows spanning several float64 blocks
    equal numpy's float64 softmax over all of them; one column is a binary logit (sigmoid)."""
    rng = np.random.default_rng(1)
    vocabulary = 32_000
    rows = 2 * (CHUNK_ELEMENTS // vocabulary) + 3  # three blocks, the last one short
    scores = rng.normal(scale=4, size=(rows, vocabulary)).astype(np.float32)
    wide = scores.astype(np.float64)
    expected = wide.max(-1) + np.log(np.exp(wide - wide.max(-1, keepdims=True)).sum(-1))
    np.testing.assert_allclose(log_normalizers(torch.from_numpy(scores)).numpy(), expected, rtol=1e-14)
    predicted, probability = top_classes(torch.from_numpy(scores).reshape(1, rows, vocabulary))
    assert predicted.shape == probability.shape == (1, rows)
    assert predicted[0].tolist() == scores.argmax(-1).tolist()
    np.testing.assert_allclose(probability[0].numpy(), np.exp(wide.max(-1) - expected), rtol=1e-12)

    logit = torch.tensor([[-2.0], [0.0], [3.0]])
    predicted, probability = top_classes(logit)
    assert predicted.tolist() == [0, 0, 1]  # 0 is not > 0: class 0, like sklearn and sigmoid > 0.5
    np.testing.assert_allclose(probability.numpy(), [1 - 1 / (1 + np.exp(2)), 0.5, 1 / (1 + np.exp(-3))])


@pytest.mark.parametrize("width", [1, 2, 4])
def test_classification_counts_refuse_scores_of_another_width(width):
    metrics = MetricSet(standard_metrics("classification", 3))
    message = rf"scores \(5, {width}\) .* {width} class scores per row, but num_classes=3"
    with pytest.raises(ValueError, match=message):
        metrics.update(torch.zeros(5, width), torch.tensor([0, 1, 2, 0, 1]))
    binary = MetricSet(standard_metrics("classification", 2))
    binary.update(torch.tensor([[-1.0], [2.0], [0.5]]), torch.tensor([0, 1, 0]))
    assert binary.compute()["confusion_0_1"] == 1.0 and binary.compute()["accuracy"] == 2 / 3
