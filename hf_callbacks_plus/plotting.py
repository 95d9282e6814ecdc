"""Learning curves from a ``log_history``, a ``trainer_state.json``, a run directory or the
package's own JSONL log (``metrics.jsonl`` of `JsonlLogger`).

The default figure answers "is it over-fitting, and where did it stop": the loss and the
monitored metric(s) (what `EarlyStopping` and `KeepBestCheckpoints` watched, read from the
checkpoint's state or the ranking's keys), each with its train-subset and eval curves
(`TrainSubsetEvaluation`), the generalization gap (the logged ``gap_<metric>`` on a right-hand
axis, else the shaded area between the train-subset and eval curves where a gap means something:
``metrics.monitor.gap_is_meaningful``), vertical markers at the
best step and at the early-stopping point (``early_stopping/best_step``,
``early_stopping/stopped_step``, else the trainer state's ``best_global_step``/
``best_model_checkpoint``) and triangles on the step axis at the checkpoints `KeepBestCheckpoints`
kept (its ``best_checkpoints/...`` summary keys, else its state in the trainer state).
``metrics="all"`` draws a panel for every curve: other eval datasets' and custom prefixes'
metrics, the running metrics of the training batches ("training": trl's ``mean_token_accuracy``,
`StreamingMetrics`' running metrics...; never drawn as the train subset), and the figures of
other sections under their full name (``throughput/tokens_per_second``); `TrainingHealth`'s
``health/<kind>/<layer or rank>`` keys draw one panel per kind (``health/grad_norm``), one line per
layer or rank. Never drawn as curves:
evaluation timings, confusion counts, and run counters such as trl's ``num_tokens`` (with
``include_training_extras``, as training-loop extras). Every key is read through the key
grammar; every series has its own colour, the same on every panel; the legend sits outside the
panels. Needs matplotlib (``pip install 'hf-callbacks-plus[plot]'``).
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Union

from ._compat import require
from .core.state import saved_states
from .metrics.keys import (
    BEST_CHECKPOINTS_SECTION,
    RUN_COUNTERS,
    TIMING_NAMES,
    TRAIN_SUBSET_PREFIX,
    KeyGrammar,
    did_you_mean,
)
from .metrics.monitor import gap_is_meaningful
from .metrics.numbers import to_float

__all__ = ["ALL", "DEFAULT_PNG", "LearningCurves", "collect_curves", "default_panels", "load_log_history",
           "plot_learning_curves", "run_folder", "series_colors"]

logger = logging.getLogger("hf_callbacks_plus")

#: Metric names that are timings, not learning curves.
_TIMING = {*TIMING_NAMES, "epoch", "step", "total_flos"}
#: Training-loop keys that get a panel only when asked for (``include_training_extras``).
_LOOP_EXTRAS = {"learning_rate", "grad_norm", *RUN_COUNTERS}
#: ``metrics=`` value that draws every curve.
ALL = "all"
#: The PNG ``hf-callbacks-plus plot`` writes into the run folder when no ``-o`` is given (the
#: demo's name for the same figure).
DEFAULT_PNG = "learning_curves.png"
#: Confusion-matrix counts (``StreamingMetrics``): numbers per evaluation, not learning curves.
_COUNTS = re.compile(r"confusion_\d+_\d+")

Source = Union[str, os.PathLike, Sequence[Mapping[str, Any]], Mapping[str, Any]]


class LearningCurves:
    """Curves extracted from a log history.

    Attributes:
        series: ``{metric: {label: [(step, value), ...]}}``; labels are ``"eval"``,
            ``"eval (squad)"``, ``"train subset"``, ``"training loss"``, ``"gap"`` or a
            custom prefix.
        best_step: The best step, or None.
        stopped_step: The step at which early stopping stopped training, or None.
        kept_steps: The steps of the checkpoints ``KeepBestCheckpoints`` kept, ascending.
        monitors: The metrics `EarlyStopping` and `KeepBestCheckpoints` watched, as panel
            names (``"loss"``, ``"accuracy"``), in the order found.
        separate: The panels of keys in a section of their own (``throughput/tokens_per_second``).
    """

    def __init__(self) -> None:
        self.series: dict[str, dict[str, list[tuple[int, float]]]] = {}
        self.best_step: Optional[int] = None
        self.stopped_step: Optional[int] = None
        self.kept_steps: list[int] = []
        self.monitors: list[str] = []
        self.separate: set[str] = set()

    def add(self, metric: str, label: str, step: int, value: float) -> None:
        self.series.setdefault(metric, {}).setdefault(label, []).append((step, value))


def load_log_history(source: Source) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Return ``(log_history, trainer_state)`` from a path, a state dict or a history list.

    Args:
        source: A ``trainer_state.json`` path; a JSONL log written by `JsonlLogger`
            (``metrics.jsonl``: its ``log`` lines become records keyed by rendered names); a
            run directory (its ``trainer_state.json``, else its ``metrics.jsonl``, else the
            newest ``checkpoint-N/trainer_state.json``); a trainer state dict; or a
            ``log_history`` list.

    Raises:
        FileNotFoundError: Nothing to read at the path.
        ValueError: The file is neither a trainer state nor a JSONL log.
        TypeError: ``source`` is none of the above.
    """
    if isinstance(source, (str, os.PathLike)):
        path = _state_path(Path(source))
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ValueError(
                f"plot_learning_curves: {str(path)!r} is not a text file (not UTF-8); give a "
                "trainer_state.json, a checkpoint or output folder, or a JSONL log."
            ) from None
        try:
            state = json.loads(text)
        except json.JSONDecodeError:  # several JSON documents: one per line
            return _read_jsonl(path, text), {}
        if isinstance(state, Mapping) and "event" in state:  # a JSONL log of a single line
            return _read_jsonl(path, text), {}
        if not isinstance(state, Mapping):
            raise ValueError(f"plot_learning_curves: {str(path)!r} holds no trainer state (a JSON object).")
        return list(state.get("log_history", [])), dict(state)
    if isinstance(source, Mapping):
        return list(source.get("log_history", [])), dict(source)
    if isinstance(source, Sequence) and all(isinstance(record, Mapping) for record in source):
        return [dict(record) for record in source], {}
    raise TypeError(
        "plot_learning_curves: source must be a path to trainer_state.json, metrics.jsonl or a run "
        f"directory, a trainer state dict or a log_history list of dicts, got {type(source).__name__}."
    )


