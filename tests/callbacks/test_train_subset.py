"""TrainSubsetEvaluation in a stock Trainer, TrainerPlus and LightweightTrainer."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import torch

pytest.importorskip("transformers")

import transformers  # noqa: E402
from transformers import EarlyStoppingCallback  # noqa: E402

from hf_callbacks_plus.callbacks.train_subset import TrainSubsetEvaluation  # noqa: E402
from hf_callbacks_plus.callbacks.train_subset.sampling import choose_indices  # noqa: E402
from hf_callbacks_plus.core.callback import TrainerCallback  # noqa: E402
from hf_callbacks_plus.integrations.ordering import run_before_integrations  # noqa: E402
from hf_callbacks_plus.integrations.transformers import TrainerPlus  # noqa: E402
from hf_callbacks_plus.runtime.isolated_evaluation import evaluation_arguments  # noqa: E402
from tests.integrations.tensorboard_events import read_scalars  # noqa: E402
from tests.tiny_models import RegressionDataset, make_trainer  # noqa: E402

EVAL_EVERY = {"eval_strategy": "steps", "eval_steps": 4, "logging_steps": 4, "max_steps": 8}


class EvaluateRecorder(TrainerCallback):
    def __init__(self):
        self.metrics = []

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.metrics.append(dict(metrics))


def eval_records(trainer):
    return [r for r in trainer.state.log_history if "eval_loss" in r]


def subset_metrics_directly(trainer, indices):
    """The reference: trainer.evaluate on the same samples, with another prefix."""
    return trainer.evaluate(torch.utils.data.Subset(trainer.train_dataset, indices), metric_key_prefix="ref")


@pytest.mark.parametrize("how", ["stock", "plus"])
@pytest.mark.transformers
@pytest.mark.compat
def test_subset_metrics_in_the_eval_record(tmp_path, how, caplog, monkeypatch):
    # transformers' loggers reach caplog only when they propagate (off unless CI is set)
    monkeypatch.setattr(logging.getLogger("transformers"), "propagate", True)
    callback = TrainSubsetEvaluation(size=16, seed=3, gap_metrics=True)
    recorder = EvaluateRecorder()
    early = EarlyStoppingCallback(early_stopping_patience=5)
    # transformers < 4.50's EarlyStoppingCallback asserts load_best_model_at_end
    common = dict(report_to="tensorboard", metric_for_best_model="eval_loss", load_best_model_at_end=True,
                  save_strategy="steps", save_steps=4, **EVAL_EVERY)
    if how == "stock":
        trainer = make_trainer(tmp_path, callbacks=[recorder, early], **common)
        run_before_integrations(trainer, callback)
    else:
        trainer = make_trainer(
            tmp_path, callbacks=[callback, recorder, early], trainer_class=TrainerPlus, **common
        )
        assert callback.trainer is trainer  # bound automatically
    with caplog.at_level(logging.WARNING):
        trainer.train()
    records = eval_records(trainer)
    assert [r["step"] for r in records] == [4, 8]  # one record per evaluation: no double logging
    assert not [r for r in trainer.state.log_history if "train_subset_mse" in r and "eval_loss" not in r]
    for record in records:
        assert {"train_subset_loss", "train_subset_mse", "train_subset_mae", "gap_loss", "gap_mse",
                "gap_mae"} <= set(record)
        assert record["gap_mse"] == pytest.approx(record["train_subset_mse"] - record["eval_mse"])
        assert "train_runtime" not in record  # never looks like the end-of-training record
    # on_evaluate fired once per evaluation (no recursion), with the same metrics
    assert len(recorder.metrics) == 2 and all("train_subset_mse" in m for m in recorder.metrics)
    assert "early stopping required metric_for_best_model" not in caplog.text
    # the subset: fixed, 16 samples; values equal a direct evaluation of those samples
    assert len(callback.indices) == 16
    final = trainer.evaluate()
    reference = subset_metrics_directly(trainer, callback.indices)
    assert final["train_subset_mse"] == pytest.approx(reference["ref_mse"], rel=1e-6)
    assert final["train_subset_loss"] == pytest.approx(reference["ref_loss"], rel=1e-6)
    # the report_to integration saw them in the same step (rendered by transformers' rewrite_logs)
    scalars = read_scalars(tmp_path)
    assert set(scalars["train/train_subset_mse"]) == {4, 8}
    assert set(scalars["train/gap_loss"]) == {4, 8}
    assert trainer.state.best_metric == min(r["eval_loss"] for r in records)  # eval_loss, not train


@pytest.mark.transformers
@pytest.mark.compat
def test_control_is_untouched_and_on_evaluate_not_fired(tmp_path):
    callback = TrainSubsetEvaluation(size=0.25, seed=0)
    recorder = EvaluateRecorder()
    trainer = make_trainer(tmp_path, callbacks=[recorder], trainer_class=TrainerPlus, max_steps=1)
    trainer.add_callback(callback)
    assert callback.trainer is trainer
    trainer.control.should_save = True
    trainer.control.should_log = True
    metrics = callback.compute()
    assert set(metrics) == {"train_subset_loss", "train_subset_mse", "train_subset_mae"}
    assert recorder.metrics == [] and trainer.state.log_history == []
    assert trainer.control.should_save and trainer.control.should_log
    assert len(callback.indices) == 16  # 25 % of 64


@pytest.mark.transformers
@pytest.mark.compat
def test_own_schedule_logs_its_own_records(tmp_path):
    callback = TrainSubsetEvaluation(size=8, every=3)
    trainer = make_trainer(tmp_path, max_steps=7, logging_steps=100, eval_strategy="no")
    run_before_integrations(trainer, callback)
    trainer.train()
    records = [r for r in trainer.state.log_history if "train_subset_mse" in r]
    assert [r["step"] for r in records] == [3, 6]


@pytest.mark.transformers
@pytest.mark.compat
def test_hf_dataset_stratified(tmp_path):
    datasets = pytest.importorskip("datasets")
    base = RegressionDataset(60, seed=1)
    groups = ["a"] * 40 + ["b"] * 15 + ["c"] * 5
    train = datasets.Dataset.from_dict(
        {"input_x": base.x.tolist(), "labels": base.y.tolist(), "group": groups}
    ).with_format("torch")
    callback = TrainSubsetEvaluation(size=12, stratify_by="group", seed=1)
    trainer = make_trainer(tmp_path, callbacks=[callback], trainer_class=TrainerPlus, max_steps=1)
    trainer.train_dataset = train
    metrics = callback.compute()
    assert "train_subset_mse" in metrics
    assert Counter(groups[i] for i in callback.indices) == {"a": 8, "b": 3, "c": 1}
    with pytest.raises(ValueError, match="stratify_by='nope'.*columns"):
        TrainSubsetEvaluation(size=4, stratify_by="nope").bind(trainer).subset()


@pytest.mark.transformers
def test_unbound_in_a_stock_trainer_says_how_to_bind(tmp_path):
    trainer = make_trainer(tmp_path, callbacks=[TrainSubsetEvaluation(size=4)], max_steps=1)
    with pytest.raises(RuntimeError, match="run_before_integrations"):
        trainer.train()


@pytest.mark.transformers
def test_bound_but_pre_log_never_fired_warns(tmp_path, caplog):
    callback = TrainSubsetEvaluation(size=4)
    trainer = make_trainer(tmp_path, callbacks=[callback], eval_strategy="steps", eval_steps=1, max_steps=1)
    callback.bind(trainer)  # bound by hand, but no bridge: on_pre_log is never fired
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer.train()
    assert "did not fire on_pre_log" in caplog.text


def test_lightweight_trainer(tmp_path):
    from hf_callbacks_plus.loop.arguments import LoopArguments
    from hf_callbacks_plus.loop.trainer import LightweightTrainer

    args = LoopArguments(output_dir=str(tmp_path), max_steps=6, logging_steps=3, eval_strategy="steps",
                         eval_steps=3, save_strategy="no", disable_tqdm=True)
    train_data = [[float(i), float(i + 1)] for i in range(10)]  # 10 batches
    evaluated = []

    def eval_step(batch):
        evaluated.append(batch)
        return {"loss": sum(batch) / len(batch)}

    trainer = LightweightTrainer(
        args, train_step=lambda batch: {"loss": 1.0}, train_data=train_data,
        eval_data=[[0.0, 1.0]], eval_step=eval_step,
        metrics_fn=lambda outputs: {"count": float(len(outputs))},
    )
    callback = TrainSubsetEvaluation(size=0.3, seed=5, gap_metrics=["loss"])
    trainer.add_callback(callback.bind(trainer))
    trainer.train()
    records = [r for r in trainer.state.log_history if "eval_loss" in r]
    assert [r["step"] for r in records] == [3, 6]
    chosen = [train_data[i] for i in callback.indices]
    expected_loss = sum(sum(b) / len(b) for b in chosen) / 3
    for record in records:
        assert record["train_subset_count"] == 3.0  # 30 % of 10 batches
        assert record["train_subset_loss"] == pytest.approx(expected_loss)
        assert record["gap_loss"] == pytest.approx(expected_loss - 0.5)
        assert "gap_count" not in record
    subset_records = [r for r in trainer.state.log_history if "train_subset_loss" in r]
    assert len(subset_records) == 2


def test_choose_indices_counts_fractions_and_seed():
    assert len(choose_indices(100, 10, seed=1)) == 10
    assert len(choose_indices(100, 0.25, seed=1)) == 25
    assert len(choose_indices(3, 0.01, seed=1)) == 1  # at least one
    assert choose_indices(100, 10, seed=1) == choose_indices(100, 10, seed=1)
    assert choose_indices(100, 10, seed=1) != choose_indices(100, 10, seed=2)
    assert choose_indices(5, 50, seed=1) == [0, 1, 2, 3, 4]


def test_stratified_allocation_keeps_proportions():
    labels = [0] * 70 + [1] * 20 + [2] * 10
    chosen = choose_indices(100, 10, seed=4, labels=labels)
    assert Counter(labels[i] for i in chosen) == {0: 7, 1: 2, 2: 1}
    assert len(set(chosen)) == 10


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"size": 0}, ValueError, "size must be >= 1"),
        ({"size": 1.5}, ValueError, r"size as a fraction must be in \(0, 1\]"),
        ({"size": "10"}, TypeError, "size must be an int or a float"),
        ({"every": "epoch"}, ValueError, "every must be 'eval' or an int"),
        ({"prefix": "eval"}, ValueError, "prefix must be"),
        ({"gap_metrics": "loss"}, TypeError, r"did you mean \['loss'\]"),
        ({"stratify_by": 3}, TypeError, "stratify_by must be"),
    ],
)
def test_argument_validation(kwargs, error, match):
    with pytest.raises(error, match=match):
        TrainSubsetEvaluation(**kwargs)


@pytest.mark.transformers
def test_subset_gets_its_own_progress_bar_and_eval_dataloader_is_restored(tmp_path):
    from transformers import ProgressCallback

    class BarRecorder(ProgressCallback):
        """transformers' ProgressCallback that remembers every evaluation bar it opened."""

        def __init__(self):
            super().__init__()
            self.bars = []

        def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
            super().on_prediction_step(args, state, control, eval_dataloader=eval_dataloader, **kwargs)
            if not self.bars or self.bars[-1] is not self.prediction_bar:
                self.bars.append(self.prediction_bar)

    class DataloaderRecorder(TrainerCallback):
        def __init__(self):
            self.sizes = []

        def on_evaluate(self, args, state, control, eval_dataloader=None, **kwargs):
            self.sizes.append(len(eval_dataloader.dataset))

    bars, loaders = BarRecorder(), DataloaderRecorder()
    # eval set: 16 samples = 2 batches of 8; train subset: 24 samples = 3 batches
    trainer = make_trainer(tmp_path, callbacks=[TrainSubsetEvaluation(size=24, seed=0), loaders],
                           trainer_class=TrainerPlus, disable_tqdm=False, **EVAL_EVERY)
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(bars)
    trainer.train()
    assert [(bar.total, bar.n) for bar in bars.bars] == [(2, 2), (3, 3)] * 2
    assert loaders.sizes == [16, 16]  # on_evaluate still sees the eval dataloader, not the subset's


