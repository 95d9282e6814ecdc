"""Checkpoints of the lightweight loop: save, rotate, find the last one, resume, best model.

The folder layout and the rules are transformers 5.x's: ``<output_dir>/checkpoint-<step>/``
holding ``trainer_state.json`` (readable by transformers), rotation by ``save_total_limit``
that always keeps the newest and the best checkpoint. ``resume_from_checkpoint=True`` means
"the highest-numbered *complete* checkpoint in ``output_dir``" (see
``hf_callbacks_plus.core.checkpoint_folders``; transformers takes the highest-numbered one).

The model is saved through the user's ``save_model_fn(dir)`` / ``load_model_fn(dir)``
hooks when given; otherwise a peft model saves its adapter (``save_pretrained``:
``adapter_model.safetensors``, as ``transformers.Trainer`` does) and any other model with
``state_dict()``/``load_state_dict()`` is pickled to ``model_state.pkl`` (only load
checkpoints you wrote yourself: pickle runs code).
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Any, Optional, Union

from ..callbacks.early_stopping.best_weights import active_adapter, load_checkpoint_weights
from ..core.checkpoint_folders import (
    PREFIX_CHECKPOINT_DIR,
    checkpoint_folder,
    newest_complete_checkpoint,
)
from ..core.state import (
    TRAINER_STATE_NAME,
    TrainerControl,
    TrainerState,
    callback_states,
    exportable_state_types,
)

__all__ = [
    "MODEL_STATE_NAME",
    "CheckpointMixin",
    "rotate_checkpoints",
    "sort_checkpoints",
]

logger = logging.getLogger("hf_callbacks_plus")

#: File holding the pickled ``model.state_dict()`` when no ``save_model_fn`` is given.
MODEL_STATE_NAME = "model_state.pkl"


def sort_checkpoints(
    output_dir: Union[str, os.PathLike],
    use_mtime: bool = False,
    best_model_checkpoint: Optional[str] = None,
) -> list[str]:
    """Checkpoint folders oldest first; the best one is moved just before the newest.

    With ``use_mtime`` the order is by modification time, falling back to step numbers when
    all mtimes lie within one second (as transformers does on unreliable filesystems).
    """
    paths = [str(x) for x in Path(output_dir).glob(f"{PREFIX_CHECKPOINT_DIR}-*") if os.path.isdir(x)]
    ordering: list[tuple[float, str]] = []
    for path in paths:
        if use_mtime:
            ordering.append((os.path.getmtime(path), path))
        else:
            match = re.match(f".*{PREFIX_CHECKPOINT_DIR}-([0-9]+)", path)
            if match is not None:
                ordering.append((int(match.groups()[0]), path))
    ordering.sort()
    if use_mtime and len(ordering) > 1 and ordering[-1][0] - ordering[0][0] < 1.0:
        return sort_checkpoints(output_dir, use_mtime=False, best_model_checkpoint=best_model_checkpoint)
    ordered = [path for _, path in ordering]
    if best_model_checkpoint is not None:
        best = str(Path(best_model_checkpoint))
        if best in ordered and ordered[-1] != best:
            newest = ordered[-1]
            ordered = [path for path in ordered if path not in {best, newest}] + [best, newest]
    return ordered


def rotate_checkpoints(
    output_dir: Union[str, os.PathLike],
    save_total_limit: Optional[int] = None,
    best_model_checkpoint: Optional[str] = None,
    use_mtime: bool = False,
) -> None:
    """Delete the oldest checkpoints beyond ``save_total_limit``, keeping the newest and the best."""
    if save_total_limit is None or save_total_limit <= 0:
        return
    checkpoints = sort_checkpoints(output_dir, use_mtime)
    if len(checkpoints) <= save_total_limit:
        return
    protected = {checkpoints[-1]}
    if best_model_checkpoint is not None:
        protected.add(str(Path(best_model_checkpoint)))
    keep = max(save_total_limit, len(protected))
    remaining = len(checkpoints)
    for checkpoint in checkpoints:
        if remaining <= keep:
            break
        if checkpoint not in protected:
            shutil.rmtree(checkpoint, ignore_errors=True)
            remaining -= 1


class CheckpointMixin:
    """Checkpoint methods of `LightweightTrainer` (its ``__init__`` sets the attributes they read)."""

    # -- model weights -------------------------------------------------------------------
    def _save_model(self, output_dir: str) -> None:
        if self.save_model_fn is not None:
            self.save_model_fn(output_dir)
        elif active_adapter(self.model) is not None and hasattr(self.model, "save_pretrained"):
            self.model.save_pretrained(output_dir)  # a peft model: only the adapter, as Trainer saves it
        elif self.model is not None and callable(getattr(self.model, "state_dict", None)):
            with open(os.path.join(output_dir, MODEL_STATE_NAME), "wb") as handle:
                pickle.dump(self.model.state_dict(), handle)

    def save_model(self, output_dir: Optional[str] = None, _internal_call: bool = False) -> None:
        """Save the model into ``output_dir`` (defaults to ``args.output_dir``), as ``Trainer.save_model``:
        through ``save_model_fn``, a peft adapter, or ``model_state.pkl``. The trainer's checkpoints call
        it with ``_internal_call=True``."""
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        os.makedirs(output_dir, exist_ok=True)
        self._save_model(output_dir)

    def _load_model(self, checkpoint: str) -> None:
        if self.load_model_fn is not None:
            self.load_model_fn(checkpoint)
            return
        if active_adapter(self.model) is not None and load_checkpoint_weights(self.model, checkpoint):
            return
        path = os.path.join(checkpoint, MODEL_STATE_NAME)
        if (
            self.model is not None
            and os.path.isfile(path)
            and callable(getattr(self.model, "load_state_dict", None))
        ):
            with open(path, "rb") as handle:
                self.model.load_state_dict(pickle.load(handle))  # noqa: S301 - our own checkpoint

    def _load_best_model(self) -> None:
        logger.info(
            "Loading best model from %s (score: %s).",
            self.state.best_model_checkpoint,
            self.state.best_metric,
        )
        self._load_model(self.state.best_model_checkpoint)

    # -- saving ------------------------------------------------------------------------
    def _stateful_callbacks(self) -> list[Any]:
        allowed = exportable_state_types()
        return [cb for cb in [*self.callback_handler.callbacks, self.control] if isinstance(cb, allowed)]

    def _save_checkpoint(self) -> None:
        """Write ``checkpoint-<step>``: model (hook/pickle), ``trainer_state.json``; then rotate."""
        run_dir = self.args.output_dir
        output_dir = checkpoint_folder(run_dir, self.state.global_step)
        self.store_flos()
        self.save_model(output_dir, _internal_call=True)

        if self.args.save_strategy in ("steps", "epoch", "best") and self.state.best_global_step:
            best_dir = checkpoint_folder(run_dir, self.state.best_global_step)
            if os.path.exists(best_dir):
                self.state.best_model_checkpoint = best_dir

        # Current state of every stateful callback. Unlike transformers 5.23 (which appends to the
        # list of a class with several instances at every save), the entry is rebuilt each time.
        self.state.stateful_callbacks = callback_states(self._stateful_callbacks())
        self.state.save_to_json(os.path.join(output_dir, TRAINER_STATE_NAME))

        rotate_checkpoints(
            run_dir,
            save_total_limit=self.args.save_total_limit,
            best_model_checkpoint=self.state.best_model_checkpoint,
            use_mtime=True,
        )

    # -- resuming ------------------------------------------------------------------------
    def _resolve_checkpoint(self, resume_from_checkpoint: Union[str, bool, None]) -> Optional[str]:
        if resume_from_checkpoint is None or resume_from_checkpoint is False:
            return None
        if resume_from_checkpoint is True:
            found = newest_complete_checkpoint(self.args.output_dir, trainer_name=type(self).__name__)
            if found is None:
                raise ValueError(
                    f"train(resume_from_checkpoint=True): no valid checkpoint-N folder found in "
                    f"output_dir={self.args.output_dir!r}."
                )
            return found
        path = os.fspath(resume_from_checkpoint)
        if not os.path.isdir(path):
            raise ValueError(
                f"train(resume_from_checkpoint={resume_from_checkpoint!r}): not a directory; pass a "
                "checkpoint-N folder, True (newest in output_dir) or None."
            )
        return path

    def _init_training_state(
        self, max_steps: int, steps_per_epoch: int, num_epochs: int, checkpoint: Optional[str]
    ) -> tuple[int, int]:
        """Fresh state, or the checkpoint's; returns (epochs trained, batches to skip in the next)."""
        self.state = TrainerState(stateful_callbacks=self._stateful_callbacks())
        self.state.train_batch_size = self.args.train_batch_size
        self.state.compute_steps(self.args, max_steps)
        epochs_trained = 0
        batches_to_skip = 0
        if checkpoint is not None and os.path.isfile(os.path.join(checkpoint, TRAINER_STATE_NAME)):
            self.state = TrainerState.load_from_json(os.path.join(checkpoint, TRAINER_STATE_NAME))
            best = self.state.best_model_checkpoint
            if best is not None and not os.path.isdir(best):
                logger.warning(
                    "The best checkpoint %s recorded in the resumed state does not exist anymore.", best
                )
                self.state.best_model_checkpoint = None
            self._load_callback_state()
            epochs_trained = int(self.state.global_step // steps_per_epoch)
            if not self.args.ignore_data_skip:
                batches_to_skip = (
                    self.state.global_step % steps_per_epoch
                ) * self.args.gradient_accumulation_steps
        self.state.max_steps = max_steps
        self.state.num_train_epochs = num_epochs
        self.state.is_local_process_zero = True
        self.state.is_world_process_zero = True
        return epochs_trained, batches_to_skip

    def _load_callback_state(self) -> None:
        """Rebuild stateful callbacks from the checkpoint (``restore_callback_states_from_checkpoint``).

        Same rules as transformers: matching classes are re-created from their saved
        ``args``/``attributes`` and moved to the end of the callback list.
        """
        if not self.args.restore_callback_states_from_checkpoint:
            return
        not_found = []
        new_callbacks = []
        original = [*self.callback_handler.callbacks, self.control]
        for stored_name, data in self.state.stateful_callbacks.items():
            entries = data if isinstance(data, list) else [data]
            duplicates = [cb for cb in original if cb.__class__.__name__ == stored_name]
            if not duplicates:
                not_found.append(stored_name)
                continue
            for callback, callback_data in zip(duplicates, entries):
                new_callback = type(callback)(**callback_data.get("args", {}))
                for attribute, value in callback_data.get("attributes", {}).items():
                    setattr(new_callback, attribute, value)
                if isinstance(callback, TrainerControl):
                    self.control = new_callback
                else:
                    new_callbacks.append(new_callback)
                self.callback_handler.remove_callback(type(new_callback))
        if not_found:
            logger.warning(
                "Checkpoint included callbacks not included in current configuration. Ignoring. (%s)",
                ", ".join(not_found),
            )
        for callback in new_callbacks:
            self.callback_handler.add_callback(callback)

    def _finalize_checkpoints(self) -> None:
        """With ``save_total_limit=1`` keep only the best checkpoint once training ends."""
        best = self.state.best_model_checkpoint
        checkpoints = sort_checkpoints(self.args.output_dir, best_model_checkpoint=best)
        if best is not None and self.args.save_total_limit == 1:
            for checkpoint in checkpoints:
                if not os.path.samefile(checkpoint, best):
                    logger.info("Deleting older checkpoint [%s] due to args.save_total_limit", checkpoint)
                    shutil.rmtree(checkpoint, ignore_errors=True)
