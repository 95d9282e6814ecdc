"""transformers' notebook table with the values our callbacks add beside the trainer's own.

In a Jupyter notebook a Trainer shows each evaluation as a row of the table drawn by
``NotebookProgressCallback.on_evaluate``. That method takes the evaluation's prefix from the
last key ending in ``_loss`` and names each column after what follows the key's first ``_``:
with ``TrainSubsetEvaluation(gap_metrics=True)`` the row showed ``gap_loss`` as "Validation
Loss" and ``gap_accuracy`` as "Accuracy", and the eval values nowhere. `fit_notebook_table`
wraps that method of each such callback of a trainer: transformers draws the row from the
evaluation's own keys (``<prefix>_*``: the row it draws without our callbacks), then the other
keys of the record (train subset, gap, early stopping...) are added to the same row, each in a
column of its own ("Train Subset Loss", "Gap Accuracy", "Early Stopping Wait"). With a
`ConsoleSummary`, the row is its compact line instead (the loss and the monitored metric, their
train-subset values and gaps, the best so far, throughput).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

from ..callbacks.console_summary import ConsoleSummary
from ..core.callback import weak_reference
from ..core.wrapping import wrap_method
from ..metrics.keys import TIMING_NAMES, evaluation_prefix

__all__ = ["column_name", "evaluation_prefix", "fit_notebook_table"]

#: Marks the wrapped ``on_evaluate``, so a second call wraps nothing.
_FITTED = "_hf_callbacks_plus_table"
#: Keys of an evaluation record that are the trainer's and belong to no prefix.
_SHARED_KEYS = ("epoch", "total_flos")


def _is_notebook_callback(callback: Any) -> bool:
    cls = type(callback)
    return cls.__name__ == "NotebookProgressCallback" and cls.__module__.startswith("transformers.")


def fit_notebook_table(trainer: Any) -> None:
    """Make the notebook table of ``trainer`` show our values beside the trainer's own columns.

    With a `ConsoleSummary` among the trainer's callbacks the row is its line: the trainer's
    columns for the metrics the line shows (the loss, the monitored metric), then the line's
    train-subset values, gaps, best so far and throughput. Without it, every other key of the
    record gets a column. A no-op without transformers' ``NotebookProgressCallback`` (outside a
    notebook) and for a callback already fitted.

    Args:
        trainer: A ``transformers.Trainer`` (or subclass).
    """
    for callback in getattr(getattr(trainer, "callback_handler", None), "callbacks", ()):
        if _is_notebook_callback(callback):
            wrap_method(callback, "on_evaluate", lambda original, callback=callback: _fitted_on_evaluate(
                callback, original, weak_reference(trainer)), marker=_FITTED)


def _summary_of(trainer: Any) -> Optional[ConsoleSummary]:
    callbacks = getattr(getattr(trainer, "callback_handler", None), "callbacks", ())
    return next((callback for callback in callbacks if isinstance(callback, ConsoleSummary)), None)


def column_name(key: str) -> str:
    """``train_subset_loss`` -> ``Train Subset Loss``, ``early_stopping/wait`` -> ``Early Stopping Wait``."""
    return " ".join(part.capitalize() for part in re.split(r"[_/]+", key) if part)


def _fitted_on_evaluate(callback: Any, original: Callable[..., Any],
                        trainer: Callable[[], Any]) -> Callable[..., Any]:
    def on_evaluate(args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> Any:
        prefix = evaluation_prefix(metrics) if isinstance(metrics, dict) else None
        if prefix is None:
            return original(args, state, control, metrics=metrics, **kwargs)
        own = {k: v for k, v in metrics.items() if k in _SHARED_KEYS or str(k).startswith(f"{prefix}_")}
        extra = {column_name(str(k)): v for k, v in metrics.items() if k not in own}
        summary = _summary_of(trainer())
        if summary is not None:  # the row is the summary's line
            line = summary.evaluation_line(metrics, state, args, prefix)
            shown = {item.key for item in line.metrics}
            own = {k: v for k, v in own.items()
                   if k in shown or k in _SHARED_KEYS or str(k)[len(prefix) + 1:] in TIMING_NAMES}
            extra = line.columns()
        view = dict(own)
        result = original(args, state, control, metrics=view, **kwargs)
        for key in own:  # what transformers removes from the record (timings), removed as without us
            if key not in view:
                metrics.pop(key, None)
        if extra:
            _add_columns(callback, state, extra)
        return result

    return on_evaluate


def _add_columns(callback: Any, state: Any, columns: dict[str, Any]) -> None:
    tracker = getattr(callback, "training_tracker", None)
    if tracker is not None:  # during training: the row just written gets the columns
        first = getattr(callback, "first_column", "Step")
        tracker.write_line({first: int(state.epoch) if first == "Epoch" else state.global_step, **columns})
        tracker.display()
        return
    from transformers.utils import notebook  # outside training: a table of their own, below

    table = notebook.text_to_html_table([list(columns), list(columns.values())])
    notebook.disp.display(notebook.disp.HTML(table))
