"""The run config a logger logs once: ``TrainingArguments`` and the model config, flattened and redacted."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, Optional

from ..metrics.keys import flatten_metrics
from .secrets import is_vocabulary_token, redact_config

__all__ = ["collect_config", "truncate", "typed"]

logger = logging.getLogger("hf_callbacks_plus")


def truncate(text: str, limit: Optional[int]) -> str:
    """Cut ``text`` to ``limit`` characters, marking the cut with ``...``."""
    return text if limit is None or len(text) <= limit else text[: max(0, limit - 3)] + "..."


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


def _flat(config: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """``config`` flat (`flatten_metrics`: ``{"a": {"b": 1}}`` -> ``a.b``), its keys under ``prefix.``."""
    return {f"{prefix}.{key}": value for key, value in flatten_metrics(config).items()}


def args_to_dict(args: Any) -> dict[str, Any]:
    """``args.to_dict()`` (its ``<HUB_TOKEN>``-style placeholders undone for unset fields and vocabulary
    tokens), the dataclass fields, or the public attributes of ``args`` (a model config too)."""
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
        return {item.name: getattr(args, item.name, None) for item in dataclasses.fields(args)}
    if isinstance(args, dict):
        return dict(args)
    return {key: value for key, value in getattr(args, "__dict__", {}).items() if not key.startswith("_")}


def model_facts(model: Any) -> dict[str, Any]:
    """What the stock ``WandbCallback`` adds to the config: ``model/num_parameters`` and the peft
    adapters' configs (``peft_config.<adapter>.<field>``)."""
    facts: dict[str, Any] = {}
    if model is None:
        return facts
    try:
        count = getattr(model, "num_parameters", None)
        if callable(count):
            facts["model/num_parameters"] = int(count())
        elif callable(getattr(model, "parameters", None)):
            facts["model/num_parameters"] = sum(int(p.numel()) for p in model.parameters())
    except Exception as error:  # a model that cannot count must not stop the config
        logger.debug("model/num_parameters not logged: %s", error)
    peft = getattr(model, "peft_config", None)
    if isinstance(peft, Mapping):
        for adapter, adapter_config in peft.items():
            to_dict = getattr(adapter_config, "to_dict", None)
            values = to_dict() if callable(to_dict) else getattr(adapter_config, "__dict__", {})
            if isinstance(values, Mapping):
                facts.update(_flat(values, f"peft_config.{adapter}"))
    return facts


def collect_config(args: Any, model: Any = None) -> dict[str, str]:
    """``args`` (``TrainingArguments``, ``LoopArguments``, a dataclass or a dict: bare keys), the model
    config (``model.<key>``), its parameter count and peft config, flat, as redacted strings."""
    model_config = args_to_dict(getattr(model, "config", None))
    config = {**flatten_metrics(args_to_dict(args)), **_flat(model_config, "model"), **model_facts(model)}
    return redact_config(config)
