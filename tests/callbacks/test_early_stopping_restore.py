"""EarlyStopping(restore_best=True): best weights from the best checkpoint, else from memory.

Neither load_best_model_at_end nor a particular save strategy is needed.
"""

from __future__ import annotations

import logging

import pytest
from transformers import TrainerCallback

from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
from tests.callbacks.early_stopping_helpers import scripted_lightweight, scripted_trainer

pytestmark = pytest.mark.transformers


def by_eval(*values):
    return lambda step: values[min(max(step // 2 - 1, 0), len(values) - 1)]


class RecordWeights(TrainerCallback):
    """Remembers the tiny model's (a, b) after every step."""

    def __init__(self):
        self.weights = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.weights[state.global_step] = (model.a.item(), model.b.item())


SCRIPT = by_eval(5, 4, 3, 3.5, 3.2, 3.1)  # best at step 6, stop at step 12 (patience 3)


@pytest.mark.parametrize(("save", "source"), [("no", "memory"), ("steps", "checkpoint-6")])
def test_restore_best_from_memory_or_checkpoint(tmp_path, caplog, save, source):
    stopper = EarlyStopping("eval_score", mode="min", patience=3, restore_best=True)
    recorder = RecordWeights()
    trainer = scripted_trainer(tmp_path, SCRIPT, callbacks=[stopper, recorder], save_strategy=save,
                               save_steps=2, learning_rate=0.05)
    with caplog.at_level(logging.INFO, logger="hf_callbacks_plus"):
        trainer.train()
    assert (stopper.best_step, stopper.stopped_step) == (6, 12)
    assert recorder.weights[12] != recorder.weights[6]
    assert (trainer.model.a.item(), trainer.model.b.item()) == pytest.approx(recorder.weights[6])
    assert "restored the best weights (step 6" in caplog.text and source in caplog.text
    # the memory copy is dropped once a checkpoint safe from rotation holds the same weights
    assert (stopper._best_weights.snapshot is None) == (save == "steps")


def test_restore_best_in_lightweight_trainer_from_its_checkpoint(tmp_path):
    stopper = EarlyStopping("eval_score", mode="min", patience=3, restore_best=True)
    trainer = scripted_lightweight(tmp_path, SCRIPT, callbacks=[stopper], save_strategy="steps", save_steps=2,
                                   learning_rate=0.05)
    trainer.train()
    assert stopper.best_checkpoint.endswith("checkpoint-6")
    import pickle

    with open(tmp_path / "checkpoint-6" / "model_state.pkl", "rb") as handle:
        saved = pickle.load(handle)  # noqa: S301 - written by this test's run
    assert float(trainer.model.a) == pytest.approx(float(saved["a"]))


def test_reports_reach_trackers_through_run_before_integrations(tmp_path):
    """Stock Trainer: with run_before_integrations the early_stopping/* keys are in log_history."""
    from hf_callbacks_plus.integrations.transformers import run_before_integrations

    stopper = EarlyStopping("eval_score", mode="min", patience=3)
    trainer = scripted_trainer(tmp_path, SCRIPT)
    run_before_integrations(trainer, stopper)
    trainer.train()
    record = next(r for r in trainer.state.log_history if r.get("eval_score") is not None and r["step"] == 12)
    assert record["early_stopping/stopped_step"] == 12 and record["early_stopping/reason"] == "patience"
    assert record["early_stopping/best_value"] == 3.0 and record["early_stopping/best_step"] == 6
