"""Stateful callbacks that restore themselves on resume, in any trainer.

A stock ``transformers.Trainer`` saves every ``ExportableState`` callback's ``state()`` into
``checkpoint-N/trainer_state.json`` but restores it only with
``restore_callback_states_from_checkpoint=True`` (and then replaces the instances, moving
them to the end of the callback list). `SelfRestoringState` removes both problems:
at ``on_train_begin`` the resumed ``TrainerState`` already holds the saved
``stateful_callbacks`` dict, so the callback finds its own entry (matched by
`state_key`, so several instances of one class each get their own state) and loads
it in place.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Optional

from .._compat import trainer_saves_callback_states_per_checkpoint
from .callback import TrainerCallback
from .checkpoint_folders import checkpoint_folder
from .state import (
    STATE_KEY_FIELD,
    TRAINER_STATE_NAME,
    ExportableState,
    saved_attributes,
    write_json_atomically,
)

__all__ = ["SelfRestoringState"]

logger = logging.getLogger("hf_callbacks_plus")


class SelfRestoringState(TrainerCallback, ExportableState):
    """Base for callbacks whose state survives checkpoint/resume without any flag.

    Subclasses implement `state_args` (constructor kwargs), `state_attributes`
    (mutable state, JSON-serializable) and `load_state_attributes`, and may override
    `state_key` to tell apart several instances of the same class. Subclasses that
    override ``on_train_begin`` must call ``super().on_train_begin(...)`` first.
    """

    #: Attribute name under which the instance key is saved.
    STATE_KEY_FIELD = STATE_KEY_FIELD

    @property
    def state_key(self) -> str:
        """Identifies this instance among others of its class. Defaults to the class name."""
        return type(self).__name__

    @state_key.setter
    def state_key(self, value: str) -> None:
        # transformers' ``restore_callback_states_from_checkpoint=True`` restores by
        # ``setattr`` of every saved attribute; the key is derived, so the write is ignored.
        pass

    def state_args(self) -> dict[str, Any]:
        """Constructor kwargs that rebuild an equivalent instance."""
        return {}

    def state_attributes(self) -> dict[str, Any]:
        """The mutable state to checkpoint (JSON-serializable).

        Use the real attribute names as keys: transformers'
        ``restore_callback_states_from_checkpoint=True`` restores them with ``setattr``.
        """
        return {}

    def load_state_attributes(self, attributes: dict[str, Any]) -> None:
        """Load what `state_attributes` returned (read keys with ``.get``)."""

    def state(self) -> dict[str, Any]:
        """The ``ExportableState`` payload saved into ``trainer_state.json``."""
        attributes = dict(self.state_attributes())
        attributes[self.STATE_KEY_FIELD] = self.state_key
        return {"args": self.state_args(), "attributes": attributes}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> SelfRestoringState:
        """Rebuild an instance (used by transformers' ``restore_callback_states_from_checkpoint``)."""
        instance = cls(**state.get("args", {}))
        attributes = dict(state.get("attributes", {}))
        attributes.pop(cls.STATE_KEY_FIELD, None)
        instance.load_state_attributes(attributes)
        return instance

    def find_saved_state(self, trainer_state: Any) -> Optional[dict[str, Any]]:
        """Return this instance's saved attributes from a resumed ``TrainerState``, or None."""
        return saved_attributes(trainer_state, type(self).__name__, self.state_key)

    def restore_from_trainer_state(self, trainer_state: Any) -> bool:
        """Load this instance's state from a resumed ``TrainerState``.

        Returns:
            True when a saved state was found and loaded.
        """
        attributes = self.find_saved_state(trainer_state)
        if attributes is None:
            return False
        attributes = dict(attributes)
        attributes.pop(self.STATE_KEY_FIELD, None)
        self.load_state_attributes(attributes)
        logger.info(
            "%s restored its state from the checkpoint (key %r).", type(self).__name__, self.state_key
        )
        return True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """On transformers < 4.45, write this instance's current state into the new checkpoint.

        Those releases save callback states only at train begin; subclasses that override
        ``on_save`` must call ``super().on_save(...)``.
        """
        if trainer_saves_callback_states_per_checkpoint(args):
            return
        if not getattr(state, "is_world_process_zero", True):
            return
        folder = checkpoint_folder(args.output_dir, state.global_step)
        self.write_state_into_checkpoint(folder)
        self.keep_trainer_state_current(args, state)

    def write_state_into_checkpoint(self, folder: str) -> bool:
        """Replace this instance's entry in ``<folder>/trainer_state.json`` by its current state.

        Returns:
            False when the folder has no ``trainer_state.json`` (e.g. a custom run directory).
        """
        path = os.path.join(folder, TRAINER_STATE_NAME)
        if not os.path.isfile(path):
            logger.debug("%s: no %s to write its state into.", type(self).__name__, path)
            return False
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        data["stateful_callbacks"] = self._with_current_entry(data.get("stateful_callbacks") or {})
        write_json_atomically(path, data)
        return True

    def _with_current_entry(self, saved: dict[str, Any]) -> dict[str, Any]:
        """``saved`` (a ``stateful_callbacks`` dict) with this instance's entry replaced by its
        current state (appended when the class has other instances)."""
        name, current = type(self).__name__, self.state()
        entries = saved.get(name)
        if isinstance(entries, list):
            keys = [entry.get("attributes", {}).get(self.STATE_KEY_FIELD) for entry in entries]
            if self.state_key in keys:
                entries[len(keys) - 1 - keys[::-1].index(self.state_key)] = current
            else:
                entries.append(current)
        elif isinstance(entries, dict) and entries.get("attributes", {}).get(self.STATE_KEY_FIELD) not in (
            None, self.state_key
        ):
            saved[name] = [entries, current]
        else:
            saved[name] = current
        return saved

    def keep_trainer_state_current(self, args: Any, state: Any) -> None:
        """On transformers < 4.45, put this instance's current state into the trainer's
        ``state.stateful_callbacks``, which it computed at train begin and writes into every
        checkpoint: the next checkpoint then holds this state even when the process dies between
        the trainer's save and our ``on_save`` (transformers >= 4.45 asks at each save itself)."""
        saved = getattr(state, "stateful_callbacks", None)
        if isinstance(saved, dict) and not trainer_saves_callback_states_per_checkpoint(args):
            self._with_current_entry(saved)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Restore from the checkpoint being resumed, if any (``state.global_step > 0``)."""
        if getattr(state, "global_step", 0) > 0:
            self.restore_from_trainer_state(state)
