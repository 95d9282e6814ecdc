"""`ConsoleSummary`: one line per evaluation (and per training log) instead of the record's dict.

transformers prints each log record as a dict (``PrinterCallback``, or ``ProgressCallback``
under the progress bar): with train-subset metrics, gaps, streaming metrics, early-stopping and
throughput keys, an evaluation is one dict of some forty keys in which train-subset and eval
values are never side by side. `ConsoleSummary` prints the story instead::

    step 80/600 (epoch 4.27) | eval_loss 0.5391 (subset 0.4102, gap -0.1289) best 0.5391 @ 80 new | ...

and, with ``quiet_printer=True``, the trainer's own printer skips the records it printed. The
full record is untouched: it stays in ``state.log_history`` and reaches every tracker.

Which metric leads the line: ``monitor`` when given; else the one an `EarlyStopping` of the
trainer watches, else the first of a `KeepBestCheckpoints`, else ``args.metric_for_best_model``,
else the evaluation's loss. The best so far is `EarlyStopping`'s own (its ``min_delta`` applies,
with its wait and patience) when it watches that metric, else the best of the values seen here,
in the metric's direction. Throughput is the latest training record's ``throughput/`` figures
(`ThroughputMonitor`).

How it reaches the printer: it needs the trainer (``TrainerPlus`` and ``LightweightTrainer``
bind their callbacks; ``run_before_integrations(trainer)`` for a stock or trl trainer). In a
notebook (transformers' ``NotebookProgressCallback``) nothing is printed: the table's row shows
the same values (``hf_callbacks_plus.integrations.notebook``).
"""

from __future__ import annotations

import logging
import math
import sys
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..core.checks import check_bool, check_name, check_names
from ..core.wrapping import wrap_method
from ..metrics.keys import TRAIN_SUBSET_PREFIX, evaluation_prefix, is_training_record
from ..metrics.monitor import Monitor, gap_is_meaningful, infer_mode
from ..metrics.numbers import to_float
from ..runtime.console import tell
from .monitoring import MonitoringCallback

__all__ = ["ConsoleSummary", "EvaluationLine"]

logger = logging.getLogger("hf_callbacks_plus")

#: The ``throughput/`` figures a line shows, in this order, with their labels.
THROUGHPUT_SHOWN = (("sequences_per_second", "sequences/s"), ("tokens_per_second", "tokens/s"),
                    ("mfu", "MFU"))
#: Marks a printer's ``on_log`` that a summary wrapped (one wrapper per printer).
_QUIETED = "_hf_callbacks_plus_quieted"
_OWNER = "ConsoleSummary"


@dataclass
class Shown:
    """One metric of a line: its key, its name in its section (``eval_accuracy``: ``accuracy``),
    its value, the train-subset value and the gap when known."""

    key: str
    name: str
    value: float
    subset: Optional[float] = None
    gap: Optional[float] = None


@dataclass
class EvaluationLine:
    """What one evaluation's line says (also the notebook row's columns).

    Attributes:
        step: The global step.
        metrics: The metrics shown, the monitored one first.
        best: ``(value, step)`` of the monitored metric's best so far, or None (direction unknown).
        new_best: This evaluation is the best so far.
        wait: ``(evaluations without improvement, patience)`` from `EarlyStopping`, or None.
        throughput: ``{label: value}`` of the latest training record's throughput figures.
    """

    step: int
    metrics: list[Shown] = field(default_factory=list)
    best: Optional[tuple[float, int]] = None
    new_best: bool = False
    wait: Optional[tuple[int, int]] = None
    throughput: dict[str, float] = field(default_factory=dict)

    def columns(self) -> dict[str, Any]:
        """The columns a table row adds beside the evaluation's own (``Train Subset Loss``,
        ``Gap Loss``, ``Best Loss``, ``Best Step``, ``Samples/s``...), in the line's order."""
        out: dict[str, Any] = {}
        for shown in self.metrics:
            title = _title(shown.name)
            if shown.subset is not None:
                out[f"Train Subset {title}"] = shown.subset
            if shown.gap is not None:
                out[f"Gap {title}"] = shown.gap
        if self.best is not None and self.metrics:
            out[f"Best {_title(self.metrics[0].name)}"] = self.best[0]
            out["Best Step"] = self.best[1]
        for label, value in self.throughput.items():
            out[label if label == "MFU" else label.capitalize()] = value
        return out


