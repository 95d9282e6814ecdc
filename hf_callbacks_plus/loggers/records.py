"""The records a tracker logger queues, and how a batch of them is planned for a backend.

Worker thread: :func:`make_log_record` renders one ``logs`` dict (copied on the training
thread by ``on_log``) with the key grammar and normalizes its values into a
``{"kind": "log", ...}`` record (curves vs. summary); :func:`plan_batch` turns a batch of
queued records (``log``, ``params``, ``tags``) into backend calls, in order: consecutive
log records are grouped, names are sanitized, and every metric point at a step the run
already holds is skipped (resumed run, re-evaluation at one step), so nothing is logged
twice.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any, Callable, Optional

from ..metrics.keys import KeyGrammar
from .values import WarnOnce, normalize_value

__all__ = ["make_log_record", "plan_batch"]


def make_log_record(logs: dict[str, Any], step: int, grammar: KeyGrammar, nonfinite: str, warn: WarnOnce,
                    owner: str, timestamp_ms: Optional[int] = None) -> Optional[dict[str, Any]]:
    """Render and normalize one ``on_log`` dict; None when nothing is left to log.

    Args:
        logs: The ``logs`` of ``on_log``.
        step: ``state.global_step``.
        grammar: Renders the keys (and learns prefixes from ``logs``).
        nonfinite: ``"keep"`` or ``"drop"`` NaN/Inf values (one warning per key).
        warn: Warns once per key about dropped values.
        owner: The logger's class name, shown in warnings.
        timestamp_ms: When the values were logged. Defaults to now.

    Returns:
        ``{"kind": "log", "step", "timestamp" (ms), "metrics", "summary"}`` or None.
    """
    grammar.learn_from_metrics(logs)
    curves, summary = grammar.render_logs(logs)
    metrics: dict[str, float] = {}
    texts: dict[str, Any] = {}
    for target, values in ((metrics, curves), (texts, summary)):
        for name, value in values.items():
            kind, number = normalize_value(value)
            if kind == "number":
                if nonfinite == "drop" and (math.isnan(number) or math.isinf(number)):
                    warn(("nonfinite", name), "%s: dropping non-finite value %r of %r (nonfinite='drop').",
                         owner, number, name)
                    continue
                target[name] = number
            elif kind == "text":
                texts[name] = number
            else:
                warn(("drop", name), "%s: %r has a value of type %s that is neither a number nor a string; "
                     "it is not logged.", owner, name, type(value).__name__)
    if not metrics and not texts:
        return None
    if timestamp_ms is None:
        timestamp_ms = int(time.time() * 1000)
    return {"kind": "log", "step": int(step), "timestamp": timestamp_ms, "metrics": metrics,
            "summary": texts}


def plan_batch(batch: list[dict[str, Any]], seen: dict[str, int], sanitize: Callable[[str], str],
               summary_as_curves: bool) -> Iterator[tuple[str, Any]]:
    """Backend calls for ``batch``, in order: ``("logs", [records])``, ``("params", {})``, ``("tags", {})``.

    Args:
        batch: Queued records.
        seen: Last step logged per (sanitized) metric name; updated as points are planned, so
            when a ``"logs"`` item is yielded, ``seen`` covers exactly the points planned so far.
        sanitize: Turns a rendered name into one the backend accepts.
        summary_as_curves: Send numeric summary values as points at the record's step
            (backends without a run summary, such as MLflow).

    Yields:
        ``(kind, payload)`` pairs; other record kinds are skipped (a backend handles them).
    """
    logs: list[dict[str, Any]] = []
    for record in batch:
        kind = record.get("kind")
        if kind == "log":
            step = record["step"]
            values, summary_in = record["metrics"], record["summary"]
            if summary_as_curves:  # e.g. MLflow: totals are metrics at the last step
                values = {**values, **{k: v for k, v in summary_in.items() if not isinstance(v, str)}}
                summary_in = {k: v for k, v in summary_in.items() if isinstance(v, str)}
            metrics = {}
            for name, value in values.items():
                clean = sanitize(name)
                if seen.get(clean, -1) >= step:
                    continue  # already logged (resumed run or re-evaluation at one step)
                seen[clean] = step
                metrics[clean] = value
            summary = {sanitize(name): value for name, value in summary_in.items()}
            if metrics or summary:
                logs.append({"kind": "log", "step": step, "timestamp": record["timestamp"],
                             "metrics": metrics, "summary": summary})
            continue
        if logs:
            yield "logs", logs
            logs = []
        if kind == "params":
            yield "params", record["params"]
        elif kind == "tags":
            yield "tags", record["tags"]
    if logs:
        yield "logs", logs
