"""Can this trainer produce the monitored metric? ``EarlyStopping``'s checks against the run.

At train begin: the metric against ``TrainingArguments`` (an eval metric with
``eval_strategy="no"``, a ``test_*`` metric, ...) and two instances sharing one state key.
During training: a record that should hold the metric but does not (the message lists the
keys present with a "did you mean"). The argument validation lives with what it validates
(`Monitor`, `StoppingPolicy`, the callback's own flags).
"""

from __future__ import annotations

import difflib
from typing import Any, Optional

from ..metrics.keys import SPEED_SUFFIXES, TRAINING_LOOP_KEYS, KeyGrammar
from ..metrics.monitor import MAXIMIZE_WORDS, MINIMIZE_WORDS, TRL_DIRECTIONS, Monitor

__all__ = [
    "check_against_args", "check_against_trainer", "expected_prefix",
    "misspelt_against_args", "missing_metric_problem", "monitor_from_args", "typo_suggestion",
]

#: Metric names a monitor is likely to mean: the words `infer_mode` knows, trl's metrics and
#: the training loop's keys. A name close to one of them (but not equal) is probably a typo.
KNOWN_NAMES = tuple(sorted(MINIMIZE_WORDS | MAXIMIZE_WORDS | set(TRL_DIRECTIONS) | TRAINING_LOOP_KEYS))


def typo_suggestion(monitor: str, grammar: KeyGrammar, known: Any = KNOWN_NAMES) -> Optional[str]:
    """A likely intended spelling of ``monitor`` (``"eval_los"`` -> ``"eval_loss"``), or None.

    The metric name inside its section is compared with ``known`` names; only a close miss
    (similarity >= 0.8, not equal) counts, so a user's own metric name is left alone.
    """
    raw = grammar.canonical(monitor)
    name = grammar.parse(raw).name
    if not raw.endswith(name):
        return None
    pieces = name.split("_")  # "squad_acuracy": an unknown dataset's name may come first
    for start in range(len(pieces)):
        tail = "_".join(pieces[start:])
        if tail in known:
            return None
        close = difflib.get_close_matches(tail, list(known), n=1, cutoff=0.8)
        if close:
            return raw[: len(raw) - len(tail)] + close[0]
    return None


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


#: Methods whose override can add evaluation metrics beyond ``compute_metrics`` (trl's
#: trainers add theirs in ``log``; a custom ``evaluate`` may add anything).
_EVALUATION_METHODS = ("log", "evaluate", "evaluation_loop", "prediction_step", "compute_loss")


def _stock_evaluation(trainer: Any) -> bool:
    """True when ``trainer`` evaluates as ``transformers.Trainer`` does: its metrics are
    ``<prefix>_loss`` plus what ``compute_metrics`` returns (no subclass adds any)."""
    mro = type(trainer).__mro__
    if not any(cls.__name__ == "Trainer" and cls.__module__.startswith("transformers.") for cls in mro):
        return False
    for method in _EVALUATION_METHODS:
        owner = next((cls for cls in mro if method in vars(cls)), None)
        if owner is None or not owner.__module__.startswith(("transformers.", "hf_callbacks_plus.")):
            return False
    return True


def check_against_trainer(monitor: str, grammar: KeyGrammar, trainer: Any) -> Optional[str]:
    """Explain why ``trainer`` cannot produce the evaluation metric ``monitor``, or None.

    Knowable before training: with a dict of eval datasets every evaluation is
    ``eval_<name>``, so a plain ``eval_*`` metric never shows up; a stock ``Trainer`` without
    ``compute_metrics`` evaluates only the loss. The message has a "did you mean".
    """
    if trainer is None:
        return None
    eval_dataset = getattr(trainer, "eval_dataset", None)
    datasets = sorted(name for name in eval_dataset if isinstance(name, str) and name) if isinstance(
        eval_dataset, dict) else []
    for name in datasets:  # the trainer's datasets, also those assigned after construction
        grammar.declare_dataset(name)
    raw = grammar.canonical(grammar.candidates(monitor)[0])
    parsed = grammar.parse(raw)
    if parsed.section != "eval":
        return None
    if datasets and parsed.dataset is None:
        suggestions = [f"eval_{name}_{parsed.name}" for name in sorted(datasets)]
        return (
            f"EarlyStopping: monitor={monitor!r} is never produced: the trainer evaluates a dict of datasets "
            f"{sorted(datasets)}, so its metrics are eval_<dataset>_<metric>. Did you mean "
            f"{' or '.join(repr(s) for s in suggestions)}?"
        )
    no_metrics = getattr(trainer, "compute_metrics", None) is None
    if parsed.name != "loss" and no_metrics and _stock_evaluation(trainer):
        loss = "eval_loss" if parsed.dataset is None else f"eval_{parsed.dataset}_loss"
        return (
            f"EarlyStopping: monitor={monitor!r} is never produced: the trainer has no compute_metrics, so "
            f"its evaluations return only {loss!r} (and timings). Did you mean {loss!r}? Or pass "
            f"compute_metrics=... to the trainer."
        )
    return None


def misspelt_against_args(monitor: str, grammar: KeyGrammar, args: Any) -> Optional[str]:
    """``monitor`` is a near miss of ``args.metric_for_best_model`` (``"eval_acuracy"`` while the
    trainer selects on ``"accuracy"``) and not a known metric name itself: the message, or None."""
    wanted = getattr(args, "metric_for_best_model", None)
    if not isinstance(wanted, str) or not wanted:
        return None
    target = wanted if wanted.startswith("eval_") else f"eval_{wanted}"
    raw = grammar.canonical(grammar.candidates(monitor)[0])
    if raw == target or grammar.parse(raw).name in KNOWN_NAMES:
        return None
    if difflib.SequenceMatcher(None, raw, target).ratio() < 0.85:
        return None
    return (
        f"EarlyStopping: monitor={monitor!r} is not produced under that name; the trainer selects its best "
        f"model on args.metric_for_best_model={wanted!r}. Did you mean {target!r}?"
    )


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
    name = grammar.parse(grammar.candidates(monitor.monitor)[0]).name
    if prefix == "eval" and any(p.startswith("eval_") and f"{p}_{name}" in values for p in prefixes):
        # several eval datasets: every evaluation is eval_<name>_..., a plain eval_* never comes
        explanation = monitor.explain_missing(values)
        return (f"EarlyStopping: the trainer evaluates named datasets ({sorted(prefixes)}), never a plain "
                f"'eval' set. {explanation}")
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
    if not monitor.startswith("eval_") and monitor.partition("/")[0] not in ("eval", "train_subset", "gap"):
        monitor = f"eval_{monitor}"  # as transformers reads metric_for_best_model ("loss" is eval_loss)
    return monitor, mode
