"""The stopping rule of ``EarlyStopping``, pure: ``StoppingPolicy.decide(monitor, value, step, epoch,
progress) -> Decision``, why it stopped (``StopReason``) and the sentences that tell the user.

The policy has no state and does no I/O (compare Lightning's ``_evaluate_stopping_criteria(current)
-> (should_stop, reason)``), so every rule is tested by a table of cases without any trainer
(``tests/callbacks/test_early_stopping_policy.py``). The callback feeds it observations and
stores what it returns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Optional

from ...core.checks import check_bool, check_int, check_number
from ...metrics.monitor import Monitor, check_thresholds

__all__ = ["Decision", "Progress", "StopReason", "StoppingPolicy", "stop_message", "summary_message"]


class StopReason(str, Enum):
    """Why `EarlyStopping` stopped training (``NOT_STOPPED`` while it has not)."""

    NOT_STOPPED = "not_stopped"
    PATIENCE = "patience"
    BASELINE_NOT_REACHED = "baseline_not_reached"
    STOPPING_THRESHOLD = "stopping_threshold"
    DIVERGENCE_THRESHOLD = "divergence_threshold"
    NON_FINITE = "non_finite"

    @property
    def code(self) -> int:
        """The reason's position in the enum (a small integer)."""
        return list(StopReason).index(self)


@dataclass(frozen=True)
class Decision:
    """The outcome of one observation of the monitored value (see `EarlyStopping.decide`)."""

    improved: bool
    wait: int
    best_value: Optional[float]
    best_step: Optional[int]
    best_epoch: Optional[float]
    reason: StopReason

    @property
    def should_stop(self) -> bool:
        """True when training must stop."""
        return self.reason is not StopReason.NOT_STOPPED


def _shown(value: Any) -> str:
    """A value as a person reads it: floats with 6 significant digits, the rest as repr."""
    return f"{value:.6g}" if isinstance(value, float) else repr(value)


def stop_message(reason: StopReason, name: Optional[str], value: float, step: int, *,
                 best_value: Optional[float], best_step: Optional[int], wait: int,
                 options: Mapping[str, Any]) -> str:
    """The log line of a stop: which rule fired, with the value, the setting and the best so far.

    Args:
        reason: Why training stops (not ``NOT_STOPPED``).
        name: The monitored metric.
        value: The value observed at ``step``.
        step: The global step of the stop.
        best_value: The best value so far (None when nothing beat the baseline).
        best_step: The step of ``best_value``.
        wait: Observations without improvement.
        options: The ``EarlyStopping`` constructor arguments (patience, min_delta, thresholds...).

    Returns:
        One sentence starting with "EarlyStopping stopped training at step ...".
    """
    best = f"{_shown(best_value)} at step {best_step}"
    patience = options["patience"]
    texts = {
        StopReason.PATIENCE: f"{name}={_shown(value)} did not improve on the best {best} by more than "
                             f"{options['min_delta']} ({options['min_delta_mode']}) for {wait} "
                             f"evaluation(s) (patience={patience})",
        StopReason.BASELINE_NOT_REACHED: f"{name} did not beat baseline={options['baseline']!r} within "
                                         f"{wait} evaluation(s) (patience={patience})",
        StopReason.STOPPING_THRESHOLD: f"{name}={_shown(value)} reached stopping_threshold="
                                       f"{options['stopping_threshold']!r}",
        StopReason.DIVERGENCE_THRESHOLD: f"{name}={_shown(value)} is worse than divergence_threshold="
                                         f"{options['divergence_threshold']!r}",
        StopReason.NON_FINITE: f"{name} is {_shown(value)} (check_finite=True)",
    }
    return f"EarlyStopping stopped training at step {step}: {texts[reason]}. Best: {best}."


def summary_message(name: Optional[str], *, reason: StopReason, stopped_step: Optional[int], last_step: int,
                    best_value: Optional[float], best_step: Optional[int], label: Optional[str] = None,
                    options: Optional[Mapping[str, Any]] = None) -> str:
    """The end-of-training line: whether and when training stopped, why, and the best value.

    Args:
        name: The monitored metric.
        reason: Why training stopped (``NOT_STOPPED`` when it ran to the end).
        stopped_step: The global step of the stop, if any.
        last_step: The global step training ended at.
        best_value: The best value (None when nothing beat the baseline or nothing was seen).
        best_step: The step of ``best_value``.
        label: The instance's ``log_name``, shown to tell several instances apart. Defaults to None.
        options: The constructor arguments (for the baseline). Defaults to None.

    Returns:
        One sentence starting with "EarlyStopping summary".
    """
    head = "EarlyStopping summary" + (f" [{label}]" if label else "")
    if reason is StopReason.NOT_STOPPED:
        outcome = f"no early stop (training ended at step {last_step})"
    else:
        outcome = f"stopped at step {stopped_step} ({reason.value})"
    if best_value is not None:
        best = f"best {name}={_shown(best_value)} at step {best_step}"
    elif options and options.get("baseline") is not None:
        best = f"no {name} value beat baseline={options['baseline']!r}"
    else:
        best = f"no finite {name} value was observed"
    return f"{head}: {outcome}; {best}."


