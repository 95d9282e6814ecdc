"""StreamingMetrics in a real transformers.Trainer and TrainerPlus, side by side with a stock
``compute_metrics`` over every logit (tests/streaming_reference.py).

Matrix: task (classification, token classification, causal LM) x trainer (Trainer, TrainerPlus)
x how it meets the user's ``compute_metrics`` (alone and streaming; beside one that needs every
logit; beside one that streams too); training windows x gradient accumulation against the logits
recorded by the test's own forward hook; resume; several eval sets; the train subset; the
predictions files; the errors.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("torchmetrics")

from transformers import Trainer, TrainerCallback  # noqa: E402

from hf_callbacks_plus import TrainerPlus, TrainSubsetEvaluation, run_before_integrations  # noqa: E402
from hf_callbacks_plus.callbacks.streaming_metrics import StreamingMetrics  # noqa: E402
from tests.streaming_reference import assert_same_metrics, reference_compute_metrics, reference_values  # noqa: E402
from tests.tiny_models import (  # noqa: E402
    TinyClassifier,
    TinyTagger,
    classification_rows,
    lm_rows,
    tagging_rows,
    tiny_causal_lm,
    training_args,
)

#: task -> (model factory, rows factory, num_classes)
TASKS = {
    "classification": (lambda: TinyClassifier(3), classification_rows, 3),
    "token_classification": (lambda: TinyTagger(), tagging_rows, 4),
    "causal_lm": (tiny_causal_lm, lm_rows, None),
}


def build(
    task,
    tmp_path,
    *,
    trainer_class=Trainer,
    callbacks=(),
    compute_metrics=None,
    n_train=40,
    n_eval=30,
    eval_dataset=None,
    model=None,
    **overrides,
):
    make_model, make_rows, _ = TASKS[task]
    options = {
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 7,
        "learning_rate": 0.05,
        "num_train_epochs": 1,
        "logging_steps": 2,
    }
    options.update(overrides)
    trainer = trainer_class(
        model=model if model is not None else make_model(),
        args=training_args(tmp_path, **options),
        train_dataset=make_rows(n_train, seed=1),
        eval_dataset=eval_dataset or make_rows(n_eval, seed=2),
        compute_metrics=compute_metrics,
        callbacks=list(callbacks),
    )
    if trainer_class is Trainer:
        run_before_integrations(trainer)
    return trainer


def streaming(task, **kwargs):
    return StreamingMetrics(task=task, num_classes=TASKS[task][2], **kwargs)


def stock_metrics(task, tmp_path, **overrides):
    """The stock Trainer's evaluation with the reference compute_metrics (every logit at once)."""
    trainer = build(
        task, tmp_path / "stock", compute_metrics=reference_compute_metrics(task, TASKS[task][2]), **overrides
    )
    return trainer.evaluate()


def reference_keys(task):
    return reference_values(*_dummy(task), task, TASKS[task][2]).keys()


def _dummy(task):
    if task == "classification":
        return torch.zeros(2, 3).numpy(), torch.tensor([0, 1]).numpy()
    if task == "token_classification":
        return torch.zeros(1, 2, 4).numpy(), torch.tensor([[0, 1]]).numpy()
    return torch.zeros(1, 3, 5).numpy(), torch.tensor([[0, 1, 2]]).numpy()


def without(metrics, prefix="eval", task="classification"):
    """The reference metrics of ``task`` in ``metrics``, without their prefix."""
    return {name: metrics[f"{prefix}_{name}"] for name in reference_keys(task)}