@pytest.mark.parametrize("how", ["stock", "plus"])
@pytest.mark.transformers
def test_early_stopping_monitors_train_subset_and_gap_metrics(tmp_path, how):
    from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping

    subset = TrainSubsetEvaluation(size=16, seed=3, gap_metrics=True)
    # nothing beats the first value by 1e9: each stops at the 2nd evaluation it sees
    on_train = EarlyStopping("train_subset_mse", patience=1, min_delta=1e9, log_name="train")
    on_gap = EarlyStopping("gap_mse", mode="max", patience=2, min_delta=1e9, log_name="gap")
    args = dict(eval_strategy="steps", eval_steps=2, logging_steps=2, max_steps=12)
    if how == "stock":
        trainer = make_trainer(tmp_path, **args)
        run_before_integrations(trainer, subset, on_train, on_gap)
    else:
        callbacks = [subset, on_train, on_gap]
        trainer = make_trainer(tmp_path, callbacks=callbacks, trainer_class=TrainerPlus, **args)
    trainer.train()
    assert (on_train.best_step, on_train.stopped_step, trainer.state.global_step) == (2, 4, 4)
    first = eval_records(trainer)[0]
    assert on_train.best_value == pytest.approx(first["train_subset_mse"])
    assert on_gap.best_value == pytest.approx(first["train_subset_mse"] - first["eval_mse"])
    assert not on_gap.stopped


