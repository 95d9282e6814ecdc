"""Several EarlyStopping instances: separate state across resume, same order, clear errors."""

from __future__ import annotations

import pytest

from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
from tests.callbacks.early_stopping_helpers import RESUME_SCRIPT, scripted_lightweight, scripted_trainer

pytestmark = pytest.mark.transformers

LOOPS = {"transformers": scripted_trainer, "lightweight": scripted_lightweight}


def two_stoppers():
    # The same metric and mode, told apart by log_name. Script by evaluation (every 2 steps):
    # 5, 4, 3, 3.5, 2.5, 2.6, 2.7, ... "patient" keeps best 2.5@10; "coarse" needs > 0.6 to
    # improve, keeps best 3@6 and stops at step 14 (patience 4).
    return (EarlyStopping("eval_score", mode="min", patience=30, log_name="patient"),
            EarlyStopping("eval_score", mode="min", patience=4, min_delta=0.6, log_name="coarse"))


def train(loop, output_dir, resume=None):
    patient, coarse = two_stoppers()
    trainer = LOOPS[loop](output_dir, RESUME_SCRIPT, callbacks=[patient, coarse], save_strategy="steps",
                          save_steps=4, logging_steps=100)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, patient, coarse


def outcome(stopper):
    return stopper.best_value, stopper.best_step, stopper.stopped_step, stopper.wait


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_same_metric_instances_each_resume_their_own_state_in_the_same_order(tmp_path, loop):
    trainer, patient, coarse = train(loop, tmp_path / "full")
    assert trainer.state.global_step == 14
    assert outcome(patient) == (2.5, 10, None, 2) and outcome(coarse) == (3.0, 6, 14, 4)
    order = [type(cb).__name__ for cb in trainer.callback_handler.callbacks]

    # at checkpoint-12 the two states differ (patient: best 2.5@10, coarse: best 3@6, wait 3)
    checkpoint = tmp_path / "full" / "checkpoint-12"
    resumed, patient_again, coarse_again = train(loop, tmp_path / "resumed", checkpoint)
    assert resumed.state.global_step == 14
    assert outcome(patient_again) == outcome(patient) and outcome(coarse_again) == outcome(coarse)
    assert [type(cb).__name__ for cb in resumed.callback_handler.callbacks] == order
    assert resumed.callback_handler.callbacks.index(patient_again) < resumed.callback_handler.callbacks.index(
        coarse_again)


def test_two_instances_with_one_state_key_are_refused_at_train_begin(tmp_path):
    first = EarlyStopping("eval_score", mode="min")
    second = EarlyStopping("eval_score", mode="min", patience=9)
    trainer = scripted_trainer(tmp_path, RESUME_SCRIPT, callbacks=[first, second])
    with pytest.raises(ValueError, match=r"2 instances share state_key='EarlyStopping\[eval_score,min\]'.*"
                                         r"distinct log_name"):
        trainer.train()


def test_patience_zero_behaves_like_one(tmp_path):
    stoppers = {patience: EarlyStopping("eval_score", mode="min", patience=patience) for patience in (0, 1)}
    steps = {}
    for patience, stopper in stoppers.items():
        trainer = scripted_trainer(tmp_path / str(patience), RESUME_SCRIPT, callbacks=[stopper])
        trainer.train()
        steps[patience] = (trainer.state.global_step, stopper.best_step)
    assert steps[0] == steps[1] == (8, 6)  # 3.5 at step 8 does not improve on 3 at step 6


# -- aliases, the same instance twice ------------------------------------------------------------

@pytest.mark.parametrize(
    ("first", "second"),
    [("eval_loss", "eval/loss"), ("eval/loss", "eval/loss"),
     ("train_subset_accuracy", "train_subset/accuracy"), ("loss", "train/loss"), ("gap_loss", "gap/loss"),
     ("eval_rewards/accuracies", "eval/rewards/accuracies")],
)
def test_aliases_of_one_metric_have_one_state_key(first, second):
    assert EarlyStopping(first, mode="min").state_key == EarlyStopping(second, mode="min").state_key
    assert EarlyStopping(first, mode="min").state_key != EarlyStopping(first, mode="max").state_key


@pytest.mark.parametrize("second", ["eval_score", "eval/score"])
def test_aliases_in_one_trainer_are_refused_at_train_begin(tmp_path, second):
    first = EarlyStopping("eval_score", mode="min")
    other = EarlyStopping(second, mode="min", patience=9)
    trainer = scripted_trainer(tmp_path, RESUME_SCRIPT, callbacks=[first, other])
    with pytest.raises(ValueError, match=r"2 instances share state_key='EarlyStopping\[eval_score,min\]'.*"
                                         r"distinct log_name"):
        trainer.train()
    assert trainer.state.global_step == 0


@pytest.mark.parametrize("runner", ["stock", "trainerplus", "lightweight"])
def test_one_instance_listed_twice_says_so(tmp_path, runner):
    from hf_callbacks_plus.integrations.transformers import TrainerPlus

    stopper = EarlyStopping("eval_score", mode="min")
    if runner == "lightweight":
        trainer = scripted_lightweight(tmp_path, RESUME_SCRIPT, callbacks=[stopper, stopper])
    else:
        trainer = scripted_trainer(tmp_path, RESUME_SCRIPT, callbacks=[stopper, stopper],
                                   trainer_class=TrainerPlus if runner == "trainerplus" else None)
    with pytest.raises(ValueError, match=r"the same instance \(EarlyStopping\[eval_score,min\]\) is listed "
                                         r"twice") as err:
        trainer.train()
    assert "log_name" not in str(err.value)


def test_train_can_be_called_again_with_the_same_instances(tmp_path):
    stopper = EarlyStopping("eval_score", mode="min")
    trainer = scripted_trainer(tmp_path, RESUME_SCRIPT, callbacks=[stopper], max_steps=4)
    trainer.train()
    trainer.train()  # no "listed twice": the claim of the first run was released at its end
    assert trainer.state.global_step == 4


@pytest.mark.parametrize(
    ("stopper", "old_key", "args"),
    [(lambda: EarlyStopping("eval/score", mode="min"), "EarlyStopping[eval/score,min]", {}),
     (lambda: EarlyStopping(), "EarlyStopping[score,max]",
      {"metric_for_best_model": "score", "greater_is_better": True})],
)
def test_a_checkpoint_saved_under_the_old_key_still_restores(stopper, old_key, args):
    """Checkpoints written before the monitor was canonical keep their state on resume."""
    from types import SimpleNamespace

    from hf_callbacks_plus.core.state import TrainerState

    instance = stopper()
    instance._check_settings(SimpleNamespace(**args))
    assert instance.state_key != old_key
    saved = {"args": {}, "attributes": {"state_key": old_key, "wait": 2, "best_value": 1.5, "best_step": 4}}
    state = TrainerState(global_step=8, stateful_callbacks={"EarlyStopping": [saved]})
    assert instance.restore_from_trainer_state(state)
    assert (instance.wait, instance.best_value, instance.best_step) == (2, 1.5, 4)