_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _read_jsonl(path: Path, text: str) -> list[dict[str, Any]]:
    """The ``log`` lines of a `JsonlLogger` file as records: ``{"step": N, <rendered>: value}``."""
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"plot_learning_curves: {str(path)!r} line {number} is not JSON ({error.msg}); "
                             "expected a trainer_state.json or a JSONL log of JsonlLogger.") from None
        is_log = isinstance(event, Mapping) and event.get("event") == "log"
        if is_log and isinstance(event.get("curves"), Mapping):
            values = {key: _NON_FINITE.get(value, value) if isinstance(value, str) else value
                      for key, value in event["curves"].items()}
            summary = event.get("summary") if isinstance(event.get("summary"), Mapping) else {}
            kept = {key: value for key, value in summary.items()
                    if key.startswith(f"{BEST_CHECKPOINTS_SECTION}/")}
            records.append({**values, **kept, "step": event.get("step")})
    return records


def _newest_checkpoint_state(folder: Path) -> Optional[Path]:
    found = folder.glob("checkpoint-*/trainer_state.json")
    checkpoints = sorted((p for p in found if p.parent.name.split("-")[-1].isdigit()),
                         key=lambda p: int(p.parent.name.split("-")[-1]))
    return checkpoints[-1] if checkpoints else None


#: Where a run's trainer state is: a stock Trainer writes it into checkpoints only.
_WHERE = ("a Trainer writes trainer_state.json into each checkpoint-N folder (and into output_dir only "
          "with trainer.save_state())")


def _state_path(path: Path) -> Path:
    """The file to read for ``path``: itself, or in a run folder its ``trainer_state.json``, its
    ``metrics.jsonl`` or the newest checkpoint's state (also for ``<run folder>/trainer_state.json``
    when that file does not exist, with a warning naming the file read)."""
    if path.is_dir():
        for name in ("trainer_state.json", "metrics.jsonl"):
            if (path / name).is_file():
                return path / name
        newest = _newest_checkpoint_state(path)
        if newest is not None:
            return newest
        runs = [child for child in sorted(path.iterdir()) if child.is_dir() and _readable(child)][:5]
        inside = f" It holds run folders: {', '.join(repr(str(run)) for run in runs)}." if runs else ""
        raise FileNotFoundError(
            f"plot_learning_curves: no trainer_state.json or metrics.jsonl in {str(path)!r} or in a "
            f"checkpoint-N folder of it; {_WHERE}. Pass the output_dir of a run that saved checkpoints, "
            f"a checkpoint folder, or a JsonlLogger's metrics.jsonl.{inside}"
        )
    if path.is_file():
        return path
    newest = _newest_checkpoint_state(path.parent) if path.parent.is_dir() else None
    if path.name == "trainer_state.json" and newest is not None:
        logger.warning("plot_learning_curves: %s does not exist (%s); plotting the newest checkpoint's, %s.",
                       path, _WHERE, newest)
        return newest
    close = _close_paths(path)
    hint = f" Did you mean {' or '.join(repr(str(c)) for c in close)}?" if close else ""
    raise FileNotFoundError(f"plot_learning_curves: {str(path)!r} does not exist ({_WHERE}).{hint}")