# -- misuse is said early, once ------------------------------------------------------------------
@pytest.mark.parametrize("how", ["stock", "plus"])
@pytest.mark.transformers
def test_eval_strategy_no_warns_once_at_train_begin(tmp_path, caplog, how):
    callback = TrainSubsetEvaluation(size=8)
    if how == "stock":
        trainer = make_trainer(tmp_path, eval_strategy="no", max_steps=4)
        run_before_integrations(trainer, callback)
    else:
        trainer = make_trainer(tmp_path, callbacks=[callback], trainer_class=TrainerPlus, eval_strategy="no",
                               max_steps=4)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer.train()
        trainer.train()
    warnings = [r.getMessage() for r in caplog.records if "eval_strategy='no'" in r.getMessage()]
    assert len(warnings) == 1 and "every=N" in warnings[0]
    # an explicit evaluate() afterwards still gets the subset metrics
    assert f"{callback.prefix}_loss" in trainer.evaluate()


class UnlabeledDataset(torch.utils.data.Dataset):
    def __init__(self, n):
        self.inner = RegressionDataset(n, seed=5)

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, index):
        return {"input_x": self.inner[index]["input_x"]}


@pytest.mark.transformers
def test_unlabeled_subset_warns_once_with_the_reason(tmp_path, caplog):
    callback = TrainSubsetEvaluation(size=8, dataset=UnlabeledDataset(32))
    trainer = make_trainer(tmp_path, callbacks=[callback], trainer_class=TrainerPlus, compute_metrics=None,
                           **EVAL_EVERY)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer.train()
    warnings = [r.getMessage() for r in caplog.records if "produced no metric" in r.getMessage()]
    assert len(warnings) == 1 and "no labels" in warnings[0] and "compute_metrics" in warnings[0]
    assert all(f"{callback.prefix}_loss" not in record for record in eval_records(trainer))


