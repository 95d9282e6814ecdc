"""TerminateOnNonFinite: a stock Trainer (what it can and cannot see), TrainerPlus, LightweightTrainer."""

from __future__ import annotations

import math

import pytest
import torch

from hf_callbacks_plus.callbacks.terminate_on_nonfinite import NonFiniteError, TerminateOnNonFinite
from tests.tiny_models import TinyRegressionModel, make_trainer

pytestmark = pytest.mark.transformers
NAN_STEP = 3


class NaNAtStepModel(TinyRegressionModel):
    """The tiny model whose training loss is NaN from its NAN_STEP-th training forward on (a real
    NaN: it flows into the gradients and the weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, input_x, labels=None):
        out = super().forward(input_x, labels)
        if self.training and labels is not None:
            self.calls += 1
            if self.calls >= NAN_STEP:
                out["loss"] = out["loss"] * float("nan")
        return out


def nan_trainer(tmp_path, guard, trainer_class=None, **args):
    trainer = make_trainer(tmp_path, callbacks=[guard], trainer_class=trainer_class, max_steps=8,
                           logging_steps=1, **args)
    trainer.model = NaNAtStepModel()
    trainer.model_wrapped = trainer.model
    return trainer


def test_stock_trainer_with_nan_filter_cannot_see_the_nan_loss(tmp_path):
    guard = TerminateOnNonFinite()
    trainer = nan_trainer(tmp_path, guard)
    trainer.train()
    assert guard.triggered is None and trainer.state.global_step == 8
    assert all(math.isfinite(r["loss"]) for r in trainer.state.log_history if "loss" in r)
    assert math.isnan(trainer.model.a.item())  # the weights are NaN: the filter hid it


def test_stock_trainer_without_the_filter_stops_at_the_nan_step(tmp_path):
    guard = TerminateOnNonFinite()
    trainer = nan_trainer(tmp_path, guard, logging_nan_inf_filter=False)
    trainer.train()
    assert guard.triggered[:2] == (NAN_STEP, "loss") and math.isnan(guard.triggered[2])
    assert trainer.state.global_step == NAN_STEP


def test_stock_trainer_sees_a_watched_eval_metric(tmp_path):
    guard = TerminateOnNonFinite(monitor="eval_loss", check_training_loss=False)
    trainer = nan_trainer(tmp_path, guard, eval_strategy="steps", eval_steps=2)
    trainer.train()
    assert guard.triggered[:2] == (4, "eval_loss") and trainer.state.global_step == 4


def test_trainer_plus_catches_the_raw_loss_despite_the_filter(tmp_path):
    from hf_callbacks_plus.integrations.transformers import TrainerPlus

    guard = TerminateOnNonFinite()
    trainer = nan_trainer(tmp_path, guard, trainer_class=TrainerPlus)
    trainer.train()
    assert guard.triggered[:2] == (NAN_STEP, "training loss")
    assert trainer.state.global_step == NAN_STEP


def test_lightweight_trainer_raise_names_step_and_value(tmp_path):
    from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments

    args = LoopArguments(output_dir=str(tmp_path), max_steps=8, logging_steps=4, save_strategy="no",
                         disable_tqdm=True)
    losses = [1.0, 0.5, float("inf"), 0.2] * 2
    trainer = LightweightTrainer(args, train_step=lambda batch: losses[batch], train_data=list(range(8)),
                                 callbacks=[TerminateOnNonFinite(action="raise")])
    expected = r"training loss is inf at step 3 \(raw micro-batch loss\); raising"
    with pytest.raises(NonFiniteError, match=expected):
        trainer.train()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"action": "halt"}, ValueError, r"action must be one of \['stop', 'raise'\], got 'halt'"),
        ({"monitor": 3}, TypeError, r"monitor must be None, a metric name, a list of names or '\*', got 3"),
        ({"monitor": ["eval_loss", ""]}, TypeError, r"monitor must be None, a metric name"),
        ({"check_training_loss": "no"}, TypeError, r"check_training_loss must be True or False, got 'no'"),
    ],
)
def test_validation(kwargs, error, message):
    with pytest.raises(error, match=message):
        TerminateOnNonFinite(**kwargs)


def test_star_watches_every_value():
    from hf_callbacks_plus.core.state import TrainerControl, TrainerState

    guard, control = TerminateOnNonFinite(monitor="*"), TrainerControl()
    metrics = {"eval_f1": 0.5, "eval_x": torch.tensor(-math.inf)}
    guard.on_evaluate(None, TrainerState(global_step=5), control, metrics=metrics)
    assert control.should_training_stop and guard.triggered == (5, "eval_x", -math.inf)
