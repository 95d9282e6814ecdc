"""StreamingMetrics at the edges of a real evaluation, side by side with a stock ``compute_metrics``
over every logit (scikit-learn and numpy, tests/streaming_reference.py) or the stock Trainer.

The classes: the predictions a non-streaming ``compute_metrics`` receives (concatenated or one
array per batch, logits alone or with hidden states) x task; an evaluation interrupted at a batch
or in ``compute_metrics`` x how metrics are computed (per batch, at the end, at the end from
per-batch arrays) x trainer (Trainer, TrainerPlus, LightweightTrainer); logits of the wrong width,
and one logit per row for a binary classifier; the user's own metrics function beside
StreamingMetrics in the loop and in a Trainer with ``batch_eval_metrics`` off; an unbound
StreamingMetrics; the list of predictions files.
"""

from __future__ import annotations

import functools
import json
import logging

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("transformers")
pytest.importorskip("torchmetrics")

from torchmetrics.classification import MulticlassAUROC  # noqa: E402
from transformers import Trainer, TrainerCallback  # noqa: E402

from hf_callbacks_plus import LightweightTrainer, LoopArguments, TrainerPlus  # noqa: E402
from hf_callbacks_plus.callbacks.streaming_metrics import StreamingMetrics  # noqa: E402
from hf_callbacks_plus.metrics.streaming import CHUNK_ELEMENTS, standard_metrics  # noqa: E402
from tests.callbacks.test_streaming_metrics import TASKS, build, stock_metrics, streaming, without  # noqa: E402
from tests.loop.test_streaming_in_loop import batches  # noqa: E402
from tests.streaming_reference import assert_same_metrics, reference_values  # noqa: E402
from tests.tiny_models import TinyClassifier, TinyTagger, classification_rows, training_args  # noqa: E402


class WithHiddenStates(TinyClassifier):
    """TinyClassifier that also returns its features as ``hidden_states``: the Trainer's
    predictions become ``(logits, hidden_states)``."""

    def forward(self, features, labels=None):
        return {**super().forward(features, labels), "hidden_states": features * 2}


def rows_counted(eval_pred):
    """A user's non-streaming ``compute_metrics`` that works with concatenated predictions and with
    one array per batch (``eval_do_concat_batches=False``)."""
    labels = eval_pred.label_ids
    parts = labels if isinstance(labels, list) else [labels]
    return {"rows": float(sum(len(part) for part in parts))}


# -- eval_do_concat_batches=False ------------------------------------------------------------------
@pytest.mark.parametrize("concatenated", [True, False], ids=["concatenated", "per_batch"])
@pytest.mark.parametrize(
    "task,hidden",
    [("classification", False), ("classification", True), ("token_classification", False),
     ("causal_lm", False)],
    ids=["classification", "classification+hidden", "token_classification", "causal_lm"],
)
def test_every_batch_counts_however_the_trainer_holds_the_predictions(task, hidden, concatenated, tmp_path):
    """A non-streaming ``compute_metrics`` beside StreamingMetrics: the Trainer holds every logit,
    concatenated or as one array per batch, maybe with hidden states; StreamingMetrics counts
    every row either way, as the reference over all of them does."""
    expected = without(stock_metrics(task, tmp_path), task=task)
    trainer = build(
        task,
        tmp_path / "ours",
        callbacks=[streaming(task, train_metrics=None)],
        compute_metrics=rows_counted,
        eval_do_concat_batches=concatenated,
        model=WithHiddenStates() if hidden else None,
    )
    assert trainer.args.batch_eval_metrics is False
    metrics = trainer.evaluate()
    assert_same_metrics(metrics, expected)
    assert metrics["eval_rows"] == 30.0


# -- an interrupted evaluation ---------------------------------------------------------------------
class InjectedFault(RuntimeError):
    """The failure the fault injections below raise (an OOM or a Ctrl-C in a notebook)."""