@pytest.mark.compat
@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("trainer_class", [Trainer, TrainerPlus], ids=["Trainer", "TrainerPlus"])
@pytest.mark.parametrize("user", ["alone", "beside_full", "beside_streaming"])
def test_evaluation_equals_a_stock_compute_metrics(task, trainer_class, user, tmp_path):
    stock = stock_metrics(task, tmp_path)
    expected = {**without(stock, task=task), "loss": stock["eval_loss"]}
    calls = []

    def full(eval_pred):  # needs every logit: the Trainer must keep them
        calls.append(len(eval_pred.label_ids))
        return {"rows": float(len(eval_pred.label_ids))}

    def batched(eval_pred, compute_result=False):  # streams too
        calls.append(len(eval_pred.label_ids))
        return {"rows": float(sum(calls))} if compute_result else {}

    user_fn = {"alone": None, "beside_full": full, "beside_streaming": batched}[user]
    overrides = {"batch_eval_metrics": True} if user == "beside_streaming" else {}
    trainer = build(
        task,
        tmp_path / "ours",
        trainer_class=trainer_class,
        callbacks=[streaming(task)],
        compute_metrics=user_fn,
        **overrides,
    )
    assert trainer.args.batch_eval_metrics is (user != "beside_full")
    metrics = trainer.evaluate()

    assert_same_metrics(
        metrics, without(expected and {f"eval_{k}": v for k, v in expected.items()}, task=task)
    )
    assert metrics["eval_loss"] == pytest.approx(expected["loss"], rel=1e-6)
    if user == "beside_full":
        assert calls == [30] and metrics["eval_rows"] == 30.0
    elif user == "beside_streaming":
        assert calls == [7, 7, 7, 7, 2] and metrics["eval_rows"] == 30.0


class ForwardRecorder:
    """The test's own record of every training forward pass: (logits, labels) per micro-batch."""

    def __init__(self, model):
        self.batches = []
        model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output):
        if module.training:
            self.batches.append((output["logits"].detach().clone().numpy(), kwargs["labels"].clone().numpy()))


def window_reference(batches, task, num_classes):
    """The reference metrics over a window of micro-batches (sequences of one length)."""
    import numpy as np

    logits = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    return reference_values(logits, labels, task, num_classes)


@pytest.mark.compat
@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("accumulation", [1, 2])
def test_training_metrics_cover_each_logging_window(task, accumulation, tmp_path):
    callback = streaming(task)
    trainer = build(
        task, tmp_path, callbacks=[callback], gradient_accumulation_steps=accumulation, logging_steps=2
    )
    recorder = ForwardRecorder(trainer.model)
    trainer.train()

    records = [r for r in trainer.state.log_history if "loss" in r]
    assert len(records) == (10 // accumulation) // 2
    per_window = 2 * accumulation
    for index, record in enumerate(records):
        window = recorder.batches[index * per_window : (index + 1) * per_window]
        expected = window_reference(window, task, TASKS[task][2])
        if task == "causal_lm":  # default training metrics of a causal LM: token accuracy only
            expected = {"token_accuracy": expected["token_accuracy"]}
            assert "perplexity" not in record
        assert_same_metrics(record, expected, prefix="")
    assert callback._hook is None  # removed at train end


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


@pytest.mark.compat
def test_training_metrics_resume_like_the_loss(tmp_path, monkeypatch):
    """A resumed run logs, after the checkpoint, the same training and evaluation metrics as the
    uninterrupted run (windows start at the resume point, like the Trainer's loss)."""
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # transformers < 4.47 with torch >= 2.6
    options = {
        "max_steps": 8,
        "eval_strategy": "steps",
        "eval_steps": 4,
        "save_strategy": "steps",
        "save_steps": 4,
        "logging_steps": 2,
        "num_train_epochs": 2,
    }
    whole = build("classification", tmp_path / "whole", callbacks=[streaming("classification")], **options)
    whole.train()

    first = build(
        "classification", tmp_path / "resumed", callbacks=[streaming("classification"), StopAt(4)], **options
    )
    first.train()  # "crashes" after checkpoint-4
    resumed = build(
        "classification", tmp_path / "resumed", callbacks=[streaming("classification")], **options
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "resumed" / "checkpoint-4"))

    def after_checkpoint(trainer):
        return [
            {k: v for k, v in r.items() if "runtime" not in k and "per_second" not in k}
            for r in trainer.state.log_history
            if 4 < r["step"] and "train_loss" not in r
        ]

    ours, theirs = after_checkpoint(resumed), after_checkpoint(whole)
    assert [sorted(r) for r in ours] == [sorted(r) for r in theirs]
    for mine, other in zip(ours, theirs):
        for key, value in other.items():
            if key.startswith(
                ("accuracy", "f1", "precision", "recall", "confusion", "eval_accuracy", "eval_f1")
            ):
                assert mine[key] == value, (key, mine, other)


