"""StreamingMetrics under ``torchrun --nproc_per_node 2`` (CPU, gloo): evaluation metrics equal the
single-process reference over the whole eval set (the uneven last batch counted once), training
metrics cover both ranks' micro-batches of each window, the same on every rank; predictions
written once, by rank 0."""

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


def two_ranks_stream_metrics(out: Path) -> None:
    """StreamingMetrics in a stock Trainer. Each rank records the logits and labels of its own
    training forward passes and writes them, its log history and (rank 0) the final model."""
    from transformers import Trainer

    from hf_callbacks_plus import run_before_integrations
    from hf_callbacks_plus.callbacks.streaming_metrics import StreamingMetrics
    from tests.tiny_models import training_args

    rank = int(os.environ["RANK"])
    model = TinyClassifier()
    recorded = []

    def record(module, args, kwargs, output):
        if module.training:
            recorded.append((output["logits"].detach().tolist(), kwargs["labels"].tolist()))

    model.register_forward_hook(record, with_kwargs=True)
    args = training_args(out, per_device_train_batch_size=4, per_device_eval_batch_size=4, max_steps=5,
                         logging_steps=2, eval_strategy="steps", eval_steps=5, learning_rate=0.05,
                         ddp_backend="gloo", gradient_accumulation_steps=1)
    trainer = Trainer(model=model, args=args, train_dataset=classification_rows(40, seed=1),
                      eval_dataset=classification_rows(30, seed=2),
                      callbacks=[StreamingMetrics(task="classification", num_classes=3,
                                                  save_predictions=True)])
    run_before_integrations(trainer)
    trainer.train()
    if rank == 0:
        torch.save(model.state_dict(), out / "final.pt")
    outcome = {"rank": rank, "log_history": trainer.state.log_history, "recorded": recorded}
    (out / f"outcome-rank{rank}.json").write_text(json.dumps(outcome), encoding="utf-8")


@pytest.mark.distributed(scenario=two_ranks_stream_metrics)
def test_two_ranks_count_every_example_once(distributed_outcome):
    tmp_path = distributed_outcome.dir
    outcomes = [json.loads((tmp_path / f"outcome-rank{rank}.json").read_text()) for rank in (0, 1)]

    def same_on_every_rank(record):  # timings, and the Trainer's own per-rank train_loss, differ
        return {
            k: v
            for k, v in record.items()
            if not any(t in k for t in ("runtime", "per_second", "train_loss"))
        }

    assert [same_on_every_rank(r) for r in outcomes[0]["log_history"]] == [
        same_on_every_rank(r) for r in outcomes[1]["log_history"]
    ]

    # training: each logged window holds both ranks' micro-batches (2 steps x 2 ranks x 4 rows)
    records = [r for r in outcomes[0]["log_history"] if "loss" in r]
    assert len(records) == 2
    for index, record in enumerate(records):
        batches = [b for outcome in outcomes for b in outcome["recorded"][2 * index : 2 * index + 2]]
        expected = reference_values(
            np.concatenate([np.array(b[0]) for b in batches]),
            np.concatenate([np.array(b[1]) for b in batches]),
            "classification",
            3,
        )
        assert sum(v for k, v in record.items() if k.startswith("confusion_")) == 16
        assert_same_metrics(record, expected, prefix="")

    # evaluation: the 30 rows once each (the last gathered batch holds 6, not 8)
    model = TinyClassifier()
    model.load_state_dict(torch.load(tmp_path / "final.pt"))
    rows = classification_rows(30, seed=2)
    with torch.no_grad():  # in the ranks' batches of 4 rows, so the logits are bit for bit theirs
        logits = np.concatenate(
            [
                model(torch.stack([r["features"] for r in rows[i : i + 4]]))["logits"].numpy()
                for i in range(0, 30, 4)
            ]
        )
    labels = np.array([int(r["labels"]) for r in rows])
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