class FailAtPredictionStep(TrainerCallback):
    """Fault injection: raises once, at the ``step``-th batch of an evaluation (after ``step - 1``
    batches went through ``compute_metrics``)."""

    def __init__(self, step):
        self.step, self.seen, self.armed = step, 0, True

    def on_prediction_step(self, args, state, control, **kwargs):
        self.seen += 1
        if self.armed and self.seen == self.step:
            self.armed = False
            raise InjectedFault(f"injected at batch {self.step}")


def failing_once(function, at_call):
    """Fault injection: ``function``, except that its ``at_call``-th call raises."""
    calls = []

    @functools.wraps(function)  # the same signature (transformers checks for compute_result)
    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == at_call:
            raise InjectedFault(f"injected in compute_metrics call {at_call}")
        return function(*args, **kwargs)

    return wrapped


def last_batch_rows(eval_pred, compute_result=False):
    """A user's streaming ``compute_metrics`` (stateless: the rows of the last batch)."""
    return {"last_rows": float(len(eval_pred.label_ids))} if compute_result else {}


#: how the metrics are computed -> (user compute_metrics, TrainingArguments overrides)
MODES = {
    "per_batch": (None, {}),
    "user_per_batch": (last_batch_rows, {"batch_eval_metrics": True}),
    "at_the_end": (rows_counted, {}),
    "at_the_end_per_batch_arrays": (rows_counted, {"eval_do_concat_batches": False}),
}


def prediction_rows(folder):
    files = sorted(folder.iterdir())
    assert [f.name for f in files] == ["eval-step-0.jsonl"], files  # no partial file left
    return [json.loads(line) for line in files[0].read_text().splitlines()]


@pytest.mark.parametrize("trainer_class", [Trainer, TrainerPlus], ids=["Trainer", "TrainerPlus"])
@pytest.mark.parametrize(
    "mode,where",
    [("per_batch", "batch"), ("user_per_batch", "batch"), ("user_per_batch", "compute_metrics"),
     ("at_the_end", "batch"), ("at_the_end", "compute_metrics"),
     ("at_the_end_per_batch_arrays", "compute_metrics")],
)
def test_an_interrupted_evaluation_leaks_nothing_into_the_next(mode, where, trainer_class, tmp_path):
    user, overrides = MODES[mode]
    if where == "compute_metrics":  # after StreamingMetrics counted (the third batch, or the only call)
        user = failing_once(user, 3 if overrides.get("batch_eval_metrics") else 1)
    faults = [FailAtPredictionStep(3)] if where == "batch" else []
    # sum states (the confusion matrix) and list states (AUROC)
    metrics = {**standard_metrics("classification", 3), "auroc": MulticlassAUROC(num_classes=3)}
    callback = StreamingMetrics(metrics, train_metrics=None, save_predictions=True)
    trainer = build(
        "classification",
        tmp_path,
        trainer_class=trainer_class,
        callbacks=[callback, *faults],
        compute_metrics=user,
        **overrides,
    )
    with pytest.raises(InjectedFault):
        trainer.evaluate()
    metrics = trainer.evaluate()

    assert_same_metrics(metrics, without(stock_metrics("classification", tmp_path / "stock")))
    if mode == "user_per_batch":
        assert metrics["eval_last_rows"] == 2.0
    elif mode != "per_batch":
        assert metrics["eval_rows"] == 30.0
    rows = prediction_rows(tmp_path / "predictions")
    assert [row["id"] for row in rows] == list(range(30))
    assert callback.prediction_files == [tmp_path / "predictions" / "eval-step-0.jsonl"]
    output = trainer.predict(trainer.eval_dataset)
    expected_auroc = sklearn_auroc(output.predictions, output.label_ids)
    assert metrics["eval_auroc"] == pytest.approx(expected_auroc, abs=1e-6)


