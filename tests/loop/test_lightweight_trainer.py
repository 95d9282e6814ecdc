"""LightweightTrainer on its own (no torch, no transformers needed): flow, hooks, custom events."""

from __future__ import annotations

import json
import math

import pytest

from hf_callbacks_plus.core.checkpoint_folders import get_last_checkpoint
from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments, TrainerCallback, TrainerState
from hf_callbacks_plus.testing import EventRecorder


def make(tmp_path, callbacks=(), train_data=None, **kwargs):
    trainer_kwargs = {
        key: kwargs.pop(key)
        for key in list(kwargs)
        if key
        in {
            "train_step",
            "eval_data",
            "eval_step",
            "metrics_fn",
            "eval_fn",
            "model",
            "optimizer",
            "lr_scheduler",
            "optimizer_step_fn",
            "learning_rate_fn",
            "save_model_fn",
            "load_model_fn",
            "num_tokens_fn",
        }
    }
    args = LoopArguments(
        output_dir=str(tmp_path), disable_tqdm=True, save_strategy=kwargs.pop("save_strategy", "no"), **kwargs
    )
    trainer_kwargs.setdefault("train_step", lambda batch: float(sum(batch)))
    return LightweightTrainer(
        args,
        train_data=train_data if train_data is not None else [[1.0], [2.0], [3.0], [4.0]],
        callbacks=list(callbacks),
        **trainer_kwargs,
    )


def test_event_order_of_a_small_run(tmp_path):
    recorder = EventRecorder()
    make(
        tmp_path,
        [recorder],
        train_data=[[1.0]] * 3,
        max_steps=2,
        gradient_accumulation_steps=2,
        logging_steps=1,
    ).train()
    assert recorder.names() == [
        "on_init_end",
        "on_train_begin",
        "on_epoch_begin",
        "on_step_begin",
        "on_substep_end",
        "on_pre_optimizer_step",
        "on_optimizer_step",
        "on_step_end",
        "on_log",
        "on_step_begin",
        "on_pre_optimizer_step",
        "on_optimizer_step",
        "on_step_end",
        "on_log",
        "on_epoch_end",
        "on_log",
        "on_train_end",
    ]
    assert recorder.steps("on_log") == [1, 2, 2]
    assert recorder.of("on_step_end")[1].epoch == 1.0  # the short last accumulation ends the epoch
    assert recorder.of("on_step_end")[1].flags == ("should_training_stop", "should_log")


def test_logged_values_and_final_record(tmp_path):
    trainer = make(
        tmp_path,
        train_data=[[1.0], [3.0]],
        max_steps=2,
        logging_steps=1,
        gradient_accumulation_steps=2,
        train_step=lambda batch: {"loss": batch[0], "grad_norm": 0.5},
        learning_rate_fn=lambda: 0.01,
    )
    output = trainer.train()
    first = trainer.state.log_history[0]
    assert first == {"loss": 2.0, "grad_norm": 0.5, "learning_rate": 0.01, "epoch": 1.0, "step": 1}
    final = trainer.state.log_history[-1]
    assert {
        "train_runtime",
        "train_samples_per_second",
        "train_steps_per_second",
        "total_flos",
        "train_loss",
        "epoch",
        "step",
    } == set(final)
    assert output.global_step == 2 and output.training_loss == pytest.approx(2.0)


def test_nan_losses_are_filtered_from_logs_but_reach_on_training_loss(tmp_path):
    recorder = EventRecorder(custom_events=["on_training_loss"])
    losses = iter([1.0, float("nan"), 3.0, 5.0])
    trainer = make(tmp_path, [recorder], max_steps=4, logging_steps=2, train_step=lambda batch: next(losses))
    trainer.train()
    seen = [event.values["loss"] for event in recorder.of("on_training_loss")]
    assert math.isnan(seen[1]) and len(seen) == 4
    # transformers' rule: tr_loss += tr_loss / (1 + global_step - last_logged) = 1 + 1/2, over 2 steps
    assert trainer.state.log_history[0]["loss"] == pytest.approx(0.75)
    assert trainer.state.log_history[1]["loss"] == pytest.approx(4.0)


def test_on_training_loss_receives_loss_scaled_by_accumulation(tmp_path):
    recorder = EventRecorder(custom_events=["on_training_loss"])
    make(
        tmp_path,
        [recorder],
        train_data=[[2.0], [4.0], [6.0]],
        num_train_epochs=1,
        gradient_accumulation_steps=2,
    ).train()
    seen = [event.values["loss"] for event in recorder.of("on_training_loss")]
    assert seen == [1.0, 2.0, 6.0]  # last accumulation has one batch


def test_on_pre_log_edits_logs_before_history_and_on_log(tmp_path):
    class AddKey(TrainerCallback):
        def on_pre_log(self, args, state, control, logs, **kwargs):
            logs["extra/value"] = 1.5

    recorder = EventRecorder(custom_events=["on_pre_log"])
    trainer = make(tmp_path, [AddKey(), recorder], max_steps=2, logging_steps=1)
    trainer.train()
    assert all("extra/value" in entry for entry in trainer.state.log_history)
    assert "extra/value" in recorder.of("on_log")[0].keys
    assert recorder.names().index("on_pre_log") < recorder.names().index("on_log")


