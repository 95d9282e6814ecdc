"""EarlyStopping(restore_best=True) on a LoRA model equals the stock EarlyStoppingCallback +
load_best_model_at_end on the same run: fresh, resumed before and after the best step, with
the best checkpoint rotated away.

The monitored metric is scripted by step (``compute_metrics``) so the best step is known:
step 4 of evaluations at 2, 4, 6, 8 (patience 2: both stop at step 8).
"""

from __future__ import annotations

import logging
import os

import pytest
from transformers import EarlyStoppingCallback, TrainerCallback

from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
from tests.trl_peft import runs

pytestmark = [pytest.mark.transformers, pytest.mark.slow]

SCORES = {2: 5.0, 4: 3.0, 6: 4.0, 8: 4.5, 10: 4.2, 12: 4.1}
BEST_STEP = 4


class ScriptedScore:
    """``compute_metrics`` returning the scripted score of the trainer's current step."""

    def __init__(self):
        self.trainer = None

    def __call__(self, eval_pred):
        return {"score": SCORES[self.trainer.state.global_step]}


class FaultInjectingCrash(TrainerCallback):
    """Injects a crash (the process dying) at the end of one step."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise RuntimeError(f"injected crash at step {self.step}")


ARGS = dict(max_steps=8, eval_strategy="steps", eval_steps=2, logging_steps=2, save_strategy="steps",
            save_steps=2, save_total_limit=1, with_subset_eval=False, peft=True)


def build(output_dir, callbacks, **overrides):
    score = ScriptedScore()
    trainer = runs.trainer("sft", output_dir, callbacks=callbacks, compute_metrics=score,
                           **{**ARGS, **overrides})
    score.trainer = trainer
    return trainer


def lora_weights(trainer):
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters() if p.requires_grad}


def assert_same_weights(got, expected):
    assert got.keys() == expected.keys() and got
    assert all(bool((got[name] == expected[name]).all()) for name in expected)


@pytest.fixture(scope="module")
def stock_best(tmp_path_factory):
    """Stock trl SFTTrainer + EarlyStoppingCallback + load_best_model_at_end (best protected)."""
    trainer = build(tmp_path_factory.mktemp("stock"), [EarlyStoppingCallback(early_stopping_patience=2)],
                    load_best_model_at_end=True, metric_for_best_model="score", greater_is_better=False)
    recorder = {}

    class Remember(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            recorder[state.global_step] = {n: p.detach().clone() for n, p in model.named_parameters()
                                           if p.requires_grad}

    trainer.add_callback(Remember())
    trainer.train()
    assert trainer.state.global_step == 8
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{BEST_STEP}")
    final = lora_weights(trainer)
    assert_same_weights(final, recorder[BEST_STEP])
    assert any(bool((recorder[8][n] != final[n]).any()) for n in final)  # restoring changed the weights
    return final


def ours(**kwargs):
    return EarlyStopping("eval_score", mode="min", patience=2, restore_best=True, **kwargs)


def test_fresh_run_keeps_only_the_adapter_in_memory_and_restores_it(tmp_path, stock_best, caplog):
    stopper = ours()
    trainer = build(tmp_path, [stopper])
    snapshots = []

    class SnapshotSize(TrainerCallback):
        def on_evaluate(self, args, state, control, **kwargs):
            if stopper._best_weights.snapshot is not None:
                snapshots.append(sum(t.numel() for t in stopper._best_weights.snapshot.values()))

    trainer.add_callback(SnapshotSize())
    with caplog.at_level(logging.INFO, logger="hf_callbacks_plus"):
        trainer.train()
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.model.parameters())
    assert snapshots and set(snapshots) == {trainable} and trainable * 10 < total
    assert (stopper.best_step, stopper.stopped_step) == (BEST_STEP, 8)
    assert_same_weights(lora_weights(trainer), stock_best)
    # the best checkpoint was rotated away (save_total_limit=1): the copy carried in checkpoint-8 served
    assert not os.path.isdir(tmp_path / f"checkpoint-{BEST_STEP}")
    assert "restored the best weights (step 4" in caplog.text


@pytest.mark.parametrize("crash_at", [3, 7], ids=["resumed-before-best", "resumed-after-best-rotated-away"])
def test_resumed_run_restores_the_best_like_stock(tmp_path, stock_best, crash_at, caplog):
    with pytest.raises(RuntimeError, match="injected crash"):
        build(tmp_path, [ours(), FaultInjectingCrash(crash_at)]).train()
    checkpoint = tmp_path / f"checkpoint-{crash_at - 1}"
    assert checkpoint.is_dir() and (checkpoint / "adapter_model.safetensors").is_file()
    if crash_at > BEST_STEP:
        assert not (tmp_path / f"checkpoint-{BEST_STEP}").exists()  # rotated away
        assert any(name.startswith("best_weights-") for name in os.listdir(checkpoint))
    stopper = ours()
    trainer = build(tmp_path, [stopper])
    with caplog.at_level(logging.INFO, logger="hf_callbacks_plus"):
        trainer.train(resume_from_checkpoint=str(checkpoint))
    assert (stopper.best_step, stopper.stopped_step) == (BEST_STEP, 8)
    assert "cannot restore" not in caplog.text
    assert_same_weights(lora_weights(trainer), stock_best)


def test_adapter_checkpoint_of_the_best_step_is_used_when_kept(tmp_path, stock_best, caplog):
    """Without rotation the copy is dropped and the adapter checkpoint itself is loaded."""
    stopper = ours()
    trainer = build(tmp_path, [stopper], save_total_limit=None)
    with caplog.at_level(logging.INFO, logger="hf_callbacks_plus"):
        trainer.train()
    assert stopper._best_weights.snapshot is None
    assert stopper.best_checkpoint.endswith(f"checkpoint-{BEST_STEP}")
    assert f"checkpoint-{BEST_STEP}" in caplog.text.split("restored the best weights")[1]
    assert_same_weights(lora_weights(trainer), stock_best)


#: A near miss: transformers' best moves from 2 to 4 (an improvement below min_delta=0.1).
NEAR_MISS = {2: 5.0, 4: 4.95, 6: 5.5, 8: 5.6, 10: 5.7, 12: 5.8}


class RecordAdapter(TrainerCallback):
    def __init__(self):
        self.weights = {}

    def on_evaluate(self, args, state, control, model=None, **kwargs):
        self.weights[state.global_step] = {n: p.detach().clone() for n, p in model.named_parameters()
                                           if p.requires_grad}


@pytest.mark.parametrize("monitor", ["eval_score", None])
@pytest.mark.parametrize("load_best", [False, True])
def test_lora_min_delta_with_a_save_limit_ends_on_its_own_best(tmp_path, monitor, load_best, monkeypatch):
    """SFTTrainer + LoRA, metric_for_best_model set, min_delta=0.1, save_total_limit=1: ours is
    step 2 while transformers protects checkpoint-4 and rotates checkpoint-2 away."""
    monkeypatch.setattr(ScriptedScore, "__call__",
                        lambda self, _: {"score": NEAR_MISS[self.trainer.state.global_step]})
    stopper = EarlyStopping(monitor, mode="min", patience=3, min_delta=0.1, restore_best=True)
    recorder = RecordAdapter()
    trainer = build(tmp_path, [stopper, recorder], max_steps=12, metric_for_best_model="score",
                    greater_is_better=False, load_best_model_at_end=load_best)
    trainer.train()
    assert (stopper.best_step, stopper.stopped_step) == (2, 8)
    assert trainer.state.best_model_checkpoint.endswith("checkpoint-4")
    assert not (tmp_path / "checkpoint-2").exists()
    assert any(bool((recorder.weights[8][n] != recorder.weights[2][n]).any()) for n in recorder.weights[2])
    assert_same_weights(lora_weights(trainer), recorder.weights[2])