def sklearn_auroc(logits, labels):
    """scikit-learn's one-vs-rest macro AUROC of the softmax probabilities (MulticlassAUROC's), of
    arrays or of lists of per-batch arrays."""
    from sklearn.metrics import roc_auc_score

    if isinstance(logits, list):
        logits, labels = np.concatenate(logits), np.concatenate(labels)
    wide = np.asarray(logits, dtype=np.float64)
    probabilities = np.exp(wide - wide.max(-1, keepdims=True))
    return roc_auc_score(labels, probabilities / probabilities.sum(-1, keepdims=True), multi_class="ovr")


def loop_eval_step(model):
    def eval_step(batch):
        with torch.no_grad():
            output = model(**batch)
        return {"loss": output["loss"], "logits": output["logits"], "labels": batch["labels"]}

    return eval_step


def loop_rows(outputs):
    """A non-streaming ``metrics_fn`` of the loop."""
    return {"rows": float(sum(len(output["labels"]) for output in outputs))}


def loop_reference(model, eval_batches):
    outputs = [loop_eval_step(model)(batch) for batch in eval_batches]
    return reference_values(
        np.concatenate([o["logits"].numpy() for o in outputs]),
        np.concatenate([o["labels"].numpy() for o in outputs]),
        "classification",
        3,
    )


@pytest.mark.parametrize("per_batch", [True, False], ids=["per_batch", "at_the_end"])
def test_an_interrupted_evaluation_in_the_loop_leaks_nothing(per_batch, tmp_path):
    model = TinyClassifier()
    eval_batches = batches(classification_rows(30, seed=2), 7)
    callback = StreamingMetrics(num_classes=3, train_metrics=None, save_predictions=True)
    trainer = LightweightTrainer(
        LoopArguments(output_dir=str(tmp_path), disable_tqdm=True),
        eval_data=eval_batches,
        eval_step=loop_eval_step(model),
        metrics_fn=None if per_batch else loop_rows,
        callbacks=[callback, FailAtPredictionStep(3)],
    )
    assert trainer.args.batch_eval_metrics is per_batch
    with pytest.raises(InjectedFault):
        trainer.evaluate()
    metrics = trainer.evaluate()
    assert_same_metrics(metrics, loop_reference(model, eval_batches))
    assert per_batch or metrics["eval_rows"] == 30.0
    assert [row["id"] for row in prediction_rows(tmp_path / "predictions")] == list(range(30))


# -- logits and num_classes ------------------------------------------------------------------------
class OtherWidth(nn.Module):
    """A classifier or tagger with ``width`` outputs per row; its loss ignores the labels (so only
    StreamingMetrics can notice the width)."""

    def __init__(self, task, width):
        super().__init__()
        self.inner = TinyClassifier(width) if task == "classification" else TinyTagger(num_classes=width)

    def forward(self, features=None, input_ids=None, labels=None):
        logits = self.inner(features if input_ids is None else input_ids)["logits"]
        return {"loss": logits.pow(2).mean(), "logits": logits}


class CountBatches(TrainerCallback):
    def __init__(self):
        self.batches = 0

    def on_prediction_step(self, args, state, control, **kwargs):
        self.batches += 1


@pytest.mark.parametrize("width", [1, 2, 5])
@pytest.mark.parametrize("task", ["classification", "token_classification"])
def test_logits_of_another_width_than_num_classes_are_refused_at_the_first_batch(task, width, tmp_path):
    """num_classes=3 (4 for tagging) with models of other widths: evaluation and training stop at
    their first batch with an error naming the logits' shape and num_classes."""
    num_classes = TASKS[task][2]
    width = {1: 1, 2: num_classes - 1, 5: num_classes + 2}[width]
    counter = CountBatches()
    trainer = build(
        task, tmp_path, callbacks=[streaming(task), counter], max_steps=2, model=OtherWidth(task, width)
    )
    message = rf"scores \(\d+, {width}\).*{width} class scores per row.*num_classes={num_classes}"
    with pytest.raises(ValueError, match=message):
        trainer.evaluate()
    assert counter.batches == 1
    with pytest.raises(ValueError, match=message):
        trainer.train()
    assert trainer.state.global_step == 0


