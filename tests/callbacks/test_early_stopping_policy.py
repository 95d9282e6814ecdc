"""The stopping rule, tested directly by a table of cases (no trainer, no transformers, no torch)."""

from __future__ import annotations

import inspect
import math

import pytest

from hf_callbacks_plus.callbacks.early_stopping import ARGUMENTS, EarlyStopping
from hf_callbacks_plus.callbacks.early_stopping.policy import Decision, Progress, StoppingPolicy, StopReason

NAN, INF = math.nan, math.inf
R = StopReason
FRESH = Progress()


def best(value, step, wait=0, epoch=None):
    return Progress(wait, value, step, float(step) / 10 if epoch is None else epoch)


# (policy options, monitor mode/min_delta, progress before, value, step, expected decision)
CASES = {
    "first value is best": ({}, "min", FRESH, 5.0, 2,
                            Decision(True, 0, 5.0, 2, 0.2, R.NOT_STOPPED)),
    "improvement resets wait": ({}, "min", best(5.0, 2, wait=2), 4.0, 8,
                                Decision(True, 0, 4.0, 8, 0.8, R.NOT_STOPPED)),
    "no improvement counts": ({"patience": 3}, "min", best(5.0, 2, wait=1), 5.0, 6,
                              Decision(False, 2, 5.0, 2, 0.2, R.NOT_STOPPED)),
    "patience reached": ({"patience": 3}, "min", best(5.0, 2, wait=2), 6.0, 8,
                         Decision(False, 3, 5.0, 2, 0.2, R.PATIENCE)),
    "patience 0 stops at the first miss": ({"patience": 0}, "min", best(5.0, 2), 5.0, 4,
                                            Decision(False, 1, 5.0, 2, 0.2, R.PATIENCE)),
    "max mode": ({}, "max", best(0.5, 2), 0.6, 4, Decision(True, 0, 0.6, 4, 0.4, R.NOT_STOPPED)),
    "max mode lower is a miss": ({"patience": 1}, "max", best(0.5, 2), 0.4, 4,
                                 Decision(False, 1, 0.5, 2, 0.2, R.PATIENCE)),
    "min_delta: not enough": ({}, ("min", 0.1), best(1.0, 2), 0.95, 4,
                              Decision(False, 1, 1.0, 2, 0.2, R.NOT_STOPPED)),
    "min_delta: exactly the margin is not enough": ({}, ("min", 0.5), best(1.0, 2), 0.5, 4,
                                                    Decision(False, 1, 1.0, 2, 0.2, R.NOT_STOPPED)),
    "min_delta: enough": ({}, ("min", 0.1), best(1.0, 2), 0.8, 4,
                          Decision(True, 0, 0.8, 4, 0.4, R.NOT_STOPPED)),
    "baseline not beaten": ({"baseline": 0.5, "patience": 2}, "max", Progress(1), 0.4, 4,
                            Decision(False, 2, None, None, None, R.BASELINE_NOT_REACHED)),
    "baseline beaten becomes best": ({"baseline": 0.5}, "max", Progress(1), 0.6, 4,
                                     Decision(True, 0, 0.6, 4, 0.4, R.NOT_STOPPED)),
    "stopping threshold reached": ({"stopping_threshold": 2.0}, "min", best(3.0, 2), 2.0, 4,
                                   Decision(True, 0, 2.0, 4, 0.4, R.STOPPING_THRESHOLD)),
    "stopping threshold without improvement": ({"stopping_threshold": 2.0}, ("min", 5.0), best(3.0, 2), 1.5,
                                                4, Decision(False, 1, 3.0, 2, 0.2, R.STOPPING_THRESHOLD)),
    "divergence": ({"divergence_threshold": 10.0}, "min", best(3.0, 2), 11.0, 4,
                   Decision(False, 1, 3.0, 2, 0.2, R.DIVERGENCE_THRESHOLD)),
    "at the divergence threshold is not divergence": (
        {"divergence_threshold": 10.0}, "min", best(3.0, 2), 10.0, 4,
        Decision(False, 1, 3.0, 2, 0.2, R.NOT_STOPPED)),
    "nan stops": ({}, "min", best(3.0, 2), NAN, 4, Decision(False, 0, 3.0, 2, 0.2, R.NON_FINITE)),
    "inf stops, also in warm-up": ({"start_from_step": 10}, "min", FRESH, INF, 4,
                                   Decision(False, 0, None, None, None, R.NON_FINITE)),
    "nan not checked is a miss, never best": ({"check_finite": False, "patience": 1}, "min", best(3.0, 2),
                                              NAN, 4, Decision(False, 1, 3.0, 2, 0.2, R.PATIENCE)),
    "-inf not checked is never best": ({"check_finite": False}, "min", best(3.0, 2), -INF, 4,
                                       Decision(False, 1, 3.0, 2, 0.2, R.NOT_STOPPED)),
    "warm-up by step ignores": ({"start_from_step": 6}, "min", FRESH, 1.0, 6,
                                Decision(False, 0, None, None, None, R.NOT_STOPPED)),
    "after warm-up counts": ({"start_from_step": 6}, "min", FRESH, 1.0, 8,
                             Decision(True, 0, 1.0, 8, 0.8, R.NOT_STOPPED)),
    "warm-up by epoch ignores": ({"start_from_epoch": 1}, "min", FRESH, 1.0, 8,  # epoch 8/8 = 1.0
                                 Decision(False, 0, None, None, None, R.NOT_STOPPED)),
    "after the warm-up epoch counts": ({"start_from_epoch": 1}, "min", FRESH, 1.0, 9,  # epoch 1.125
                                       Decision(True, 0, 1.0, 9, 9 / 8, R.NOT_STOPPED)),
    "warm-up ignores divergence": ({"start_from_step": 6, "divergence_threshold": 2.0}, "min", FRESH, 9.0, 4,
                                   Decision(False, 0, None, None, None, R.NOT_STOPPED)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_decision_table(case):
    options, monitor_mode, progress, value, step, expected = CASES[case]
    mode, min_delta = monitor_mode if isinstance(monitor_mode, tuple) else (monitor_mode, 0.0)
    from hf_callbacks_plus.metrics.monitor import Monitor

    monitor = Monitor("eval_x", mode=mode, min_delta=min_delta)
    epoch = float(step) / 10 if options.get("start_from_epoch") is None else step / 8
    decision = StoppingPolicy(**options).decide(monitor, value, step, epoch, progress)
    assert decision == expected
    assert decision.should_stop is (expected.reason is not R.NOT_STOPPED)


def test_decide_is_pure():
    from hf_callbacks_plus.metrics.monitor import Monitor

    policy, monitor, progress = StoppingPolicy(patience=1), Monitor("eval_loss"), best(1.0, 2)
    first = policy.decide(monitor, 2.0, 4, 0.4, progress)
    assert first == policy.decide(monitor, 2.0, 4, 0.4, progress) and progress == best(1.0, 2)


def test_the_callback_decides_through_the_policy_and_changes_nothing():
    stopper = EarlyStopping("eval_loss", patience=2)
    stopper.wait, stopper.best_value, stopper.best_step, stopper.best_epoch = 1, 1.0, 2, 0.2
    assert stopper.decide(2.0, 4, 0.4) == Decision(False, 2, 1.0, 2, 0.2, R.PATIENCE)
    assert stopper.progress == Progress(1, 1.0, 2, 0.2) and not stopper.stopped
    with pytest.raises(RuntimeError, match="needs a resolved monitor"):
        EarlyStopping().decide(1.0, 1, 0.1)


def test_saved_arguments_are_the_constructor_signature():
    names = [name for name in inspect.signature(EarlyStopping.__init__).parameters if name != "self"]
    assert list(ARGUMENTS) == names
    assert EarlyStopping("eval_loss", patience=7).state_args()["patience"] == 7


# -- settings are plain attributes: a change takes effect, or raises, at the next train begin --------

def begin(stopper):
    """Fire on_train_begin as a trainer does (validates the settings, builds the rule)."""
    from types import SimpleNamespace

    from hf_callbacks_plus.core.state import TrainerControl, TrainerState

    stopper.on_train_begin(SimpleNamespace(eval_strategy="steps", output_dir=None), TrainerState(),
                           TrainerControl())


#: setting -> (new value, (value, step, epoch) observed after best 1.0@2 and wait 0,
#: expected reason or improved)
EFFECTS = {
    "patience": (1, (2.0, 4, 0.4), R.PATIENCE),
    "min_delta": (0.5, (0.8, 4, 0.4), False),
    "min_delta_mode": ("relative", (9.5, 4, 0.4), False),  # best 10, min_delta=0.1: < 9.9 -> < 9.0
    "baseline": (0.5, (0.8, 4, 0.4), False),  # nothing beat the baseline yet (fresh progress)
    "start_from_step": (10, (0.5, 4, 0.4), False),
    "start_from_epoch": (1.0, (0.5, 4, 0.4), False),
    "stopping_threshold": (0.9, (0.8, 4, 0.4), R.STOPPING_THRESHOLD),
    "divergence_threshold": (10.0, (11.0, 4, 0.4), R.DIVERGENCE_THRESHOLD),
    "check_finite": (False, (NAN, 4, 0.4), False),
}


@pytest.mark.parametrize("name", sorted(EFFECTS))
def test_a_setting_changed_after_construction_takes_effect_at_train_begin(name):
    value, (observed, step, epoch), expected = EFFECTS[name]
    stopper = EarlyStopping("eval_loss", patience=3, min_delta=0.1 if name == "min_delta_mode" else 0.0)
    if name != "baseline":
        stopper.best_value, stopper.best_step, stopper.best_epoch = 1.0, 2, 0.2
    if name == "min_delta_mode":
        stopper.best_value = 10.0
    before = stopper.decide(observed, step, epoch)
    setattr(stopper, name, value)
    progress = stopper.progress
    begin(stopper)  # the train begin validates the settings and builds the rule (and resets progress)
    stopper.wait, stopper.best_value, stopper.best_step, stopper.best_epoch = (
        progress.wait, progress.best_value, progress.best_step, progress.best_epoch)
    after = stopper.decide(observed, step, epoch)
    assert getattr(stopper, name) == value and stopper.state_args()[name] == value
    assert after != before
    if isinstance(expected, bool):
        assert after.improved is expected and after.reason is R.NOT_STOPPED
    else:
        assert after.reason is expected


@pytest.mark.parametrize(
    ("name", "value", "error", "message"),
    [("patience", -1, ValueError, r"patience must be an int >= 0"),
     ("patience", 2.5, TypeError, r"patience must be an int >= 0 .* got 2.5"),
     ("min_delta", -0.1, ValueError, r"min_delta must be >= 0"),
     ("min_delta_mode", "pct", ValueError, r"min_delta_mode must be one of"),
     ("baseline", "1", TypeError, r"baseline must be a number or None"),
     ("start_from_step", -1, ValueError, r"start_from_step must be an int >= 0"),
     ("start_from_epoch", -1, ValueError, r"start_from_epoch must be >= 0"),
     ("stopping_threshold", 5.0, ValueError,
      r"stopping_threshold=5.0 must be below or equal to baseline=2.0"),
     ("divergence_threshold", 1.0, ValueError, r"divergence_threshold=1.0 must be above baseline=2.0"),
     ("check_finite", "yes", TypeError, r"check_finite must be True or False"),
     ("strict", 1, TypeError, r"strict must be True or False"),
     ("restore_best", None, TypeError, r"restore_best must be True or False"),
     ("reset_on_resume", "no", TypeError, r"reset_on_resume must be True or False"),
     ("sync_decision", 0, TypeError, r"sync_decision must be True or False"),
     ("report", "x", TypeError, r"report must be True or False"),
     ("verbose", 2, TypeError, r"verbose must be True or False")],
)
def test_a_bad_setting_is_refused_like_the_constructor_at_train_begin(tmp_path, name, value, error, message):
    from tests.callbacks.early_stopping_helpers import scripted_loop

    stopper = EarlyStopping("eval_loss", baseline=2.0)
    setattr(stopper, name, value)
    loop = scripted_loop(tmp_path, lambda step: 1.0, callbacks=[stopper], name="loss")
    with pytest.raises(error, match=message):
        loop.train()
    assert loop.state.global_step == 0
    with pytest.raises(error, match=message):
        EarlyStopping("eval_loss", **{"baseline": 2.0, name: value})


@pytest.mark.parametrize("name", ["strict", "restore_best", "reset_on_resume", "sync_decision", "report",
                                  "verbose"])
def test_flags_are_settable(name):
    stopper = EarlyStopping("eval_loss")
    setattr(stopper, name, not getattr(stopper, name))
    assert stopper.state_args()[name] is getattr(stopper, name)


@pytest.mark.parametrize("report", [True, False])
def test_report_set_after_construction_decides_what_the_log_records_hold(tmp_path, report):
    from tests.callbacks.early_stopping_helpers import scripted_lightweight

    stopper = EarlyStopping("eval_score", mode="min", patience=2)
    stopper.report = report
    trainer = scripted_lightweight(tmp_path, lambda step: 5.0 - (step == 2), callbacks=[stopper], max_steps=8)
    trainer.train()
    assert stopper.stopped_step == 6
    reported = [key for record in trainer.state.log_history for key in record
                if key.startswith("early_stopping/")]
    assert bool(reported) is report


def test_every_argument_is_an_attribute():
    stopper = EarlyStopping("eval_loss", patience=4)
    assert {name: getattr(stopper, name) for name in ARGUMENTS} == stopper.state_args()