def test_several_eval_sets_and_predict(tmp_path):
    eval_sets = {"a": classification_rows(13, seed=3), "b": classification_rows(9, seed=4)}
    trainer = build(
        "classification", tmp_path, callbacks=[streaming("classification")], eval_dataset=eval_sets
    )
    metrics = trainer.evaluate()
    stock = build(
        "classification",
        tmp_path / "stock",
        eval_dataset=eval_sets,
        compute_metrics=reference_compute_metrics("classification", 3),
    )
    expected = stock.evaluate()
    for name in ("a", "b"):
        assert_same_metrics(metrics, without(expected, f"eval_{name}"), prefix=f"eval_{name}")
    output = trainer.predict(eval_sets["a"])
    assert_same_metrics(output.metrics, without(expected, "eval_a"), prefix="test")


def test_train_subset_gets_the_streaming_metrics(tmp_path):
    subset = TrainSubsetEvaluation(size=11, seed=3)
    trainer = build(
        "classification", tmp_path, callbacks=[streaming("classification", train_metrics=None), subset]
    )
    trainer.train()
    metrics = trainer.evaluate()
    rows = [trainer.train_dataset[i] for i in subset.indices]
    stock = build(
        "classification",
        tmp_path / "stock",
        eval_dataset=rows,
        compute_metrics=reference_compute_metrics("classification", 3),
    )
    stock.model.load_state_dict(trainer.model.state_dict())
    expected = stock.evaluate()
    record = trainer.state.log_history[-1]
    assert record["eval_accuracy"] == metrics["eval_accuracy"]
    assert_same_metrics(record, without(expected), prefix="train_subset")


@pytest.mark.parametrize("task", list(TASKS))
def test_predictions_files(task, tmp_path):
    bound = 20
    trainer = build(
        task,
        tmp_path,
        callbacks=[streaming(task, save_predictions=bound, train_metrics=None)],
        eval_strategy="steps",
        eval_steps=5,
        max_steps=10,
    )
    trainer.train()
    files = sorted(p.name for p in (tmp_path / "predictions").iterdir())
    assert files == ["eval-step-10.jsonl", "eval-step-5.jsonl"]
    rows = [
        json.loads(line)
        for line in (tmp_path / "predictions" / "eval-step-10.jsonl").read_text().splitlines()
    ]
    assert [row["id"] for row in rows] == list(range(bound))

    output = trainer.predict(trainer.eval_dataset)
    logits, labels = output.predictions, output.label_ids
    test_rows = [
        json.loads(line)
        for line in (tmp_path / "predictions" / "test-step-10.jsonl").read_text().splitlines()
    ]
    assert len(test_rows) == bound
    for row in test_rows:
        scores, target = logits[row["id"]], labels[row["id"]]
        if task == "classification":
            assert (row["label"], row["prediction"]) == (int(target), int(scores.argmax()))
            assert row["score"] == pytest.approx(
                float(torch.softmax(torch.tensor(scores, dtype=torch.float64), -1).max())
            )
        else:
            if task == "causal_lm":
                scores, target = scores[:-1], target[1:]
            keep = target != -100
            assert row["label"] == target[keep].tolist()
            assert row["prediction"] == scores.argmax(-1)[keep].tolist()


def test_errors_name_the_argument_and_the_choices(tmp_path):
    with pytest.raises(ValueError, match=r"task must be one of .*'causal_lm'.*got 'regression'"):
        StreamingMetrics(task="regression")
    with pytest.raises(ValueError, match="needs num_classes"):
        StreamingMetrics(task="classification")
    with pytest.raises(ValueError, match="save_predictions must be"):
        StreamingMetrics(task="causal_lm", save_predictions=-1)
    with pytest.raises(ValueError, match="train_metrics must be 'same', None or metrics, got 'all'"):
        StreamingMetrics(task="causal_lm", train_metrics="all")
    with pytest.raises(TypeError, match="metric 'acc' .* has no update, reset"):
        StreamingMetrics({"acc": type("Half", (), {"compute": lambda self: 1.0})()})

    unbound = Trainer(
        model=TinyClassifier(),
        args=training_args(tmp_path, max_steps=1),
        train_dataset=classification_rows(8),
        callbacks=[streaming("classification")],
    )
    with pytest.raises(RuntimeError, match=r"not bound to a trainer.*run_before_integrations\(trainer\)"):
        unbound.train()

    def clashing(eval_pred):
        return {"accuracy": 1.0}

    trainer = build(
        "classification",
        tmp_path / "clash",
        callbacks=[streaming("classification")],
        compute_metrics=clashing,
    )
    with pytest.raises(ValueError, match=r"your compute_metrics also returns \['accuracy'\]"):
        trainer.evaluate()


