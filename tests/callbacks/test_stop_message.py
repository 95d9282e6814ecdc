"""The stop log line reads like a sentence: rounded values, the rule, the best so far."""

import math

from hf_callbacks_plus.callbacks.stop_reason import StopReason, stop_message

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
