"""``batch_eval_metrics`` in the lightweight loop, side by side with transformers.Trainer, and
StreamingMetrics in the loop against the reference compute_metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("torchmetrics")

from transformers import Trainer  # noqa: E402

from hf_callbacks_plus import LightweightTrainer, LoopArguments  # noqa: E402
from hf_callbacks_plus.callbacks.streaming_metrics import StreamingMetrics  # noqa: E402
from tests.streaming_reference import assert_same_metrics, reference_values  # noqa: E402
from tests.tiny_models import TinyClassifier, classification_rows, training_args  # noqa: E402


def batches(rows, size):
    return [
        {key: torch.stack([row[key] for row in rows[i : i + size]]) for key in rows[0]}
        for i in range(0, len(rows), size)
    ]


@pytest.mark.compat
@pytest.mark.parametrize("batch_eval_metrics", [False, True])
def test_metrics_calls_are_those_of_transformers(batch_eval_metrics, tmp_path):
    """The same evaluation data: the loop calls metrics_fn with the batches and compute_result
    flags transformers calls compute_metrics with."""
    rows = classification_rows(30, seed=2)
    theirs, ours = [], []

    def recording(calls):
        if batch_eval_metrics:

            def compute(prediction, compute_result=False):
                labels = prediction.label_ids if hasattr(prediction, "label_ids") else prediction[0]["labels"]
                calls.append((len(labels), compute_result))
                return {"n": float(sum(size for size, _ in calls))} if compute_result else {}
        else:

            def compute(prediction):
                size = (
                    len(prediction.label_ids)
                    if hasattr(prediction, "label_ids")
                    else sum(len(output["labels"]) for output in prediction)
                )
                calls.append((size, None))
                return {"n": float(size)}

        return compute

    stock = Trainer(
        model=TinyClassifier(),
        args=training_args(tmp_path, per_device_eval_batch_size=7, batch_eval_metrics=batch_eval_metrics),
        eval_dataset=rows,
        compute_metrics=recording(theirs),
    )
    expected = stock.evaluate()

    model = TinyClassifier()

    def eval_step(batch):
        with torch.no_grad():
            output = model(**batch)
        return {"loss": output["loss"], "logits": output["logits"], "labels": batch["labels"]}

    loop = LightweightTrainer(
        LoopArguments(
            output_dir=str(tmp_path / "loop"),
            batch_eval_metrics=batch_eval_metrics,
            per_device_eval_batch_size=7,
            disable_tqdm=True,
        ),
        eval_data=batches(rows, 7),
        eval_step=eval_step,
        metrics_fn=recording(ours),
    )
    metrics = loop.evaluate()
    assert ours == theirs
    assert metrics["eval_n"] == expected["eval_n"] == 30.0
    assert metrics["eval_loss"] == pytest.approx(expected["eval_loss"], rel=1e-6)


def test_streaming_metrics_in_the_loop(tmp_path):
    model = TinyClassifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    seen = []

    def train_step(batch):
        output = model(**batch)
        output["loss"].backward()
        seen.append((output["logits"].detach().clone().numpy(), batch["labels"].numpy()))
        return {"loss": output["loss"], "logits": output["logits"], "labels": batch["labels"]}

    def eval_step(batch):
        with torch.no_grad():
            output = model(**batch)
        return {"loss": output["loss"], "logits": output["logits"], "labels": batch["labels"]}

    callback = StreamingMetrics(task="classification", num_classes=3)
    eval_batches = batches(classification_rows(30, seed=2), 7)
    args = LoopArguments(
        output_dir=str(tmp_path),
        max_steps=10,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=10,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = LightweightTrainer(
        args,
        train_step,
        batches(classification_rows(40, seed=1), 4),
        model=model,
        optimizer=optimizer,
        eval_data=eval_batches,
        eval_step=eval_step,
        callbacks=[callback],
    )
    assert args.batch_eval_metrics is True  # switched on at bind: nothing else needs the outputs
    trainer.train()

    records = [r for r in trainer.state.log_history if "loss" in r]
    assert len(records) == 5
    for index, record in enumerate(records):
        window = seen[2 * index : 2 * index + 2]
        expected = reference_values(
            np.concatenate([w[0] for w in window]),
            np.concatenate([w[1] for w in window]),
            "classification",
            3,
        )
        assert_same_metrics(record, expected, prefix="")

    final = [eval_step(batch) for batch in eval_batches]
    expected = reference_values(
        np.concatenate([o["logits"].numpy() for o in final]),
        np.concatenate([o["labels"].numpy() for o in final]),
        "classification",
        3,
    )
    evaluation = next(r for r in trainer.state.log_history if "eval_accuracy" in r)
    assert_same_metrics(evaluation, expected)
