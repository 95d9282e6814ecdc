"""TrainerPlus / TrainerPlusMixin on a real transformers.Trainer (run by `make compat` too)."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")

import transformers  # noqa: E402

from hf_callbacks_plus.core.callback import TrainerCallback  # noqa: E402
from hf_callbacks_plus.core.handler import CallbackHandler  # noqa: E402
from hf_callbacks_plus.integrations.transformers import TrainerPlus, TrainerPlusMixin  # noqa: E402
from hf_callbacks_plus.testing import EventRecorder  # noqa: E402
from tests.integrations.tensorboard_events import read_scalars  # noqa: E402
from tests.tiny_models import RegressionDataset, make_trainer  # noqa: E402

pytestmark = [pytest.mark.transformers, pytest.mark.compat]

EVAL_EVERY = {"eval_strategy": "steps", "eval_steps": 4, "logging_steps": 4, "max_steps": 8}


def nested_metrics(eval_pred):
    predictions, labels = eval_pred
    error = float(((torch.as_tensor(predictions) - torch.as_tensor(labels)) ** 2).mean())
    return {"mse": error, "detail": {"rmse": math.sqrt(error)}}


class AddEvalExtra(TrainerCallback):
    """Adds ``eval_extra`` to every eval record, from on_pre_log (our event)."""

    def __init__(self):
        self.pre_log_calls = 0

    def on_pre_log(self, args, state, control, logs=None, **kwargs):
        self.pre_log_calls += 1
        if "eval_loss" in logs:
            logs["eval_extra"] = 2.0 * logs["eval_loss"]


def test_handler_is_ours_with_same_callbacks_in_same_order(tmp_path):
    extra = AddEvalExtra()
    stock = make_trainer(tmp_path / "a", callbacks=[extra], report_to="tensorboard")
    plus = make_trainer(tmp_path / "b", callbacks=[extra], report_to="tensorboard", trainer_class=TrainerPlus)
    assert isinstance(plus.callback_handler, CallbackHandler)
    assert [type(cb) for cb in plus.callback_handler.callbacks] == [
        type(cb) for cb in stock.callback_handler.callbacks
    ]
    assert extra in plus.callback_handler.callbacks


def test_pre_log_runs_right_before_on_log_of_every_record(tmp_path):
    recorder = EventRecorder(custom_events=["on_pre_log"])
    trainer = make_trainer(tmp_path, callbacks=[recorder], trainer_class=TrainerPlus, **EVAL_EVERY)
    trainer.train()
    events = [event for event in recorder.events if event.event in ("on_pre_log", "on_log")]
    assert [event.event for event in events[:2]] == ["on_pre_log", "on_log"]
    assert recorder.count("on_pre_log") == recorder.count("on_log") == len(trainer.state.log_history)
    for pre, post in zip(events[::2], events[1::2]):
        assert (pre.event, post.event) == ("on_pre_log", "on_log")
        # fired when the record reaches the handler's on_log, as the last history entry
        assert post.history_length == pre.history_length
    assert "epoch" in events[0].keys  # callbacks see the full record


def test_tensorboard_receives_fixed_logs_with_trainer_plus(tmp_path):
    extra = AddEvalExtra()
    trainer = make_trainer(tmp_path, callbacks=[extra], trainer_class=TrainerPlus, report_to="tensorboard",
                           compute_metrics=nested_metrics, **EVAL_EVERY)
    trainer.train()
    scalars = read_scalars(tmp_path)
    assert set(scalars["eval/extra"]) == {4, 8}
    assert scalars["eval/extra"][8] == pytest.approx(2 * scalars["eval/loss"][8], rel=1e-5)
    assert set(scalars["eval/detail.rmse"]) == {4, 8}  # nested dict flattened: not dropped
    history = [r for r in trainer.state.log_history if "eval_loss" in r]
    assert all("eval_extra" in r and "eval_detail.rmse" in r for r in history)


def test_tensorboard_misses_callback_changes_in_a_stock_trainer(tmp_path):
    class FixInOnLog(TrainerCallback):  # the best a user callback can do in a stock Trainer
        def on_log(self, args, state, control, logs=None, **kwargs):
            if "eval_loss" in logs:
                logs["eval_extra"] = 1.0

    trainer = make_trainer(tmp_path, callbacks=[FixInOnLog()], report_to="tensorboard", **EVAL_EVERY)
    trainer.train()
    scalars = read_scalars(tmp_path)
    assert "eval/loss" in scalars and "eval/extra" not in scalars  # TensorBoard ran first


def test_on_training_loss_sees_every_micro_batch_and_raw_nan(tmp_path):
    class NanLabels(RegressionDataset):
        def __getitem__(self, index):
            item = super().__getitem__(index)
            return {**item, "labels": torch.tensor(float("nan"))} if index == 5 else item

    losses = EventRecorder(custom_events=["on_training_loss"])
    trainer = make_trainer(tmp_path, callbacks=[losses], trainer_class=TrainerPlus, n_train=8,
                           per_device_train_batch_size=2, gradient_accumulation_steps=2,
                           num_train_epochs=1, logging_steps=1)
    trainer.train_dataset = NanLabels(8, seed=1)
    trainer.train()
    values = [event.values["loss"] for event in losses.of("on_training_loss")]
    assert len(values) == 4  # 8 samples / batch 2: 4 micro-batches, 2 optimizer steps
    assert any(math.isnan(v) for v in values)  # before logging_nan_inf_filter


def test_no_training_loss_dispatch_without_a_listener(tmp_path):
    trainer = make_trainer(tmp_path, trainer_class=TrainerPlus, max_steps=2)
    fired = []
    original = trainer.callback_handler.call_event

    def counting(event, *args, **kwargs):
        fired.append(event)
        return original(event, *args, **kwargs)

    trainer.callback_handler.call_event = counting
    trainer.train()
    assert "on_training_loss" not in fired


def test_on_exception_then_reraised(tmp_path):
    class FailingAtStep2(TrainerCallback):  # injects the failure
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                raise RuntimeError("boom at step 2")

    recorder = EventRecorder(custom_events=["on_exception"])
    trainer = make_trainer(tmp_path, callbacks=[recorder, FailingAtStep2()], trainer_class=TrainerPlus)
    with pytest.raises(RuntimeError, match="boom at step 2"):
        trainer.train()
    exceptions = recorder.of("on_exception")
    assert len(exceptions) == 1 and exceptions[0].global_step == 2
    assert str(exceptions[0].values["exception"]) == "boom at step 2"


def test_custom_prefixes_and_eval_datasets_feed_the_grammar(tmp_path):
    trainer = make_trainer(tmp_path, trainer_class=TrainerPlus, max_steps=1)
    trainer.eval_dataset = {"near": RegressionDataset(8, seed=3), "far": RegressionDataset(8, seed=4)}
    metrics = trainer.evaluate()
    assert "eval_near_loss" in metrics and "eval_far_mse" in metrics
    assert trainer.key_grammar.render("eval_near_loss") == "eval/near/loss"
    metrics = trainer.evaluate(RegressionDataset(8, seed=5), metric_key_prefix="val")
    assert "val_loss" in metrics
    assert trainer.key_grammar.render("val_mse") == "val/mse"


def test_loop_context_names_the_loop_arguments(tmp_path):
    seen = []

    class ReadContext(TrainerCallback):
        def on_log(self, args, state, control, **kwargs):
            seen.append(dict(trainer.loop_context))

    trainer = make_trainer(tmp_path, callbacks=[ReadContext()], trainer_class=TrainerPlus,
                           max_steps=2, logging_steps=1)
    trainer.train()
    in_loop = [context for context in seen if context]
    assert len(in_loop) == 2
    for context in in_loop:
        assert {"tr_loss", "grad_norm", "model", "epoch"} <= set(context)
    assert dict(trainer.loop_context) == {}


class CustomLossTrainer(transformers.Trainer):
    """A user's Trainer subclass (doubles the loss) to mix TrainerPlusMixin into."""

    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        outputs = model(**inputs)
        loss = 2.0 * outputs["loss"]
        return (loss, outputs) if return_outputs else loss


