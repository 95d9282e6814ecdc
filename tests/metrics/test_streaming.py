"""hf_callbacks_plus.metrics.streaming without a trainer: exact against scikit-learn and numpy
over every batch split, the shapes each task takes, the errors."""

from __future__ import annotations

import itertools
import math
from unittest import mock

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchmetrics")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hf_callbacks_plus.metrics import streaming  # noqa: E402
from hf_callbacks_plus.metrics.streaming import (  # noqa: E402
    CHUNK_ELEMENTS,
    MetricSet,
    classification_scores,
    labelled_blocks,
    log_normalizers,
    scored_pairs,
    standard_metrics,
    top_classes,
)
from tests.streaming_reference import reference_values  # noqa: E402


def streamed(task, logits, labels, splits, num_classes=None, blocks=False):
    """The metrics of `standard_metrics` fed in the given batch splits (each batch as `scored_pairs`,
    or as `labelled_blocks`)."""
    metrics = MetricSet(standard_metrics(task, num_classes))
    start = 0
    for end in [*splits, len(labels)]:
        if end > start:
            batch = torch.as_tensor(logits[start:end]), torch.as_tensor(labels[start:end])
            for scores, target in labelled_blocks(*batch, task) if blocks else [scored_pairs(*batch, task)]:
                metrics.update(scores, target)
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


def labelled_runs(labels, task):
    """The lengths of the runs of consecutive labelled positions, counted in plain Python over the
    flattened labels (causal LM: the labels shifted by one, each row's last position unlabelled)."""
    if task == "causal_lm":
        labels = np.concatenate([labels[:, 1:], np.full_like(labels[:, :1], -100)], axis=1)
    flat = labels.reshape(-1).tolist()
    return [len(list(run)) for labelled, run in itertools.groupby(flat, key=lambda x: x != -100) if labelled]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 8),
    length=st.integers(2, 9),
    classes=st.integers(2, 5),
    unlabelled=st.sampled_from([0.0, 0.2, 0.6, 1.0]),
    view_rows=st.integers(1, 5),
    cuts=st.lists(st.integers(0, 8), max_size=3),
)
def test_labelled_blocks_are_views_of_the_long_runs_and_give_the_same_metrics(
    seed, n, length, classes, unlabelled, view_rows, cuts
):
    """`labelled_blocks` holds the rows of `scored_pairs`; each run of labelled positions with at
    least `VIEW_ELEMENTS` scores is a view of the logits (no copy), the shorter runs one copy; the
    metrics fed block by block, in any batch split, equal numpy's and scikit-learn's."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=(n, length))
    labels[rng.random(size=labels.shape) < unlabelled] = -100
    logits = rng.normal(size=(n, length, classes)).astype(np.float32)
    splits = sorted(c for c in cuts if c < n)
    with mock.patch.object(streaming, "VIEW_ELEMENTS", view_rows * classes):
        for task in ("token_classification", "causal_lm"):
            scores_in, labels_in = torch.from_numpy(logits), torch.from_numpy(labels)
            blocks = labelled_blocks(scores_in, labels_in, task)
            scores, target = scored_pairs(scores_in, labels_in, task)

            def rows(pairs):
                return sorted((int(t), tuple(s)) for part, tags in pairs for s, t in zip(part.tolist(), tags))

            assert rows(blocks) == rows([(scores, target)])
            shared = scores_in.untyped_storage().data_ptr()
            views = [s for s, _ in blocks if s.untyped_storage().data_ptr() == shared]
            runs = labelled_runs(labels, task)
            everything = runs == [n * length]  # every position labelled: the batch itself
            assert len(views) == (1 if everything else sum(run >= view_rows for run in runs))
            assert len(blocks) - len(views) <= 1  # the short runs, copied together
            if not runs:
                continue
            ours = streamed(task, logits, labels, splits, classes, blocks=True)
            expected = reference_values(logits, labels, task, classes)
            if task == "causal_lm":
                assert ours["token_accuracy"] == expected["token_accuracy"]
                assert math.isclose(ours["perplexity"], expected["perplexity"], rel_tol=1e-12)
            else:
                assert ours == expected


def test_a_language_model_row_is_one_view_at_the_real_threshold():
    """At `VIEW_ELEMENTS` as shipped: each row of a causal LM (vocabulary 8192) labelled after a
    5-token prompt is one view; a tagger's short runs (9 classes) are one copy."""
    logits = torch.randn(3, 128, 8192)
    labels = torch.randint(0, 8192, (3, 128))
    labels[:, :5] = -100
    blocks = labelled_blocks(logits, labels, "causal_lm")
    assert [len(target) for _, target in blocks] == [123, 123, 123]  # positions 4..126 predict 5..127
    assert all(s.untyped_storage().data_ptr() == logits.untyped_storage().data_ptr() for s, _ in blocks)
    tags = torch.randint(0, 9, (3, 40))
    tags[:, ::3] = -100
    (scores, target), = labelled_blocks(torch.randn(3, 40, 9), tags, "token_classification")
    assert len(target) == 3 * 26


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
