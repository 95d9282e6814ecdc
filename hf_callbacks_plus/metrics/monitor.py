"""Monitor: one watched metric: its key, its direction, what counts as better, and what to
tell the user when the run cannot produce it.

Every component that watches a metric (``EarlyStopping``, a best-checkpoint keeper, a
scheduler) uses `Monitor`, so "which key", "is this value better" and "why is it missing"
have one definition. How a new callback uses it (``EarlyStopping`` does exactly this)::

    monitor = Monitor("eval_loss", min_delta=0.01, owner="MyCallback")  # mode, typos: raises
    monitor.warn_if_misspelt()              # mode given and a near miss of a known name
    monitor = Monitor.from_args(args, ...)  # or: args.metric_for_best_model, as transformers reads it
    # bind(trainer):    monitor.grammar = grammar_for(trainer)
    # on_train_begin:   problem = monitor.check_run(args, trainer)     # None, or why it never shows up
    # on_evaluate/log:  key, value = monitor.lookup(metrics)
    #                   if key is None: problem = monitor.missing_problem(metrics, from_evaluate=True)
    #                   elif monitor.is_improvement(value, best): ...

* lookup goes through `KeyGrammar` (``"accuracy"`` finds ``eval_accuracy``; ``"eval/accuracy"``
  finds it through rendering); a missing metric's message lists the keys present with a
  "did you mean" (`explain_missing`);
* ``mode`` is ``"min"``, ``"max"`` or ``"auto"`` (from the name, like Keras; a misspelt name
  raises "did you mean", a name that says nothing raises telling what to pass);
* ``min_delta`` is an absolute amount or a fraction of the best value (``min_delta_mode``);
* a non-finite value (NaN, +-Inf) is never an improvement, so it never becomes "best";
* the settings are validated here: `check_mode` and `check_thresholds` (baseline / stopping /
  divergence thresholds on the right side of each other), messages naming the argument, the
  value and the choices.

`Monitor.is_improvement` is a pure function of its two arguments.
"""

from __future__ import annotations

import difflib
import logging
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from ..core.checks import check_choice, check_number
from .keys import SPEED_SUFFIXES, TIMING_NAMES, TRAINING_LOOP_KEYS, KeyGrammar

logger = logging.getLogger("hf_callbacks_plus")

__all__ = [
    "KNOWN_NAMES",
    "MAXIMIZE_WORDS",
    "MINIMIZE_WORDS",
    "MIN_DELTA_MODES",
    "MODES",
    "TRL_DIRECTIONS",
    "Monitor",
    "check_mode",
    "check_thresholds",
    "gap_is_meaningful",
    "infer_mode",
    "trl_metric",
]

#: Valid values of ``mode``.
MODES = ("min", "max", "auto")
#: Valid values of ``min_delta_mode``.
MIN_DELTA_MODES = ("absolute", "relative")

#: Name tokens meaning "lower is better".
MINIMIZE_WORDS = frozenset(
    {
        "loss", "error", "err", "mse", "mae", "rmse", "msle", "mape", "smape", "perplexity", "ppl",
        "wer", "cer", "ter", "nll", "distance", "brier", "logloss", "entropy", "crossentropy", "kl",
        "hamming", "fpr", "fnr", "eer", "runtime", "regret",
    }
)
#: Name tokens meaning "higher is better".
MAXIMIZE_WORDS = frozenset(
    {
        "accuracy", "acc", "f1", "fbeta", "auc", "auroc", "roc", "precision", "recall", "bleu",
        "sacrebleu", "rouge", "rouge1", "rouge2", "rougel", "rougelsum", "meteor", "chrf", "map",
        "mrr", "ndcg", "iou", "miou", "dice", "r2", "spearman", "spearmanr", "pearson", "pearsonr",
        "matthews", "mcc", "exact", "em", "bertscore", "top1", "top5", "tpr", "specificity",
        "sensitivity", "kappa", "jaccard", "psnr", "ssim", "reward",
    }
)
#: Tokens whose direction depends on who computed the value: ``mode`` must be explicit.
AMBIGUOUS_WORDS = frozenset({"gap", "delta", "diff", "difference"})

