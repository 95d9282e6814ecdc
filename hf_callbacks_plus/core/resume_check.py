"""The pre-flight resume check of ``LightweightTrainer`` and ``TrainerPlus``: ``on_resume_check``.

``transformers.Trainer`` (and ``LightweightTrainer``, which reproduces its flow event for
event) looks at ``control.should_training_stop`` only after an optimizer step, so a callback
that sets it in ``on_train_begin`` cannot prevent one step. Before training a resumed run,
both our trainers fire the custom event

``on_resume_check(args, state, control, checkpoint=<path>, reasons=<list>, **kwargs)``

with ``state`` loaded from the checkpoint's ``trainer_state.json`` and a fresh ``control``.
A callback that sets ``control.should_training_stop`` (and appends a one-line reason to
``reasons``) vetoes the run: the trainer takes the checkpoint's state and weights, logs one
WARNING and returns at once, firing no training event (``TrainOutput.metrics`` holds
``train_skipped=1.0``). When no callback implements the event nothing happens at all, so the
events of an ordinary run are exactly transformers'.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from .state import TRAINER_STATE_NAME, TrainerControl, TrainerState

__all__ = ["RESUME_CHECK_EVENT", "TRAIN_SKIPPED_METRIC", "run_resume_check", "skipped_metrics"]

logger = logging.getLogger("hf_callbacks_plus")

#: The custom event fired before training a resumed run.
RESUME_CHECK_EVENT = "on_resume_check"
#: Key of ``TrainOutput.metrics`` (value 1.0) when the resume check vetoed training.
TRAIN_SKIPPED_METRIC = "train_skipped"


def _listeners(handler: Any) -> str:
    names = [type(cb).__name__ for cb in handler.callbacks if callable(getattr(cb, RESUME_CHECK_EVENT, None))]
    return ", ".join(names) or "a callback"


def run_resume_check(
    handler: Any,
    args: Any,
    checkpoint: Optional[str],
    *,
    trainer_name: str,
    state_class: Any = TrainerState,
    control_class: Any = TrainerControl,
) -> Optional[Any]:
    """Fire ``on_resume_check`` for ``checkpoint``; return its state when a callback vetoes training.

    Args:
        handler: The trainer's `CallbackHandler`.
        args: The trainer's arguments, passed to the event.
        checkpoint: The resolved ``checkpoint-N`` folder, or None (fresh run: nothing to check).
        trainer_name: Named in the WARNING line (``"LightweightTrainer"``, ``"TrainerPlus"``).
        state_class: Class whose ``load_from_json`` reads ``trainer_state.json``. Defaults to
            our `TrainerState`.
        control_class: Class of the fresh control passed to the event. Defaults to ours.

    Returns:
        The state loaded from the checkpoint when a callback set
        ``control.should_training_stop`` (a WARNING naming the reasons was logged), else None.
        Without a listener, a checkpoint or its ``trainer_state.json``, nothing is read: None.
    """
    if checkpoint is None or not handler.listens(RESUME_CHECK_EVENT):
        return None
    path = os.path.join(checkpoint, TRAINER_STATE_NAME)
    if not os.path.isfile(path):
        return None
    state = state_class.load_from_json(path)
    reasons: list[str] = []
    control = handler.call_event(
        RESUME_CHECK_EVENT, args, state, control_class(), checkpoint=checkpoint, reasons=reasons
    )
    if not control.should_training_stop:
        return None
    why = " | ".join(str(reason) for reason in reasons) or (
        f"{_listeners(handler)} set control.should_training_stop in {RESUME_CHECK_EVENT}"
    )
    logger.warning(
        "%s: not training the run resumed from %s (global_step %s), a callback vetoed it: %s",
        trainer_name, checkpoint, state.global_step, why,
    )
    return state


def skipped_metrics(state: Any) -> dict[str, float]:
    """``TrainOutput.metrics`` of a vetoed resume: ``train_skipped=1.0`` and the checkpoint's epoch."""
    metrics = {TRAIN_SKIPPED_METRIC: 1.0, "train_runtime": 0.0}
    if getattr(state, "epoch", None) is not None:
        metrics["epoch"] = float(state.epoch)
    return metrics