# -- isolation: the run trains exactly as without the callback ----------------------------------
class DropoutRegression(torch.nn.Module):
    """``y = dropout(x) * a + b``: training depends on the torch random generator."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(0.0))
        self.b = torch.nn.Parameter(torch.tensor(0.0))
        self.dropout = torch.nn.Dropout(0.5)

    def forward(self, input_x, labels=None):
        y = self.dropout(input_x) * self.a + self.b
        return {"loss": torch.nn.functional.mse_loss(y, labels), "logits": y}


@pytest.mark.parametrize("every", ["eval", 3])
@pytest.mark.transformers
def test_training_is_identical_with_and_without_the_subset_evaluation(tmp_path, every):
    """The subset evaluation restores the random generators and the modules' train/eval mode."""
    from transformers import Trainer

    from tests.tiny_models import training_args

    def run(trainer_class, callbacks, output_dir):
        torch.manual_seed(0)
        trainer = trainer_class(
            model=DropoutRegression(), args=training_args(output_dir, max_steps=9, eval_strategy="steps",
                                                          eval_steps=2, logging_steps=1),
            train_dataset=RegressionDataset(64, seed=1), eval_dataset=RegressionDataset(16, seed=2),
            callbacks=callbacks)
        trainer.train()
        return [(r["step"], r.get("loss"), r.get("eval_loss"), r.get("grad_norm"))
                for r in trainer.state.log_history if "loss" in r or "eval_loss" in r]

    plain = run(Trainer, [], tmp_path / "plain")
    ours = run(TrainerPlus, [TrainSubsetEvaluation(size=16, every=every)], tmp_path / "ours")
    assert ours == plain


