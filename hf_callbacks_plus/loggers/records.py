"""What a tracker logger queues, as value objects, and the pure rules that make them.

No threads and no backend here:

* the records: `RawLog` (the ``logs`` dict copied on the training thread by ``on_log``) and
  the records the worker sends and spills, `LogRecord`, `ParamsRecord`, `TagsRecord`,
  `ArtifactRecord` and `FinishRecord` (told apart by type; `record_from_json` reads a spilled
  one back);
* `RecordRenderer`: turns a `RawLog` into a `LogRecord` on the worker thread (keys rendered
  by the key grammar, values normalized, secret strings redacted);
* value policy (documented in ``docs/loggers.md``): ``bool`` -> 1.0/0.0; ints, floats, numpy
  scalars and one-element tensors -> ``float``; a string goes to the run summary (MLflow: a
  tag); anything else is dropped with one warning per key; NaN and +/-Inf are kept
  (``nonfinite="keep"``, a diverging loss is information) or dropped with one warning per key
  (``nonfinite="drop"``);
* `NameSanitizer` (backend names, collisions) and the run config (`collect_config`:
  ``TrainingArguments`` and the model config, flattened and redacted).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from ..metrics.keys import KeyGrammar, flatten_metrics
from ..metrics.numbers import to_float
from .secrets import REDACTED, is_vocabulary_token, looks_like_secret, mask_secrets, redact_config

__all__ = [
    "KEY_NAMES",
    "NONFINITE_POLICIES",
    "ArtifactRecord",
    "FinishRecord",
    "LogRecord",
    "NameSanitizer",
    "ParamsRecord",
    "RawLog",
    "Record",
    "RecordRenderer",
    "TagsRecord",
    "WarnOnce",
    "collect_config",
    "flatten_config",
    "normalize_value",
    "record_from_json",
    "record_to_json",
    "truncate",
]

logger = logging.getLogger("hf_callbacks_plus")

#: Accepted values of the ``nonfinite`` argument of the loggers.
NONFINITE_POLICIES = ("keep", "drop")
#: Accepted values of the ``key_names`` argument of the loggers: our sections, or the names the
#: stock transformers callback of the backend writes.
KEY_NAMES = ("sections", "stock")


def stock_names(logs: Mapping[str, Any], style: str,
                summary_keys: frozenset = frozenset()) -> tuple[dict[str, Any], dict[str, Any]]:
    """Name ``logs`` as the stock transformers callback does: ``(curves, summary)``.

    Args:
        logs: One ``on_log`` record.
        style: ``"raw"`` (keys unchanged, MLflowCallback) or ``"rewrite_logs"`` (``eval_`` ->
            ``eval/``, ``test_`` -> ``test/``, else ``train/``: WandbCallback, TensorBoardCallback).
        summary_keys: Keys that go to the summary under their raw name (W&B's run totals).

    Example:
        >>> stock_names({"eval_loss": 1.0, "loss": 2.0}, "rewrite_logs")
        ({'eval/loss': 1.0, 'train/loss': 2.0}, {})
    """
    curves: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    for key, value in flatten_metrics(logs).items():
        if key in summary_keys:
            summary[key] = value
            continue
        name = key
        if style == "rewrite_logs":
            if key.startswith("eval_"):
                name = "eval/" + key[len("eval_"):]
            elif key.startswith("test_"):
                name = "test/" + key[len("test_"):]
            else:
                name = "train/" + key
        (summary if isinstance(value, str) else curves)[name] = value
    return curves, summary


# -- records -----------------------------------------------------------------------------
def _record(cls: type) -> type:
    """Make ``cls`` a record dataclass: its own fields, then the two routing fields every record has.

    * ``session``: the logging session (one ``train()``) that produced it; None: the current one;
    * ``run_id``: the run it belongs to (set when it is spilled); None: the open run;
    * ``run_key``: the client-made key of that run (set when it is spilled), which finds the run
      when its id was never known (the store had not answered yet).

    (Appended here rather than inherited: a base dataclass's defaulted fields would have to come
    before the records' required ones, and ``kw_only`` needs Python 3.10.)
    """
    cls.__annotations__ = {**cls.__dict__.get("__annotations__", {}),
                           "session": "Optional[str]", "run_id": "Optional[str]", "run_key": "Optional[str]"}
    cls.session = None
    cls.run_id = None
    cls.run_key = None
    return dataclass(cls)


@dataclass
class RawLog:
    """``on_log`` data, copied on the training thread; the worker renders it into a `LogRecord`."""

    logs: dict[str, Any]
    step: int
    timestamp_ms: int


@_record
class LogRecord:
    """Curve values at one step (``metrics``) and run-summary values (``summary``)."""

    step: int
    timestamp: int  # milliseconds since the epoch
    metrics: dict[str, float]
    summary: dict[str, Any]
    #: Delivered (a batch retried after a partial failure does not send it again).
    sent: bool = False
    kind = "log"


@_record
class ParamsRecord:
    """The run config, flat ``{name: str}``, sent once per run."""

    params: dict[str, str]
    kind = "params"


@_record
class TagsRecord:
    """Run tags."""

    tags: dict[str, str]
    kind = "tags"


@_record
class ArtifactRecord:
    """A folder to upload as an artifact: a model (W&B ``log_model``) or another ``artifact_type``
    (``"predictions"``: `StreamingMetrics`' files)."""

    path: str
    aliases: list[str]
    cleanup: bool = False
    artifact_type: str = "model"
    kind = "artifact"


@_record
class FinishRecord:
    """The run's final status, kept in the spill file when it could not be set (replay sets it)."""

    status: str
    kind = "finish"


Record = Union[LogRecord, ParamsRecord, TagsRecord, ArtifactRecord, FinishRecord]
_KINDS: dict[str, Any] = {cls.kind: cls for cls in (LogRecord, ParamsRecord, TagsRecord, ArtifactRecord,
                                                    FinishRecord)}


def record_to_json(record: Record) -> dict[str, Any]:
    """The JSON form of a record (a spill-file line): its fields plus ``"kind"``.

    Shallow (no deep copy of the metrics dict, unlike ``dataclasses.asdict``): it is serialized
    right away.
    """
    data = {item.name: getattr(record, item.name) for item in dataclasses.fields(record)
            if item.name != "sent"}
    data["kind"] = record.kind
    return data


def record_from_json(data: Mapping[str, Any]) -> Optional[Record]:
    """Read a record back from its JSON form; None for an unknown kind.

    Spill files written before records were typed hold ``"wandb_artifact"`` for artifacts.
    """
    kind = "artifact" if data.get("kind") == "wandb_artifact" else data.get("kind")
    cls = _KINDS.get(str(kind))
    if cls is None:
        return None
    names = {item.name for item in dataclasses.fields(cls)} - {"sent"}
    return cls(**{name: data[name] for name in names if name in data})


# -- values ------------------------------------------------------------------------------
def normalize_value(value: Any) -> tuple[str, Any]:
    """Classify and convert one logged value.

    Args:
        value: Anything a ``logs`` dict may hold.

    Returns:
        ``("number", float)``, ``("text", str)`` or ``("drop", original)``.

    Example:
        >>> normalize_value(True)
        ('number', 1.0)
        >>> normalize_value("early")
        ('text', 'early')
    """
    if type(value) is float:  # the common case first: a record can hold hundreds of them
        return "number", value
    if isinstance(value, str):
        return "text", value
    try:
        number = to_float(value, accept_bool=True)
    except OverflowError:  # an int beyond float's range (10**400)
        return "drop", value
    return ("drop", value) if number is None else ("number", number)


def truncate(text: str, limit: Optional[int]) -> str:
    """Cut ``text`` to ``limit`` characters, marking the cut with ``...``."""
    if limit is None or len(text) <= limit:
        return text
    return text[: max(0, limit - 3)] + "..."


class WarnOnce:
    """Emit a warning once per key."""

    def __init__(self) -> None:
        self._seen: set[Any] = set()

    def __call__(self, key: Any, message: str, *args: Any) -> None:
        """Log ``message % args`` as a warning the first time ``key`` is seen."""
        if key in self._seen:
            return
        self._seen.add(key)
        logger.warning(message, *args)


class RecordRenderer:
    """Turns ``on_log`` data into a `LogRecord` (worker thread).

    Args:
        grammar: Renders the keys (and learns prefixes from the logs).
        nonfinite: ``"keep"`` or ``"drop"`` NaN/Inf values (one warning per key).
        warn: Warns once per key about dropped values.
        owner: The logger's class name, shown in warnings.
    """

    def __init__(self, grammar: KeyGrammar, nonfinite: str, warn: WarnOnce, owner: str,
                 key_names: str = "sections", stock_style: str = "raw",
                 stock_summary_keys: frozenset = frozenset()) -> None:
        self.grammar = grammar
        self.nonfinite = nonfinite
        self.warn = warn
        self.owner = owner
        self._learned_keys: tuple[Any, ...] = ()
        #: ``"sections"`` (the key grammar) or ``"stock"`` (`stock_names` with ``stock_style``).
        self.key_names = key_names
        self.stock_style = stock_style
        self.stock_summary_keys = stock_summary_keys

    def render(self, raw: RawLog) -> Optional[LogRecord]:
        """Render and normalize one ``on_log`` dict; None when nothing is left to log."""
        logs = raw.logs
        keys = tuple(logs)
        if keys != self._learned_keys:  # learning is idempotent: once per key set in a row
            self.grammar.learn_from_metrics(logs)
            self._learned_keys = keys
        if self.key_names == "stock":
            curves, summary = stock_names(logs, self.stock_style, self.stock_summary_keys)
        else:
            curves, summary = self.grammar.render_logs(logs)
        metrics: dict[str, float] = {}
        texts: dict[str, Any] = {}
        for target, values in ((metrics, curves), (texts, summary)):
            for name, value in values.items():
                kind, number = normalize_value(value)
                if kind == "number":
                    if self.nonfinite == "drop" and (math.isnan(number) or math.isinf(number)):
                        self.warn(("nonfinite", name), "%s: dropping non-finite value %r of %r "
                                  "(nonfinite='drop').", self.owner, number, name)
                        continue
                    target[name] = number
                elif kind == "text":
                    texts[name] = REDACTED if looks_like_secret(name, number) else mask_secrets(number)
                elif isinstance(value, int):
                    self.warn(("drop", name), "%s: %r = %s... is too large for a float; this value is not "
                              "logged (the other metrics are).", self.owner, name, str(value)[:20])
                else:
                    self.warn(("drop", name), "%s: %r has a value of type %s that is neither a number nor "
                              "a string; it is not logged.", self.owner, name, type(value).__name__)
        if not metrics and not texts:
            return None
        timestamp = raw.timestamp_ms if raw.timestamp_ms is not None else int(time.time() * 1000)
        return LogRecord(int(raw.step), timestamp, metrics, texts)


# -- names -------------------------------------------------------------------------------
class NameSanitizer:
    """Maps rendered metric names to names a backend accepts, detecting collisions.

    Args:
        clean: Function turning one name into an accepted one (e.g. replacing forbidden
            characters with ``_``).
        max_length: Longest accepted name, or None. Defaults to None.

    Two different names that clean to the same string keep distinct names: the later one
    gets a ``_2``, ``_3``... suffix (cutting the name so that it stays within ``max_length``),
    with one warning per name.
    """

    def __init__(self, clean: Callable[[str], str], max_length: Optional[int] = None) -> None:
        self._clean = clean
        self._max_length = max_length
        self._mapping: dict[str, str] = {}
        self._owner: dict[str, str] = {}

    def __call__(self, name: str) -> str:
        """Return the backend name of ``name`` (stable for the life of the logger)."""
        known = self._mapping.get(name)
        if known is not None:
            return known
        cleaned = self._clean(name)
        if self._max_length is not None:
            cleaned = cleaned[: self._max_length]
        candidate = cleaned
        counter = 2
        while candidate in self._owner and self._owner[candidate] != name:
            suffix = f"_{counter}"  # the suffixed name respects the limit too
            base = cleaned if self._max_length is None else cleaned[: self._max_length - len(suffix)]
            candidate = f"{base}{suffix}"
            counter += 1
        if candidate != name:
            if candidate != cleaned:
                logger.warning(
                    "Metric names %r and %r both become %r for this backend; logging %r as %r.",
                    self._owner[cleaned], name, cleaned, name, candidate,
                )
            else:
                logger.debug("Metric name %r sanitized to %r.", name, candidate)
        self._mapping[name] = candidate
        self._owner[candidate] = name
        return candidate


# -- run config --------------------------------------------------------------------------
def flatten_config(config: Mapping[str, Any], prefix: str = "", separator: str = ".") -> dict[str, Any]:
    """Flatten nested dicts (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``); other values are kept."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{separator}{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, name, separator))
        else:
            flat[name] = value
    return flat


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
        return {item.name: getattr(args, item.name, None) for item in dataclasses.fields(args)}
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


def model_facts(model: Any) -> dict[str, Any]:
    """What the stock ``WandbCallback`` adds to the config: ``model/num_parameters`` (the model's
    ``num_parameters()``, else the count of its parameters) and the peft adapters' configs
    (``peft_config.<adapter>.<field>``)."""
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
                facts.update(flatten_config(values, prefix=f"peft_config.{adapter}"))
    return facts


def collect_config(args: Any, model: Any = None) -> dict[str, str]:
    """Flatten ``args`` (bare keys), the model config (``model.<key>``), the parameter count and
    the peft config (`model_facts`), and redact secrets.

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
    config.update(model_facts(model))
    return redact_config(config)
