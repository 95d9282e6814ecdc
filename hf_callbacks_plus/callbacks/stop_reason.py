"""Why ``EarlyStopping`` stopped (``StopReason``) and what one observation decided (``Decision``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

__all__ = ["Decision", "StopReason"]


class StopReason(str, Enum):
    """Why :class:`EarlyStopping` stopped training (``NOT_STOPPED`` while it has not)."""

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
    """The outcome of one observation of the monitored value (see :meth:`EarlyStopping.decide`)."""

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
