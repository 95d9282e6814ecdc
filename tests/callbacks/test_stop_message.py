"""The stop log line reads like a sentence: rounded values, the rule, the best so far."""

import math

from hf_callbacks_plus.callbacks.early_stopping.policy import StopReason, stop_message

OPTIONS = {"patience": 5, "min_delta": 0.0, "min_delta_mode": "absolute", "baseline": None,
           "stopping_threshold": 0.1, "divergence_threshold": None}


def test_patience_message_rounds_values_and_names_the_rule():
    text = stop_message(StopReason.PATIENCE, "eval_loss", 0.6764923334121704, 180,
                        best_value=0.5389625430107117, best_step=80, wait=5, options=OPTIONS)
    assert text == (
        "EarlyStopping stopped training at step 180: eval_loss=0.676492 did not improve on the best "
        "0.538963 at step 80 by more than 0.0 (absolute) for 5 evaluation(s) (patience=5). "
        "Best: 0.538963 at step 80."
    )


def test_non_finite_and_threshold_messages():
    assert "eval_loss is nan (check_finite=True)" in stop_message(
        StopReason.NON_FINITE, "eval_loss", math.nan, 7, best_value=None, best_step=None, wait=0,
        options=OPTIONS)
    assert "eval_loss=0.05 reached stopping_threshold=0.1" in stop_message(
        StopReason.STOPPING_THRESHOLD, "eval_loss", 0.05, 3, best_value=0.05, best_step=3, wait=0,
        options=OPTIONS)


# -- what the user sees on the console (verbose=True, the default) ------------------------------
import logging  # noqa: E402

import pytest  # noqa: E402

from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping  # noqa: E402
from hf_callbacks_plus.callbacks.terminate_on_nonfinite import TerminateOnNonFinite  # noqa: E402
from tests.callbacks.early_stopping_helpers import scripted_loop, scripted_trainer  # noqa: E402

STOP_LINE = ("EarlyStopping stopped training at step 10: eval_score=3.5 did not improve on the best 3 at "
             "step 6 by more than 0.0 (absolute) for 2 evaluation(s) (patience=2). Best: 3 at step 6.")
SUMMARY_LINE = "EarlyStopping summary: stopped at step 10 (patience); best eval_score=3 at step 6."