class PlusCustom(TrainerPlusMixin, CustomLossTrainer):
    pass


class PlusSeq2Seq(TrainerPlusMixin, transformers.Seq2SeqTrainer):
    pass


@pytest.mark.parametrize("trainer_class", [PlusCustom, PlusSeq2Seq])
def test_mixin_on_other_trainer_subclasses(tmp_path, trainer_class):
    extra = AddEvalExtra()
    overrides = dict(EVAL_EVERY)
    if trainer_class is PlusSeq2Seq:
        args = transformers.Seq2SeqTrainingArguments(
            output_dir=str(tmp_path), per_device_train_batch_size=8, per_device_eval_batch_size=8,
            learning_rate=0.1, report_to="tensorboard", use_cpu=True, disable_tqdm=True,
            save_strategy="no", **overrides,
        )
        from tests.tiny_models import TinyRegressionModel, regression_metrics

        trainer = trainer_class(
            model=TinyRegressionModel(), args=args, train_dataset=RegressionDataset(64, 1),
            eval_dataset=RegressionDataset(16, 2), compute_metrics=regression_metrics, callbacks=[extra],
        )
    else:
        trainer = make_trainer(tmp_path, callbacks=[extra], trainer_class=trainer_class,
                               report_to="tensorboard", **overrides)
    trainer.train()
    assert extra.pre_log_calls == len(trainer.state.log_history)
    scalars = read_scalars(tmp_path)
    assert set(scalars["eval/extra"]) == {4, 8}
    metrics = trainer.evaluate(metric_key_prefix="holdout")
    assert "holdout_loss" in metrics and trainer.key_grammar.render("holdout_loss") == "holdout/loss"