# -- the arguments of the evaluation in progress reach the subset -------------------------------------

def gen_len(eval_pred):
    import numpy

    return {"gen_len": float(numpy.mean([(numpy.asarray(row) != 0).sum() for row in eval_pred.predictions]))}


@pytest.mark.transformers
@pytest.mark.parametrize("generation", [{"max_new_tokens": 6, "num_beams": 2}, {}])
def test_seq2seq_generation_settings_of_evaluate_reach_the_subset(tmp_path, generation):
    """``Seq2SeqTrainer.evaluate(max_new_tokens=6, num_beams=2)``: the subset generates with the same
    settings; its metrics equal a stock ``evaluate`` of the rows with them."""
    from datasets import Dataset
    from transformers import (
        DataCollatorForSeq2Seq,
        Seq2SeqTrainer,
        Seq2SeqTrainingArguments,
        T5Config,
        T5ForConditionalGeneration,
    )

    from tests.tiny_models import one_torch_thread
    from tests.trl_peft import tiny_lm

    tok = tiny_lm.tokenizer()
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(T5Config(
        vocab_size=len(tok), d_model=16, d_ff=32, d_kv=8, num_layers=1, num_decoder_layers=1, num_heads=2,
        pad_token_id=0, eos_token_id=3, decoder_start_token_id=0))
    ids = [tok(text)["input_ids"] for text in tiny_lm.texts()[:24]]
    rows = Dataset.from_list([{"input_ids": row[:12], "labels": row[1:6]} for row in ids])
    subset = TrainSubsetEvaluation(size=8)
    trainer = Seq2SeqTrainer(
        model=model, args=Seq2SeqTrainingArguments(str(tmp_path), predict_with_generate=True, use_cpu=True,
                                                   per_device_eval_batch_size=4, report_to="none",
                                                   disable_tqdm=True),
        train_dataset=rows.select(range(16)), eval_dataset=rows.select(range(16, 24)),
        data_collator=DataCollatorForSeq2Seq(tok, model=model), compute_metrics=gen_len, processing_class=tok,
        callbacks=[subset])
    run_before_integrations(trainer)
    with one_torch_thread():
        metrics = trainer.evaluate(**generation)
        stock = trainer.evaluate(trainer.train_dataset.select(subset.indices), metric_key_prefix="stock",
                                 **generation)
    assert metrics["train_subset_gen_len"] == stock["stock_gen_len"]
    assert metrics["train_subset_loss"] == stock["stock_loss"]
    if generation:
        assert metrics["train_subset_gen_len"] > 0


