"""The spike rule of `SpikeGuard`, kept on the device: the last ``window`` values of each watched
signal (the step's loss, its gradient norm), their median and median absolute deviation (MAD;
the lower middle value of an even count, as ``torch.nanmedian``),
and a step is a spike when a value is not finite or lies more than ``threshold`` robust standard
deviations (1.4826 MAD, at least 0.1 % of the median) above the median. Judging starts once the
window holds ``warmup`` values; every finite value enters the window (a lasting change of level
becomes the new normal once it fills half of it). Nothing here reads a tensor back to the host.
"""

from __future__ import annotations

import math
from typing import Any, Optional

__all__ = ["MAD_TO_SIGMA", "SIGNALS", "SpikeWindow"]

#: The signals the rule can watch, in the order of its vectors.
SIGNALS = ("loss", "grad_norm")
#: MAD of a normal distribution times this is its standard deviation.
MAD_TO_SIGMA = 1.4826
#: The scale's floor, relative to the median (a window of equal values has a MAD of 0).
RELATIVE_FLOOR = 1e-3


class SpikeWindow:
    """The window and the rule (see the module docstring).

    Args:
        size: Values kept per signal.
        warmup: Values the window must hold before a step is judged (non-finite values are
            spikes from the first step on).
        threshold: Robust standard deviations above the median that make a spike.
    """

    def __init__(self, size: int, warmup: int, threshold: float) -> None:
        self.size, self.warmup, self.threshold = size, warmup, threshold
        self.values: Any = None  # [len(SIGNALS), size] float32, NaN = empty
        self.count = 0  # steps written (host: the warm-up needs no read back)
        #: The last judgement: spike flags, robust z-scores (device tensors).
        self.last: Optional[tuple[Any, Any]] = None

    def _ensure(self, like: Any) -> None:
        import torch

        if self.values is None or self.values.device != like.device:
            values = torch.full((len(SIGNALS), self.size), math.nan, dtype=torch.float32, device=like.device)
            if self.values is not None:
                values.copy_(self.values)
            self.values = values

    def judge(self, x: Any, watched: Any) -> tuple[Any, Any]:
        """Judge the step's values ``x`` (a float32 vector over `SIGNALS`) against the window, then add
        the finite ones. ``watched``: a bool vector, the signals that count. Returns ``(spike, z)``:
        a 0-d bool tensor (any watched signal spiked) and the z-scores, on ``x``'s device."""
        import torch

        self._ensure(x)
        finite = torch.isfinite(x)
        if self.count >= self.warmup:
            median = self.values.nanmedian(dim=1).values
            mad = (self.values - median[:, None]).abs().nanmedian(dim=1).values
            scale = torch.maximum(MAD_TO_SIGMA * mad, RELATIVE_FLOOR * median.abs()).clamp_min(1e-12)
            z = (x - median) / scale
            flags = ~finite | (z > self.threshold)
        else:
            z = torch.zeros_like(x)
            flags = ~finite
        spike = (flags & watched).any()
        self.values[:, self.count % self.size] = torch.where(finite, x, torch.full_like(x, math.nan))
        self.count += 1
        self.last = (spike, z)
        return spike, z

    # -- the checkpoint ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The window, oldest value first (a read back: at a save only)."""
        held = min(self.count, self.size)
        if self.values is None or held == 0:
            return {"count": self.count, "values": [[] for _ in SIGNALS]}
        order = [(self.count - held + i) % self.size for i in range(held)]
        rows = self.values[:, order].tolist()
        return {"count": self.count, "values": [[None if math.isnan(v) else v for v in row] for row in rows]}

    def load(self, saved: Any) -> None:
        """Put back what `to_dict` gave (kept on the CPU until the first judgement moves it)."""
        import torch

        if not isinstance(saved, dict):
            return
        rows = saved.get("values") or []
        count = saved.get("count")
        if not isinstance(count, int) or len(rows) != len(SIGNALS):
            return
        held = min(len(rows[0]), self.size)
        values = torch.full((len(SIGNALS), self.size), math.nan, dtype=torch.float32)
        for signal, row in enumerate(rows):
            for i, value in enumerate(row[len(row) - held:]):
                values[signal, (count - held + i) % self.size] = math.nan if value is None else float(value)
        self.values, self.count = values, count