class OneLogitClassifier(nn.Module):
    """A binary classifier with one logit per row (the positive class's) and a BCE loss."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.linear = nn.Linear(4, 1)

    def forward(self, features, labels=None):
        logits = self.linear(features)
        if labels is None:
            return {"logits": logits}
        loss = nn.functional.binary_cross_entropy_with_logits(logits.squeeze(1), labels.float())
        return {"loss": loss, "logits": logits}


def test_one_logit_binary_classifier_equals_sklearn_and_torchmetrics(tmp_path):
    """``[batch, 1]`` logits with num_classes=2: class 1 where the logit is > 0, scikit-learn's rule
    for a decision function and torchmetrics' binary rule (sigmoid > 0.5)."""
    from torchmetrics.classification import BinaryAccuracy

    from hf_callbacks_plus import run_before_integrations

    rows = classification_rows(30, seed=2, num_classes=2)
    train = classification_rows(40, seed=1, num_classes=2)
    callback = StreamingMetrics(num_classes=2, save_predictions=True, train_metrics=None)
    trainer = Trainer(
        model=OneLogitClassifier(),
        args=training_args(tmp_path, per_device_eval_batch_size=7, max_steps=3, learning_rate=0.5),
        train_dataset=train,
        eval_dataset=rows,
        callbacks=[callback],
    )
    run_before_integrations(trainer)
    trainer.train()
    metrics = trainer.evaluate()

    output = trainer.predict(rows)
    logits, labels = output.predictions[:, 0], output.label_ids
    predicted = (logits > 0).astype(int)
    assert 0 < predicted.sum() < len(predicted)  # both classes predicted: the rule matters
    # the reference's arg-max over two columns [0, logit] is exactly "logit > 0"
    two_columns = np.stack([np.zeros_like(logits), logits], axis=1)
    expected = reference_values(two_columns, labels, "classification", 2)
    assert_same_metrics(metrics, expected)
    assert metrics["eval_accuracy"] == pytest.approx(
        float(BinaryAccuracy()(torch.tensor(logits), torch.tensor(labels))), abs=1e-7
    )
    rows_written = [
        json.loads(line) for line in (tmp_path / "predictions" / "test-step-3.jsonl").read_text().splitlines()
    ]
    probability = 1 / (1 + np.exp(-logits.astype(np.float64)))
    assert [r["prediction"] for r in rows_written] == predicted.tolist()
    assert [r["score"] for r in rows_written] == pytest.approx(
        np.where(predicted == 1, probability, 1 - probability).tolist()
    )


# -- the user's own metrics function beside StreamingMetrics ---------------------------------------
def test_the_loop_calls_a_streaming_metrics_fn_beside_streaming_metrics(tmp_path):
    """As transformers calls a streaming ``compute_metrics`` beside StreamingMetrics: per batch, with
    ``compute_result`` True on the last; its result merged."""
    model = TinyClassifier()
    eval_batches = batches(classification_rows(30, seed=2), 7)
    calls = []

    def metrics_fn(outputs, compute_result=False):
        calls.append((sum(len(o["labels"]) for o in outputs), compute_result))
        return {"rows": float(sum(size for size, _ in calls))} if compute_result else {}

    trainer = LightweightTrainer(
        LoopArguments(output_dir=str(tmp_path), batch_eval_metrics=True, disable_tqdm=True),
        eval_data=eval_batches,
        eval_step=loop_eval_step(model),
        metrics_fn=metrics_fn,
        callbacks=[StreamingMetrics(num_classes=3, train_metrics=None)],
    )
    metrics = trainer.evaluate()
    assert calls == [(7, False), (7, False), (7, False), (7, False), (2, True)]
    assert metrics["eval_rows"] == 30.0
    assert_same_metrics(metrics, loop_reference(model, eval_batches))


