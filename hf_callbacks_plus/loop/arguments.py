"""LoopArguments: the ``TrainingArguments`` fields that drive the training flow.

Names, defaults and validation follow ``transformers.TrainingArguments`` 5.x, so a
callback reading ``args.eval_strategy``, ``args.logging_steps`` or
``args.metric_for_best_model`` behaves the same in both trainers. Errors name the
argument, the value received and the valid choices.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import numbers
import os
from dataclasses import dataclass
from typing import Any, Optional, Union

__all__ = ["INTERVAL_STRATEGIES", "SAVE_STRATEGIES", "LoopArguments", "strategy_value"]

logger = logging.getLogger("hf_callbacks_plus")

#: Valid values of ``logging_strategy`` and ``eval_strategy``.
INTERVAL_STRATEGIES = ("no", "steps", "epoch")
#: Valid values of ``save_strategy``.
SAVE_STRATEGIES = ("no", "steps", "epoch", "best")
#: Boolean fields: exactly True or False (a string such as ``"False"`` would read as true).
_FLAGS = (
    "logging_first_step",
    "logging_nan_inf_filter",
    "eval_on_start",
    "load_best_model_at_end",
    "ignore_data_skip",
    "restore_callback_states_from_checkpoint",
)
#: Integer fields that must be >= 1.
_POSITIVE_INTEGERS = (
    "gradient_accumulation_steps",
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
)
#: Valid values of ``include_num_input_tokens_seen`` (booleans are accepted too).
TOKEN_COUNT_MODES = ("no", "all", "non_padding")


def strategy_value(strategy: Any) -> Any:
    """Return the plain string of a strategy given as a string or an enum member.

    Works with transformers' ``IntervalStrategy``/``SaveStrategy`` (compared by ``.value``).
    """
    return getattr(strategy, "value", strategy)


def _check_integer(name: str, value: Any, minimum: Optional[int] = None, *, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        bound = f" >= {minimum}" if minimum is not None else ""
        choices = f"None or an int{bound}" if allow_none else f"an int{bound}"
        raise TypeError(f"LoopArguments: {name}={value!r} must be {choices}, got {type(value).__name__}.")
    if minimum is not None and value < minimum:
        raise ValueError(f"LoopArguments: {name}={value!r} must be >= {minimum}.")
    return int(value)


def _check_real(name: str, value: Any) -> float:
    """A finite number >= 0 (``nan``/``inf``, negative values, strings and bools are refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"LoopArguments: {name}={value!r} must be a number >= 0, got {type(value).__name__}.")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"LoopArguments: {name}={value!r} must be a finite number >= 0.")
    return value