#: The metrics trl's trainers log (trl 1.x ``DPOTrainer``, ``KTOTrainer``, ``RewardTrainer``,
#: ``GRPOTrainer``, ``RLOOTrainer``, ``SFTTrainer``, ``DistillationTrainer``; each also under
#: ``eval_`` and ``train_subset_``), by exact name: ``"max"``, ``"min"``, or None for a diagnostic with no
#: better direction (``mode`` must then be given; the error says why). They take precedence
#: over the word lists: ``rewards/rejected`` holds "reward" but is not to be maximised.
TRL_DIRECTIONS: dict[str, Optional[str]] = {
    # DPO / KTO: implicit rewards of the chosen and rejected completions
    "rewards/accuracies": "max", "rewards/margins": "max", "rewards/chosen": "max",
    "rewards/rejected": None, "logps/chosen": "max", "logps/rejected": None,
    "logits/chosen": None, "logits/rejected": None,
    # RewardTrainer
    "accuracy": "max", "margin": "max", "mean_reward": "max", "min_reward": "max", "max_reward": "max",
    # GRPO / RLOO (``rewards/<reward function>/mean`` is matched by its ending, see infer_mode)
    "reward": "max", "reward_std": None, "frac_reward_zero_std": None, "kl": "min",
    "policy_loss": "min", "entropy_coef": None, "cispo_clip_ratio": None,
    "completions/mean_length": None, "completions/min_length": None, "completions/max_length": None,
    "completions/clipped_ratio": None, "completions/mean_terminated_length": None,
    "completions/min_terminated_length": None, "completions/max_terminated_length": None,
    "clip_ratio/low_mean": None, "clip_ratio/low_min": None, "clip_ratio/high_mean": None,
    "clip_ratio/high_max": None, "clip_ratio/region_mean": None,
    "tools/call_frequency": None, "tools/failure_frequency": "min",
    "sampling/importance_sampling_ratio/min": None, "sampling/importance_sampling_ratio/mean": None,
    "sampling/importance_sampling_ratio/max": None, "sampling/sampling_logp_difference/mean": None,
    "sampling/sampling_logp_difference/max": None, "vespo/phi_seq_mean": None,
    # DistillationTrainer: seconds per training step
    "step_time": None,
    # SFT / DPO / GRPO: token accuracy; the mean entropy of the predictions is a diagnostic
    "mean_token_accuracy": "max", "entropy": None, "aux_loss": "min", "num_tokens": None,
}

_TOKEN_SPLIT = re.compile(r"[^0-9a-z]+")


def infer_mode(name: str) -> Optional[str]:
    """Guess ``"min"`` or ``"max"`` from a metric name, or None when the name does not tell.

    The name is lower-cased and split on non-alphanumeric characters; a token from
    `MINIMIZE_WORDS` means ``"min"``, one from `MAXIMIZE_WORDS` ``"max"``.
    Names with tokens of both kinds, or a token such as ``gap`` (whose sign depends on the
    producer), return None.

    Args:
        name: A metric key (``"eval_loss"``, ``"eval/squad/f1"``, ``"train_subset_accuracy"``).

    Returns:
        ``"min"``, ``"max"`` or None.

    Example:
        >>> infer_mode("eval_squad_f1"), infer_mode("eval_loss"), infer_mode("eval_score")
        ('max', 'min', None)
    """
    lowered = name.lower()
    if {token for token in _TOKEN_SPLIT.split(lowered) if token} & AMBIGUOUS_WORDS:
        return None
    known = trl_metric(lowered)
    if known is not None:
        return TRL_DIRECTIONS[known]
    if lowered.startswith("rewards/") or "_rewards/" in lowered or "/rewards/" in lowered:
        if lowered.endswith("/mean"):  # GRPO's rewards/<reward function>/mean
            return "max"
        if lowered.endswith("/std"):
            return None
    tokens = {token for token in _TOKEN_SPLIT.split(lowered) if token}
    if tokens & AMBIGUOUS_WORDS:
        return None
    for suffix in ("samples_per_second", "steps_per_second"):
        if lowered.endswith(suffix):
            return "max"
    minimize = bool(tokens & MINIMIZE_WORDS)
    maximize = bool(tokens & MAXIMIZE_WORDS)
    if minimize == maximize:
        return None
    return "min" if minimize else "max"


