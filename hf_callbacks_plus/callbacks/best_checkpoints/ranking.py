"""Which saved steps are the k best, by one or several monitored metrics. Pure: no I/O.

`KeepBestCheckpoints` (``best_checkpoints.py``) feeds `admit` one `Kept` candidate per saved
checkpoint and acts on the answer (link the new one, delete the evicted ones). The rules:

* each `TopK` ranks the entries that have a value of its metric, best first (lower first in
  ``"min"`` mode, higher first in ``"max"``); a tie keeps the earlier step;
* as ``load_best_model_at_end`` (``np.greater``/``np.less`` against a best that starts at the
  worst infinity): NaN never ranks, the best infinity (+Inf in ``"max"`` mode, -Inf in
  ``"min"``) ranks first, the worst infinity never ranks (all are stored, so the manifest shows
  them);
* a checkpoint is kept while it is in the top k of at least one `TopK`;
* an entry marked ``missing`` (its folder was deleted outside the run) keeps its place: the
  ranking stays the run's truth and nothing worse is promoted silently in its stead.

Only the kept entries are stored; the top k over them equals the top k over every candidate
ever admitted, because an entry leaves only when k better ones are kept for every metric that
kept it, and those k stay until better ones arrive.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Optional

__all__ = ["Admission", "Kept", "TopK", "admit", "rankings", "top_k"]


@dataclass(frozen=True)
class TopK:
    """One ranking: keep the ``k`` best saved checkpoints by ``monitor``.

    Args:
        monitor: The metric, in `EarlyStopping`'s grammar (``"eval_loss"``,
            ``"eval_rewards/margins"``, ``"train_subset_accuracy"``, ``"loss"``...).
        k: How many to keep (>= 1). Defaults to 1.
        mode: ``"min"``, ``"max"`` or ``"auto"`` (from the name). Defaults to ``"auto"``.

    Example:
        >>> TopK("eval_rewards/margins", k=2)
        TopK(monitor='eval_rewards/margins', k=2, mode='auto')
    """

    monitor: str
    k: int = 1
    mode: str = "auto"

    def order(self, entry: Kept) -> tuple[float, int]:
        """Sort key, best first: the value (negated in ``"max"`` mode), then the step."""
        value = entry.values[self.monitor]
        return (value if self.mode == "min" else -value, entry.step)

    def ranks(self, entry: Kept) -> bool:
        """Whether ``entry`` has a value that ranks: not NaN, not the worst infinity (the value
        ``load_best_model_at_end`` starts from, which nothing equal to it beats)."""
        value = entry.values.get(self.monitor)
        if value is None or math.isnan(value):
            return False
        return value != (math.inf if self.mode == "min" else -math.inf)


@dataclass(frozen=True)
class Kept:
    """A saved step and its monitored values (a candidate, or an entry of the ranking).

    Attributes:
        step: The global step of the checkpoint.
        values: Monitor name -> value at that step (NaN when the record held no number).
        epoch: The epoch at that step, or None.
        missing: Its kept folder was found deleted (it still holds its place in the ranking).
    """

    step: int
    values: Mapping[str, float] = field(default_factory=dict)
    epoch: Optional[float] = None
    missing: bool = False

    def lost(self) -> Kept:
        """This entry marked missing."""
        return replace(self, missing=True)

    def describe(self, monitor: Optional[str] = None) -> str:
        """``"step 40 (eval_loss=0.31)"``: one metric's value, or all of them."""
        values = self.values if monitor is None else {monitor: self.values[monitor]}
        shown = ", ".join(f"{name}={value:.6g}" for name, value in values.items())
        return f"step {self.step} ({shown}{', missing' if self.missing else ''})"

    def to_json(self) -> dict[str, Any]:
        """A strict-JSON dict: NaN becomes None, +-Inf the strings ``"inf"`` and ``"-inf"``."""
        values = {name: _json_value(value) for name, value in self.values.items()}
        return {"step": self.step, "epoch": self.epoch, "values": values, "missing": self.missing}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Kept:
        """Read what `to_json` wrote (None is NaN)."""
        values = {str(name): (math.nan if value is None else float(value))
                  for name, value in (data.get("values") or {}).items()}
        epoch = data.get("epoch")
        epoch = None if epoch is None else float(epoch)
        return cls(int(data["step"]), values, epoch, bool(data.get("missing")))


@dataclass(frozen=True)
class Admission:
    """What admitting one candidate changes.

    Attributes:
        kept: The entries kept after it, by step.
        evicted: The entries it pushed out (their folders are to be deleted).
        admitted: The candidate itself is kept.
    """

    kept: tuple[Kept, ...]
    evicted: tuple[Kept, ...]
    admitted: bool


def _json_value(value: float) -> Any:
    if math.isnan(value):
        return None
    return value if math.isfinite(value) else ("inf" if value > 0 else "-inf")


def top_k(entries: Iterable[Kept], ranking: TopK) -> list[Kept]:
    """The ``ranking.k`` best of ``entries`` by ``ranking.monitor``, best first (values that rank only)."""
    return sorted((entry for entry in entries if ranking.ranks(entry)), key=ranking.order)[: ranking.k]


def rankings(entries: Iterable[Kept], specs: Sequence[TopK]) -> dict[str, list[Kept]]:
    """Each monitor's top k of ``entries``, best first."""
    entries = list(entries)
    return {spec.monitor: top_k(entries, spec) for spec in specs}


def admit(entries: Iterable[Kept], candidate: Kept, specs: Sequence[TopK]) -> Admission:
    """Rank ``candidate`` with the kept ``entries``: what is kept, what is evicted.

    An entry of the candidate's step is replaced by the candidate (a step saved twice).

    Args:
        entries: The entries kept so far.
        candidate: The checkpoint just saved, with its values.
        specs: The rankings (modes resolved to ``"min"``/``"max"``).

    Returns:
        The `Admission`.
    """
    entries = list(entries)
    pool = [*(entry for entry in entries if entry.step != candidate.step), replace(candidate, missing=False)]
    chosen = {entry.step for spec in specs for entry in top_k(pool, spec)}
    kept = tuple(sorted((entry for entry in pool if entry.step in chosen), key=lambda entry: entry.step))
    evicted = tuple(entry for entry in entries if entry.step not in chosen)
    return Admission(kept, evicted, candidate.step in chosen)
