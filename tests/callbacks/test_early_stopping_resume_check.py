"""Resuming a run that EarlyStopping already stopped: LightweightTrainer and TrainerPlus do not train.

Their ``on_resume_check`` vetoes the run before any step (a stock Trainer runs one step first:
see ``test_early_stopping_resume.py``).
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest
import torch

from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping, StopReason
from hf_callbacks_plus.loop.checkpoints import MODEL_STATE_NAME
from hf_callbacks_plus.testing import EventRecorder
from tests.callbacks.early_stopping_helpers import RESUME_SCRIPT, scripted_lightweight, scripted_trainer

pytestmark = pytest.mark.transformers

STOP_STEP, BEST_STEP, BEST_VALUE = 16, 10, 2.5


def trainer_plus(*args, **kwargs):
    from hf_callbacks_plus.integrations.transformers import TrainerPlus

    return scripted_trainer(*args, trainer_class=TrainerPlus, **kwargs)


LOOPS = {"lightweight": scripted_lightweight, "trainerplus": trainer_plus}


def build(loop: str, output_dir: Path, callbacks=(), **stopper_kwargs):
    stopper = EarlyStopping("eval_score", mode="min", patience=3, **stopper_kwargs)
    trainer = LOOPS[loop](output_dir, RESUME_SCRIPT, callbacks=[stopper, *callbacks], save_strategy="steps",
                          save_steps=4, logging_steps=100)
    return trainer, stopper


def checkpoint_weights(loop: str, checkpoint: Path) -> dict:
    if loop == "lightweight":
        return pickle.loads((checkpoint / MODEL_STATE_NAME).read_bytes())
    from safetensors.torch import load_file

    return load_file(str(checkpoint / "model.safetensors"))


@pytest.mark.parametrize("resume", ["path", "newest"])
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_resuming_the_stop_checkpoint_runs_no_step(tmp_path, caplog, loop, resume):
    trainer, _ = build(loop, tmp_path)
    trainer.train()
    assert trainer.state.global_step == STOP_STEP
    checkpoint = tmp_path / f"checkpoint-{STOP_STEP}"
    recorder = EventRecorder()
    resumed, stopper = build(loop, tmp_path, callbacks=[recorder])
    before = {k: v.clone() for k, v in resumed.model.state_dict().items()}
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        output = resumed.train(resume_from_checkpoint=str(checkpoint) if resume == "path" else True)
    assert "on_step_begin" not in recorder.names() and recorder.names() == ["on_init_end"]
    assert resumed.state.global_step == STOP_STEP == output.global_step
    assert output.metrics["train_skipped"] == 1.0
    saved = checkpoint_weights(loop, checkpoint)
    weights = resumed.model.state_dict()
    assert all(torch.equal(weights[k].cpu(), saved[k]) for k in saved)
    assert any(not torch.equal(before[k], weights[k]) for k in saved)  # really loaded, not left as built
    assert (stopper.stopped, stopper.stopped_step, stopper.reason) == (True, STOP_STEP, StopReason.PATIENCE)
    assert (stopper.best_value, stopper.best_step) == (BEST_VALUE, BEST_STEP)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "not training the run resumed from" in warnings[0] and str(checkpoint) in warnings[0]
    assert "EarlyStopping stopped training at step 16: eval_score=2.8 did not improve" in warnings[0]
    assert "reset_on_resume=True" in warnings[0]


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_reset_on_resume_trains_on(tmp_path, loop):
    trainer, _ = build(loop, tmp_path)
    trainer.train()
    recorder = EventRecorder()
    resumed, stopper = build(loop, tmp_path / "reset", callbacks=[recorder], reset_on_resume=True)
    output = resumed.train(resume_from_checkpoint=str(tmp_path / f"checkpoint-{STOP_STEP}"))
    # counting restarts from the kept best (2.5 at step 10): 2.9, 3.0, 3.1 at steps 18-22 -> stop at 22
    assert (stopper.best_step, stopper.stopped_step, resumed.state.global_step) == (BEST_STEP, 22, 22)
    assert recorder.steps("on_step_begin")[0] == STOP_STEP and "train_skipped" not in output.metrics


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_resuming_before_the_stop_is_not_vetoed(tmp_path, loop):
    trainer, _ = build(loop, tmp_path)
    trainer.train()
    resumed, stopper = build(loop, tmp_path / "r")
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-12"))
    outcome = (resumed.state.global_step, stopper.stopped_step, stopper.best_step)
    assert outcome == (STOP_STEP, STOP_STEP, BEST_STEP)
