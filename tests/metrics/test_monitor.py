"""Monitor: the improvement rule checked against a separately written reference, plus lookup/mode."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hf_callbacks_plus.metrics.keys import KeyGrammar
from hf_callbacks_plus.metrics.monitor import Monitor, check_thresholds, infer_mode


def reference_is_improvement(mode, min_delta, min_delta_mode, current, best):
    """The rules written out plainly, independently of Monitor's code."""
    # 1. a value that is missing, NaN or infinite is never an improvement
    if current is None or current != current or current in (float("inf"), float("-inf")):
        return False
    # 2. nothing to compare with
    if best is None or best != best:
        return True
    # 3. infinite best: the "worst" infinity is beaten by anything finite, the other never
    if best == float("inf"):
        return mode == "min"
    if best == float("-inf"):
        return mode == "max"
    # 4. the margin to beat
    if min_delta_mode == "absolute":
        margin = min_delta
    else:
        margin = min_delta * (best if best >= 0 else -best)
    if mode == "min":
        needed = best - margin
        return current < needed
    needed = best + margin
    return current > needed


floats = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.floats(min_value=-10, max_value=10),
)


@settings(max_examples=400, deadline=None)
@given(
    mode=st.sampled_from(["min", "max"]),
    min_delta=st.one_of(st.just(0.0), st.floats(min_value=0, max_value=5)),
    min_delta_mode=st.sampled_from(["absolute", "relative"]),
    current=floats,
    best=floats,
)
# an infinite best, on either side, in either mode: always drawn, whatever the seed
@example(mode="min", min_delta=0.0, min_delta_mode="absolute", current=1.0, best=math.inf)
@example(mode="min", min_delta=0.0, min_delta_mode="absolute", current=1.0, best=-math.inf)
@example(mode="max", min_delta=0.5, min_delta_mode="relative", current=1.0, best=math.inf)
@example(mode="max", min_delta=0.0, min_delta_mode="absolute", current=1.0, best=-math.inf)
def test_is_improvement_matches_reference(mode, min_delta, min_delta_mode, current, best):
    monitor = Monitor("eval_x", mode=mode, min_delta=min_delta, min_delta_mode=min_delta_mode)
    expected = reference_is_improvement(mode, min_delta, min_delta_mode, current, best)
    assert monitor.is_improvement(current, best) is expected


@settings(max_examples=200, deadline=None)
@given(
    mode=st.sampled_from(["min", "max"]),
    values=st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=20),
)
def test_non_finite_never_becomes_best(mode, values):
    monitor = Monitor("eval_x", mode=mode)
    best = None
    for value in values:
        if monitor.is_improvement(value, best):
            best = value
    assert best is None or math.isfinite(best)
    finite = [v for v in values if math.isfinite(v)]
    assert best == (monitor.best_of(values) if finite else None)


def test_margin_is_strict_and_relative_scales_with_best():
    absolute = Monitor("eval_loss", min_delta=0.1)
    assert not absolute.is_improvement(0.9, 1.0)  # exactly at the margin
    assert absolute.is_improvement(0.89, 1.0)
    relative = Monitor("eval_loss", min_delta=0.1, min_delta_mode="relative")
    assert not relative.is_improvement(95.0, 100.0)
    assert relative.is_improvement(89.0, 100.0)
    assert relative.is_improvement(-1.2, -1.0)  # abs(best) for negative values
    up = Monitor("eval_accuracy", min_delta=0.01)
    assert up.mode == "max"
    assert up.is_improvement(0.52, 0.5) and not up.is_improvement(0.505, 0.5)


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("eval_loss", "min"), ("loss", "min"), ("eval_squad_f1", "max"), ("train_accuracy", "max"),
        ("eval/accuracy", "max"), ("eval_perplexity", "min"), ("eval_rouge2", "max"), ("val_mse", "min"),
        ("eval_wer", "min"), ("eval_roc_auc", "max"), ("eval_samples_per_second", "max"),
        ("eval_score", None), ("gap_accuracy", None), ("gap_loss", None), ("eval_loss_acc", None),
    ],
)
def test_infer_mode(name, mode):
    assert infer_mode(name) == mode