def _check_flag(name: str, value: Any, *, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        choices = "True, False or None" if allow_none else "True or False"
        raise TypeError(f"LoopArguments: {name}={value!r} must be {choices}, got {type(value).__name__}.")
    return value


def _check_text(name: str, value: Any, *, path: bool = False) -> Any:
    """None, or a non-empty string (or ``os.PathLike`` when ``path``)."""
    if value is None:
        return None
    if path and isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        kind = "a string or a path" if path else "a string"
        raise TypeError(
            f"LoopArguments: {name}={value!r} must be None or {kind}, got {type(value).__name__}."
        )
    if not value.strip():
        raise ValueError(f"LoopArguments: {name}={value!r} is empty; pass a name or None.")
    return value


def _check_strategy(name: str, value: Any, choices: tuple[str, ...]) -> str:
    plain = strategy_value(value)
    if not isinstance(plain, str) or plain not in choices:
        raise ValueError(f"LoopArguments: {name}={value!r} is not valid; choose one of {list(choices)}.")
    return plain


def _check_steps(name: str, value: Any, *, allow_none: bool = False) -> Any:
    """Validate an interval: an int >= 1, or a float fraction in (0, 1) of ``max_steps``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"LoopArguments: {name}={value!r} must be an int >= 1 or a float in (0, 1) "
            "(a fraction of the total number of optimizer steps)."
        )
    if not math.isfinite(value):
        raise ValueError(
            f"LoopArguments: {name}={value!r} is not a finite number; pass an int >= 1 or a fraction "
            "in (0, 1)."
        )
    if value < 0:
        raise ValueError(
            f"LoopArguments: {name}={value!r} must not be negative; pass an int >= 1 or a fraction in (0, 1)."
        )
    if value > 1:
        if value != int(value):
            raise ValueError(f"LoopArguments: {name}={value!r} must be an integer if bigger than 1.")
        return int(value)
    return value


@dataclass
class LoopArguments:
    """Arguments of `LightweightTrainer`.

    A subset of ``transformers.TrainingArguments`` with the same names, defaults and rules;
    strategies are plain strings (transformers' enum members are accepted and converted).

    Args:
        output_dir: Where ``checkpoint-N`` folders go. Defaults to ``"trainer_output"``.
        num_train_epochs: Epochs to train (may be fractional). Defaults to 3.0.
        max_steps: Optimizer steps to train; overrides ``num_train_epochs`` when > 0. Defaults to -1.
        gradient_accumulation_steps: Batches per optimizer step. Defaults to 1.
        per_device_train_batch_size: Informational (samples/s metrics). Defaults to 8.
        per_device_eval_batch_size: Informational (samples/s metrics). Defaults to 8.
        batch_eval_metrics: Call ``metrics_fn`` once per evaluation batch, with that batch's
            outputs and ``compute_result`` (True on the last batch, whose result is used), and
            keep no outputs, as transformers does. Defaults to False.
        learning_rate: Informational; logged values come from ``learning_rate_fn``. Defaults to 5e-5.
        logging_strategy: ``"no"``, ``"steps"`` or ``"epoch"``. Defaults to ``"steps"``.
        logging_steps: Steps between logs, or a fraction (< 1) of ``max_steps``. Defaults to 500.
        logging_first_step: Also log after the first step. Defaults to False.
        logging_nan_inf_filter: Replace NaN/Inf losses by the running mean in logs. Defaults to True.
        eval_strategy: ``"no"``, ``"steps"`` or ``"epoch"``. Defaults to ``"no"``.
        eval_steps: Steps between evaluations; defaults to ``logging_steps`` when None.
        eval_delay: Epochs or steps (per ``eval_strategy``) before the first evaluation. Defaults to 0.
        eval_on_start: Evaluate once before training. Defaults to False.
        save_strategy: ``"no"``, ``"steps"``, ``"epoch"`` or ``"best"``. Defaults to ``"steps"``.
        save_steps: Steps between checkpoints, or a fraction (< 1) of ``max_steps``. Defaults to 500.
        save_total_limit: Checkpoints to keep (the best one is always kept). Defaults to None (all).
        metric_for_best_model: Metric deciding the best checkpoint (``eval_`` is prepended when
            missing). Defaults to ``"loss"`` when ``load_best_model_at_end``, else None.
        greater_is_better: Direction of ``metric_for_best_model``. Defaults to False for names
            ending in ``loss``, True otherwise.
        load_best_model_at_end: Load the best checkpoint when training ends. Defaults to False.
        seed: Seed for Python's ``random`` at trainer creation. Defaults to 42.
        disable_tqdm: Use ``PrinterCallback`` instead of the tqdm ``ProgressCallback``. Defaults
            to None: True when tqdm is missing or logging is quieter than WARNING.
        ignore_data_skip: On resume, do not skip the batches already seen. Defaults to False.
        restore_callback_states_from_checkpoint: Rebuild stateful callbacks from the checkpoint
            like transformers does. Defaults to False.
        include_num_input_tokens_seen: ``"no"``, ``"all"``, ``"non_padding"`` or a bool.
            Defaults to ``"no"``.
        resume_from_checkpoint: Informational, like in transformers (pass it to ``train()``).
            Defaults to None.
        report_to: Must be ``"none"``/``[]``: pass logger callbacks explicitly. Defaults to ``"none"``.
        run_name: A name for loggers. Defaults to None.

    Raises:
        ValueError: An invalid strategy, interval or combination (messages name the argument,
            the value and the valid choices).
        TypeError: A value of the wrong type.

    Example:
        >>> args = LoopArguments(output_dir="runs/x", max_steps=100, eval_strategy="steps",
        ...                      eval_steps=10, save_strategy="steps", save_steps=20,
        ...                      load_best_model_at_end=True)
        >>> args.metric_for_best_model, args.greater_is_better
        ('loss', False)
    """

    output_dir: Optional[str] = "trainer_output"
    num_train_epochs: float = 3.0
    max_steps: int = -1
    gradient_accumulation_steps: int = 1
    per_device_train_batch_size: int = 8
    per_device_eval_batch_size: int = 8
    batch_eval_metrics: bool = False
    learning_rate: float = 5e-5
    logging_strategy: Any = "steps"
    logging_steps: float = 500
    logging_first_step: bool = False
    logging_nan_inf_filter: bool = True
    eval_strategy: Any = "no"
    eval_steps: Optional[float] = None
    eval_delay: float = 0
    eval_on_start: bool = False
    save_strategy: Any = "steps"
    save_steps: float = 500
    save_total_limit: Optional[int] = None
    metric_for_best_model: Optional[str] = None
    greater_is_better: Optional[bool] = None
    load_best_model_at_end: bool = False
    seed: int = 42
    disable_tqdm: Optional[bool] = None
    ignore_data_skip: bool = False
    restore_callback_states_from_checkpoint: bool = False
    include_num_input_tokens_seen: Union[str, bool] = "no"
    resume_from_checkpoint: Optional[str] = None
    report_to: Any = "none"
    run_name: Optional[str] = None

    def __post_init__(self) -> None:
        if self.output_dir is None:
            self.output_dir = "trainer_output"
        self.output_dir = os.path.expanduser(_check_text("output_dir", self.output_dir, path=True))
        self._check_numbers()
        self._check_flags_and_names()
        if self.disable_tqdm is None:
            from .._compat import is_available

            self.disable_tqdm = (
                not is_available("tqdm")
                or logging.getLogger("hf_callbacks_plus").getEffectiveLevel() > logging.WARN
            )
        tokens = self.include_num_input_tokens_seen
        if isinstance(tokens, bool):
            self.include_num_input_tokens_seen = "all" if tokens else "no"
        elif tokens not in TOKEN_COUNT_MODES:
            raise ValueError(
                f"LoopArguments: include_num_input_tokens_seen={tokens!r} is not valid; "
                f"choose one of {list(TOKEN_COUNT_MODES)} or a bool."
            )

        self.logging_strategy = _check_strategy(
            "logging_strategy", self.logging_strategy, INTERVAL_STRATEGIES
        )
        self.eval_strategy = _check_strategy("eval_strategy", self.eval_strategy, INTERVAL_STRATEGIES)
        self.save_strategy = _check_strategy("save_strategy", self.save_strategy, SAVE_STRATEGIES)

        self.logging_steps = _check_steps("logging_steps", self.logging_steps)
        self.save_steps = _check_steps("save_steps", self.save_steps)
        self.eval_steps = _check_steps("eval_steps", self.eval_steps, allow_none=True)
        if self.eval_strategy == "steps" and not self.eval_steps:
            if self.logging_steps > 0:
                self.eval_steps = self.logging_steps
            else:
                raise ValueError(
                    f"LoopArguments: eval_strategy='steps' needs a non-zero eval_steps or logging_steps; "
                    f"got eval_steps={self.eval_steps!r}, logging_steps={self.logging_steps!r}."
                )
        if self.logging_strategy == "steps" and self.logging_steps == 0:
            raise ValueError("LoopArguments: logging_strategy='steps' needs a non-zero logging_steps; got 0.")

        if self.load_best_model_at_end and self.metric_for_best_model is None:
            self.metric_for_best_model = "loss"
        if self.greater_is_better is None and self.metric_for_best_model is not None:
            self.greater_is_better = not self.metric_for_best_model.endswith("loss")
        if self.save_strategy == "best" and self.metric_for_best_model is None:
            raise ValueError(
                "LoopArguments: save_strategy='best' needs metric_for_best_model (e.g. 'loss', 'accuracy'); "
                "got None."
            )
        if self.load_best_model_at_end:
            self._check_best_model_args()
        self.report_to = self._check_report_to(self.report_to)

    def _check_numbers(self) -> None:
        self.max_steps = _check_integer("max_steps", self.max_steps)
        self.seed = _check_integer("seed", self.seed)
        for name in _POSITIVE_INTEGERS:
            setattr(self, name, _check_integer(name, getattr(self, name), minimum=1))
        for name in ("num_train_epochs", "learning_rate", "eval_delay"):
            setattr(self, name, _check_real(name, getattr(self, name)))
        self.save_total_limit = _check_integer("save_total_limit", self.save_total_limit, allow_none=True)

    def _check_flags_and_names(self) -> None:
        for name in _FLAGS:
            _check_flag(name, getattr(self, name))
        for name in ("greater_is_better", "disable_tqdm"):
            _check_flag(name, getattr(self, name), allow_none=True)
        if self.metric_for_best_model is not None and not isinstance(self.metric_for_best_model, str):
            raise TypeError(
                f"LoopArguments: metric_for_best_model={self.metric_for_best_model!r} must be the name of an "
                "evaluation metric as a string (e.g. 'loss', 'accuracy', 'eval_f1') or None, got "
                f"{type(self.metric_for_best_model).__name__}."
            )
        self.metric_for_best_model = _check_text("metric_for_best_model", self.metric_for_best_model)
        self.run_name = _check_text("run_name", self.run_name)
        if isinstance(self.resume_from_checkpoint, bool):
            raise TypeError(
                f"LoopArguments: resume_from_checkpoint={self.resume_from_checkpoint!r} must be None or a "
                "checkpoint path; the field is informational (as in TrainingArguments). To resume, call "
                "trainer.train(resume_from_checkpoint=True)."
            )
        self.resume_from_checkpoint = _check_text("resume_from_checkpoint", self.resume_from_checkpoint,
                                                  path=True)

    def _check_best_model_args(self) -> None:
        if self.save_strategy == "best":
            return
        if self.eval_strategy != self.save_strategy:
            raise ValueError(
                "LoopArguments: load_best_model_at_end=True needs eval_strategy == save_strategy (or "
                f"save_strategy='best'); got eval_strategy={self.eval_strategy!r}, "
                f"save_strategy={self.save_strategy!r}."
            )
        if self.eval_strategy != "steps" or self.save_steps % self.eval_steps == 0:
            return
        if self.eval_steps < 1 or self.save_steps < 1:
            if not (self.eval_steps < 1 and self.save_steps < 1):
                raise ValueError(
                    "LoopArguments: load_best_model_at_end=True needs save_steps to be a multiple of "
                    "eval_steps, which cannot be guaranteed when mixing a fraction and an absolute count: "
                    f"save_steps={self.save_steps!r}, eval_steps={self.eval_steps!r}."
                )
            large = 1_000_000
            if (self.save_steps * large) % (self.eval_steps * large) == 0:
                return
        raise ValueError(
            "LoopArguments: load_best_model_at_end=True needs save_steps to be a round multiple of "
            f"eval_steps; got save_steps={self.save_steps!r}, eval_steps={self.eval_steps!r}."
        )

    @staticmethod
    def _check_report_to(report_to: Any) -> list[str]:
        if report_to is None or report_to in ("none", ["none"], [], ()):
            return []
        raise ValueError(
            f"LoopArguments: report_to={report_to!r} is not supported by the lightweight loop; use "
            "report_to='none' and pass logger callbacks (e.g. JsonlLogger, WandbLogger) in callbacks=[...]."
        )

    # -- the read-only properties callbacks use on TrainingArguments --------------------
    @property
    def train_batch_size(self) -> int:
        """Batch size per step on one process (no data parallelism here)."""
        return self.per_device_train_batch_size

    @property
    def eval_batch_size(self) -> int:
        """Evaluation batch size on one process."""
        return self.per_device_eval_batch_size

    @property
    def world_size(self) -> int:
        """Always 1: the lightweight loop runs in one process."""
        return 1

    @property
    def process_index(self) -> int:
        """Always 0."""
        return 0

    @property
    def local_process_index(self) -> int:
        """Always 0."""
        return 0

    @property
    def should_log(self) -> bool:
        """Always True (single process)."""
        return True

    @property
    def should_save(self) -> bool:
        """Always True (single process)."""
        return True

    # -- conversions -------------------------------------------------------------------
    @classmethod
    def from_training_arguments(cls, training_args: Any, **overrides: Any) -> LoopArguments:
        """Build LoopArguments from a ``transformers.TrainingArguments`` (same-named fields).

        Args:
            training_args: A ``TrainingArguments`` (or any object with the same attributes).
            **overrides: Fields to set differently.

        Returns:
            The equivalent LoopArguments.
        """
        values: dict[str, Any] = {}
        for spec in dataclasses.fields(cls):
            if hasattr(training_args, spec.name):
                values[spec.name] = strategy_value(getattr(training_args, spec.name))
        values["report_to"] = "none"
        values.update(overrides)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """All fields as a plain dict (strategies as strings)."""
        return {spec.name: getattr(self, spec.name) for spec in dataclasses.fields(self)}

    def to_sanitized_dict(self) -> dict[str, Any]:
        """Fields as JSON-friendly scalars (None and containers as strings), like transformers."""
        out: dict[str, Any] = {}
        for key, value in self.to_dict().items():
            out[key] = value if isinstance(value, (bool, int, float, str)) else str(value)
        return out

    def to_json_string(self) -> str:
        """Fields as an indented JSON string."""
        return json.dumps(self.to_dict(), indent=2, default=str)
