"""Learning curves from a ``log_history`` or a ``trainer_state.json``.

One panel per metric: the eval curve (one per eval dataset), the train-subset curve
(`TrainSubsetEvaluation`), curves of custom
prefixes (``val``...), the running training loss on the ``loss`` panel, the generalization
gap (the logged ``gap_<metric>`` on a right-hand axis, else the shaded area between the
train-subset and eval curves), and vertical markers at the best step and at the
early-stopping point (``early_stopping/best_step``, ``early_stopping/stopped_step``, else
the trainer state's ``best_global_step``/``best_model_checkpoint``). Every key is read
through the key grammar. Needs matplotlib (``pip install 'hf-callbacks-plus[plot]'``).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Union

from ._compat import require
from .metrics.keys import TIMING_NAMES, TRAIN_SUBSET_PREFIX, KeyGrammar

__all__ = ["LearningCurves", "collect_curves", "load_log_history", "plot_learning_curves"]

#: Metric names that are timings, not learning curves.
_TIMING = {*TIMING_NAMES, "epoch", "step", "total_flos"}
#: Training-loop keys that get a panel only when asked for.
_LOOP_EXTRAS = {"learning_rate", "grad_norm", "num_input_tokens_seen", "num_tokens"}

Source = Union[str, os.PathLike, Sequence[Mapping[str, Any]], Mapping[str, Any]]


class LearningCurves:
    """Curves extracted from a log history.

    Attributes:
        series: ``{metric: {label: [(step, value), ...]}}``; labels are ``"eval"``,
            ``"eval (squad)"``, ``"train subset"``, ``"training loss"``, ``"gap"`` or a
            custom prefix.
        best_step: The best step, or None.
        stopped_step: The step at which early stopping stopped training, or None.
    """

    def __init__(self) -> None:
        self.series: dict[str, dict[str, list[tuple[int, float]]]] = {}
        self.best_step: Optional[int] = None
        self.stopped_step: Optional[int] = None

    def add(self, metric: str, label: str, step: int, value: float) -> None:
        self.series.setdefault(metric, {}).setdefault(label, []).append((step, value))


def load_log_history(source: Source) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Return ``(log_history, trainer_state)`` from a path, a state dict or a history list.

    Args:
        source: A ``trainer_state.json`` path, a directory holding one (an output dir: its
            newest ``checkpoint-N`` is used), a trainer state dict, or a ``log_history`` list.

    Raises:
        FileNotFoundError: No ``trainer_state.json`` at the path.
        TypeError: ``source`` is none of the above.
    """
    if isinstance(source, (str, os.PathLike)):
        path = _state_path(Path(source))
        state = json.loads(path.read_text())
        return list(state.get("log_history", [])), state
    if isinstance(source, Mapping):
        return list(source.get("log_history", [])), dict(source)
    if isinstance(source, Sequence) and all(isinstance(record, Mapping) for record in source):
        return [dict(record) for record in source], {}
    raise TypeError(
        "plot_learning_curves: source must be a path to trainer_state.json, a trainer state dict or a "
        f"log_history list of dicts, got {type(source).__name__}."
    )


def _state_path(path: Path) -> Path:
    if path.is_dir():
        direct = path / "trainer_state.json"
        if direct.is_file():
            return direct
        found = path.glob("checkpoint-*/trainer_state.json")
        checkpoints = sorted(
            (p for p in found if p.parent.name.split("-")[-1].isdigit()),
            key=lambda p: int(p.parent.name.split("-")[-1]),
        )
        if checkpoints:
            return checkpoints[-1]
        raise FileNotFoundError(
            f"plot_learning_curves: no trainer_state.json in {str(path)!r} or its checkpoints."
        )
    if not path.is_file():
        raise FileNotFoundError(f"plot_learning_curves: {str(path)!r} does not exist.")
    return path


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


def collect_curves(
    log_history: Sequence[Mapping[str, Any]],
    state: Optional[Mapping[str, Any]] = None,
    grammar: Optional[KeyGrammar] = None,
    include_training_extras: bool = False,
) -> LearningCurves:
    """Sort every numeric key of every record into metric panels (see module docstring).

    Args:
        log_history: The records (``state.log_history``).
        state: The trainer state dict, for ``best_global_step``. Defaults to None.
        grammar: The key grammar; prefixes and eval dataset names are learned from the
            records. Defaults to a new one.
        include_training_extras: Also plot ``learning_rate``/``grad_norm``. Defaults to False.

    Returns:
        The curves.
    """
    grammar = grammar or KeyGrammar()
    for record in log_history:
        grammar.learn_from_metrics(record)
    curves = LearningCurves()
    for record in log_history:
        if grammar.is_summary_record(record):
            continue
        step = record.get("step")
        if _number(step) is None:
            continue
        step = int(step)
        for key, raw_value in record.items():
            value = _number(raw_value)
            if value is None or key == "step":
                continue
            parsed = grammar.parse(key)
            if parsed.section == "early_stopping":
                if parsed.name == "best_step":
                    curves.best_step = int(value)
                elif parsed.name == "stopped_step":
                    curves.stopped_step = int(value)
                continue
            if parsed.name in _TIMING:
                continue
            if parsed.is_summary:
                continue
            if parsed.is_running:  # measured on the training batches: never "train subset"
                if parsed.name == "loss":
                    curves.add("loss", "training loss", step, value)
                elif parsed.name not in _LOOP_EXTRAS or include_training_extras:
                    curves.add(parsed.name, "training", step, value)
                continue
            label = {TRAIN_SUBSET_PREFIX: "train subset", "gap": "gap"}.get(parsed.section, parsed.section)
            if parsed.dataset:
                label = f"{label} ({parsed.dataset})"
            curves.add(parsed.name, label, step, value)
    if curves.best_step is None and state:
        curves.best_step = _best_step_from_state(state)
    return curves