def test_auto_mode_error_says_what_to_pass():
    expected = r"mode='auto' cannot tell whether 'eval_score'.*mode='min'.*mode='max'"
    with pytest.raises(ValueError, match=expected):
        Monitor("eval_score")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"mode": "minimum"}, ValueError, r"mode must be one of \['min', 'max', 'auto'\], got 'minimum'"),
        ({"min_delta": -0.1}, ValueError, r"min_delta must be >= 0, got -0.1"),
        ({"min_delta": "0.1"}, TypeError, r"min_delta must be a number, got '0.1' \(str\)"),
        ({"min_delta": float("nan")}, ValueError, r"Monitor: min_delta must be finite, got nan"),
        ({"min_delta_mode": "percent"}, ValueError,
         r"min_delta_mode must be one of \['absolute', 'relative'\], got 'percent'"),
        ({"grammar": {}}, TypeError, r"grammar must be a KeyGrammar or None, got dict"),
    ],
)
def test_validation_messages(kwargs, error, message):
    with pytest.raises(error, match=message):
        Monitor("eval_loss", **kwargs)


def test_monitor_name_type():
    with pytest.raises(TypeError, match=r"monitor must be a non-empty string, got 3"):
        Monitor(3)  # type: ignore[arg-type]


def test_lookup_through_the_grammar():
    grammar = KeyGrammar(eval_datasets=["squad"])
    metrics = {"eval_squad_f1": 0.7, "eval_squad_loss": 0.3, "epoch": 1.0}
    assert Monitor("eval_squad_f1", grammar=grammar).lookup(metrics) == ("eval_squad_f1", 0.7)
    assert Monitor("eval/squad/f1", grammar=grammar).lookup(metrics) == ("eval_squad_f1", 0.7)
    assert Monitor("accuracy", mode="max").lookup({"eval_accuracy": 0.9}) == ("eval_accuracy", 0.9)
    missing = Monitor("eval_f1", grammar=grammar)
    assert missing.lookup(metrics) == (None, None)
    message = missing.explain_missing(metrics)
    assert "'eval_f1' was not found" in message and "eval_squad_f1" in message and "Did you mean" in message


def test_thresholds_helpers():
    down = Monitor("eval_loss")
    assert down.reaches(0.1, 0.1) and not down.reaches(0.2, 0.1) and not down.reaches(float("nan"), 1)
    assert down.is_worse_than(5.0, 4.0) and not down.is_worse_than(4.0, 4.0)
    assert down.is_worse_than(float("nan"), 4.0)
    up = Monitor("eval_accuracy")
    assert up.reaches(0.9, 0.9) and up.is_worse_than(0.1, 0.2)


def test_owner_starts_every_message():
    with pytest.raises(ValueError, match=r"^EarlyStopping: mode must be one of"):
        Monitor("eval_loss", mode="down", owner="EarlyStopping")


@pytest.mark.parametrize(
    ("mode", "kwargs", "message"),
    [
        ("min", {"baseline": 1.0, "stopping_threshold": 2.0}, r"stopping_threshold=2.0 must be below"),
        ("max", {"baseline": 0.5, "stopping_threshold": 0.4}, r"stopping_threshold=0.4 must be above"),
        ("min", {"baseline": 1.0, "divergence_threshold": 0.5}, r"divergence_threshold=0.5 must be above"),
        ("max", {"stopping_threshold": 0.9, "divergence_threshold": 0.95},
         r"divergence_threshold=0.95 must be below stopping_threshold=0.9"),
        (None, {"baseline": "1"}, r"baseline must be a number or None, got '1' \(str\)"),
        (None, {"divergence_threshold": float("nan")}, r"divergence_threshold must be finite"),
    ],
)
def test_threshold_order_is_checked_once_here(mode, kwargs, message):
    with pytest.raises((TypeError, ValueError), match=message):
        check_thresholds(mode, **kwargs)


def test_thresholds_in_the_right_order_pass_and_unknown_mode_checks_types_only():
    check_thresholds("min", baseline=1.0, stopping_threshold=0.5, divergence_threshold=2.0)
    check_thresholds("max", baseline=0.5, stopping_threshold=0.9, divergence_threshold=0.1)
    check_thresholds(None, baseline=1.0, stopping_threshold=2.0)  # order needs the mode
    Monitor("eval_loss").check_thresholds(baseline=1.0, stopping_threshold=0.5)


