"""StreamingMetrics under ``torchrun --nproc_per_node 2`` (CPU, gloo; two scenarios of the
suite's one launch, tests/distributed.py): evaluation metrics equal the single-process reference
over the whole eval set (the uneven last batch counted once), training metrics cover both ranks'
micro-batches of each window, the same on every rank; predictions written once, by rank 0. With
the default metrics (sum states) and with the docs' MulticlassAUROC (list states) beside a
metric with max and min states."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.streaming_reference import assert_same_metrics, reference_values
from tests.tiny_models import TinyClassifier, classification_rows

pytestmark = [pytest.mark.transformers]
pytest.importorskip("torchmetrics")
from sklearn.metrics import roc_auc_score  # noqa: E402
from torchmetrics import Metric  # noqa: E402
from torchmetrics.utilities import dim_zero_cat  # noqa: E402


def record_training_passes(model) -> list:
    """The list that receives ``(logits, labels)`` of each of the model's training forward passes."""
    recorded = []

    def record(module, args, kwargs, output):
        if module.training:
            recorded.append((output["logits"].detach().tolist(), kwargs["labels"].tolist()))

    model.register_forward_hook(record, with_kwargs=True)
    return recorded


def train_and_evaluate(out: Path, streaming) -> None:
    """``streaming`` in a stock Trainer: 40 train rows, 30 eval rows in batches of 4 per rank
    (uneven shards: the last gathered eval batch holds 6 rows, not 8). Each rank records the
    logits and labels of its own training forward passes and writes them, its log history and
    (rank 0) the final model."""
    from transformers import Trainer

    from hf_callbacks_plus import run_before_integrations
    from tests.tiny_models import training_args

    rank = int(os.environ["RANK"])
    model = TinyClassifier()
    recorded = record_training_passes(model)
    args = training_args(out, per_device_train_batch_size=4, per_device_eval_batch_size=4, max_steps=5,
                         logging_steps=2, eval_strategy="steps", eval_steps=5, learning_rate=0.05,
                         ddp_backend="gloo", gradient_accumulation_steps=1)
    trainer = Trainer(model=model, args=args, train_dataset=classification_rows(40, seed=1),
                      eval_dataset=classification_rows(30, seed=2), callbacks=[streaming])
    run_before_integrations(trainer)
    trainer.train()
    if rank == 0:
        torch.save(model.state_dict(), out / "final.pt")
    outcome = {"rank": rank, "log_history": trainer.state.log_history, "recorded": recorded}
    (out / f"outcome-rank{rank}.json").write_text(json.dumps(outcome), encoding="utf-8")


def outcomes_of(folder):
    """Both ranks' outcomes; their log histories agree (but timings and per-rank train_loss)."""
    outcomes = [json.loads((folder / f"outcome-rank{rank}.json").read_text()) for rank in (0, 1)]

    def same_on_every_rank(record):
        return {
            k: v
            for k, v in record.items()
            if not any(t in k for t in ("runtime", "per_second", "train_loss"))
        }

    assert [same_on_every_rank(r) for r in outcomes[0]["log_history"]] == [
        same_on_every_rank(r) for r in outcomes[1]["log_history"]
    ]
    return outcomes


def window(outcomes, index):
    """The training forward passes of logging window ``index`` (2 steps) on both ranks."""
    batches = [b for outcome in outcomes for b in outcome["recorded"][2 * index : 2 * index + 2]]
    logits = np.concatenate([np.array(b[0]) for b in batches])
    return logits, np.concatenate([np.array(b[1]) for b in batches])


def eval_logits(folder):
    """The final model's logits of the 30 eval rows, in the ranks' batches of 4 rows (so bit for
    bit theirs), and the labels."""
    model = TinyClassifier()
    model.load_state_dict(torch.load(folder / "final.pt"))
    rows = classification_rows(30, seed=2)
    with torch.no_grad():
        logits = np.concatenate(
            [
                model(torch.stack([r["features"] for r in rows[i : i + 4]]))["logits"].numpy()
                for i in range(0, 30, 4)
            ]
        )
    return logits, np.array([int(r["labels"]) for r in rows])


