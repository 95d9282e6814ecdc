"""Collect the run config once: ``TrainingArguments`` and the model config, flat and redacted."""

from __future__ import annotations

import dataclasses
from typing import Any

from .secrets import is_vocabulary_token, redact_config
from .values import flatten_config

__all__ = ["args_to_dict", "collect_config", "model_config_to_dict"]


def args_to_dict(args: Any) -> dict[str, Any]:
    """``args.to_dict()``, the dataclass fields, or the public attributes of ``args``.

    ``TrainingArguments.to_dict()`` replaces every ``*_token`` field by a placeholder
    (``<HUB_TOKEN>``); unset fields (None) and fields holding vocabulary tokens (trl's
    ``pad_token``/``eos_token``) get their real value back, the others keep the placeholder
    (then redacted).
    """
    if args is None:
        return {}
    to_dict = getattr(args, "to_dict", None)
    if callable(to_dict):
        result = to_dict()
        if isinstance(result, dict):
            for key, value in result.items():
                real = getattr(args, key, None) if key.endswith("_token") else None
                if value == f"<{key.upper()}>" and (real is None or is_vocabulary_token(key, real)):
                    result[key] = real
            return result
    if dataclasses.is_dataclass(args) and not isinstance(args, type):
        return {field.name: getattr(args, field.name, None) for field in dataclasses.fields(args)}
    if isinstance(args, dict):
        return dict(args)
    return {key: value for key, value in vars(args).items() if not key.startswith("_")}


def model_config_to_dict(model: Any) -> dict[str, Any]:
    """The model's ``config.to_dict()`` (or a dict config), else {}."""
    config = getattr(model, "config", None)
    if config is None:
        return {}
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        result = to_dict()
        return result if isinstance(result, dict) else {}
    return dict(config) if isinstance(config, dict) else {}


def collect_config(args: Any, model: Any = None) -> dict[str, str]:
    """Flatten ``args`` (bare keys) and the model config (``model.<key>``) and redact secrets.

    Args:
        args: ``TrainingArguments``, ``LoopArguments``, a dataclass or a dict.
        model: A model with a ``config``, or None. Defaults to None.

    Returns:
        Flat ``{name: str(value)}`` where every secret value is ``"<redacted>"``.
    """
    config = flatten_config(args_to_dict(args))
    model_config = model_config_to_dict(model)
    if model_config:
        config.update(flatten_config(model_config, prefix="model"))
    return redact_config(config)