def gap_is_meaningful(name: str) -> bool:
    """Whether a train-minus-eval gap of metric ``name`` says something about over-fitting.

    The one rule for which gaps are reported (``TrainSubsetEvaluation(gap_metrics=True)``) and
    shown (the console line, the plot): a measure of quality whose better direction is known
    (`infer_mode`: a loss, an accuracy, an F1, a perplexity, trl's ``mean_token_accuracy``).
    Counts (``confusion_0_1``, trl's ``num_tokens``), diagnostics without a better direction (trl's
    ``entropy``, completion lengths) and timings have no gap worth reading.

    Args:
        name: A metric name, bare (``"accuracy"``) or with its section (``"eval_f1_macro"``).

    Example:
        >>> gap_is_meaningful("loss"), gap_is_meaningful("f1_macro"), gap_is_meaningful("confusion_0_1")
        (True, True, False)
    """
    bare = name.rsplit("/", 1)[-1]
    if any(bare == timing or bare.endswith("_" + timing) for timing in TIMING_NAMES):
        return False
    return infer_mode(name) is not None


def trl_metric(name: str) -> Optional[str]:
    """The trl metric (a key of `TRL_DIRECTIONS`) that ``name`` is, with any section prefix
    (``eval_``, ``eval_<dataset>_``, ``train_subset_``, ``eval/``...), or None."""
    lowered = name.lower()
    for known in _TRL_LONGEST_FIRST:
        if lowered == known or lowered.endswith(("_" + known, "/" + known)):
            return known
    return None


_TRL_LONGEST_FIRST = sorted(TRL_DIRECTIONS, key=len, reverse=True)


def check_mode(mode: Any, min_delta: Any, min_delta_mode: Any, *, owner: str = "Monitor") -> float:
    """Validate ``mode``, ``min_delta`` and ``min_delta_mode``; return ``min_delta`` as a float.

    Raises:
        TypeError: ``min_delta`` is not a number.
        ValueError: ``mode``/``min_delta_mode`` is not a valid choice, or ``min_delta`` < 0.
    """
    check_choice(owner, "mode", mode, MODES)
    check_choice(owner, "min_delta_mode", min_delta_mode, MIN_DELTA_MODES)
    delta = check_number(owner, "min_delta", min_delta)
    if delta is None or delta < 0:
        raise ValueError(
            f"{owner}: min_delta must be >= 0, got {min_delta!r} (the amount a value must beat the best by)."
        )
    return delta


def check_thresholds(mode: Optional[str], *, baseline: Any = None, stopping_threshold: Any = None,
                     divergence_threshold: Any = None, owner: str = "Monitor") -> None:
    """Validate the thresholds: numbers or None, and on the right side of each other for ``mode``.

    In ``"min"`` mode a value that is good enough to stop (``stopping_threshold``) is below or
    equal to the ``baseline``, which is below the hopeless value (``divergence_threshold``);
    ``"max"`` mode mirrors it. With ``mode=None`` (not known yet) only the types are checked.

    Raises:
        TypeError: A threshold is not a number or None.
        ValueError: A threshold is not finite, or two thresholds are on the wrong side of each
            other (e.g. in min mode a ``stopping_threshold`` above the ``baseline``).
    """
    baseline = check_number(owner, "baseline", baseline, allow_none=True)
    stopping = check_number(owner, "stopping_threshold", stopping_threshold, allow_none=True)
    divergence = check_number(owner, "divergence_threshold", divergence_threshold, allow_none=True)
    if mode not in ("min", "max"):
        return
    better = "below" if mode == "min" else "above"
    worse = "above" if mode == "min" else "below"

    def is_better(a: float, b: float) -> bool:
        return a < b if mode == "min" else a > b

    if stopping is not None and baseline is not None and is_better(baseline, stopping):
        raise ValueError(
            f"{owner}: stopping_threshold={stopping_threshold!r} must be {better} or equal to "
            f"baseline={baseline!r} in mode={mode!r} (it is the value that is good enough to stop)."
        )
    if divergence is not None and baseline is not None and not is_better(baseline, divergence):
        raise ValueError(
            f"{owner}: divergence_threshold={divergence_threshold!r} must be {worse} baseline={baseline!r} "
            f"in mode={mode!r} (it is the value that is hopeless)."
        )
    if divergence is not None and stopping is not None and not is_better(stopping, divergence):
        raise ValueError(
            f"{owner}: divergence_threshold={divergence_threshold!r} must be {worse} "
            f"stopping_threshold={stopping_threshold!r} in mode={mode!r}."
        )