def test_on_exception_fires_then_reraises(tmp_path):
    recorder = EventRecorder(custom_events=["on_exception"])

    def failing_step(batch):
        if batch[0] == 3.0:
            raise RuntimeError("boom")
        return 1.0

    trainer = make(tmp_path, [recorder], train_step=failing_step, max_steps=4)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.train()
    assert recorder.names()[-1] == "on_exception" and recorder.events[-1].global_step == 2
    assert not trainer.is_in_train


def test_should_epoch_stop_and_training_stop(tmp_path):
    class Stopper(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                control.should_epoch_stop = True
            if state.global_step == 6:
                control.should_training_stop = True

    recorder = EventRecorder()
    make(tmp_path, [Stopper(), recorder], num_train_epochs=3, logging_strategy="epoch").train()
    assert recorder.steps("on_epoch_end") == [1, 5, 6]
    assert recorder.count("on_epoch_begin") == 3


def test_evaluate_modes_and_prefixes(tmp_path):
    trainer = make(
        tmp_path,
        eval_data={"a": [[1.0, 2.0], [3.0]], "b": [[0.0]]},
        eval_step=lambda batch: {"loss": sum(batch)},
        metrics_fn=lambda outputs: {"count": len(outputs)},
    )
    metrics = trainer.evaluate()
    assert metrics["eval_a_count"] == 2 and metrics["eval_b_count"] == 1
    assert metrics["eval_a_loss"] == pytest.approx((3.0 * 2 + 3.0 * 1) / 3)  # weighted by batch size
    assert {"eval_a_runtime", "eval_a_samples_per_second", "eval_b_steps_per_second"} <= set(metrics)
    single = make(tmp_path, eval_fn=lambda data: {"acc": 0.5, "eval_f1": 0.2})
    assert {"eval_acc", "eval_f1", "epoch"} <= set(single.evaluate())
    output = trainer.predict([[1.0]], metric_key_prefix="test")
    assert output.predictions == [{"loss": 1.0}] and output.metrics["test_loss"] == 1.0


def test_evaluation_needs_something_to_evaluate(tmp_path):
    with pytest.raises(ValueError, match="eval_strategy='epoch' needs eval_data or eval_fn"):
        make(tmp_path, eval_strategy="epoch")
    with pytest.raises(ValueError, match="nothing to evaluate"):
        make(tmp_path).evaluate()


def test_best_metric_missing_key_lists_available(tmp_path):
    trainer = make(
        tmp_path,
        eval_fn=lambda data: {"accuracy": 1.0},
        eval_strategy="epoch",
        metric_for_best_model="acuracy",
        num_train_epochs=1,
    )
    with pytest.raises(KeyError, match="eval_accuracy"):
        trainer.train()


def test_unsized_train_data_needs_max_steps(tmp_path):
    with pytest.raises(ValueError, match="max_steps"):
        make(tmp_path, train_data=iter([[1.0]])).train()
    trainer = make(tmp_path, train_data=(x for x in [[1.0]] * 10), max_steps=3)
    assert trainer.train().global_step == 3


def test_optimizer_and_scheduler_are_called_at_optimizer_steps(tmp_path):
    calls = []

    class Optimizer:
        def step(self):
            calls.append("step")

        def zero_grad(self):
            calls.append("zero_grad")

    class Scheduler:
        def step(self):
            calls.append("scheduler")

        def get_last_lr(self):
            return [0.3]

    class Watch(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            calls.append("pre")

        def on_optimizer_step(self, args, state, control, **kwargs):
            calls.append("post")

    trainer = make(
        tmp_path,
        [Watch()],
        max_steps=1,
        gradient_accumulation_steps=2,
        logging_steps=1,
        optimizer=Optimizer(),
        lr_scheduler=Scheduler(),
    )
    trainer.train()
    assert calls == ["pre", "step", "post", "scheduler", "zero_grad"]
    assert trainer.state.log_history[0]["learning_rate"] == 0.3


class Model:
    """A torch-free model with ``state_dict``/``load_state_dict``."""

    def __init__(self):
        self.weight = 0

    def state_dict(self):
        return {"weight": self.weight}

    def load_state_dict(self, state):
        self.weight = state["weight"]


def test_checkpoints_rotation_and_best_model(tmp_path):
    model = Model()
    scores = iter([0.5, 0.9, 0.7, 0.6])

    def train_step(batch):
        model.weight += 1
        return 1.0

    trainer = make(
        tmp_path,
        model=model,
        train_step=train_step,
        eval_fn=lambda data: {"acc": next(scores)},
        max_steps=4,
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="steps",
        save_steps=1,
        save_total_limit=2,
        load_best_model_at_end=True,
        metric_for_best_model="acc",
    )
    trainer.train()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2", "checkpoint-4"]
    assert trainer.state.best_global_step == 2 and trainer.state.best_metric == 0.9
    assert model.weight == 2  # best model loaded back
    saved = TrainerState.load_from_json(tmp_path / "checkpoint-4" / "trainer_state.json")
    assert saved.global_step == 4 and saved.best_model_checkpoint == str(tmp_path / "checkpoint-2")
    assert "TrainerControl" in saved.stateful_callbacks


def test_resume_skips_seen_batches_and_restores_state(tmp_path):
    seen = []
    saved = []

    def train_step(batch):
        seen.append(batch[0])
        return 1.0

    first = make(
        tmp_path,
        train_step=train_step,
        train_data=[[i] for i in range(6)],
        max_steps=4,
        save_strategy="steps",
        save_steps=2,
        save_model_fn=lambda path: saved.append(path),
    )
    first.train()
    assert get_last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")
    seen.clear()
    loaded = []
    second = make(
        tmp_path,
        train_step=train_step,
        train_data=[[i] for i in range(6)],
        max_steps=8,
        save_strategy="steps",
        save_steps=2,
        load_model_fn=loaded.append,
    )
    second.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert loaded == [str(tmp_path / "checkpoint-2")]
    assert seen == [2, 3, 4, 5, 0, 1]  # batches 0-1 were trained before checkpoint-2
    assert second.state.global_step == 8 and len(saved) == 2
    with pytest.raises(ValueError, match="no valid checkpoint"):
        make(tmp_path / "empty", max_steps=1).train(resume_from_checkpoint=True)


def test_trainer_state_json_is_transformers_layout(tmp_path):
    make(tmp_path, max_steps=2, save_strategy="steps", save_steps=2, logging_steps=1).train()
    data = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())
    assert {"global_step", "log_history", "best_metric", "stateful_callbacks", "total_flos"} <= set(data)
    assert data["log_history"][0]["step"] == 1


def test_progress_callback_writes_logs(tmp_path, capsys):
    pytest.importorskip("tqdm")
    args = LoopArguments(
        output_dir=str(tmp_path), disable_tqdm=False, max_steps=2, logging_steps=1, save_strategy="no"
    )
    LightweightTrainer(args, train_step=lambda batch: 1.0, train_data=[[1.0]] * 2).train()
    assert "'loss': '1'" in capsys.readouterr().out


def test_callbacks_api(tmp_path):
    trainer = make(tmp_path)
    recorder = trainer.add_callback(EventRecorder, first=True)
    assert trainer.callback_handler.callbacks[0] is recorder
    assert trainer.pop_callback(EventRecorder) is recorder
    trainer.remove_callback(trainer.callback_handler.callbacks[0])
    assert "DefaultFlowCallback" not in trainer.callback_handler.callback_list


def test_isolated_evaluate_leaves_no_trace_even_before_training(tmp_path):
    recorder = EventRecorder()
    trainer = make(tmp_path, [recorder], max_steps=2, eval_data=[[1.0], [2.0]],
                   eval_step=lambda batch: batch[0])
    metrics = trainer.isolated_evaluate([[1.0], [3.0]], metric_key_prefix="train_subset")
    assert metrics == {"train_subset_loss": 2.0}  # no timing key, no model_preparation_time
    assert recorder.names() == ["on_init_end", "on_prediction_step", "on_prediction_step"]
    assert trainer.state.log_history == []
    # the first real evaluation before training is still the one that "prepares the model"
    assert trainer.evaluate()["eval_model_preparation_time"] == 0.0


def test_the_train_subset_evaluation_leaves_a_collate_generator_untouched(tmp_path):
    """In the loop: the subset's DataLoader collates with the training
    DataLoader's ``collate_fn``, which adds noise from a generator of its own; the training
    losses are identical with and without ``TrainSubsetEvaluation``."""
    torch = pytest.importorskip("torch")
    from hf_callbacks_plus.callbacks.train_subset import TrainSubsetEvaluation

    class NoisyCollate:
        def __init__(self):
            self.generator = torch.Generator().manual_seed(0)

        def __call__(self, rows):
            return torch.tensor(rows) + torch.rand(len(rows), generator=self.generator)

    def losses(with_subset):
        loader = torch.utils.data.DataLoader([float(i) for i in range(16)], batch_size=4,
                                             collate_fn=NoisyCollate())
        callbacks = [TrainSubsetEvaluation(size=8)] if with_subset else []
        trainer = make(tmp_path / str(with_subset), callbacks, max_steps=8, logging_steps=1, eval_steps=2,
                       eval_strategy="steps", eval_data=[torch.ones(2)], train_data=loader,
                       train_step=lambda batch: float(batch.mean()),
                       eval_step=lambda batch: float(batch.mean()))
        trainer.train()
        return [record["loss"] for record in trainer.state.log_history if "loss" in record], trainer

    expected, _ = losses(False)
    got, trainer = losses(True)
    assert any("train_subset_loss" in record for record in trainer.state.log_history)
    assert got == expected
