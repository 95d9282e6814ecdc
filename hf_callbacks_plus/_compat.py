"""Optional imports and transformers version shims, in one place.

Everything that depends on whether (and which) transformers, torch, wandb, mlflow or
matplotlib is installed is decided here, so the rest of the package can import names
from this module without try/except blocks of its own.

Set ``HF_CALLBACKS_PLUS_STANDALONE=1`` to ignore an installed transformers (the package
then behaves exactly as on a machine without it; used by the core tests).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from types import ModuleType
from typing import Any, Optional

__all__ = [
    "EXTRA_FOR",
    "TRUTHY",
    "CallbackHandlerBase",
    "ExportableStateBase",
    "TrainerCallbackBase",
    "env_flag",
    "is_available",
    "trainer_saves_callback_states_per_checkpoint",
    "require",
    "transformers_version",
    "version_tuple",
]

#: The pip extra that installs each optional dependency.
EXTRA_FOR = {
    "transformers": "transformers",
    "torch": "transformers",
    "datasets": "transformers",
    "accelerate": "transformers",
    "wandb": "wandb",
    "trackio": "trackio",
    "mlflow": "mlflow",
    "sqlalchemy": "mlflow-local",
    "alembic": "mlflow-local",
    "tqdm": "progress",
    "matplotlib": "plot",
    "tensorboard": "tensorboard",
    "tensorboardX": "tensorboard",
    "torchmetrics": "metrics",
}


def is_available(module: str) -> bool:
    """Tell whether ``module`` can be imported, without importing it.

    Args:
        module: Top-level module name, e.g. ``"wandb"``.

    Returns:
        True when the module is installed.
    """
    if module == "transformers" and _standalone():
        return False
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, feature: str) -> ModuleType:
    """Import an optional dependency or explain which extra installs it.

    Args:
        module: Module to import, e.g. ``"mlflow"``.
        feature: What needs it, used in the error message.

    Returns:
        The imported module.

    Raises:
        ModuleNotFoundError: The module is not installed; the message names the pip extra.
    """
    if module == "transformers" and _standalone():
        raise ModuleNotFoundError(
            f"{feature} needs transformers, but HF_CALLBACKS_PLUS_STANDALONE=1 hides it."
        )
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        top = module.split(".")[0]
        if error.name is not None and error.name.split(".")[0] != top:
            raise
        extra = EXTRA_FOR.get(top, "all")
        raise ModuleNotFoundError(
            f"{feature} needs `{top}`, which is not installed. "
            f"Install it with: pip install 'hf-callbacks-plus[{extra}]'",
            name=top,
        ) from error


#: Values of an environment variable that mean "on" (compared lower-cased, stripped).
TRUTHY = ("1", "true", "yes", "on")


def env_flag(name: str) -> Optional[bool]:
    """Read a yes/no environment variable.

    Args:
        name: The variable, e.g. ``"WANDB_DISABLED"``.

    Returns:
        None when it is unset, else whether its value is one of `TRUTHY`.
    """
    value = os.environ.get(name)
    return None if value is None else value.strip().lower() in TRUTHY


def _standalone() -> bool:
    return bool(env_flag("HF_CALLBACKS_PLUS_STANDALONE"))


def _load_transformers_callback_module() -> Optional[ModuleType]:
    if not is_available("transformers"):
        return None
    try:
        return importlib.import_module("transformers.trainer_callback")
    except Exception:  # a broken transformers install must not break our import
        return None


_TRANSFORMERS_CALLBACKS = _load_transformers_callback_module()


def version_tuple(version: Any, parts: int = 3) -> tuple[int, ...]:
    """The leading numbers of a version string, e.g. ``"4.46.0rc1"`` -> ``(4, 46, 0)``.

    Args:
        version: A version string (or a module: its ``__version__`` is read).
        parts: How many numbers to keep. Defaults to 3.

    Returns:
        A tuple of ``parts`` ints; a missing or non-numeric piece counts as 0.
    """
    if isinstance(version, ModuleType):
        version = getattr(version, "__version__", "0")
    numbers = []
    for piece in str(version).split(".")[:parts]:
        match = re.match(r"\d+", piece)
        numbers.append(int(match.group()) if match else 0)
    return tuple(numbers + [0] * (parts - len(numbers)))


def transformers_version() -> Optional[tuple[int, ...]]:
    """Return the installed transformers version as a tuple of ints, or None."""
    if _TRANSFORMERS_CALLBACKS is None:
        return None
    import transformers

    return version_tuple(transformers.__version__)


def trainer_saves_callback_states_per_checkpoint(args: Any) -> bool:
    """Whether the trainer owning ``args`` writes callback states into every checkpoint.

    transformers < 4.45 computes ``state.stateful_callbacks`` once at train begin, so every
    ``checkpoint-N/trainer_state.json`` holds the callbacks' states of the start of the run.
    Our own loop and transformers >= 4.45 save the current states at each checkpoint.
    """
    transformers_module = sys.modules.get("transformers")
    if transformers_module is None or not isinstance(args, transformers_module.TrainingArguments):
        return True  # our LoopArguments (or no transformers at all)
    version = transformers_version()
    return version is None or version >= (4, 45)


# Our base classes derive from transformers' own when it is importable, so a stock
# ``transformers.Trainer`` treats our callbacks exactly like its own (its
# ``isinstance(cb, ExportableState)`` check decides what goes into checkpoints).
# Our ``CallbackHandler`` derives from transformers' ``CallbackHandler`` likewise, so code that
# checks ``isinstance(trainer.callback_handler, transformers.trainer_callback.CallbackHandler)``
# accepts it.
ExportableStateBase: Any
TrainerCallbackBase: Any
CallbackHandlerBase: Any
if _TRANSFORMERS_CALLBACKS is not None:
    ExportableStateBase = _TRANSFORMERS_CALLBACKS.ExportableState
    TrainerCallbackBase = _TRANSFORMERS_CALLBACKS.TrainerCallback
    CallbackHandlerBase = _TRANSFORMERS_CALLBACKS.CallbackHandler
else:
    ExportableStateBase = object
    TrainerCallbackBase = object
    CallbackHandlerBase = object