def run_folder(source: Union[str, os.PathLike]) -> Path:
    """The run folder of a path `load_log_history` reads: the folder given, or the folder of the
    file given; for a ``checkpoint-N`` folder (or a file in one), the run folder holding it (the
    trainer rotates its checkpoints)."""
    path = Path(source)
    folder = path if path.is_dir() else path.parent
    checkpoint = folder.name.startswith("checkpoint-") and folder.name.split("-")[-1].isdigit()
    return folder.parent if checkpoint else folder


def _readable(path: Path) -> bool:
    """``path`` can be plotted: a file, or a folder holding a state, a JSONL log or a checkpoint's."""
    if path.is_file():
        return True
    return path.is_dir() and (any((path / name).is_file() for name in ("trainer_state.json", "metrics.jsonl"))
                              or _newest_checkpoint_state(path) is not None)


def _close_paths(path: Path) -> list[Path]:
    """Plottable paths near a missing one: the nearest existing folder above it when that folder
    can be plotted itself, else its entries whose names come close to the first missing part
    (``runs/demoo`` -> ``runs/demo``), followed by the rest of the path where that exists."""
    parts = path.parts
    for depth in range(len(parts) - 1, -1, -1):
        folder = Path(*parts[:depth]) if depth else Path(".")
        if not folder.is_dir():
            continue
        if depth and _readable(folder):
            return [folder]
        missing, rest = parts[depth], parts[depth + 1:]
        try:
            names = sorted(entry.name for entry in folder.iterdir())
        except OSError:
            return []
        found = []
        for name in difflib.get_close_matches(missing, names, n=3, cutoff=0.6):
            candidate = folder / name / Path(*rest) if rest else folder / name
            if _readable(candidate):
                found.append(candidate)
            elif _readable(folder / name):
                found.append(folder / name)
        return found
    return []


def collect_curves(
    log_history: Sequence[Mapping[str, Any]],
    state: Optional[Mapping[str, Any]] = None,
    grammar: Optional[KeyGrammar] = None,
    include_training_extras: bool = False,
) -> LearningCurves:
    """Sort every numeric key of every record into metric panels (see module docstring).

    A metric of an evaluation-like section (``eval``, an eval dataset, ``train_subset``, ``gap``,
    ``test``, a custom prefix) and the training batches' running value of the same name share
    the panel of the bare name (``accuracy``); a key of any other section has a panel of its own,
    named in full (``throughput/tokens_per_second``).

    Args:
        log_history: The records (``state.log_history``).
        state: The trainer state dict, for ``best_global_step`` and the callbacks' saved states
            (which metrics were monitored, which checkpoints were kept). Defaults to None.
        grammar: The key grammar; prefixes and eval dataset names are learned from the
            records. Defaults to a new one.
        include_training_extras: Also collect ``learning_rate``, ``grad_norm`` and the run
            counters (``num_tokens``...). Defaults to False.

    Returns:
        The curves.
    """
    grammar = grammar or KeyGrammar()
    for record in log_history:
        grammar.learn_from_metrics(record)
    curves = LearningCurves()
    kept: set[int] = set()
    monitors: list[str] = []
    for record in log_history:
        kept.update(int(value) for key, value in record.items() if _is_kept_step(grammar, key, value))
        monitors.extend(_ranked_monitor(key) for key in record if _is_kept_step(grammar, key, record[key]))
        if grammar.is_summary_record(record):
            continue
        step = record.get("step")
        if to_float(step) is None:
            continue
        step = int(step)
        for key, raw_value in record.items():
            value = to_float(raw_value)
            if value is None or key == "step":
                continue
            parsed = grammar.parse(key)
            if parsed.section == "early_stopping":
                if parsed.name == "best_step":
                    curves.best_step = int(value)
                elif parsed.name == "stopped_step":
                    curves.stopped_step = int(value)
                continue
            if parsed.is_summary or _COUNTS.fullmatch(parsed.name):
                continue
            if parsed.section == "health" and parsed.rendered.count("/") >= 2:  # one line per layer or rank
                panel, _, label = parsed.rendered.rpartition("/")
                curves.add(panel, label, step, value)
                curves.separate.add(panel)
                continue
            if parsed.section not in grammar.sections:  # a section of its own: throughput/..., a/b
                curves.add(parsed.rendered, "training", step, value)
                curves.separate.add(parsed.rendered)
                continue
            if parsed.name in _TIMING:
                continue
            if parsed.name in RUN_COUNTERS and not parsed.is_running:
                continue  # trl's eval_num_tokens: the training counter again, not an eval curve
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
    curves.kept_steps = sorted(kept or _kept_steps_from_state(state or {}))
    monitors = _monitors_from_state(state or {}) + monitors
    for monitor in monitors:
        panel = _panel_of(monitor, curves, grammar)
        if panel is not None and panel not in curves.monitors:
            curves.monitors.append(panel)
    return curves