@dataclass(frozen=True)
class Progress:
    """What the observations so far left behind: the counter and the best value.

    Attributes:
        wait: Observations since the last improvement.
        best_value: The best value (None while nothing beat the baseline).
        best_step: The global step of ``best_value``.
        best_epoch: The epoch of ``best_value``.
    """

    wait: int = 0
    best_value: Optional[float] = None
    best_step: Optional[int] = None
    best_epoch: Optional[float] = None


@dataclass(frozen=True)
class StoppingPolicy:
    """The rules: patience, baseline, thresholds, warm-up and the non-finite check.

    The improvement rule itself (``mode``, ``min_delta``) belongs to the `Monitor` passed to
    `decide`. Validated at construction (types and ranges; the order of the thresholds
    needs the mode, see `check_for`).

    Attributes:
        patience: Observations without improvement before stopping; 0 behaves like 1.
        baseline: A value to beat before anything counts as best.
        stopping_threshold: Stop as soon as the value reaches it.
        divergence_threshold: Stop as soon as the value is worse than it.
        start_from_step: Observations at ``step <= start_from_step`` are ignored (if > 0).
        start_from_epoch: Observations at ``epoch <= start_from_epoch`` are ignored (if > 0).
        check_finite: Stop on a NaN/Inf value.
    """

    patience: int = 3
    baseline: Optional[float] = None
    stopping_threshold: Optional[float] = None
    divergence_threshold: Optional[float] = None
    start_from_step: int = 0
    start_from_epoch: float = 0
    check_finite: bool = True

    def __post_init__(self) -> None:
        check_int("EarlyStopping", "patience", self.patience, 0,
                  "evaluations without improvement before stopping")
        check_int("EarlyStopping", "start_from_step", self.start_from_step, 0, "warm-up steps")
        check_number("EarlyStopping", "start_from_epoch", self.start_from_epoch, minimum=0)
        check_thresholds(None, baseline=self.baseline, stopping_threshold=self.stopping_threshold,
                         divergence_threshold=self.divergence_threshold, owner="EarlyStopping")
        check_bool("EarlyStopping", "check_finite", self.check_finite)

    def check_for(self, mode: Optional[str]) -> None:
        """Check the thresholds lie on the right side of each other for ``mode`` (None: skip).

        Raises:
            ValueError: e.g. in min mode a ``stopping_threshold`` above the ``baseline``.
        """
        check_thresholds(mode, baseline=self.baseline, stopping_threshold=self.stopping_threshold,
                         divergence_threshold=self.divergence_threshold, owner="EarlyStopping")

    def in_warmup(self, step: int, epoch: float) -> bool:
        """True while observations are ignored (``start_from_step``/``start_from_epoch``)."""
        return (0 < self.start_from_step >= step) or (0 < self.start_from_epoch >= epoch)

    def decide(self, monitor: Monitor, value: float, step: int, epoch: float, progress: Progress) -> Decision:
        """What one observation means. Pure: the same arguments always give the same decision.

        Order: non-finite check, warm-up, divergence, improvement (against the best, else the
        baseline), stopping threshold, patience.

        Args:
            monitor: Decides what an improvement is (mode, ``min_delta``).
            value: The observed value.
            step: The global step of the observation.
            epoch: The epoch of the observation.
            progress: The counter and best value before this observation.

        Returns:
            The new counter and best value, and the reason to stop (``NOT_STOPPED`` to go on).
        """
        best = (progress.best_value, progress.best_step, progress.best_epoch)
        if self.check_finite and not math.isfinite(value):
            return Decision(False, progress.wait, *best, StopReason.NON_FINITE)
        if self.in_warmup(step, epoch):
            return Decision(False, progress.wait, *best, StopReason.NOT_STOPPED)
        if (self.divergence_threshold is not None and not math.isnan(value)
                and monitor.is_worse_than(value, self.divergence_threshold)):
            return Decision(False, progress.wait + 1, *best, StopReason.DIVERGENCE_THRESHOLD)
        reference = progress.best_value if progress.best_value is not None else self.baseline
        improved = monitor.is_improvement(value, reference)
        wait = 0 if improved else progress.wait + 1
        if improved:
            best = (value, step, epoch)
        reason = StopReason.NOT_STOPPED
        if self.stopping_threshold is not None and monitor.reaches(value, self.stopping_threshold):
            reason = StopReason.STOPPING_THRESHOLD
        elif not improved and wait >= self.patience:
            no_best = best[0] is None and self.baseline is not None
            reason = StopReason.BASELINE_NOT_REACHED if no_best else StopReason.PATIENCE
        return Decision(improved, wait, *best, reason)