def _best_step_from_state(state: Mapping[str, Any]) -> Optional[int]:
    best = state.get("best_global_step")
    if isinstance(best, int) and best > 0:
        return best
    checkpoint = state.get("best_model_checkpoint")
    if isinstance(checkpoint, str):
        match = re.search(r"checkpoint-(\d+)", checkpoint)
        if match:
            return int(match.group(1))
    return None


def plot_learning_curves(
    source: Source,
    output: Union[str, os.PathLike, None] = None,
    *,
    metrics: Optional[Sequence[str]] = None,
    grammar: Optional[KeyGrammar] = None,
    title: Optional[str] = None,
    include_training_extras: bool = False,
    columns: int = 2,
    dpi: int = 110,
) -> Any:
    """Draw the learning curves; save a PNG when ``output`` is given.

    Args:
        source: ``log_history`` (list of dicts), a trainer state dict, or a path to a
            ``trainer_state.json`` (or to a directory holding one or checkpoints).
        output: Where to save the PNG. Defaults to None (only return the figure).
        metrics: Metric names to plot (``["loss", "accuracy"]``), in this order. Defaults
            to every metric that has a curve, ``loss`` first.
        grammar: Key grammar (eval dataset names, custom prefixes). Defaults to one
            learned from the records.
        title: Figure title. Defaults to None.
        include_training_extras: Add ``learning_rate``/``grad_norm`` panels. Defaults to False.
        columns: Panels per row. Defaults to 2.
        dpi: Resolution of the saved PNG. Defaults to 110.

    Returns:
        The ``matplotlib.figure.Figure``.

    Raises:
        ModuleNotFoundError: matplotlib is not installed (install the ``[plot]`` extra).
        ValueError: There is nothing to plot, or a requested metric has no curve (the
            message lists the available ones).

    Example:
        >>> plot_learning_curves("runs/demo/trainer_state.json", "curves.png")  # doctest: +SKIP
    """
    require("matplotlib", "plot_learning_curves")
    from matplotlib.figure import Figure

    if not isinstance(columns, int) or columns < 1:
        raise ValueError(f"plot_learning_curves: columns must be an int >= 1, got {columns!r}.")
    history, state = load_log_history(source)
    curves = collect_curves(history, state, grammar, include_training_extras)
    available = sorted(curves.series, key=lambda name: (name != "loss", name))
    if not available:
        raise ValueError(
            f"plot_learning_curves: no metric to plot in {len(history)} log records "
            "(numeric keys with a step, outside the end-of-training summary)."
        )
    if metrics is None:
        chosen = available
    else:
        missing = [name for name in metrics if name not in curves.series]
        if missing:
            raise ValueError(f"plot_learning_curves: no curve for metrics {missing}; available: {available}.")
        chosen = list(metrics)
    columns = min(columns, len(chosen))
    rows = math.ceil(len(chosen) / columns)
    figure = Figure(figsize=(6.0 * columns, 3.6 * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for axis, name in zip(axes, chosen):
        _draw_panel(axis, name, curves)
    for axis in axes[len(chosen):]:
        axis.set_visible(False)
    if title:
        figure.suptitle(title)
    if output is not None:
        figure.savefig(os.fspath(output), dpi=dpi)
    return figure


_STYLES = {"training loss": {"color": "#9e9e9e", "linewidth": 1.0, "alpha": 0.8},
           "train subset": {"color": "#1f77b4", "marker": "o", "markersize": 3},
           "eval": {"color": "#ff7f0e", "marker": "s", "markersize": 3}}


_GAP_COLOR = "#9467bd"


def _draw_panel(axis: Any, name: str, curves: LearningCurves) -> None:
    series = curves.series[name]
    for label, points in series.items():
        if label == "gap":
            continue
        steps, values = zip(*sorted(points))
        axis.plot(steps, values, label=label, **_STYLES.get(label, {"marker": ".", "markersize": 3}))
    if "gap" in series:
        twin = axis.twinx()
        steps, values = zip(*sorted(series["gap"]))
        twin.plot(steps, values, color=_GAP_COLOR, linestyle=":", marker="^", markersize=3,
                  label="gap (right)")
        twin.set_ylabel("gap = train - eval", color=_GAP_COLOR)
        twin.tick_params(axis="y", colors=_GAP_COLOR)
        handles, labels = twin.get_legend_handles_labels()
        legend_axis = twin  # drawn last: the legend stays above every curve
    else:
        handles, labels = [], []
        legend_axis = axis
        _shade_gap(axis, series)
    if curves.best_step is not None:
        axis.axvline(curves.best_step, color="#2ca02c", linestyle="--", linewidth=1,
                     label=f"best step {curves.best_step}")
    if curves.stopped_step is not None:
        axis.axvline(curves.stopped_step, color="#d62728", linestyle="-.", linewidth=1,
                     label=f"early stop {curves.stopped_step}")
    axis.set_title(name)
    axis.set_xlabel("step")
    axis.grid(True, alpha=0.3)
    own_handles, own_labels = axis.get_legend_handles_labels()
    legend_axis.legend(own_handles + handles, own_labels + labels, fontsize=8, loc="best")


def _shade_gap(axis: Any, series: Mapping[str, list[tuple[int, float]]]) -> None:
    train, evaluation = dict(series.get("train subset", [])), dict(series.get("eval", []))
    common = sorted(set(train) & set(evaluation))
    if len(common) >= 2:
        axis.fill_between(common, [train[s] for s in common], [evaluation[s] for s in common],
                          color=_GAP_COLOR, alpha=0.12, label="gap")
