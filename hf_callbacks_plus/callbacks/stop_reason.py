"""Why ``EarlyStopping`` stopped (``StopReason``), what one observation decided (``Decision``) and
the sentences that tell the user (``stop_message`` at the stop, ``summary_message`` at train end)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Optional

__all__ = ["Decision", "StopReason", "stop_message", "summary_message"]


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
        """A small integer, used to broadcast the reason between ranks."""
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

    def to_floats(self) -> list[float]:
        """The decision as floats (None as NaN / -1), to broadcast between ranks."""
        nan = float("nan")
        return [
            float(self.improved), float(self.wait), nan if self.best_value is None else self.best_value,
            -1.0 if self.best_step is None else float(self.best_step),
            nan if self.best_epoch is None else self.best_epoch, float(self.reason.code),
        ]

    @classmethod
    def from_floats(cls, values: Sequence[float]) -> Decision:
        """Rebuild a decision from `to_floats`."""
        return cls(
            bool(values[0]), int(values[1]), None if math.isnan(values[2]) else values[2],
            None if values[3] < 0 else int(values[3]), None if math.isnan(values[4]) else values[4],
            list(StopReason)[int(values[5])],
        )


def _shown(value: Any) -> str:
    """A value as a person reads it: floats with 6 significant digits, the rest as repr."""
    return f"{value:.6g}" if isinstance(value, float) else repr(value)


def stop_message(reason: StopReason, name: Optional[str], value: float, step: int, *,
                 best_value: Optional[float], best_step: Optional[int], wait: int,
                 options: dict[str, Any]) -> str:
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
                    options: Optional[dict[str, Any]] = None) -> str:
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