def test_a_compute_result_function_with_batch_eval_metrics_off_is_called_as_transformers_does(
    tmp_path, caplog
):
    """transformers calls such a function once, with every prediction and without
    ``compute_result``; so does StreamingMetrics, and it says so at bind, in a Trainer and in the
    loop."""
    calls = {"stock": [], "ours": [], "loop": []}

    def user(name):
        def compute_metrics(eval_pred, compute_result=False):
            labels = eval_pred.label_ids if hasattr(eval_pred, "label_ids") else eval_pred
            calls[name].append((len(labels), compute_result))
            return {"rows": float(len(labels))} if compute_result else {}

        return compute_metrics

    stock = build("classification", tmp_path / "stock", compute_metrics=user("stock"))
    assert stock.args.batch_eval_metrics is False
    expected = stock.evaluate()

    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        ours = build(
            "classification",
            tmp_path / "ours",
            callbacks=[streaming("classification", train_metrics=None)],
            compute_metrics=user("ours"),
        )
        loop = LightweightTrainer(
            LoopArguments(output_dir=str(tmp_path / "loop"), disable_tqdm=True),
            eval_data=batches(classification_rows(30, seed=2), 7),
            eval_step=loop_eval_step(TinyClassifier()),
            metrics_fn=user("loop"),
            callbacks=[StreamingMetrics(num_classes=3, train_metrics=None)],
        )
    said = [r.getMessage() for r in caplog.records if "compute_result" in r.getMessage()]
    assert len(said) == 2 and all("batch_eval_metrics" in m for m in said), said
    assert ours.args.batch_eval_metrics is False and loop.args.batch_eval_metrics is False
    metrics = ours.evaluate()
    loop.evaluate()
    assert calls["ours"] == calls["stock"] == [(30, False)]
    assert calls["loop"] == [(5, False)]  # the loop's metrics_fn receives the list of batch outputs
    assert "eval_rows" not in metrics and "eval_rows" not in expected
    assert_same_metrics(metrics, without(stock_metrics("classification", tmp_path / "reference")))


@pytest.mark.parametrize("call", ["evaluate", "predict"])
def test_an_unbound_streaming_metrics_stops_evaluation_at_its_first_batch(call, tmp_path):
    counter = CountBatches()
    trainer = Trainer(
        model=TinyClassifier(),
        args=training_args(tmp_path, per_device_eval_batch_size=7),
        eval_dataset=classification_rows(30, seed=2),
        callbacks=[counter, streaming("classification")],
    )
    with pytest.raises(RuntimeError, match=r"not bound to a trainer.*run_before_integrations\(trainer\)"):
        getattr(trainer, call)(*([] if call == "evaluate" else [trainer.eval_dataset]))
    assert counter.batches == 1


def test_a_replaced_predictions_file_is_listed_once(tmp_path):
    callback = streaming("classification", train_metrics=None, save_predictions=5)
    trainer = build("classification", tmp_path, callbacks=[callback])
    for _ in range(3):
        trainer.evaluate()
    trainer.predict(trainer.eval_dataset)
    trainer.evaluate(metric_key_prefix="again")
    folder = tmp_path / "predictions"
    expected = [folder / name for name in ("eval-step-0.jsonl", "test-step-0.jsonl", "again-step-0.jsonl")]
    assert callback.prediction_files == expected
    assert sorted(folder.iterdir()) == sorted(expected)


class NotANumber:
    """A metric whose value is NaN (a correlation of constant predictions, an AUROC of one class)."""

    def update(self, scores, target):
        pass

    def compute(self):
        return torch.tensor(float("nan"))

    def reset(self):
        pass


