"""Can this trainer produce the monitored metric? ``EarlyStopping``'s checks against the run.

At train begin: the metric against ``TrainingArguments`` (an eval metric with
``eval_strategy="no"``, a ``test_*`` metric, ...) and two instances sharing one state key.
During training: a record that should hold the metric but does not (the message lists the
keys present with a "did you mean"). The argument validation lives with what it validates
(`Monitor`, `StoppingPolicy`, the callback's own flags).
"""

from __future__ import annotations

from typing import Any, Optional

from ..metrics.keys import SPEED_SUFFIXES, TRAINING_LOOP_KEYS, KeyGrammar
from ..metrics.monitor import Monitor

__all__ = [
    "check_against_args", "check_unique_state_key", "expected_prefix", "missing_metric_problem",
    "monitor_from_args",
]

def check_unique_state_key(state: Any, class_name: str, key: str) -> None:
    """Refuse two instances with one ``state_key`` in a fresh run: their states would mix on resume.

    At train begin of a fresh run (``global_step == 0``) ``state.stateful_callbacks`` holds one
    entry per stateful callback instance, so a key seen twice means two such instances.

    Raises:
        ValueError: Two instances share ``key``; the message says how to tell them apart.
    """
    if getattr(state, "global_step", 0) != 0:
        return  # a resumed state holds an entry per checkpoint save, duplicates are normal
    entries = (getattr(state, "stateful_callbacks", None) or {}).get(class_name)
    if not isinstance(entries, list):
        return
    keys = [entry.get("attributes", {}).get("state_key") for entry in entries if isinstance(entry, dict)]
    if keys.count(key) > 1:
        raise ValueError(
            f"{class_name}: {keys.count(key)} instances share state_key={key!r} (same monitor and mode), so "
            "their states would mix on resume and their reports would overwrite each other. Give each "
            "a distinct log_name, e.g. EarlyStopping(..., log_name='patient') and "
            "EarlyStopping(..., log_name='strict')."
        )


def expected_prefix(monitor: str, grammar: KeyGrammar) -> str:
    """The ``metric_key_prefix`` of the evaluation that produces ``monitor`` (``"eval"``,
    ``"eval_squad"``, ``"train"``...), or ``""`` for training-loop keys (``loss``)."""
    raw = grammar.candidates(monitor)[0]
    if raw in TRAINING_LOOP_KEYS:
        return ""
    parsed = grammar.parse(raw)
    if parsed.section == "train" and parsed.dataset is None and (
        parsed.raw == parsed.name or parsed.name in TRAINING_LOOP_KEYS
    ):
        return ""  # logged by the training loop (``loss``, ``train/loss``) or a bare user key
    return parsed.section if parsed.dataset is None else f"{parsed.section}_{parsed.dataset}"


def _choice(value: Any) -> str:
    return str(getattr(value, "value", value))


def check_against_args(monitor: str, prefix: str, args: Any) -> Optional[str]:
    """Explain why the trainer configured by ``args`` cannot produce ``monitor``, or None."""
    if args is None:
        return None
    if prefix == "":
        if _choice(getattr(args, "logging_strategy", "steps")) == "no":
            return (
                f"EarlyStopping monitors the training-loop key {monitor!r}, but "
                f"args.logging_strategy='no' never logs it. Set logging_strategy to 'steps' or 'epoch'."
            )
        return None
    section = prefix.split("_")[0]
    if section == "test":
        return (
            f"EarlyStopping: monitor={monitor!r} is a test_* metric; the Trainer produces test_* metrics "
            f"only in predict(), never during training. Monitor an eval_* metric instead."
        )
    if section == "eval":
        strategy = _choice(getattr(args, "eval_strategy", "steps"))
        if strategy == "no":
            return (
                f"EarlyStopping: monitor={monitor!r} is an evaluation metric but args.eval_strategy='no', "
                f"so the Trainer never evaluates during training. Set eval_strategy to one of "
                f"['steps', 'epoch']."
            )
        name = grammar_name(monitor)
        if getattr(args, "prediction_loss_only", False) and name != "loss":
            return (
                f"EarlyStopping: monitor={monitor!r} needs compute_metrics, but "
                f"args.prediction_loss_only=True makes evaluation return only eval_loss. "
                f"Monitor 'eval_loss' or set prediction_loss_only=False."
            )
    return None


def grammar_name(monitor: str) -> str:
    """The metric name inside its section (``eval_squad_f1`` -> ``squad_f1`` without datasets)."""
    grammar = KeyGrammar()
    return grammar.parse(grammar.candidates(monitor)[0]).name


def missing_metric_problem(monitor: Monitor, grammar: KeyGrammar, values: dict[str, Any],
                           from_evaluate: bool) -> Optional[str]:
    """Explain why a record that should hold the monitored metric does not; None when it is fine.

    A training record (``loss``/``learning_rate``) must hold a training-loop metric; an
    evaluation of the monitored prefix (it reports ``<prefix>_runtime``...) must hold an
    evaluation metric. Other records may lack it.
    """
    prefix = expected_prefix(monitor.monitor, grammar)
    if prefix == "":
        training_record = bool({"loss", "learning_rate"} & set(values)) and "train_runtime" not in values
        if not from_evaluate and training_record:
            return "EarlyStopping: " + monitor.explain_missing(values)
        return None
    if not from_evaluate:
        return None
    prefixes = {
        key[: -len(suffix)] for key in values if isinstance(key, str)
        for suffix in SPEED_SUFFIXES if key.endswith(suffix)
    }
    if prefix in prefixes:
        explanation = monitor.explain_missing(values)
        return f"EarlyStopping: the {prefix!r} evaluation did not return it. {explanation}"
    return None


def monitor_from_args(args: Any, mode: str) -> tuple[str, str]:
    """``monitor=None``: the metric and mode of ``args.metric_for_best_model`` / ``greater_is_better``.

    Raises:
        ValueError: ``args.metric_for_best_model`` is not set either.
    """
    monitor = getattr(args, "metric_for_best_model", None)
    if not monitor:
        raise ValueError(
            "EarlyStopping: monitor=None takes the metric from args.metric_for_best_model, which is "
            "None. Pass monitor='eval_loss' (or another metric) or set metric_for_best_model."
        )
    if mode == "auto":
        mode = "max" if getattr(args, "greater_is_better", None) else "min"
    return monitor, mode