class ConsoleSummary(MonitoringCallback):
    """Print one compact line per evaluation (and per training log) in place of the record's dict.

    Args:
        monitor: The metric that leads each evaluation line (any name `EarlyStopping` takes:
            ``"eval_accuracy"``, ``"accuracy"``, ``"eval/accuracy"``). Defaults to None: the
            metric an `EarlyStopping` of the trainer watches, else a `KeepBestCheckpoints`' first,
            else ``args.metric_for_best_model``, else the evaluation's loss.
        metrics: More metrics to show after it (and the evaluation's loss, always shown), each
            with its train-subset value and gap when logged. Defaults to ().
        training: Also one line per training record (loss, learning rate, grad norm,
            throughput). Defaults to True.
        quiet_printer: The trainer's own printer (transformers' ``PrinterCallback`` or
            ``ProgressCallback``, the lightweight loop's) no longer prints the records this
            callback prints; every other record (the end-of-training totals, your own logs) it
            prints as before. False prints both. Defaults to True.

    Raises:
        TypeError: An argument has the wrong type.

    Note:
        A name the run cannot produce is a warning at train begin; one missing from the first
        evaluation, a warning there (the keys present, a "did you mean"). The line goes to
        stdout, where the dict went (through ``tqdm.write`` under a progress bar), on the main
        process only. The record itself is unchanged: trackers,
        ``state.log_history`` and the other callbacks get every key. Quieting the printer needs
        the trainer: with a stock or trl trainer call ``run_before_integrations(trainer)`` (else
        both are printed and one warning says so).

    Example:
        >>> summary = ConsoleSummary()
        >>> trainer = TrainerPlus(model=model, args=args, train_dataset=train, eval_dataset=val,
        ...                       callbacks=[TrainSubsetEvaluation(size=256), EarlyStopping("eval_loss"),
        ...                                  summary])
        >>> trainer.train()   # step 40/400 (epoch 1.00) | eval_loss 0.61 (subset 0.55, gap -0.06) best ...
    """

    def __init__(self, monitor: Optional[str] = None, *, metrics: Sequence[str] = (), training: bool = True,
                 quiet_printer: bool = True) -> None:
        self.monitor = check_name(_OWNER, "monitor", monitor, example="eval_accuracy",
                                  none="what EarlyStopping watches, else metric_for_best_model")
        self.metrics = check_names(_OWNER, "metrics", metrics, "a list of metric names")
        self.training = check_bool(_OWNER, "training", training)
        self.quiet_printer = check_bool(_OWNER, "quiet_printer", quiet_printer)
        super().__init__()
        self._best: dict[str, tuple[float, int]] = {}
        self._throughput: dict[str, float] = {}
        self._last: Optional[tuple[Any, EvaluationLine]] = None
        self._warned_unquiet = False

    # -- wiring ----------------------------------------------------------------------------
    def bind(self, trainer: Any) -> ConsoleSummary:
        """Take the trainer's key grammar and quiet its printer (called by every runner)."""
        super().bind(trainer)
        self._quiet_printers()
        return self

    def _callbacks(self) -> list[Any]:
        return list(getattr(getattr(self.trainer, "callback_handler", None), "callbacks", ()))

    def _quiet_printers(self) -> None:
        if not self.quiet_printer:
            return
        for callback in self._callbacks():
            if _prints_logs(callback):
                wrap_method(callback, "on_log", lambda on_log: _quieted(on_log, self), marker=_QUIETED)

    def _in_notebook(self) -> bool:
        return any(type(callback).__name__ == "NotebookProgressCallback" for callback in self._callbacks())

    def summarizes(self, logs: Any) -> bool:
        """True for a record this callback prints a line for (an evaluation's, or a training
        record with ``training=True``): the records a quieted printer skips."""
        if not isinstance(logs, Mapping):
            return False
        if evaluation_prefix(logs) is not None:
            return True
        return self.training and is_training_record(logs)

    # -- events ----------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Start the bests from the run's history (empty for a fresh ``train()``, the records up to
        the checkpoint for a resumed one); quiet a printer added since ``bind``; warn about a name
        the run cannot produce."""
        self._best, self._throughput, self._last = {}, {}, None
        self._confirmed = set()
        for name in (self.monitor, *self.metrics):
            problem = name and Monitor(name, "min", grammar=self.grammar, owner=_OWNER).check_run(args)
            if problem:
                logger.warning("%s (the line goes on without it.)", problem)
        for record in getattr(state, "log_history", None) or ():
            if not isinstance(record, Mapping):
                continue
            if is_training_record(record):
                self._throughput = _throughput(record) or self._throughput
            elif evaluation_prefix(record) is not None:
                self.evaluation_line(record, None, args, remember=True)
        self._last = None
        self._quiet_printers()

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """Print the record's line."""
        if not isinstance(logs, Mapping):
            return
        if is_training_record(logs):
            self._throughput = _throughput(logs) or self._throughput
        prefix = evaluation_prefix(logs)
        if prefix is not None:
            self._check_names(logs, prefix)
            line = self.evaluation_line(logs, state, args, prefix, remember=True)
            text = self.format_evaluation(line, state)
        elif self.training and is_training_record(logs):
            text = self.format_training(logs, state)
        else:
            return
        if self._in_notebook():
            return  # the notebook's table shows the row (integrations/notebook.py)
        self._warn_if_printed_twice()
        tell(text, state, verbose=True, file=sys.stdout)

    def _check_names(self, logs: Mapping[str, Any], prefix: str) -> None:
        """The first evaluation record: warn once for each name asked for that it does not hold."""
        for name in (self.monitor, *self.metrics):
            if name and name not in self._confirmed:
                self._confirmed.add(name)
                if self._key_in(name, logs, prefix) is None:
                    logger.warning("ConsoleSummary: %s (the line goes on without it.)",
                                   self.grammar.explain_missing(name, logs))

    def _warn_if_printed_twice(self) -> None:
        """Unbound (a stock trainer without ``run_before_integrations``), the printer is out of reach."""
        if not self.quiet_printer or self._warned_unquiet or self.trainer is not None:
            return
        self._warned_unquiet = True
        logger.warning(
            "ConsoleSummary: this trainer's own printer prints each record as a dict too. Call "
            "run_before_integrations(trainer) once after building a stock or trl trainer (TrainerPlus "
            "and LightweightTrainer need nothing) so ConsoleSummary can quiet it, or pass "
            "ConsoleSummary(quiet_printer=False) to keep both.")

    # -- the line --------------------------------------------------------------------------
    def monitored(self, args: Any = None) -> Optional[str]:
        """The metric leading the evaluation lines (see the class docstring), or None: the loss."""
        if self.monitor is not None:
            return self.monitor
        from .best_checkpoints import KeepBestCheckpoints
        from .early_stopping import EarlyStopping

        callbacks = self._callbacks()
        for callback in callbacks:
            if isinstance(callback, EarlyStopping) and callback.monitor_name:
                return callback.monitor_name
        for callback in callbacks:
            if isinstance(callback, KeepBestCheckpoints) and callback.specs:
                return callback.specs[0].monitor
        return getattr(args, "metric_for_best_model", None) or None

    def evaluation_line(self, logs: Mapping[str, Any], state: Any = None, args: Any = None,
                        prefix: Optional[str] = None, remember: bool = False) -> EvaluationLine:
        """What the line of an evaluation record says.

        Args:
            logs: The evaluation's record (``<prefix>_runtime`` and its metrics).
            state: The trainer state (the step). Defaults to None.
            args: The training arguments (``metric_for_best_model``). Defaults to None.
            prefix: The evaluation's ``metric_key_prefix``. Defaults to None: read from ``logs``.
            remember: Count the value towards the best so far. Defaults to False (the line of
                the record just printed is returned as it was printed).
        """
        if self._last is not None and self._last[0] is logs:
            return self._last[1]
        prefix = prefix or evaluation_prefix(logs) or "eval"
        step = int(getattr(state, "global_step", 0) or logs.get("step") or 0)
        line = EvaluationLine(step=step, throughput=dict(self._throughput))
        keys = []
        monitor = self.monitored(args)
        lead = self._key_in(monitor, logs, prefix) if monitor else None
        for key in (lead, f"{prefix}_loss", *(self._key_in(name, logs, prefix) for name in self.metrics)):
            if key is not None and key not in keys and to_float(logs.get(key)) is not None:
                keys.append(key)
        for key in keys:
            line.metrics.append(self._shown(key, logs))
        if line.metrics:
            self._best_of(line, logs, remember)
        if remember:
            self._last = (logs, line)
        return line

    def _key_in(self, name: str, logs: Mapping[str, Any], prefix: str) -> Optional[str]:
        """The key of ``name`` in this evaluation's record: the name itself, or the same metric
        under this record's prefix (another eval set's record)."""
        found = self.grammar.resolve(name, logs)
        if found is not None:
            return found
        metric = self.grammar.parse(self.grammar.canonical(name)).name
        key = f"{prefix}_{metric}"
        return key if key in logs else None

    def _shown(self, key: str, logs: Mapping[str, Any]) -> Shown:
        parsed = self.grammar.parse(key)
        shown = Shown(key, parsed.name, float(logs[key]))
        if parsed.section == TRAIN_SUBSET_PREFIX or parsed.is_running:
            return shown
        shown.subset = to_float(logs.get(f"{TRAIN_SUBSET_PREFIX}_{parsed.name}"))
        gap = to_float(logs.get(f"gap_{parsed.name}"))
        if gap is None and shown.subset is not None and gap_is_meaningful(parsed.name):
            gap = shown.subset - shown.value
        shown.gap = gap
        return shown

    def _best_of(self, line: EvaluationLine, logs: Mapping[str, Any], remember: bool) -> None:
        lead = line.metrics[0]
        stopper = self._stopper_of(lead.key, logs)
        if stopper is not None:  # its verdict on this record (min_delta, warm-up, baseline)
            if stopper.best_value is not None:
                line.best = (float(stopper.best_value), int(stopper.best_step or 0))
                line.new_best = stopper.best_step == line.step and stopper.wait == 0
            line.wait = (int(stopper.wait), int(stopper.patience))
            return
        mode = self._mode_of(lead.key)
        previous = self._best.get(lead.key)
        if mode is None or not math.isfinite(lead.value):  # NaN and +-Inf are never best
            line.best = previous
            return
        better = previous is None or (lead.value < previous[0] if mode == "min" else lead.value > previous[0])
        best = (lead.value, line.step) if better else previous
        line.best, line.new_best = best, better
        if remember:
            self._best[lead.key] = best

    def _stopper_of(self, key: str, logs: Mapping[str, Any]) -> Any:
        from .early_stopping import EarlyStopping

        for callback in self._callbacks():
            if isinstance(callback, EarlyStopping) and callback.monitor_name \
                    and self.grammar.resolve(callback.monitor_name, logs) == key:
                return callback
        return None

    def _mode_of(self, key: str) -> Optional[str]:
        from .best_checkpoints import KeepBestCheckpoints

        for callback in self._callbacks():
            if isinstance(callback, KeepBestCheckpoints):
                for spec in callback.specs:
                    if spec.monitor == self.grammar.canonical(key) and spec.mode in ("min", "max"):
                        return spec.mode
        return infer_mode(key)

    def format_evaluation(self, line: EvaluationLine, state: Any = None) -> str:
        """The text of an evaluation line."""
        parts = [_head(line.step, state)]
        for index, shown in enumerate(line.metrics):
            text = f"{shown.key} {_fmt(shown.value)}"
            inner = []
            if shown.subset is not None:
                inner.append(f"subset {_fmt(shown.subset)}")
            if shown.gap is not None:
                inner.append(f"gap {shown.gap:+.4g}")
            if inner:
                text += f" ({', '.join(inner)})"
            if index == 0 and line.best is not None:
                text += f" best {_fmt(line.best[0])} @ {line.best[1]}"
                if line.new_best:
                    text += " new"
                elif line.wait is not None:
                    text += f" wait {line.wait[0]}/{line.wait[1]}"
            parts.append(text)
        if line.throughput:
            parts.append(_format_throughput(line.throughput))
        return " | ".join(parts)

    def format_training(self, logs: Mapping[str, Any], state: Any = None) -> str:
        """The text of a training record's line: loss, learning rate, grad norm, the running
        value of the shown metrics, throughput."""
        step = int(getattr(state, "global_step", 0) or logs.get("step") or 0)
        parts = [_head(step, state)]
        for key, label in (("loss", "loss"), ("learning_rate", "lr"), ("grad_norm", "grad_norm")):
            value = to_float(logs.get(key))
            if value is not None:
                parts.append(f"{label} {value:.3g}" if key == "learning_rate" else f"{label} {_fmt(value)}")
        names = [self.grammar.parse(self.grammar.canonical(name)).name
                 for name in (self.monitored(), *self.metrics) if name]
        for name in dict.fromkeys(names):
            value = to_float(logs.get(name)) if name != "loss" else None
            if value is not None:
                parts.append(f"{name} {_fmt(value)}")
        figures = _throughput(logs)
        if figures:
            parts.append(_format_throughput(figures))
        return " | ".join(parts)


