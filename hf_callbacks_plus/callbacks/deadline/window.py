"""The logging window: what a trainer accumulated since its last logging step, carried through the
checkpoint of a stop between two logging steps.

A trainer logs the mean loss of the steps since its last log. A stop at step 37 with
``logging_steps=10`` would leave steps 31-37 out of the loss logged at step 40 after the resume
(transformers restarts the window at the resumed step), so the resumed run's ``log_history`` and
trackers would differ from an uninterrupted run's. At a stop, `capture` reads the window (every
rank's running loss sum: one small collective, at the stop only) and the callback keeps it in the
checkpoint; `restore` puts it back at the resumed train begin. What is carried:

* ``_tr_loss`` (per rank) and ``_globalstep_last_logged``: ``transformers.Trainer`` 5.x (a local
  variable before 5.0, so nothing is carried there) and ``LightweightTrainer``;
* trl's running metrics of the training mode (``_metrics["train"]``: lists of numbers, the same
  on every rank, gathered by trl).

This reads and writes private attributes of those trainers; a trainer without them carries nothing
and logs as transformers does after any resume.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Optional

from ...metrics.numbers import to_float
from ...runtime.distributed import distributed_rank, distributed_world_size, sum_over_ranks

__all__ = ["capture", "restore"]

logger = logging.getLogger("hf_callbacks_plus")


def _running_metrics(trainer: Any) -> dict[str, list[float]]:
    metrics = getattr(trainer, "_metrics", None)
    train = metrics.get("train") if isinstance(metrics, dict) else None
    if not isinstance(train, dict):
        return {}
    kept: dict[str, list[float]] = {}
    for key, values in train.items():
        if isinstance(key, str) and isinstance(values, list) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            kept[key] = [float(v) for v in values]
    return kept


def capture(trainer: Any, step: int, logs_now: bool, group: Any = None) -> Optional[dict[str, Any]]:
    """The window to carry when training stops after ``step``; None when there is nothing to carry.

    A collective under ``torch.distributed`` (every rank calls it at the stop). ``logs_now``: the
    trainer logs at this step (then the window restarts here and nothing is carried).
    """
    if trainer is None or not hasattr(trainer, "_tr_loss") or not hasattr(trainer, "_globalstep_last_logged"):
        return None
    since = int(trainer._globalstep_last_logged)
    if logs_now or since >= step:
        return None
    value = to_float(trainer._tr_loss)
    world, rank = distributed_world_size(), distributed_rank()
    slots = [0.0] * world
    slots[rank] = value if value is not None else math.nan
    losses = sum_over_ranks(slots, group=group)
    return {"since": since, "step": int(step), "loss": losses, "running_metrics": _running_metrics(trainer)}


def restore(trainer: Any, window: Optional[dict[str, Any]], step: int) -> bool:
    """Put ``window`` back into ``trainer`` when resuming at ``step`` (the step it was captured at).

    Returns:
        True when it was put back.
    """
    if not isinstance(window, dict) or trainer is None or int(window.get("step", -1)) != step:
        return False
    if not hasattr(trainer, "_tr_loss") or not hasattr(trainer, "_globalstep_last_logged"):
        return False
    losses = list(window.get("loss") or [])
    world, rank = distributed_world_size(), distributed_rank()
    if len(losses) != world or any(not isinstance(v, (int, float)) or not math.isfinite(v) for v in losses):
        logger.warning("Deadline: the checkpoint's logging window was kept by %d rank(s), this run has %d; "
                       "the loss logged at the next logging step covers only the steps after step %d.",
                       len(losses), world, step)
        return False
    value = float(losses[rank])
    current = trainer._tr_loss
    if hasattr(current, "fill_"):
        current.fill_(value)  # the tensor the trainer accumulates into, on its device
    else:
        trainer._tr_loss = value
    trainer._globalstep_last_logged = int(window["since"])
    if hasattr(trainer, "_total_loss_scalar"):  # train_loss of this train() call: its own steps only
        trainer._total_loss_scalar -= sum(losses) / world
    running = window.get("running_metrics") or {}
    metrics = getattr(trainer, "_metrics", None)
    if running and isinstance(metrics, dict) and isinstance(metrics.get("train"), dict):
        for key, values in running.items():
            metrics["train"][key] = list(values)
    return True