class WithExtraOutput(torch.nn.Module):
    """The regression model returning one more output, which ``ignore_keys`` drops."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, input_x, labels=None):
        y = input_x * self.a
        return {"loss": torch.nn.functional.mse_loss(y, labels), "logits": y, "extra": y * 2}


def output_count(eval_pred):
    predictions = eval_pred.predictions
    return {"outputs": float(len(predictions) if isinstance(predictions, tuple) else 1)}


class ArgumentsProbe(TrainerCallback):
    """Reads what the subset evaluation will read (`evaluation_arguments`) at each eval record."""

    def __init__(self):
        self.trainer = None
        self.seen = []

    def bind(self, trainer):
        self.trainer = trainer

    def on_pre_log(self, args, state, control, logs=None, **kwargs):
        if "eval_runtime" in logs:
            self.seen.append(evaluation_arguments(self.trainer))


@pytest.mark.transformers
@pytest.mark.parametrize("how", ["stock", "plus"])
def test_ignore_keys_of_evaluate_and_of_train_reach_the_subset(tmp_path, how):
    """The arguments are recorded where ``evaluate()`` passes (TrainerPlusMixin.evaluate, or the
    wrapper a stock trainer gets at bind), not read from the call stack."""
    from tests.tiny_models import training_args

    subset, probe = TrainSubsetEvaluation(size=8), ArgumentsProbe()
    args = training_args(tmp_path, max_steps=2, eval_strategy="steps", eval_steps=2)
    trainer = (TrainerPlus if how == "plus" else transformers.Trainer)(
        model=WithExtraOutput(), args=args, train_dataset=RegressionDataset(16, seed=1),
        eval_dataset=RegressionDataset(8, seed=2), compute_metrics=output_count, callbacks=[subset, probe])
    if how == "stock":
        run_before_integrations(trainer)
        assert "evaluate" in vars(trainer)  # the recording wrapper, installed once at bind
        run_before_integrations(trainer)
        assert not hasattr(vars(trainer)["evaluate"], "__wrapped__")
    else:
        assert "evaluate" not in vars(trainer)  # TrainerPlusMixin records the calls itself
    metrics = trainer.evaluate(ignore_keys=["extra"])
    assert metrics["eval_outputs"] == metrics["train_subset_outputs"] == 1.0  # "extra" ignored by both
    assert trainer.evaluate(None, ["extra"])["train_subset_outputs"] == 1.0  # positional too
    assert trainer.evaluate()["train_subset_outputs"] == 2.0
    trainer.train(ignore_keys_for_eval=["extra"])
    record = next(r for r in trainer.state.log_history if "train_subset_outputs" in r and r["step"] == 2)
    assert record["eval_outputs"] == record["train_subset_outputs"] == 1.0
    assert probe.seen == [{"ignore_keys": ["extra"]}, {"ignore_keys": ["extra"]}, {},
                          {"ignore_keys": ["extra"]}]
    assert evaluation_arguments(trainer) == {}  # nothing left once the calls returned


@pytest.mark.parametrize(("labels", "size", "expected"), [
    ([0] * 7 + [1] * 3, 4, {0: 3, 1: 1}),  # quotas 2.8 and 1.2: the spare goes to the larger remainder
    ([0] * 5 + [1] * 5 + [2] * 2, 5, {0: 2, 1: 2, 2: 1}),  # 2.08, 2.08, 0.83: the small class gets it
    (["b"] * 4 + ["a"] * 6, 5, {"a": 3, "b": 2}),  # exact quotas 3 and 2: no spare
])
def test_stratified_sizes_follow_the_largest_remainder_rule(labels, size, expected):
    # Hamilton's method worked out by hand: each class gets the floor of its quota, the spares go
    # to the largest remainders
    for seed in range(5):
        indices = choose_indices(len(labels), size, seed, labels=labels)
        assert Counter(labels[i] for i in indices) == expected
        assert indices == sorted(set(indices))