def by_eval(*values):
    return lambda step: values[min(max(step // 2 - 1, 0), len(values) - 1)]


def lines_of(text, start):
    return [line for line in text.splitlines() if line.startswith(start)]


BOTH_LOOPS = ["lightweight", pytest.param("transformers", marks=pytest.mark.transformers)]


@pytest.mark.parametrize("loop", BOTH_LOOPS)
def test_a_stop_prints_one_line_and_a_summary_by_default(tmp_path, capfd, loop):
    make = scripted_loop if loop == "lightweight" else scripted_trainer
    stopper = EarlyStopping("eval_score", mode="min", patience=2)
    make(tmp_path, by_eval(5, 4, 3, 3.5, 3.5), callbacks=[stopper]).train()
    err = capfd.readouterr().err  # the real stderr of the process (no logging handler configured)
    assert lines_of(err, "EarlyStopping stopped") == [STOP_LINE]
    assert lines_of(err, "EarlyStopping summary") == [SUMMARY_LINE]
    assert err.index(STOP_LINE) < err.index(SUMMARY_LINE)


def test_summary_when_training_ran_to_the_end_and_with_a_log_name(tmp_path, capfd):
    stopper = EarlyStopping("eval_score", mode="min", patience=50, log_name="patient")
    scripted_loop(tmp_path, by_eval(5, 4, 3), callbacks=[stopper], max_steps=8).train()
    err = capfd.readouterr().err
    assert lines_of(err, "EarlyStopping stopped") == []
    assert lines_of(err, "EarlyStopping summary") == [
        "EarlyStopping summary [patient]: no early stop (training ended at step 8); "
        "best eval_score=3 at step 6."]


def test_verbose_false_prints_nothing_and_logs_the_stop(tmp_path, capfd, caplog):
    stopper = EarlyStopping("eval_score", mode="min", patience=2, verbose=False)
    with caplog.at_level(logging.INFO, logger="hf_callbacks_plus"):
        scripted_loop(tmp_path, by_eval(5, 4, 3, 3.5, 3.5), callbacks=[stopper]).train()
    assert "EarlyStopping" not in capfd.readouterr().err
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("EarlyStopping")]
    assert logged == [STOP_LINE]


def test_verbose_lines_also_reach_the_log_at_debug_only(tmp_path, capfd, caplog):
    with caplog.at_level(logging.DEBUG, logger="hf_callbacks_plus"):
        scripted_loop(tmp_path, by_eval(5, 4, 3, 3.5, 3.5), callbacks=[EarlyStopping("eval_score", mode="min",
                                                                                   patience=2)]).train()
    ours = [r for r in caplog.records if r.getMessage().startswith("EarlyStopping")]
    assert [r.levelno for r in ours] == [logging.DEBUG, logging.DEBUG]
    assert len(lines_of(capfd.readouterr().err, "EarlyStopping")) == 2


def test_only_the_world_main_process_prints(tmp_path, capfd):
    from hf_callbacks_plus import TrainerCallback

    class OtherRank(TrainerCallback):  # what transformers sets on rank > 0
        def on_train_begin(self, args, state, control, **kwargs):
            state.is_world_process_zero = False

    stopper = EarlyStopping("eval_score", mode="min", patience=2)
    scripted_loop(tmp_path, by_eval(5, 4, 3, 3.5, 3.5), callbacks=[OtherRank(), stopper]).train()
    assert stopper.stopped_step == 10 and "EarlyStopping" not in capfd.readouterr().err


@pytest.mark.parametrize("loop", BOTH_LOOPS)
def test_terminate_on_nonfinite_prints_one_line_and_a_summary(tmp_path, capfd, loop):
    guard = TerminateOnNonFinite(monitor="eval_score")
    make = scripted_loop if loop == "lightweight" else scripted_trainer
    make(tmp_path, by_eval(5, float("nan"), 3), callbacks=[guard]).train()
    err = capfd.readouterr().err
    assert lines_of(err, "TerminateOnNonFinite:") == [
        "TerminateOnNonFinite: eval_score is nan at step 4 (logged); stopping training."]
    assert lines_of(err, "TerminateOnNonFinite summary") == [
        "TerminateOnNonFinite summary: stopped training at step 4 because eval_score was nan; "
        "the run ended at step 4."]



def test_terminate_on_nonfinite_not_verbose_logs_a_warning(tmp_path, capfd, caplog):
    quiet = TerminateOnNonFinite(monitor="eval_score", verbose=False)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        scripted_loop(tmp_path, by_eval(5, float("nan"), 3), callbacks=[quiet]).train()
    assert "TerminateOnNonFinite" not in capfd.readouterr().err
    levels = [r.levelno for r in caplog.records if "TerminateOnNonFinite" in r.getMessage()]
    assert levels == [logging.WARNING]
    with pytest.raises(TypeError, match="verbose must be True or False, got 1"):
        TerminateOnNonFinite(verbose=1)


@pytest.mark.transformers
def test_the_stop_line_stays_whole_next_to_a_progress_bar(tmp_path, capfd):
    """With transformers' tqdm progress bar the line goes through ``tqdm.write``: one intact line."""
    stopper = EarlyStopping("eval_score", mode="min", patience=2)
    scripted_trainer(tmp_path, by_eval(5, 4, 3, 3.5, 3.5), callbacks=[stopper], disable_tqdm=False).train()
    err = capfd.readouterr().err
    assert "it/s" in err or "%|" in err  # the bar was drawn
    import re

    shown = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", err)  # tqdm's cursor moves around its bar
    # splitlines also splits at "\r": a line printed into the bar's own line would not be whole
    assert [line for line in shown.splitlines() if "EarlyStopping stopped" in line] == [STOP_LINE]
    assert shown.count(SUMMARY_LINE) == 1