def test_a_real_train_loss_is_used_as_it_is():
    """``train_loss`` (an evaluation under the prefix "train") is that key; the train-subset metric is
    ``train_subset_loss`` (0.1.0's names are not mapped: nobody installed 0.1.0 from an index)."""
    assert Monitor("train_loss").lookup({"train_loss": 0.3, "train_subset_loss": 0.4}) == ("train_loss", 0.3)
    assert Monitor("train_loss").lookup({"train_subset_loss": 0.4}) == (None, None)


# -- mode="auto" knows the metrics trl logs (read from trl 1.x's trainers) --------------------------

@pytest.mark.parametrize(
    ("name", "mode"),
    [("eval_rewards/accuracies", "max"), ("eval/rewards/accuracies", "max"), ("rewards/margins", "max"),
     ("eval_rewards/chosen", "max"), ("train_subset_mean_token_accuracy", "max"), ("eval_reward", "max"),
     ("eval_rewards/correctness/mean", "max"), ("eval_accuracy", "max"), ("eval_margin", "max"),
     ("eval_mean_reward", "max"), ("eval_kl", "min"), ("eval_aux_loss", "min"), ("eval_policy_loss", "min"),
     ("eval_rewards/rejected", None), ("eval_logps/rejected", None), ("eval_entropy", None),
     ("eval_reward_std", None), ("eval_frac_reward_zero_std", None), ("eval_completions/mean_length", None),
     ("eval_num_tokens", None), ("eval_crossentropy", "min")],
)
def test_infer_mode_knows_trl_metrics(name, mode):
    assert infer_mode(name) == mode
    if mode is None:
        with pytest.raises(ValueError, match=r"is a diagnostic with no better direction|cannot tell"):
            Monitor(name)
    else:
        assert Monitor(name).mode == mode


def trl_logged_metric_names() -> set[str]:
    """The metric names trl's installed trainers log (``self._metrics[mode]["<name>"]``, read
    from their sources); an f-string part (a reward function's name) becomes ``correctness``."""
    import trl

    pattern = re.compile(r"""_metrics\[[^\]]+\]\[f?"([^"]+)"\]""")
    names = set()
    for path in (Path(trl.__file__).parent / "trainer").glob("*_trainer.py"):
        names |= {re.sub(r"\{[^}]*\}", "correctness", name) for name in pattern.findall(path.read_text())}
    return names


def test_every_metric_trl_logs_has_a_direction_or_is_a_known_diagnostic():
    # the ground truth is trl itself: each name its trainers log either gets a direction from
    # mode="auto" or is refused with the reason "a diagnostic", never the bare "cannot tell"
    pytest.importorskip("trl")
    names = trl_logged_metric_names()
    assert {"rewards/margins", "mean_token_accuracy", "margin", "kl", "rewards/correctness/mean"} <= names
    unexplained = []
    for name in sorted(names):
        for key in (f"eval_{name}", f"train_subset_{name}"):
            try:
                Monitor(key)
            except ValueError as error:
                if "is a diagnostic with no better direction" not in str(error) and not re.fullmatch(
                        r"rewards/\w+/std", name):  # a reward function's spread: checked below
                    unexplained.append(key)
    assert unexplained == []
    assert infer_mode("eval_rewards/correctness/std") is None and infer_mode("eval_rewards/x/mean") == "max"


@pytest.mark.parametrize(("name", "meaningful"), [
    ("loss", True), ("accuracy", True), ("f1_macro", True), ("precision_micro", True), ("perplexity", True),
    ("token_accuracy", True), ("mean_token_accuracy", True), ("eval_squad_f1", True),
    ("rewards/accuracies", True), ("confusion_0_1", False), ("confusion_12_3", False), ("num_tokens", False),
    ("num_input_tokens_seen", False),
    ("entropy", False), ("completions/mean_length", False), ("runtime", False), ("samples_per_second", False),
    ("eval_steps_per_second", False), ("score", False), ("gap_loss", False),
])
def test_gap_is_meaningful_for_measures_with_a_direction_only(name, meaningful):
    from hf_callbacks_plus.metrics.monitor import gap_is_meaningful

    assert gap_is_meaningful(name) is meaningful