def test_own_metric_objects(tmp_path):
    """Any object with update/compute/reset: here a count of labelled positions."""

    class Count:
        def __init__(self):
            self.n = 0

        def update(self, scores, target):
            self.n += len(target)

        def compute(self):
            return self.n

        def reset(self):
            self.n = 0

    trainer = build(
        "token_classification",
        tmp_path,
        callbacks=[StreamingMetrics({"labelled": Count()}, task="token_classification")],
    )
    labelled = sum(int((row["labels"] != -100).sum()) for row in trainer.eval_dataset)
    assert trainer.evaluate()["eval_labelled"] == labelled


def test_a_forward_pass_without_labels_is_said_once(tmp_path, caplog):
    trainer = build(
        "causal_lm", tmp_path, callbacks=[streaming("causal_lm")], max_steps=4, label_smoothing_factor=0.1
    )  # the label smoother takes the labels out of the inputs
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer.train()
    said = [r.getMessage() for r in caplog.records if "no labels" in r.getMessage()]
    assert len(said) == 1 and "label smoother" in said[0]
    assert not any("accuracy" in r for r in trainer.state.log_history if "loss" in r)


def test_early_stopping_and_the_plot_see_training_metrics_in_their_section(tmp_path):
    """``train/accuracy`` watches the running training metric; a bare ``accuracy`` means
    ``eval_accuracy`` in a run that evaluates (never the training record's); the plot draws the
    training, train-subset and eval curves of ``accuracy`` on one panel."""
    from hf_callbacks_plus import EarlyStopping
    from hf_callbacks_plus.plotting import collect_curves

    watched = {}
    callbacks = [streaming("classification"), TrainSubsetEvaluation(size=10)]
    for monitor in ("train/accuracy", "accuracy"):
        stopper = EarlyStopping(monitor=monitor, mode="max", patience=100, log_name=monitor.replace("/", "_"))
        seen = watched.setdefault(monitor, [])
        decide = stopper.decide
        stopper.decide = lambda value, step, epoch, seen=seen, decide=decide: (
            seen.append((step, value)),
            decide(value, step, epoch),
        )[1]
        callbacks.append(stopper)
    trainer = build(
        "classification", tmp_path, callbacks=callbacks, eval_strategy="steps", eval_steps=4, max_steps=8
    )
    trainer.train()
    history = trainer.state.log_history
    training = [(r["step"], r["accuracy"]) for r in history if "loss" in r]
    evaluated = [(r["step"], r["eval_accuracy"]) for r in history if "eval_accuracy" in r]
    assert watched["train/accuracy"] == training and len(training) == 4
    assert watched["accuracy"] == evaluated and len(evaluated) == 2

    curves = collect_curves(history)
    assert set(curves.series["accuracy"]) == {"training", "train subset", "eval"}
    assert not any(name.startswith("confusion_") for name in curves.series)


def test_gap_metrics_true_reports_only_gaps_that_mean_something(tmp_path):
    """``gap_metrics=True`` beside the streaming metrics: a gap for every score (loss, accuracy,
    precision, recall, F1), none for the confusion counts (``gap_confusion_0_1`` meant nothing)."""
    subset = TrainSubsetEvaluation(size=11, seed=3, gap_metrics=True)
    callbacks = [streaming("classification", train_metrics=None), subset]
    trainer = build("classification", tmp_path, callbacks=callbacks, eval_strategy="steps", eval_steps=2,
                    max_steps=2)
    trainer.train()
    record = next(r for r in trainer.state.log_history if "eval_loss" in r)
    gaps = {key for key in record if key.startswith("gap_")}
    scores = {"loss", "accuracy", *(f"{name}_{average}" for name in ("precision", "recall", "f1")
                                    for average in ("micro", "macro"))}
    assert gaps == {f"gap_{name}" for name in scores}
    assert any(key.startswith("train_subset_confusion_") for key in record)  # the counts themselves stay
    for name in scores:
        assert record[f"gap_{name}"] == record[f"train_subset_{name}"] - record[f"eval_{name}"]