# -- helpers ----------------------------------------------------------------------------------------

def _prints_logs(callback: Any) -> bool:
    """A callback that prints every log record: transformers' ``PrinterCallback`` and
    ``ProgressCallback`` (by their package: they cannot carry our attribute) or a class saying
    ``prints_logs = True`` (the lightweight loop's)."""
    cls = type(callback)
    if getattr(cls, "prints_logs", False) is True:
        return True
    printer = cls.__name__ in ("PrinterCallback", "ProgressCallback")
    return printer and cls.__module__.startswith("transformers.")


def _quieted(on_log: Callable[..., Any], summary: ConsoleSummary) -> Callable[..., Any]:
    owner = weakref.ref(summary)

    def quieted_on_log(args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> Any:
        current = owner()
        if current is not None and current.quiet_printer and current.summarizes(logs):
            return None  # the summary's line says it
        return on_log(args, state, control, logs=logs, **kwargs)

    return quieted_on_log


def _throughput(logs: Mapping[str, Any]) -> dict[str, float]:
    figures = {}
    for name, label in THROUGHPUT_SHOWN:
        value = to_float(logs.get(f"throughput/{name}"))
        if value is not None:
            figures[label] = value
    return figures


def _format_throughput(figures: Mapping[str, float]) -> str:
    parts = []
    for label, value in figures.items():
        if label == "MFU":
            parts.append(f"MFU {value * 100:.1f}%")
        else:
            parts.append(f"{_rate(value)} {label}")
    return ", ".join(parts)


def _head(step: int, state: Any) -> str:
    total = int(getattr(state, "max_steps", 0) or 0)
    head = f"step {step}/{total}" if total > 0 else f"step {step}"
    epoch = to_float(getattr(state, "epoch", None))
    return head + (f" (epoch {epoch:.2f})" if epoch is not None else "")


def _title(name: str) -> str:
    """``f1_macro`` -> ``F1 Macro`` (transformers' notebook columns are written so)."""
    return " ".join(part.capitalize() for part in name.replace("/", "_").split("_") if part)


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _rate(value: float) -> str:
    for threshold, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= threshold:
            return f"{value / threshold:.3g}{suffix}"
    return f"{value:.3g}"
