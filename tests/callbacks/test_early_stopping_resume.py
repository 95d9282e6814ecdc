"""Stateful EarlyStopping: resuming from any checkpoint ends like the uninterrupted run.

No ``restore_callback_states_from_checkpoint`` anywhere: the callback restores itself.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping, StopReason
from tests.callbacks.early_stopping_helpers import (
    RESUME_SCRIPT,
    checkpoint_steps,
    scripted_lightweight,
    scripted_trainer,
)
from tests.kill_at_pause import kill_when_paused

pytestmark = pytest.mark.transformers

LOOPS = {"transformers": scripted_trainer, "lightweight": scripted_lightweight}
STOP_STEP, BEST_STEP, BEST_VALUE = 16, 10, 2.5
REPO = Path(__file__).resolve().parents[2]


def train(loop: str, output_dir: Path, resume=None, **stopper_kwargs):
    stopper = EarlyStopping("eval_score", mode="min", patience=3, **stopper_kwargs)
    trainer = LOOPS[loop](output_dir, RESUME_SCRIPT, callbacks=[stopper], save_strategy="steps",
                          save_steps=4, logging_steps=100)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, stopper


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_resume_from_every_checkpoint_ends_like_the_uninterrupted_run(tmp_path, loop):
    trainer, stopper = train(loop, tmp_path)
    assert (trainer.state.global_step, stopper.stopped_step) == (STOP_STEP, STOP_STEP)
    assert (stopper.best_value, stopper.best_step) == (BEST_VALUE, BEST_STEP)
    assert stopper.reason is StopReason.PATIENCE
    steps = checkpoint_steps(tmp_path)
    assert steps == [4, 8, 12, 16]
    for step in steps:
        resumed, again = train(loop, tmp_path / f"resume-{step}", resume=str(tmp_path / f"checkpoint-{step}"))
        assert again.stopped_step == STOP_STEP, step
        assert (again.best_value, again.best_step, again.reason.value) == (BEST_VALUE, BEST_STEP, "patience")
        # Resuming from the checkpoint written at the stop itself: a stock Trainer checks
        # `should_training_stop` only after a step, so exactly one more step runs; our loop's
        # on_resume_check vetoes the run before any step.
        extra = 1 if (step == STOP_STEP and loop == "transformers") else 0
        assert resumed.state.global_step == STOP_STEP + extra, step


def test_counter_is_restored_not_restarted_also_in_trainer_plus(tmp_path):
    """From checkpoint-12 (wait=1), a callback that forgot its counter would stop at 20, not 16."""
    from hf_callbacks_plus.integrations.transformers import TrainerPlus

    LOOPS["trainerplus"] = lambda *a, **k: scripted_trainer(*a, trainer_class=TrainerPlus, **k)
    try:
        train("trainerplus", tmp_path)
        resumed, fresh = train("trainerplus", tmp_path / "r", resume=str(tmp_path / "checkpoint-12"))
    finally:
        del LOOPS["trainerplus"]
    assert fresh.stopped_step == STOP_STEP == resumed.state.global_step and fresh.wait == 3
    assert (fresh.best_value, fresh.best_step) == (BEST_VALUE, BEST_STEP)


def test_transformers_restore_flag_still_works(tmp_path):
    """With restore_callback_states_from_checkpoint=True transformers replaces the instance."""
    train("transformers", tmp_path)
    stopper = EarlyStopping("eval_score", mode="min", patience=3)
    trainer = scripted_trainer(tmp_path / "flag", RESUME_SCRIPT, callbacks=[stopper], save_strategy="steps",
                               save_steps=4, logging_steps=100, restore_callback_states_from_checkpoint=True)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-12"))
    active = next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, EarlyStopping))
    assert (active.stopped_step, active.best_step) == (STOP_STEP, BEST_STEP)
    assert trainer.state.global_step == STOP_STEP


def test_stock_trainer_resuming_a_stopped_run_stops_after_one_step_unless_reset(tmp_path, caplog):
    """A stock Trainer has no on_resume_check: the documented one extra step."""
    train("transformers", tmp_path)
    checkpoint = str(tmp_path / f"checkpoint-{STOP_STEP}")
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer, stopper = train("transformers", tmp_path / "again", resume=checkpoint)
    assert "already stopped early at step 16 (patience); stopping again at once" in caplog.text
    assert "reset_on_resume=True" in caplog.text
    assert stopper.stopped and trainer.state.global_step == STOP_STEP + 1
    trainer, stopper = train("transformers", tmp_path / "reset", resume=checkpoint, reset_on_resume=True)
    # counting restarts from the kept best (2.5 at step 10): 2.9, 3.0, 3.1 at steps 18-22 -> stop at 22
    assert (stopper.best_step, stopper.stopped_step, trainer.state.global_step) == (BEST_STEP, 22, 22)


#: Where the run is killed: after step 7 (checkpoint-6 complete, none being written) and inside the
#: save of checkpoint-8 (its folder there, its trainer_state.json not yet): both resume from 6.
KILL_POINTS = [pytest.param("7:between", marks=pytest.mark.second_tier), "8:mid-save"]


@pytest.mark.parametrize("pause", KILL_POINTS)
def test_sigkill_then_resume_from_newest_complete_checkpoint(tmp_path, pause):
    script = str(Path(__file__).with_name("early_stopping_kill_script.py"))
    kill_when_paused(script, [str(tmp_path), pause], tmp_path / "paused", tmp_path / "stderr.txt", within=120)
    complete = [step for step in checkpoint_steps(tmp_path)
                if (tmp_path / f"checkpoint-{step}" / "trainer_state.json").exists()]
    assert complete == [2, 4, 6]
    assert checkpoint_steps(tmp_path)[-1] == (8 if pause.endswith("mid-save") else 6)
    from tests.callbacks.early_stopping_kill_script import run

    trainer, stopper = run(str(tmp_path / "resumed"), resume=str(tmp_path / "checkpoint-6"))
    outcome = (trainer.state.global_step, stopper.stopped_step, stopper.best_value, stopper.best_step)
    assert outcome == (STOP_STEP, STOP_STEP, BEST_VALUE, BEST_STEP)