def default_panels(curves: LearningCurves) -> list[str]:
    """The panels of the default figure: the loss, then each monitored metric (`collect_curves`);
    every panel when the run has neither (a log without a loss)."""
    chosen = [name for name in ("loss", *curves.monitors) if name in curves.series]
    return list(dict.fromkeys(chosen)) or _every_panel(curves)


def _every_panel(curves: LearningCurves) -> list[str]:
    """Every panel: the loss first, the metrics of evaluation-like sections, then the others."""
    return sorted(curves.series, key=lambda name: (name != "loss", name in curves.separate, name))


def _ranked_monitor(key: str) -> str:
    """``best_checkpoints/eval_rewards/margins/rank1_step`` -> ``eval_rewards/margins``."""
    return key[len(BEST_CHECKPOINTS_SECTION) + 1:].rsplit("/", 1)[0]


def _monitors_from_state(state: Mapping[str, Any]) -> list[str]:
    """The metrics the saved `EarlyStopping` and `KeepBestCheckpoints` states name."""
    found: list[str] = []
    for name in ("EarlyStopping", "KeepBestCheckpoints"):
        for entry in saved_states(state, name):
            attributes = entry.get("attributes") or {}
            key = attributes.get("state_key")
            if name == "EarlyStopping" and isinstance(key, str) and key.startswith("EarlyStopping["):
                found.append(key[len("EarlyStopping["):].split(",")[0])  # the resolved monitor
                continue
            monitor = (entry.get("args") or {}).get("monitor")
            for item in monitor if isinstance(monitor, list) else [monitor]:
                item = item.get("monitor") if isinstance(item, Mapping) else item
                if isinstance(item, str) and item:
                    found.append(item)
            for kept in attributes.get("entries") or []:  # monitor=None: the ranked values name it
                if isinstance(kept, Mapping) and isinstance(kept.get("values"), Mapping):
                    found.extend(str(value) for value in kept["values"])
    return found


def _panel_of(monitor: str, curves: LearningCurves, grammar: KeyGrammar) -> Optional[str]:
    """The panel a monitored metric is drawn on (``eval_accuracy`` -> ``accuracy``), if it has one."""
    for name in (monitor, grammar.parse(grammar.canonical(monitor)).name):
        if name in curves.series:
            return name
    return None


def _is_kept_step(grammar: KeyGrammar, key: Any, value: Any) -> bool:
    parsed = grammar.parse(key)
    return parsed.section == BEST_CHECKPOINTS_SECTION and parsed.name.endswith("_step") \
        and to_float(value) is not None


