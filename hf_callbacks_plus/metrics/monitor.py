"""Monitor: metric lookup, mode, ``min_delta`` and finiteness, in one reusable piece.

Every component that watches a metric (``EarlyStopping``, best-model logic, schedulers)
uses `Monitor`, so "is this value better than that one" has one definition:

* lookup goes through `KeyGrammar` (``"accuracy"``
  finds ``eval_accuracy``; ``"eval/accuracy"`` finds it through rendering);
* ``mode`` is ``"min"``, ``"max"`` or ``"auto"`` (decided from the metric name, like Keras
  and Composer; a name that says nothing raises an error telling what to pass);
* ``min_delta`` is an absolute amount or a fraction of the best value
  (``min_delta_mode="relative"``);
* a non-finite value (NaN, +-Inf) is never an improvement, so it never becomes "best";
* the settings are validated here and nowhere else: `check_mode` (mode, ``min_delta``,
  ``min_delta_mode``) and `check_thresholds` (baseline / stopping / divergence thresholds on
  the right side of each other), with messages naming the argument, the value and the choices.

`Monitor.is_improvement` is a pure function of its two arguments.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from .keys import KeyGrammar

logger = logging.getLogger("hf_callbacks_plus")

__all__ = [
    "MAXIMIZE_WORDS",
    "MINIMIZE_WORDS",
    "MIN_DELTA_MODES",
    "MODES",
    "TRL_DIRECTIONS",
    "Monitor",
    "check_mode",
    "check_number",
    "check_thresholds",
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


def trl_metric(name: str) -> Optional[str]:
    """The trl metric (a key of `TRL_DIRECTIONS`) that ``name`` is, with any section prefix
    (``eval_``, ``eval_<dataset>_``, ``train_subset_``, ``eval/``...), or None."""
    lowered = name.lower()
    for known in _TRL_LONGEST_FIRST:
        if lowered == known or lowered.endswith(("_" + known, "/" + known)):
            return known
    return None


_TRL_LONGEST_FIRST = sorted(TRL_DIRECTIONS, key=len, reverse=True)


def check_number(name: str, value: Any, *, owner: str = "Monitor", allow_none: bool = False,
                 minimum: Optional[float] = None) -> Optional[float]:
    """Validate one numeric setting: a finite int/float (not a bool), optionally >= ``minimum``.

    Raises:
        TypeError: ``value`` is not a number (or None when ``allow_none``).
        ValueError: ``value`` is not finite or below ``minimum``.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "a number or None" if allow_none else "a number"
        raise TypeError(f"{owner}: {name} must be {kind}, got {value!r} ({type(value).__name__}).")
    if not math.isfinite(value):
        raise ValueError(f"{owner}: {name} must be finite, got {value!r}.")
    if minimum is not None and value < minimum:
        raise ValueError(f"{owner}: {name} must be >= {minimum}, got {value!r}.")
    return float(value)


def check_mode(mode: Any, min_delta: Any, min_delta_mode: Any, *, owner: str = "Monitor") -> float:
    """Validate ``mode``, ``min_delta`` and ``min_delta_mode``; return ``min_delta`` as a float.

    Raises:
        TypeError: ``min_delta`` is not a number.
        ValueError: ``mode``/``min_delta_mode`` is not a valid choice, or ``min_delta`` < 0.
    """
    if mode not in MODES:
        raise ValueError(f"{owner}: mode must be one of {list(MODES)}, got {mode!r}.")
    if min_delta_mode not in MIN_DELTA_MODES:
        raise ValueError(
            f"{owner}: min_delta_mode must be one of {list(MIN_DELTA_MODES)}, got {min_delta_mode!r}."
        )
    delta = check_number("min_delta", min_delta, owner=owner)
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
    baseline = check_number("baseline", baseline, owner=owner, allow_none=True)
    stopping = check_number("stopping_threshold", stopping_threshold, owner=owner, allow_none=True)
    divergence = check_number("divergence_threshold", divergence_threshold, owner=owner, allow_none=True)
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
            ``mode="auto"`` with a name that does not tell the direction.

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
        if mode == "auto":
            inferred = infer_mode(monitor)
            if inferred is None:
                known = trl_metric(monitor)
                why = (f" trl's {known!r} is a diagnostic with no better direction." if known is not None
                       else "")
                raise ValueError(
                    f"{owner}: mode='auto' cannot tell whether {monitor!r} should go down or up.{why} "
                    f"Pass mode='min' (lower is better, e.g. a loss) or mode='max' (higher is better, "
                    f"e.g. an accuracy)."
                )
            mode = inferred
        if grammar is not None and not isinstance(grammar, KeyGrammar):
            raise TypeError(f"{owner}: grammar must be a KeyGrammar or None, got {type(grammar).__name__}.")
        self.monitor = monitor
        self.mode = mode
        self.min_delta = delta
        self.min_delta_mode = min_delta_mode
        self.grammar = grammar if grammar is not None else KeyGrammar()
        self.owner = owner
        self._warned_rename = False

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
        """Return ``(key, raw value)`` of the monitored metric, or ``(None, None)``.

        A 0.1.0 train-subset name (``train_loss``) that is not in ``metrics`` finds the current
        one (``train_subset_loss``), with one warning saying the new name.
        """
        key = self.resolve(metrics.keys())
        if key is None:
            key = self._renamed(metrics)
        return (key, metrics[key]) if key is not None else (None, None)

    def _renamed(self, metrics: Mapping[str, Any]) -> Optional[str]:
        current = KeyGrammar.current_name(self.monitor)
        key = None if current is None else self.grammar.resolve(current, metrics.keys())
        if key is not None and not self._warned_rename:
            self._warned_rename = True
            logger.warning(
                "%s: monitor=%r is the train-subset name of hf_callbacks_plus 0.1.0; TrainSubsetEvaluation "
                "now logs %r. Monitoring %r: pass monitor=%r to silence this warning.",
                self.owner, self.monitor, key, key, current)
        return key

    def explain_missing(self, metrics: Iterable[str]) -> str:
        """Message for a missing metric: the keys available and a "did you mean"."""
        return self.grammar.explain_missing(self.monitor, metrics)

    # -- comparisons (pure) ------------------------------------------------------------
    @property
    def worst(self) -> float:
        """The value every finite value improves on (``+inf`` for min, ``-inf`` for max)."""
        return math.inf if self.mode == "min" else -math.inf

    def check_thresholds(self, *, baseline: Optional[float] = None,
                         stopping_threshold: Optional[float] = None,
                         divergence_threshold: Optional[float] = None, owner: str = "Monitor") -> None:
        """`check_thresholds` for this monitor's mode."""
        check_thresholds(self.mode, baseline=baseline, stopping_threshold=stopping_threshold,
                         divergence_threshold=divergence_threshold, owner=owner)

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