#: Metric names a monitor is likely to mean: the words `infer_mode` knows, trl's metrics and the
#: training loop's keys. A name close to one of them (but not equal) is probably a typo.
KNOWN_NAMES = tuple(sorted(MINIMIZE_WORDS | MAXIMIZE_WORDS | set(TRL_DIRECTIONS) | TRAINING_LOOP_KEYS))

#: Methods whose override can add evaluation metrics beyond ``compute_metrics`` (trl's trainers
#: add theirs in ``log``; a custom ``evaluate`` may add anything).
_EVALUATION_METHODS = ("log", "evaluate", "evaluation_loop", "prediction_step", "compute_loss")


def _choice(value: Any) -> str:
    return str(getattr(value, "value", value))


class Monitor:
    """Finds a metric in a metrics dict and decides whether a value improves on the best.

    Args:
        monitor: The metric to watch: a raw key (``"eval_loss"``), a bare name resolved like
            ``metric_for_best_model`` (``"accuracy"`` -> ``eval_accuracy`` when present), or a
            rendered name (``"eval/accuracy"``).
        mode: ``"min"``, ``"max"`` or ``"auto"`` (decided from the name, see
            `infer_mode`). Defaults to ``"auto"``.
        min_delta: How much a value must beat the best by to count as an improvement; must
            be >= 0. Defaults to 0.0.
        min_delta_mode: ``"absolute"`` (beat the best by ``min_delta``) or ``"relative"``
            (beat it by ``min_delta * abs(best)``). Defaults to ``"absolute"``.
        grammar: The key grammar used for lookup. Defaults to a new `KeyGrammar`.
        owner: Starts every error message (the component the user configured, e.g.
            ``"EarlyStopping"``). Defaults to ``"Monitor"``.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: Unknown ``mode``/``min_delta_mode``, negative ``min_delta``, or
            ``mode="auto"`` with a misspelt name ("did you mean") or a name that does not tell
            the direction.

    Example:
        >>> m = Monitor("eval_loss", min_delta=0.01)
        >>> m.mode, m.is_improvement(0.5, 0.6), m.is_improvement(0.595, 0.6)
        ('min', True, False)
    """

    def __init__(
        self,
        monitor: str,
        mode: str = "auto",
        min_delta: float = 0.0,
        min_delta_mode: str = "absolute",
        grammar: Optional[KeyGrammar] = None,
        *,
        owner: str = "Monitor",
    ) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise TypeError(f"{owner}: monitor must be a non-empty string, got {monitor!r}.")
        delta = check_mode(mode, min_delta, min_delta_mode, owner=owner)
        if grammar is not None and not isinstance(grammar, KeyGrammar):
            raise TypeError(f"{owner}: grammar must be a KeyGrammar or None, got {type(grammar).__name__}.")
        self.monitor = monitor
        self.grammar = grammar if grammar is not None else KeyGrammar()
        self.owner = owner
        if mode == "auto":
            mode = infer_mode(monitor) or self._unknown_direction()
        self.mode = mode
        self.min_delta = delta
        self.min_delta_mode = min_delta_mode

    def _unknown_direction(self) -> str:
        suggestion = self.suggestion()
        if suggestion is not None:  # a typo first: "cannot tell" would mislead
            raise ValueError(
                f"{self.owner}: monitor={self.monitor!r} looks like a misspelt metric name. Did you mean "
                f"{suggestion!r}? (If {self.monitor!r} is your own metric, pass mode='min' or mode='max'.)"
            )
        known = trl_metric(self.monitor)
        why = f" trl's {known!r} is a diagnostic with no better direction." if known is not None else ""
        raise ValueError(
            f"{self.owner}: mode='auto' cannot tell whether {self.monitor!r} should go down or up.{why} "
            f"Pass mode='min' (lower is better, e.g. a loss) or mode='max' (higher is better, e.g. an "
            f"accuracy)."
        )

    @classmethod
    def from_args(cls, args: Any, mode: str = "auto", **kwargs: Any) -> Monitor:
        """The monitor of ``args.metric_for_best_model``, read as transformers reads it (``"loss"``
        is ``eval_loss``); ``mode="auto"`` takes ``args.greater_is_better``.

        Raises:
            ValueError: ``args.metric_for_best_model`` is not set.
        """
        owner = kwargs.get("owner", "Monitor")
        monitor = getattr(args, "metric_for_best_model", None)
        if not monitor:
            raise ValueError(
                f"{owner}: monitor=None takes the metric from args.metric_for_best_model, which is "
                "None. Pass monitor='eval_loss' (or another metric) or set metric_for_best_model."
            )
        if mode == "auto":
            mode = "max" if getattr(args, "greater_is_better", None) else "min"
        if not monitor.startswith("eval_") and monitor.partition("/")[0] not in ("eval", "train_subset",
                                                                                  "gap"):
            monitor = f"eval_{monitor}"
        return cls(monitor, mode, **kwargs)

    def __repr__(self) -> str:
        return (
            f"Monitor({self.monitor!r}, mode={self.mode!r}, min_delta={self.min_delta!r}, "
            f"min_delta_mode={self.min_delta_mode!r})"
        )

    # -- lookup ----------------------------------------------------------------------
    def resolve(self, metrics: Iterable[str]) -> Optional[str]:
        """The key of ``metrics`` that this monitor names, or None."""
        return self.grammar.resolve(self.monitor, metrics)

    def lookup(self, metrics: Mapping[str, Any]) -> tuple[Optional[str], Any]:
        """Return ``(key, raw value)`` of the monitored metric, or ``(None, None)``."""
        key = self.resolve(metrics.keys())
        return (key, metrics[key]) if key is not None else (None, None)

    def explain_missing(self, metrics: Iterable[str]) -> str:
        """Message for a missing metric: the keys available and a "did you mean"."""
        return self.grammar.explain_missing(self.monitor, metrics)

    # -- did you mean, and can this run produce it ----------------------------------
    def suggestion(self) -> Optional[str]:
        """A likely intended spelling of the monitor (``"eval_los"`` -> ``"eval_loss"``), or None.

        The metric name inside its section is compared with `KNOWN_NAMES`; only a close miss
        (similarity >= 0.8, not equal) counts, so a user's own metric name is left alone.
        """
        raw = self.grammar.canonical(self.monitor)
        name = self.grammar.parse(raw).name
        if not raw.endswith(name):
            return None
        pieces = name.split("_")  # "squad_acuracy": an unknown dataset's name may come first
        for start in range(len(pieces)):
            tail = "_".join(pieces[start:])
            if tail in KNOWN_NAMES:
                return None
            close = difflib.get_close_matches(tail, list(KNOWN_NAMES), n=1, cutoff=0.8)
            if close:
                return raw[: len(raw) - len(tail)] + close[0]
        return None

    def warn_if_misspelt(self) -> None:
        """Log a WARNING when the name is a near miss of a known metric (``mode`` was given, so
        it may be the user's own metric; ``mode="auto"`` raised instead)."""
        suggestion = self.suggestion()
        if suggestion is not None:
            logger.warning("%s: monitor=%r looks like a misspelt %r (ignore this if it is your own metric; "
                           "a missing metric raises at the first evaluation).", self.owner, self.monitor,
                           suggestion)

    @property
    def prefix(self) -> str:
        """The ``metric_key_prefix`` of the evaluation that produces the metric (``"eval"``,
        ``"eval_squad"``, ``"train_subset"``...), or ``""`` for training-loop keys (``loss``)."""
        raw = self.grammar.candidates(self.monitor)[0]
        if raw in TRAINING_LOOP_KEYS:
            return ""
        parsed = self.grammar.parse(raw)
        if parsed.section == "train" and parsed.dataset is None and (
            parsed.raw == parsed.name or parsed.name in TRAINING_LOOP_KEYS
        ):
            return ""  # logged by the training loop (``loss``, ``train/loss``) or a bare user key
        return parsed.section if parsed.dataset is None else f"{parsed.section}_{parsed.dataset}"

    def check_run(self, args: Any, trainer: Any = None) -> Optional[str]:
        """Why the run configured by ``args`` (and ``trainer``, when known) can never produce the
        metric, or None. Knowable before training: an eval metric with ``eval_strategy="no"``, a
        ``test_*`` metric, a near miss of ``args.metric_for_best_model``, a plain ``eval_*``
        metric while ``trainer.eval_dataset`` is a dict, an eval metric other than the loss from
        a stock ``Trainer`` without ``compute_metrics``. Messages end with a "did you mean" where
        one exists.
        """
        return self._against_args(args) or self._misspelt_against_args(args) or self._against_trainer(trainer)

    def _against_args(self, args: Any) -> Optional[str]:
        prefix, monitor, owner = self.prefix, self.monitor, self.owner
        if args is None:
            return None
        if prefix == "":
            if _choice(getattr(args, "logging_strategy", "steps")) == "no":
                return (f"{owner} monitors the training-loop key {monitor!r}, but args.logging_strategy='no' "
                        f"never logs it. Set logging_strategy to 'steps' or 'epoch'.")
            return None
        section = prefix.split("_")[0]
        if section == "test":
            return (f"{owner}: monitor={monitor!r} is a test_* metric; the Trainer produces test_* metrics "
                    f"only in predict(), never during training. Monitor an eval_* metric instead.")
        if section != "eval":
            return None
        if _choice(getattr(args, "eval_strategy", "steps")) == "no":
            return (f"{owner}: monitor={monitor!r} is an evaluation metric but args.eval_strategy='no', so "
                    f"the Trainer never evaluates during training. Set eval_strategy to one of "
                    f"['steps', 'epoch'].")
        name = KeyGrammar().parse(self.grammar.candidates(monitor)[0]).name
        if getattr(args, "prediction_loss_only", False) and name != "loss":
            return (f"{owner}: monitor={monitor!r} needs compute_metrics, but args.prediction_loss_only=True "
                    f"makes evaluation return only eval_loss. Monitor 'eval_loss' or set "
                    f"prediction_loss_only=False.")
        return None

    def _misspelt_against_args(self, args: Any) -> Optional[str]:
        """A near miss of ``args.metric_for_best_model`` (``"eval_acuracy"`` while the trainer
        selects on ``"accuracy"``) that is not a known metric name itself."""
        wanted = getattr(args, "metric_for_best_model", None)
        if not isinstance(wanted, str) or not wanted:
            return None
        target = wanted if wanted.startswith("eval_") else f"eval_{wanted}"
        raw = self.grammar.canonical(self.grammar.candidates(self.monitor)[0])
        if raw == target or self.grammar.parse(raw).name in KNOWN_NAMES:
            return None
        if difflib.SequenceMatcher(None, raw, target).ratio() < 0.85:
            return None
        return (f"{self.owner}: monitor={self.monitor!r} is not produced under that name; the trainer "
                f"selects its best model on args.metric_for_best_model={wanted!r}. Did you mean {target!r}?")

    def _against_trainer(self, trainer: Any) -> Optional[str]:
        if trainer is None:
            return None
        eval_dataset = getattr(trainer, "eval_dataset", None)
        datasets = sorted(name for name in eval_dataset if isinstance(name, str) and name) if isinstance(
            eval_dataset, dict) else []
        for name in datasets:  # the trainer's datasets, also those assigned after construction
            self.grammar.declare_dataset(name)
        parsed = self.grammar.parse(self.grammar.canonical(self.grammar.candidates(self.monitor)[0]))
        if parsed.section != "eval":
            return None
        if datasets and parsed.dataset is None:
            suggestions = " or ".join(repr(f"eval_{name}_{parsed.name}") for name in datasets)
            return (f"{self.owner}: monitor={self.monitor!r} is never produced: the trainer evaluates a dict "
                    f"of datasets {datasets}, so its metrics are eval_<dataset>_<metric>. Did you mean "
                    f"{suggestions}?")
        if parsed.name != "loss" and getattr(trainer, "compute_metrics", None) is None \
                and _evaluates_like_stock_trainer(trainer):
            loss = "eval_loss" if parsed.dataset is None else f"eval_{parsed.dataset}_loss"
            return (f"{self.owner}: monitor={self.monitor!r} is never produced: the trainer has no "
                    f"compute_metrics, so its evaluations return only {loss!r} (and timings). Did you mean "
                    f"{loss!r}? Or pass compute_metrics=... to the trainer.")
        return None

    def missing_problem(self, values: Mapping[str, Any], from_evaluate: bool) -> Optional[str]:
        """Why a record that should hold the metric does not (keys present, "did you mean"), or
        None when this record may lack it.

        A training record (``loss``/``learning_rate``) must hold a training-loop metric; an
        evaluation of the monitor's `prefix` (it reports ``<prefix>_runtime``...) must hold an
        evaluation metric. Other records may lack it.
        """
        prefix, owner = self.prefix, self.owner
        if prefix == "":
            training_record = bool({"loss", "learning_rate"} & set(values)) and "train_runtime" not in values
            missing = not from_evaluate and training_record
            return f"{owner}: {self.explain_missing(values)}" if missing else None
        if not from_evaluate:
            return None
        prefixes = {key[: -len(suffix)] for key in values if isinstance(key, str)
                    for suffix in SPEED_SUFFIXES if key.endswith(suffix)}
        if prefix in prefixes:
            return f"{owner}: the {prefix!r} evaluation did not return it. {self.explain_missing(values)}"
        name = self.grammar.parse(self.grammar.candidates(self.monitor)[0]).name
        if prefix == "eval" and any(p.startswith("eval_") and f"{p}_{name}" in values for p in prefixes):
            # several eval datasets: every evaluation is eval_<name>_..., a plain eval_* never comes
            return (f"{owner}: the trainer evaluates named datasets ({sorted(prefixes)}), never a plain "
                    f"'eval' set. {self.explain_missing(values)}")
        return None

    # -- comparisons (pure) ------------------------------------------------------------
    @property
    def worst(self) -> float:
        """The value every finite value improves on (``+inf`` for min, ``-inf`` for max)."""
        return math.inf if self.mode == "min" else -math.inf

    def check_thresholds(self, *, baseline: Optional[float] = None,
                         stopping_threshold: Optional[float] = None,
                         divergence_threshold: Optional[float] = None) -> None:
        """`check_thresholds` for this monitor's mode."""
        check_thresholds(self.mode, baseline=baseline, stopping_threshold=stopping_threshold,
                         divergence_threshold=divergence_threshold, owner=self.owner)

    def reaches(self, current: float, threshold: float) -> bool:
        """``current`` is at least as good as ``threshold`` (``<=`` for min, ``>=`` for max)."""
        if not math.isfinite(current):
            return False
        return current <= threshold if self.mode == "min" else current >= threshold

    def is_worse_than(self, current: float, threshold: float) -> bool:
        """``current`` is strictly worse than ``threshold`` (NaN counts as worse)."""
        if math.isnan(current):
            return True
        return current > threshold if self.mode == "min" else current < threshold

    def is_improvement(self, current: Optional[float], best: Optional[float]) -> bool:
        """Decide whether ``current`` improves on ``best``. Pure function of its arguments.

        Rules:
            * a non-finite or missing ``current`` never improves;
            * a missing or NaN ``best`` is improved on by any finite value, and so is the
              worst infinity (``+inf`` in min mode, ``-inf`` in max mode);
            * the best infinity (``-inf`` in min mode) is never improved on;
            * otherwise ``current`` must beat ``best`` by more than the margin: ``min_delta``
              (absolute) or ``min_delta * abs(best)`` (relative); a value exactly at the
              margin does not count.

        Args:
            current: The new value.
            best: The best value so far (None when there is none).

        Returns:
            True when ``current`` is an improvement.
        """
        if current is None or not math.isfinite(current):
            return False
        if best is None or math.isnan(best):
            return True
        if math.isinf(best):
            return best == self.worst
        margin = self.min_delta if self.min_delta_mode == "absolute" else self.min_delta * abs(best)
        if self.mode == "min":
            return current < best - margin
        return current > best + margin

    def best_of(self, values: Iterable[Optional[float]]) -> Optional[float]:
        """The best finite value of ``values`` (no ``min_delta``), or None."""
        finite = [v for v in values if v is not None and math.isfinite(v)]
        if not finite:
            return None
        return min(finite) if self.mode == "min" else max(finite)


def _evaluates_like_stock_trainer(trainer: Any) -> bool:
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
