"""The stopping rule of ``EarlyStopping``, as a pure function of one observation and the progress so far.

``StoppingPolicy.decide(monitor, value, step, epoch, progress) -> Decision`` has no state and
does no I/O (compare Lightning's ``_evaluate_stopping_criteria(current) -> (should_stop,
reason)``), so every rule is tested by a table of cases without any trainer
(``tests/callbacks/test_early_stopping_policy.py``). The callback feeds it observations and
stores what it returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ..metrics.monitor import Monitor, check_number, check_thresholds
from .stop_reason import Decision, StopReason

__all__ = ["Progress", "StoppingPolicy"]


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


def _check_count(name: str, value: object, meaning: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"EarlyStopping: {name} must be an int >= 0 ({meaning}), got {value!r} "
                        f"({type(value).__name__}).")
    if value < 0:
        raise ValueError(f"EarlyStopping: {name} must be an int >= 0 ({meaning}), got {value!r}.")


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
        _check_count("patience", self.patience, "evaluations without improvement before stopping")
        _check_count("start_from_step", self.start_from_step, "warm-up steps")
        check_number("start_from_epoch", self.start_from_epoch, owner="EarlyStopping", minimum=0)
        check_thresholds(None, baseline=self.baseline, stopping_threshold=self.stopping_threshold,
                         divergence_threshold=self.divergence_threshold, owner="EarlyStopping")
        if not isinstance(self.check_finite, bool):
            raise TypeError(f"EarlyStopping: check_finite must be True or False, got {self.check_finite!r}.")

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
