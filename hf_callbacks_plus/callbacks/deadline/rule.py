"""The stopping rule of `Deadline`, pure: at a step boundary, with so many seconds left, go on or
stop (and whether to evaluate before the stop's save).

The rule is one sentence: **go on only while the next boundary at which the ranks agree is still
early enough for a complete save**. Going on costs what is scheduled at this boundary (its
evaluation and save), the steps to the next check and what is scheduled between; the next check
must then still have room for one save. Otherwise training stops here, and evaluates first when
asked (or scheduled) only if the evaluation and the save both fit. The callback decides again right
after every save (``saved=True``): that checkpoint can be the stop's, so stopping there costs
nothing, and a save whose duration was never measured (counted as 0) is then known. Nothing here
reads a clock or a trainer: `plan_boundary` is table- and property-tested alone
(``tests/callbacks/test_deadline_rule.py``), the callback feeds it `Durations` it measured.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["Durations", "Measurements", "Plan", "Schedule", "plan_boundary", "plan_stop"]


@dataclass(frozen=True)
class Durations:
    """How long things take, in seconds (estimates; 0 for what was never measured)."""

    step: float = 0.0
    evaluate: float = 0.0
    save: float = 0.0


@dataclass(frozen=True)
class Schedule:
    """The trainer's step-based plan: evaluate every ``eval_every`` steps, save every ``save_every``
    (0: no step-based evaluation or save), up to ``max_steps``. Epoch strategies are not in it: the
    epoch's end is a boundary of its own, where the trainer's flags say what comes."""

    eval_every: int = 0
    save_every: int = 0
    max_steps: int = 0

    def evaluates(self, step: int) -> bool:
        """Whether the trainer evaluates after ``step`` (the last step included, as transformers 5)."""
        return self.eval_every > 0 and (step % self.eval_every == 0 or step == self.max_steps)

    def saves(self, step: int) -> bool:
        """Whether the trainer saves after ``step`` (the last step included)."""
        return self.save_every > 0 and (step % self.save_every == 0 or step == self.max_steps)

    def next_check(self, step: int, every: int) -> int:
        """The next step (after ``step``) at which the ranks agree: a multiple of ``every``, or the
        last step."""
        following = (step // every + 1) * every
        return min(following, self.max_steps) if self.max_steps > 0 else following


@dataclass(frozen=True)
class Plan:
    """What to do at a boundary.

    Attributes:
        stop: Stop training here (and save).
        evaluate: Evaluate before the save (when ``stop``: a scheduled evaluation, or the final one
            asked for, that fits; when going on: whatever the trainer scheduled).
        fits: The stop's save (and evaluation) fits in the time left (the margin kept). A stop that
            does not fit still saves.
        needed: Seconds the plan needs from now (its tail when stopping: 0 for a stop right after
            a save; up to the next check's save when going on).
        ahead: Seconds going on would need (up to the next check's save; ``needed`` when going on).
    """

    stop: bool
    evaluate: bool
    fits: bool = True
    needed: float = 0.0
    ahead: float = 0.0


def plan_stop(left: float, durations: Durations, *, evaluate: bool, saved: bool = False,
              ahead: float = math.inf) -> Plan:
    """The stop at this boundary: evaluate first (when ``evaluate`` is asked or scheduled) only if
    the evaluation and the save both fit in ``left`` seconds.

    Args:
        left: Seconds until the deadline, less the margin (``math.inf`` without one).
        durations: The estimates.
        evaluate: An evaluation is scheduled here, or asked for before a stop.
        saved: This step's checkpoint was just written: without an evaluation the stop needs no
            save. Defaults to False.
        ahead: What going on would have needed (for `Plan.ahead`). Defaults to ``math.inf``.
    """
    with_evaluation = durations.evaluate + durations.save
    if evaluate and with_evaluation <= left:
        return Plan(stop=True, evaluate=True, fits=True, needed=with_evaluation, ahead=ahead)
    if saved:  # the checkpoint is written: nothing left to fit
        return Plan(stop=True, evaluate=False, fits=True, needed=0.0, ahead=ahead)
    return Plan(stop=True, evaluate=False, fits=durations.save <= left, needed=durations.save, ahead=ahead)


def plan_boundary(left: float, step: int, durations: Durations, schedule: Schedule, *,
                  check_every: int = 1, evaluates_now: bool = False, saves_now: bool = False,
                  epoch_ends_here: bool = False, evaluate_before_stop: bool = False,
                  saved: bool = False) -> Plan:
    """Go on or stop at the boundary after ``step``, with ``left`` seconds to the deadline.

    Args:
        left: Seconds until the deadline, less the margin (``math.inf`` without one).
        step: The step just ended (``state.global_step``).
        durations: The estimates.
        schedule: The trainer's step-based evaluations and saves.
        check_every: Steps between two checks. Defaults to 1.
        evaluates_now: The trainer evaluates at this boundary (its ``control.should_evaluate``).
        saves_now: The trainer saves at this boundary.
        epoch_ends_here: This step ends an epoch: the next check is the epoch's end, no step later.
        evaluate_before_stop: Evaluate before a stop's save when it fits. Defaults to False.
        saved: This step's checkpoint was just written (the boundary is right after its save): a
            stop here keeps it and needs no save, unless it evaluates first. Defaults to False.

    Returns:
        The `Plan`: go on (``stop=False``) when the cost up to the next check plus one save fits in
        ``left``; else stop here. At the last step the training ends anyway: the plan stops.
    """
    wants_evaluation = evaluates_now or evaluate_before_stop
    if schedule.max_steps > 0 and step >= schedule.max_steps:
        return plan_stop(left, durations, evaluate=wants_evaluation, saved=saved)
    cost = (durations.evaluate if evaluates_now else 0.0) + (durations.save if saves_now else 0.0)
    following = step if epoch_ends_here else schedule.next_check(step, check_every)
    for between in range(step + 1, following):
        cost += durations.step
        cost += (durations.evaluate if schedule.evaluates(between) else 0.0)
        cost += (durations.save if schedule.saves(between) else 0.0)
    if following > step:
        cost += durations.step  # the step that ends at the next check
    needed = cost + durations.save
    if needed <= left:
        return Plan(stop=False, evaluate=evaluates_now, fits=True, needed=needed, ahead=needed)
    return plan_stop(left, durations, evaluate=wants_evaluation, saved=saved, ahead=needed)


class Measurements:
    """The last few durations of each kind, measured in this process or a previous one (kept in the
    checkpoint): the estimate of each is the longest of its last ``keep`` measurements.

    Args:
        keep: Measurements kept per kind. Defaults to 16.
    """

    KINDS = ("step", "evaluate", "save")

    def __init__(self, keep: int = 16) -> None:
        self.keep = keep
        self._seen: dict[str, deque[float]] = {kind: deque(maxlen=keep) for kind in self.KINDS}

    def add(self, kind: str, seconds: float) -> None:
        """Record one duration (negative or non-finite values are ignored)."""
        if math.isfinite(seconds) and seconds >= 0:
            self._seen[kind].append(float(seconds))

    def count(self, kind: str) -> int:
        """How many durations of ``kind`` are kept."""
        return len(self._seen[kind])

    def estimate(self) -> Durations:
        """The longest kept duration of each kind (0 for a kind never measured)."""
        return Durations(**{kind: max(values, default=0.0) for kind, values in self._seen.items()})

    def to_dict(self) -> dict[str, list[float]]:
        """The kept durations, for the checkpoint."""
        return {kind: list(values) for kind, values in self._seen.items()}

    def load(self, saved: Optional[Mapping[str, Any]]) -> None:
        """Put back what `to_dict` returned (unknown kinds and bad values are ignored)."""
        for kind in self.KINDS:
            values: Iterable[Any] = (saved or {}).get(kind) or ()
            self._seen[kind].clear()
            for value in values:
                if isinstance(value, (int, float)):
                    self.add(kind, float(value))
