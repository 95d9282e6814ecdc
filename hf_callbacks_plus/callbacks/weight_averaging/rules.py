"""The averaging rules of `WeightAveraging`: which buffers an average keeps and how much of the
new weights each update takes. Pure: numbers in, numbers out (table-tested).

``t`` counts the optimizer steps applied since the averaging started (after ``update_after``):
the first update after the start is at ``t = update_every``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional, Union

__all__ = ["BEMA", "EMA", "Rule", "rule_of"]


def _number(owner: str, name: str, value: object, low: float, high: float = math.inf, *,
            open_low: bool = False, open_high: bool = False) -> float:
    """``value`` as a float within its bounds, or a ValueError naming the argument and the range."""
    number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    too_low = number <= low if open_low else number < low
    too_high = number >= high if open_high else number > high
    if math.isnan(number) or too_low or too_high:
        interval = f"{'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
        raise ValueError(f"{owner}: {name} must be a number in {interval}, got {value!r}.")
    return number


@dataclass(frozen=True)
class EMA:
    """Exponential moving average: ``average <- decay * average + (1 - decay) * weights``.

    Args:
        decay: The decay, in (0, 1) (0.999 averages over about the last 1,000 updates).
            Defaults to 0.999.
        warmup: timm's warm-up (``ModelEmaV3(use_warmup=True)``): the decay of update ``t`` is
            ``1 - (1 + (t - 1) / warmup_gamma) ** -warmup_power``, capped at ``decay`` (the first
            update copies the weights). Defaults to False: ``decay`` from the first update.
        warmup_gamma: timm's ``warmup_gamma`` (> 0). Defaults to 1.0.
        warmup_power: timm's ``warmup_power`` (> 0). Defaults to 2/3.

    Raises:
        ValueError: ``decay`` outside (0, 1), or a warm-up setting out of range.
    """

    decay: float = 0.999
    warmup: bool = False
    warmup_gamma: float = 1.0
    warmup_power: float = 2 / 3

    #: The buffers of this rule on each rank, the one evaluated first.
    buffers = ("average",)

    def __post_init__(self) -> None:
        _number("EMA", "decay", self.decay, 0.0, 1.0, open_low=True, open_high=True)
        if not isinstance(self.warmup, bool):
            raise TypeError(f"EMA: warmup must be True or False, got {self.warmup!r}.")
        _number("EMA", "warmup_gamma", self.warmup_gamma, 0.0, open_low=True)
        _number("EMA", "warmup_power", self.warmup_power, 0.0, open_low=True)

    def weight(self, t: int) -> float:
        """The weight of the new weights in the update at ``t`` (``1 - decay``, as timm computes it)."""
        decay = self.decay
        if self.warmup:
            step = t - 1  # timm: max(0, step - update_after_step - 1), its step counting from 1
            if step <= 0:
                return 1.0
            decay = max(min(1 - (1 + step / self.warmup_gamma) ** -self.warmup_power, self.decay), 0.0)
        return 1.0 - decay


@dataclass(frozen=True)
class BEMA:
    """Bias-corrected EMA (Block & Zhang, "EMA Without the Lag", arXiv 2508.00180; trl's
    ``BEMACallback``, whose argument names and defaults these are).

    At update ``t``: ``beta = max((lag + multiplier * t) ** -ema_power, min_ema_multiplier)``,
    ``alpha = (lag + multiplier * t) ** -bias_power``; ``ema <- (1 - beta) * ema + beta * weights``;
    the average is ``ema + alpha * (weights - origin)``, ``origin`` being the weights where the
    averaging started (after ``update_after``).

    Args:
        ema_power: kappa (>= 0; 0 disables the EMA: ``ema`` is the weights). Defaults to 0.5.
        bias_power: eta (>= 0), or None for no bias correction: then the average is the EMA with
            this warm-up (trl's schedule without its correction; one buffer instead of three).
            Defaults to 0.2.
        lag: rho, the virtual age at the start (> 0). Defaults to 10.
        multiplier: gamma (> 0). Defaults to 1.0.
        min_ema_multiplier: The smallest beta, in [0, 1]. Defaults to 0.0.

    Raises:
        ValueError: A setting out of range.
    """

    ema_power: float = 0.5
    bias_power: Optional[float] = 0.2
    lag: float = 10
    multiplier: float = 1.0
    min_ema_multiplier: float = 0.0

    def __post_init__(self) -> None:
        _number("BEMA", "ema_power", self.ema_power, 0.0)
        if self.bias_power is not None:
            _number("BEMA", "bias_power", self.bias_power, 0.0)
        _number("BEMA", "lag", self.lag, 0.0, open_low=True)
        _number("BEMA", "multiplier", self.multiplier, 0.0, open_low=True)
        _number("BEMA", "min_ema_multiplier", self.min_ema_multiplier, 0.0, 1.0)

    @property
    def buffers(self) -> tuple[str, ...]:
        """``average`` (what is evaluated), and with the bias correction ``ema`` and ``origin``."""
        return ("average",) if self.bias_power is None else ("average", "ema", "origin")

    def weight(self, t: int) -> float:
        """beta at ``t``: the weight of the new weights in the EMA."""
        return max((self.lag + self.multiplier * t) ** (-self.ema_power), self.min_ema_multiplier)

    def correction(self, t: int) -> float:
        """alpha at ``t`` (0 without bias correction)."""
        return 0.0 if self.bias_power is None else (self.lag + self.multiplier * t) ** (-self.bias_power)


Rule = Union[EMA, BEMA]


def rule_of(method: Union[str, Rule, Mapping[str, Any]]) -> Rule:
    """``"ema"`` -> ``EMA()``, ``"bema"`` -> ``BEMA()``, a rule as it is, ``{"ema": {"decay": 0.99}}`` ->
    ``EMA(decay=0.99)`` (as `WeightAveraging.state_args` writes it).

    Raises:
        ValueError: Another string. TypeError: Another type.
    """
    if isinstance(method, (EMA, BEMA)):
        return method
    if isinstance(method, Mapping) and len(method) == 1:
        (name, settings), = method.items()
        if str(name).lower() in ("ema", "bema") and isinstance(settings, Mapping):
            return (EMA if str(name).lower() == "ema" else BEMA)(**settings)
    if isinstance(method, str) and method.lower() in ("ema", "bema"):
        return EMA() if method.lower() == "ema" else BEMA()
    if isinstance(method, (str, Mapping)):
        raise ValueError("WeightAveraging: method must be 'ema', 'bema', EMA(...) or BEMA(...), got "
                         f"{method!r}.")
    raise TypeError(f"WeightAveraging: method must be 'ema', 'bema', EMA(...) or BEMA(...), got "
                    f"{type(method).__name__}.")
