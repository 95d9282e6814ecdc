"""TrainerState, TrainerControl and ExportableState, field for field as in transformers 5.x.

``trainer_state.json`` files written here load in transformers and vice versa.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Optional, Union

from .._compat import ExportableStateBase

__all__ = [
    "TRAINER_STATE_NAME",
    "ExportableState",
    "TrainerControl",
    "TrainerState",
    "callback_states",
    "saved_attributes",
    "saved_states",
    "write_json_atomically",
]

#: File name of the serialized state inside a checkpoint folder (same as transformers).
TRAINER_STATE_NAME = "trainer_state.json"
#: The attribute under which a stateful callback saves the key that tells its instances apart.
STATE_KEY_FIELD = "state_key"


class ExportableState(ExportableStateBase):
    """Base for objects whose state is saved in checkpoints and restored on resume.

    When transformers is installed this class derives from
    ``transformers.trainer_callback.ExportableState``, so a stock ``Trainer`` saves our
    stateful callbacks into ``trainer_state.json`` exactly like its own.

    Subclasses implement `state` returning ``{"args": {...}, "attributes": {...}}``.
    """

    def state(self) -> dict[str, Any]:
        """Return ``{"args": constructor kwargs, "attributes": mutable state}``."""
        raise NotImplementedError("You must implement a `state` function to utilize this class.")

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ExportableState:
        """Build an instance from the dict returned by `state`."""
        instance = cls(**state["args"])
        for key, value in state["attributes"].items():
            setattr(instance, key, value)
        return instance


def write_json_atomically(json_path: Union[str, os.PathLike], data: Any) -> None:
    """Write ``data`` as indented JSON to a temporary file next to ``json_path``, then rename it
    over ``json_path``: readers see the old file or the whole new one, never a truncated one."""
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    path = os.fspath(json_path)
    partial = f"{path}.{os.getpid()}.partial"
    try:
        with open(partial, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def callback_states(callbacks: Iterable[Any]) -> dict[str, Any]:
    """The ``stateful_callbacks`` entry of ``trainer_state.json`` for these callbacks.

    ``{class name: callback.state()}``; a class with several instances maps to the list of
    their states, in callback order (transformers' layout).
    """
    grouped: dict[str, Any] = {}
    for callback in callbacks:
        name = callback.__class__.__name__
        if name in grouped:
            if not isinstance(grouped[name], list):
                grouped[name] = [grouped[name]]
            grouped[name].append(callback.state())
        else:
            grouped[name] = callback.state()
    return grouped


def saved_states(source: Any, name: str) -> list[Mapping[str, Any]]:
    """The saved states (``{"args", "attributes"}``) of class ``name``, oldest first: the one reader
    of ``stateful_callbacks`` (`callback_states`' layout), from a ``TrainerState``, the content of a
    ``trainer_state.json`` or its ``stateful_callbacks`` dict."""
    if isinstance(source, Mapping):
        saved = source["stateful_callbacks"] if "stateful_callbacks" in source else source
    else:
        saved = getattr(source, "stateful_callbacks", None)
    entries = saved.get(name) if isinstance(saved, Mapping) else None
    entries = entries if isinstance(entries, list) else [entries]
    return [entry for entry in entries if isinstance(entry, Mapping)]


def saved_attributes(source: Any, name: str, key: str) -> Optional[dict[str, Any]]:
    """The saved attributes of the instance of class ``name`` whose ``state_key`` is ``key``, or None;
    the last entry wins (transformers appends one at each save for a class with several instances)."""
    for entry in reversed(saved_states(source, name)):
        attributes = entry.get("attributes")
        if isinstance(attributes, Mapping) and attributes.get(STATE_KEY_FIELD) == key:
            return dict(attributes)
    return None


def exportable_state_types() -> tuple[type, ...]:
    """Classes whose instances count as stateful (ours, and transformers' when installed)."""
    types: list[type] = [ExportableState]
    if ExportableStateBase is not object:
        types.append(ExportableStateBase)
    return tuple(types)


@dataclass
class TrainerState:
    """The inner state of a training run, passed to every callback event.

    Same fields, defaults and JSON layout as ``transformers.TrainerState``. One step is one
    optimizer update (``gradient_accumulation_steps`` batches).
    """

    epoch: float = 0
    global_step: int = 0
    max_steps: int = 0
    logging_steps: int = 500
    eval_steps: int = 500
    save_steps: int = 500
    train_batch_size: Optional[int] = None
    num_train_epochs: int = 0
    num_input_tokens_seen: int = 0
    total_flos: float = 0
    log_history: list[dict[str, float]] = None  # type: ignore[assignment]
    best_metric: Optional[float] = None
    best_global_step: Optional[int] = None
    best_model_checkpoint: Optional[str] = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    is_hyper_param_search: bool = False
    trial_name: Optional[str] = None
    trial_params: Optional[dict[str, Union[str, float, int, bool]]] = None
    stateful_callbacks: Any = None

    def __post_init__(self) -> None:
        if self.log_history is None:
            self.log_history = []
        if self.stateful_callbacks is None:
            self.stateful_callbacks = {}
        elif isinstance(self.stateful_callbacks, dict):
            pass  # loaded from a state file
        else:
            allowed = exportable_state_types()
            for callback in self.stateful_callbacks:
                if not isinstance(callback, allowed):
                    raise TypeError(
                        "All callbacks passed to be saved must inherit `ExportableState`, "
                        f"but received {type(callback)}"
                    )
            self.stateful_callbacks = callback_states(self.stateful_callbacks)

    def save_to_json(self, json_path: Union[str, os.PathLike]) -> None:
        """Write this state as JSON (same layout as transformers' ``trainer_state.json``).

        The file is written next to its place and renamed over it: a failed write (a full
        disk) never leaves a truncated state, and the folder's modification time marks the
        save, as the new files of a transformers checkpoint do (rotation by
        ``save_total_limit`` orders checkpoints by that time).
        """
        write_json_atomically(json_path, dataclasses.asdict(self))

    @classmethod
    def load_from_json(cls, json_path: Union[str, os.PathLike]) -> TrainerState:
        """Read a state written by `save_to_json` or by transformers.

        Keys unknown to this version (written by a newer or older transformers) are ignored.
        """
        with open(json_path, encoding="utf-8") as handle:
            data = json.load(handle)
        known = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})

    def compute_steps(self, args: Any, max_steps: int) -> None:
        """Turn fractional ``logging/eval/save_steps`` (< 1) into absolute step counts."""
        for kind in ("logging", "eval", "save"):
            num_steps = getattr(args, f"{kind}_steps")
            if num_steps is not None:
                if num_steps < 1:
                    num_steps = math.ceil(max_steps * num_steps)
                setattr(self, f"{kind}_steps", num_steps)


@dataclass
class TrainerControl(ExportableState):
    """Switches callbacks flip to steer the loop; same reset rules as transformers.

    ``should_training_stop`` is reset at train begin, ``should_epoch_stop`` at each epoch
    begin, ``should_save/should_evaluate/should_log`` at each step begin.
    """

    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False

    def state(self) -> dict[str, Any]:
        """Return the flags as ``{"args": ..., "attributes": {}}``."""
        return {
            "args": {
                "should_training_stop": self.should_training_stop,
                "should_epoch_stop": self.should_epoch_stop,
                "should_save": self.should_save,
                "should_evaluate": self.should_evaluate,
                "should_log": self.should_log,
            },
            "attributes": {},
        }