@pytest.mark.parametrize("changed", ["nan", "rounded in on_pre_log"])
def test_predictions_files_are_named_when_written_whatever_the_logged_values(tmp_path, changed):
    """The file is named by the evaluation that writes it (its metric_key_prefix): a NaN metric, or a
    record whose values a callback changed, named nothing when files were renamed after the logged
    values (they stayed ``evaluation-step-0-0.jsonl``)."""

    class Rounding(TrainerCallback):
        def on_pre_log(self, args, state, control, logs=None, **kwargs):
            logs.update({key: round(value, 2) for key, value in logs.items() if key.endswith("accuracy")})

    metrics = {"score": NotANumber()} if changed == "nan" else None
    callback = StreamingMetrics(metrics, num_classes=3, train_metrics=None, save_predictions=5)
    trainer = build("classification", tmp_path, trainer_class=TrainerPlus,
                    callbacks=[callback] + ([Rounding()] if changed != "nan" else []))
    trainer.evaluate()
    trainer.evaluate(metric_key_prefix="again")
    folder = tmp_path / "predictions"
    assert sorted(path.name for path in folder.iterdir()) == ["again-step-0.jsonl", "eval-step-0.jsonl"]
    assert callback.prediction_files == [folder / "eval-step-0.jsonl", folder / "again-step-0.jsonl"]


# -- memory ----------------------------------------------------------------------------------------
def peak_allocated(function):
    """The peak of the bytes torch's CPU allocator holds while ``function`` runs, above what it held
    before (torch's profiler records every allocation and free, temporaries of one op excepted)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        function()
    current = peak = 0
    for event in sorted(profiler.events(), key=lambda event: event.time_range.start):
        current += event.self_cpu_memory_usage
        peak = max(peak, current)
    return peak


@pytest.mark.parametrize(
    "held,labelled",
    [("batch", "after_a_prompt"), ("concatenated", "after_a_prompt"), ("per_batch_arrays", "after_a_prompt"),
     ("batch", "every_other_token")],
)
def test_a_language_model_batch_copies_only_its_short_runs_of_labelled_logits(held, labelled, tmp_path):
    """Vocabulary 32k: the metrics of one batch (token accuracy, perplexity, the predictions file)
    never hold a float64 copy of the batch's logits, only one float64 block (`CHUNK_ELEMENTS`).
    A row labelled after its prompt reaches the metrics as a view of the logits, so nothing else is
    held (before issue 40 the labelled rows were copied: 1.16x the batch's logits, most of the
    evaluation's time); labels scattered one token in two are copied (one float32 copy of the
    labelled rows). Held predictions (``batch_eval_metrics=False``) are taken a batch at a time."""
    from transformers import EvalPrediction

    callback = StreamingMetrics(task="causal_lm", save_predictions=True, train_metrics=None)
    trainer = build("causal_lm", tmp_path, callbacks=[callback], per_device_eval_batch_size=2)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4 if held != "batch" else 2, 32, 32_000, generator=generator)
    labels = torch.randint(0, 32_000, logits.shape[:2], generator=generator)
    if labelled == "after_a_prompt":
        labels[:, :3] = -100
    else:
        labels[:, ::2] = -100
    batch_bytes = logits[:2].nbytes
    if held == "batch":
        call = lambda: trainer.compute_metrics(EvalPrediction(logits, labels), compute_result=True)  # noqa: E731
    else:
        trainer.args.eval_do_concat_batches = held == "concatenated"
        arrays = (logits.numpy(), labels.numpy())
        if held == "per_batch_arrays":
            arrays = ([arrays[0][:2], arrays[0][2:]], [arrays[1][:2], arrays[1][2:]])
        call = lambda: trainer.compute_metrics(EvalPrediction(*arrays))  # noqa: E731
    results = []
    peak = peak_allocated(lambda: results.append(call()))
    float64_block = CHUNK_ELEMENTS * 8
    copied = 0 if labelled == "after_a_prompt" else batch_bytes / 2  # the labelled rows, float32
    assert peak <= copied + float64_block + 0.01 * batch_bytes, (
        f"peak {peak / batch_bytes:.3f}x a batch's logits, expected at most "
        f"{(copied + float64_block) / batch_bytes:.3f}x"
    )
    assert_same_metrics(results[0], reference_values(logits.numpy(), labels.numpy(), "causal_lm"), prefix="")