def two_ranks_stream_metrics(out: Path) -> None:
    """The default metrics (a confusion matrix: sum states) and a predictions file."""
    from hf_callbacks_plus.callbacks.streaming_metrics import StreamingMetrics

    train_and_evaluate(out, StreamingMetrics(task="classification", num_classes=3, save_predictions=True))


@pytest.mark.distributed(scenario=two_ranks_stream_metrics)
def test_two_ranks_count_every_example_once(distributed_outcome):
    tmp_path = distributed_outcome.dir
    outcomes = outcomes_of(tmp_path)

    # training: each logged window holds both ranks' micro-batches (2 steps x 2 ranks x 4 rows)
    records = [r for r in outcomes[0]["log_history"] if "loss" in r]
    assert len(records) == 2
    for index, record in enumerate(records):
        expected = reference_values(*window(outcomes, index), "classification", 3)
        assert sum(v for k, v in record.items() if k.startswith("confusion_")) == 16
        assert_same_metrics(record, expected, prefix="")

    # evaluation: the 30 rows once each (the last gathered batch holds 6, not 8)
    logits, labels = eval_logits(tmp_path)
    evaluation = next(r for r in outcomes[0]["log_history"] if "eval_accuracy" in r)
    assert sum(v for k, v in evaluation.items() if k.startswith("eval_confusion_")) == 30
    expected = reference_values(logits, labels, "classification", 3)
    assert_same_metrics(evaluation, expected)

    files = sorted((tmp_path / "predictions").iterdir())
    assert [f.name for f in files] == ["eval-step-5.jsonl"]
    predictions = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert [p["id"] for p in predictions] == list(range(30))
    assert [p["label"] for p in predictions] == labels.tolist()
    assert [p["prediction"] for p in predictions] == logits.argmax(-1).tolist()


class ScoreRange(Metric):
    """The largest and the smallest score seen: states reduced across ranks by max and by min."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("high", default=torch.tensor(float("-inf")), dist_reduce_fx="max")
        self.add_state("low", default=torch.tensor(float("inf")), dist_reduce_fx="min")

    def update(self, scores: torch.Tensor, target: torch.Tensor) -> None:
        self.high = torch.maximum(self.high, scores.max())
        self.low = torch.minimum(self.low, scores.min())

    def compute(self) -> dict[str, torch.Tensor]:
        return {"max_score": self.high, "min_score": self.low}


def two_ranks_stream_list_max_min_states(out: Path) -> None:
    """The docs' MulticlassAUROC (list states) and `ScoreRange` (max and min states)."""
    from torchmetrics.classification import MulticlassAUROC

    from hf_callbacks_plus.callbacks.streaming_metrics import StreamingMetrics

    metrics = {"auroc": MulticlassAUROC(num_classes=3), "range": ScoreRange()}
    train_and_evaluate(out, StreamingMetrics(metrics, task="classification"))


