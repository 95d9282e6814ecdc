"""Options of ``WandbLogger``: choices, transformers' environment variables, value types.

``WANDB_LOG_MODEL``, ``WANDB_WATCH``, ``WANDB_DISABLED`` and ``WANDB_MODE`` are read here,
with the same meaning as in transformers' ``WandbCallback``.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Sequence

from .secrets import command_line_has_secret

__all__ = [
    "LOG_MODEL_CHOICES", "MAX_TAG_LENGTH", "MODE_CHOICES", "RESUME_CHOICES", "STEP_KEY", "WATCH_CHOICES",
    "choice", "settings_hiding_secret_args", "typed", "version_of", "wandb_disabled_reason",
]

#: Values of ``log_model`` / ``WANDB_LOG_MODEL`` ("true" is transformers' legacy spelling of "end").
LOG_MODEL_CHOICES = ("false", "end", "checkpoint")
#: Values of ``watch`` / ``WANDB_WATCH``.
WATCH_CHOICES = ("false", "gradients", "parameters", "all")
RESUME_CHOICES = ("allow", "must")
MODE_CHOICES = ("online", "offline", "disabled", "shared")
_TRUE = {"1", "true", "yes", "on"}
STEP_KEY = "train/global_step"
MAX_TAG_LENGTH = 64


def wandb_disabled_reason(mode: Optional[str] = None) -> Optional[str]:
    """Why W&B logging is switched off, or None when it is on.

    Args:
        mode: The ``mode`` argument given to the logger. Defaults to None (environment only).

    Returns:
        A sentence naming the setting that disables W&B, or None.
    """
    if os.environ.get("WANDB_DISABLED", "").strip().lower() in _TRUE:
        return f"WANDB_DISABLED={os.environ['WANDB_DISABLED']!r} is set"
    if mode == "disabled":
        return "mode='disabled' was given"
    if mode is None and os.environ.get("WANDB_MODE", "").strip().lower() == "disabled":
        return "WANDB_MODE='disabled' is set"
    return None


def choice(name: str, value: Any, env: str, default: str, choices: Sequence[str]) -> str:
    """Validate ``value`` (else the environment variable ``env``, else ``default``) against ``choices``.

    Raises:
        ValueError: Not one of ``choices``; the message names the argument or variable.
    """
    raw = value if value is not None else os.environ.get(env, default)
    if isinstance(raw, bool):
        raw = "end" if (raw and name == "log_model") else ("all" if raw else "false")
    text = str(raw).strip().lower()
    if name == "log_model" and text in ("true", "1"):
        text = "end"
    if text in ("", "0", "none", "no"):
        text = "false"
    if text not in choices:
        source = f"{name}={value!r}" if value is not None else f"{env}={raw!r}"
        raise ValueError(f"WandbLogger: {source} is not valid; choose one of {choices}.")
    return text


def typed(value: str) -> Any:
    """Config values arrive as strings; give numbers and booleans back their type."""
    if value in ("True", "False"):
        return value == "True"
    if value == "None":
        return None
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            continue
    return value


def version_of(module: Any) -> tuple[int, ...]:
    """``(major, minor)`` of a module's ``__version__``."""
    parts = []
    for piece in str(getattr(module, "__version__", "0")).split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def settings_hiding_secret_args(settings: Any, wandb: Any, argv: list[str], warn: Callable[..., None]) -> Any:
    """``settings`` plus ``x_disable_meta=True`` when ``argv`` passes a secret.

    W&B writes the command line (``sys.argv``) into the run metadata, which lands in the run
    files; ``x_disable_meta`` is the wandb setting that stops collecting it (with the rest of the
    system metadata). A value you set for ``x_disable_meta`` yourself is kept.

    Args:
        settings: The user's ``wandb.Settings``, a dict of settings, or None.
        wandb: The ``wandb`` module.
        argv: The command-line arguments (``sys.argv[1:]``).
        warn: A `WarnOnce`.

    Returns:
        The settings to give ``wandb.init`` (None when there is nothing to set).
    """
    if not command_line_has_secret(argv):
        return settings
    if isinstance(settings, dict):
        if "x_disable_meta" in settings:
            return settings
        settings = {**settings, "x_disable_meta": True}
    elif settings is None:
        settings = wandb.Settings(x_disable_meta=True)
    elif "x_disable_meta" in getattr(settings, "model_fields_set", ()):
        return settings
    else:
        settings = settings.model_copy(update={"x_disable_meta": True})
    warn(("argv-secret",), "WandbLogger: the command line passes a secret (a token, password or api key); "
         "W&B's system metadata, which records the command line, is not collected for this run "
         "(x_disable_meta=True). Pass secrets through environment variables to keep the metadata.")
    return settings