def _kept_steps_from_state(state: Mapping[str, Any]) -> set[int]:
    """The kept steps saved in a checkpoint's state by ``KeepBestCheckpoints`` (every instance)."""
    steps: set[int] = set()
    for entry in saved_states(state, "KeepBestCheckpoints"):
        attributes = entry.get("attributes") or {}
        if isinstance(attributes.get("kept"), list):  # the steps kept once that checkpoint is ranked
            steps.update(int(step) for step in attributes["kept"])
            continue
        entries = attributes.get("entries") or []
        steps.update(int(kept["step"]) for kept in entries if isinstance(kept, Mapping))
    return steps


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
    metrics: Union[Sequence[str], str, None] = None,
    grammar: Optional[KeyGrammar] = None,
    title: Optional[str] = None,
    include_training_extras: bool = False,
    columns: int = 2,
    dpi: int = 110,
) -> Any:
    """Draw the learning curves; save a PNG when ``output`` is given.

    Args:
        source: ``log_history`` (list of dicts), a trainer state dict, or a path to a
            ``trainer_state.json``, to a JSONL log of `JsonlLogger` (``metrics.jsonl``) or to
            a run directory (see `load_log_history`).
        output: Where to save the PNG. Defaults to None (only return the figure).
        metrics: Metrics to plot, in this order: bare (``"accuracy"``), prefixed
            (``"eval_accuracy"``, ``"train_subset_accuracy"``) or rendered (``"eval/accuracy"``)
            names all name the panel ``accuracy``; a figure of another section by its full or
            its last name (``"throughput/samples_per_second"``, ``"samples_per_second"``); or
            ``"all"`` for every curve. Defaults to None: the loss and the monitored metric(s)
            (`default_panels`).
        grammar: Key grammar (eval dataset names, custom prefixes). Defaults to one
            learned from the records.
        title: Figure title. Defaults to None.
        include_training_extras: Add ``learning_rate``, ``grad_norm`` and the run counters
            (``num_tokens``...) to the panels ``"all"`` draws (or that ``metrics`` names).
            Defaults to False.
        columns: Panels per row. Defaults to 2.
        dpi: Resolution of the saved PNG. Defaults to 110.

    Returns:
        The ``matplotlib.figure.Figure``.

    Raises:
        ModuleNotFoundError: matplotlib is not installed (install the ``[plot]`` extra).
        ValueError: There is nothing to plot, or a requested metric has no curve (the
            message says which names come close and lists the available ones).

    Example:
        >>> plot_learning_curves("runs/demo/trainer_state.json", "curves.png")  # doctest: +SKIP
    """
    require("matplotlib", "plot_learning_curves")
    from matplotlib.figure import Figure

    if not isinstance(columns, int) or columns < 1:
        raise ValueError(f"plot_learning_curves: columns must be an int >= 1, got {columns!r}.")
    history, state = load_log_history(source)
    grammar = grammar or KeyGrammar()
    curves = collect_curves(history, state, grammar, include_training_extras)
    available = _every_panel(curves)
    if not available:
        raise ValueError(
            f"plot_learning_curves: no metric to plot in {len(history)} log records "
            "(numeric keys with a step, outside the end-of-training summary)."
        )
    if metrics is None:
        chosen = default_panels(curves)
    elif isinstance(metrics, str) and metrics == ALL:
        chosen = available
    elif isinstance(metrics, str):
        raise TypeError(f"plot_learning_curves: metrics must be a list of names or {ALL!r}, got {metrics!r}; "
                        f"did you mean [{metrics!r}]?")
    else:
        chosen = _panels_for(metrics, curves, grammar, available)
    columns = min(columns, len(chosen))
    rows = math.ceil(len(chosen) / columns)
    figure = Figure(figsize=(6.0 * columns + 2.2, 3.6 * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    colors = series_colors(label for name in chosen for label in curves.series[name])
    legend: dict[str, Any] = {}
    for axis, name in zip(axes, chosen):
        for handle, label in zip(*_draw_panel(axis, name, curves, colors, name in curves.monitors)):
            legend.setdefault(label, handle)
    for axis in axes[len(chosen):]:
        axis.set_visible(False)
    if title:
        figure.suptitle(title)
    # one legend for the figure, outside every panel: it never covers data
    figure.legend(list(legend.values()), list(legend), loc="outside right upper", fontsize=8)
    if output is not None:
        figure.savefig(os.fspath(output), dpi=dpi)
    return figure


def _panels_for(metrics: Sequence[str], curves: LearningCurves, grammar: KeyGrammar,
                available: list[str]) -> list[str]:
    """The panel of each requested name (bare, prefixed, rendered, or the last part of a panel
    of its own section), in order, once each."""
    chosen: list[str] = []
    missing = []
    for wanted in metrics:
        panel = _panel_named(wanted, curves, grammar)
        if panel is None:
            missing.append(wanted)
        elif panel not in chosen:
            chosen.append(panel)
    if missing:
        close = sorted({match for wanted in missing for match in did_you_mean(wanted, available)})
        hint = f" (did you mean {' or '.join(repr(name) for name in close)}?)" if close else ""
        raise ValueError(f"plot_learning_curves: no curve for metrics {missing}{hint}; "
                         f"available: {available}.")
    return chosen


def _panel_named(wanted: str, curves: LearningCurves, grammar: KeyGrammar) -> Optional[str]:
    if wanted in curves.series:
        return wanted
    name = grammar.parse(grammar.canonical(wanted)).name
    if name in curves.series:
        return name
    endings = sorted((panel for panel in curves.series if panel.endswith("/" + wanted)), key=len)
    return endings[0] if endings else None


#: Fixed colours of the series every run has; markers: best step green, early stop red, kept
#: checkpoints blue triangles on the step axis.
FIXED_COLORS = {"training loss": "#7f7f7f", "training": "#8c564b", "train subset": "#1f77b4",
                "eval": "#ff7f0e", "gap": "#9467bd"}
_BEST_COLOR, _STOP_COLOR, _KEPT_COLOR = "#2ca02c", "#d62728", "#1f3a93"
#: Colours for the other series (eval datasets, custom prefixes), none equal to a fixed one.
_MORE_COLORS = ("#e377c2", "#17becf", "#bcbd22", "#ad494a", "#637939", "#7b4173", "#8c6d31", "#e6550d",
                "#31a354", "#000000", "#ce6dbd", "#843c39")


def series_colors(labels: Any) -> dict[str, tuple[str, str]]:
    """A distinct ``(colour, line style)`` for every series label, stable across panels.

    Args:
        labels: The series labels of the figure (any iterable, duplicates allowed).

    Returns:
        ``{label: (colour, linestyle)}``; two labels never share both.
    """
    out = {label: (color, "-") for label, color in FIXED_COLORS.items()}
    others = sorted({label for label in labels} - set(FIXED_COLORS))
    styles = ("-", "--", "-.", ":")
    for index, label in enumerate(others):
        out[label] = (_MORE_COLORS[index % len(_MORE_COLORS)], styles[(index // len(_MORE_COLORS)) % 4])
    return out


def _draw_panel(axis: Any, name: str, curves: LearningCurves, colors: Mapping[str, tuple[str, str]],
                monitored: bool = False) -> tuple[list[Any], list[str]]:
    from matplotlib.ticker import MaxNLocator

    series = curves.series[name]
    for label, points in series.items():
        if label == "gap":
            continue
        steps, values = zip(*sorted(points))
        color, style = colors[label]
        running = label in ("training loss", "training")
        axis.plot(steps, values, label=label, color=color, linestyle=style,
                  linewidth=1.0 if running else 1.5, alpha=0.8 if running else 1.0,
                  marker="." if running else "o", markersize=3)
    handles, labels = [], []
    if "gap" in series:
        twin = axis.twinx()
        steps, values = zip(*sorted(series["gap"]))
        twin.plot(steps, values, color=colors["gap"][0], linestyle=":", marker="^", markersize=3,
                  label="gap (right axis)")
        twin.set_ylabel("gap = train subset - eval", color=colors["gap"][0])
        twin.tick_params(axis="y", colors=colors["gap"][0])
        handles, labels = twin.get_legend_handles_labels()
    elif gap_is_meaningful(name):  # a loss, an accuracy...: not a diagnostic such as trl's entropy
        _shade_gap(axis, series, colors["gap"][0])
    if curves.best_step is not None:
        axis.axvline(curves.best_step, color=_BEST_COLOR, linestyle="--", linewidth=1,
                     label=f"best step {curves.best_step}")
    if curves.stopped_step is not None:
        axis.axvline(curves.stopped_step, color=_STOP_COLOR, linestyle="-.", linewidth=1,
                     label=f"early stop {curves.stopped_step}")
    if curves.kept_steps:
        axis.plot(curves.kept_steps, [0.0] * len(curves.kept_steps), linestyle="none", marker="^",
                  markersize=7, color=_KEPT_COLOR, transform=axis.get_xaxis_transform(), clip_on=False,
                  label=f"kept checkpoints ({len(curves.kept_steps)})")
    axis.set_title(f"{name} (monitored)" if monitored else name)
    axis.set_xlabel("step")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.grid(True, alpha=0.3)
    own_handles, own_labels = axis.get_legend_handles_labels()
    return own_handles + handles, own_labels + labels


def _shade_gap(axis: Any, series: Mapping[str, list[tuple[int, float]]], color: str) -> None:
    train, evaluation = dict(series.get("train subset", [])), dict(series.get("eval", []))
    common = sorted(set(train) & set(evaluation))
    if len(common) >= 2:
        axis.fill_between(common, [train[s] for s in common], [evaluation[s] for s in common],
                          color=color, alpha=0.12, label="gap (shaded)")