def list_state_reference(logits, labels):
    """scikit-learn's one-vs-rest macro AUROC (MulticlassAUROC's definition) and numpy's max/min."""
    wide = logits.astype(np.float64)
    probabilities = np.exp(wide - wide.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    auroc = roc_auc_score(labels, probabilities, multi_class="ovr", average="macro")
    return {"auroc": auroc, "max_score": float(logits.max()), "min_score": float(logits.min())}


@pytest.mark.distributed(scenario=two_ranks_stream_list_max_min_states)
def test_list_max_and_min_states_under_two_ranks(distributed_outcome):
    """Evaluation over the 30 rows and each training window over both ranks' micro-batches equal
    scikit-learn and numpy."""
    folder = distributed_outcome.dir
    outcomes = outcomes_of(folder)
    records = [r for r in outcomes[0]["log_history"] if "loss" in r]
    assert len(records) == 2
    for index, record in enumerate(records):
        for name, value in list_state_reference(*window(outcomes, index)).items():
            assert record[name] == pytest.approx(value, rel=1e-6, abs=1e-6), (index, name)
    evaluation = next(r for r in outcomes[0]["log_history"] if "eval_auroc" in r)
    for name, value in list_state_reference(*eval_logits(folder)).items():
        assert evaluation[f"eval_{name}"] == pytest.approx(value, rel=1e-6, abs=1e-6), name


class LabelledScores(Metric):
    """List states of two shapes and dtypes: each row's scores ``[n, classes]`` (float) and its
    label ``[n]`` (integer); computes the mean score of the labelled class and the row count."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("scores", default=[], dist_reduce_fx="cat")
        self.add_state("labels", default=[], dist_reduce_fx="cat")

    def update(self, scores: torch.Tensor, target: torch.Tensor) -> None:
        self.scores.append(scores.detach().float())
        self.labels.append(target.detach().long())

    def compute(self) -> dict[str, torch.Tensor]:
        scores, labels = dim_zero_cat(self.scores), dim_zero_cat(self.labels)  # lists, or gathered
        label_score = scores.gather(1, labels.unsqueeze(1)).mean()
        return {"label_score": label_score, "rows": torch.tensor(len(labels))}


class UnlabelledTolerantClassifier(TinyClassifier):
    """TinyClassifier whose loss is 0 (not NaN) for a batch without any labelled row."""

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        logits = self.linear(features)
        if labels is None:
            return {"logits": logits}
        loss = torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
        return {"loss": loss / (labels != -100).sum().clamp(min=1), "logits": logits}


def two_ranks_list_states_with_empty_windows(out: Path) -> None:
    """List-state metrics in training when a rank has no labelled row in a logging window: rank 1
    in the first window (steps 1-2), both ranks in the second (steps 3-4), none in the third."""
    from transformers import Trainer, default_data_collator

    from hf_callbacks_plus import run_before_integrations
    from hf_callbacks_plus.callbacks.streaming_metrics import StreamingMetrics
    from tests.tiny_models import training_args

    rank = int(os.environ["RANK"])
    batches = []

    def collate(rows):
        batch = default_data_collator(rows)
        step = len(batches) + 1
        if (rank == 1 and step <= 2) or step in (3, 4):
            batch["labels"] = torch.full_like(batch["labels"], -100)
        batches.append(batch["labels"].tolist())
        return batch

    model = UnlabelledTolerantClassifier()
    recorded = record_training_passes(model)
    streaming = StreamingMetrics({"scored": LabelledScores()}, task="classification")
    args = training_args(out, per_device_train_batch_size=4, max_steps=6, logging_steps=2,
                         learning_rate=0.05, ddp_backend="gloo", gradient_accumulation_steps=1)
    trainer = Trainer(model=model, args=args, train_dataset=classification_rows(48, seed=3),
                      data_collator=collate, callbacks=[streaming])
    run_before_integrations(trainer)
    trainer.train()
    outcome = {"rank": rank, "log_history": trainer.state.log_history, "recorded": recorded}
    (out / f"outcome-rank{rank}.json").write_text(json.dumps(outcome), encoding="utf-8")


@pytest.mark.distributed(scenario=two_ranks_list_states_with_empty_windows)
def test_list_states_when_a_rank_or_every_rank_has_no_labelled_row(distributed_outcome):
    """A window with rows on rank 0 only is computed over them; a window without any labelled row
    adds no metric (as in one process); the rest is exact."""
    outcomes = outcomes_of(distributed_outcome.dir)
    records = [r for r in outcomes[0]["log_history"] if "loss" in r]
    assert len(records) == 3
    for index, record in enumerate(records):
        logits, labels = window(outcomes, index)
        logits, labels = logits[labels != -100], labels[labels != -100]
        if index == 1:
            assert len(labels) == 0 and "label_score" not in record and "rows" not in record, record
            continue
        assert record["rows"] == len(labels) == (8 if index == 0 else 16)  # rank 0 only, then both
        expected = float(np.mean(logits[np.arange(len(labels)), labels]))
        assert record["label_score"] == pytest.approx(expected, rel=1e-6, abs=1e-6), index
