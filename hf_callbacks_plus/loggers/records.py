"""The records a tracker logger queues, and how a batch of them is planned for a backend.

Worker thread: `make_log_record` renders one ``logs`` dict (copied on the training
thread by ``on_log``) with the key grammar and normalizes its values into a
``{"kind": "log", ...}`` record (curves vs. summary); `plan_batch` turns a batch of
queued records (``log``, ``params``, ``tags``) into backend calls, in order: consecutive
log records are grouped and names are sanitized.

What is skipped, and only that: a metric point at a step the run already held from a
*previous* session (the resume boundary: the checkpointed / queried last step per metric when
the training started), so a resumed run does not log twice the steps the earlier process
already sent; a point equal to the last one delivered for its metric (same step, same
value: the ``epoch`` of the end-of-training record repeats the last step's); and records
already delivered (``"sent"``, set after a successful send, so a
batch retried after a partial failure is not sent twice). Every point produced in the current
session is delivered, including a second value at one step (``trainer.evaluate()`` on other
data at the step of the last evaluation): MLflow and JSONL keep both, W&B keeps the first in
its history row and puts the later one in the run summary, with one warning per key.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any, Callable, Optional

from ..metrics.keys import KeyGrammar
from .secrets import REDACTED, looks_like_secret, mask_secrets
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
                texts[name] = REDACTED if looks_like_secret(name, number) else mask_secrets(number)
            else:
                warn(("drop", name), "%s: %r has a value of type %s that is neither a number nor a string; "
                     "it is not logged.", owner, name, type(value).__name__)
    if not metrics and not texts:
        return None
    if timestamp_ms is None:
        timestamp_ms = int(time.time() * 1000)
    return {"kind": "log", "step": int(step), "timestamp": timestamp_ms, "metrics": metrics,
            "summary": texts}


def plan_batch(batch: list[dict[str, Any]], held: dict[str, int], sanitize: Callable[[str], str],
               summary_as_curves: bool, session: Optional[str] = None,
               replayed: Optional[dict[str, int]] = None,
               last_points: Optional[dict[str, tuple[int, float]]] = None) -> Iterator[tuple[str, Any]]:
    """Backend calls for ``batch``, in order: ``("logs", [records])``, ``("params", {})``, ``("tags", {})``.

    Args:
        batch: Queued records. A log record whose ``"session"`` differs from ``session`` was
            produced by an earlier process (replayed from the spill file).
        held: The resume boundary: last step per (sanitized) metric name that the run held
            from previous sessions when this one started. Points at or below it are skipped.
        sanitize: Turns a rendered name into one the backend accepts.
        summary_as_curves: Send numeric summary values as points at the record's step
            (backends without a run summary, such as MLflow).
        session: The current session id. Defaults to None (every record is current).
        replayed: Last step per metric delivered from records of earlier sessions in this
            session (updated here); current points at or below it are skipped too, since the
            earlier process logged those steps. Defaults to a new dict.
        last_points: ``(step, value)`` of the last point per metric; updated as points are
            planned. A point equal to it is not sent again. Defaults to a new dict.

    Yields:
        ``(kind, payload)`` pairs; a planned log record has a ``"source"`` key: the queued
        record, to be marked ``"sent"`` once delivered. Other record kinds are skipped (a
        backend handles them).
    """
    replayed = {} if replayed is None else replayed
    last_points = {} if last_points is None else last_points
    logs: list[dict[str, Any]] = []
    for record in batch:
        kind = record.get("kind")
        if kind == "log":
            if record.get("sent"):
                continue  # delivered before a later part of its batch failed
            step = record["step"]
            earlier = record.get("session", session) != session
            values, summary_in = record["metrics"], record["summary"]
            if summary_as_curves:  # e.g. MLflow: totals are metrics at the last step
                values = {**values, **{k: v for k, v in summary_in.items() if not isinstance(v, str)}}
                summary_in = {k: v for k, v in summary_in.items() if isinstance(v, str)}
            metrics = {}
            for name, value in values.items():
                clean = sanitize(name)
                limit = held.get(clean, -1)
                if not earlier:
                    limit = max(limit, replayed.get(clean, -1))
                if step <= limit or last_points.get(clean) == (step, value):
                    continue  # the run held this step before this session started, or a repeat
                last_points[clean] = (step, value)
                if earlier:
                    replayed[clean] = max(step, replayed.get(clean, -1))
                metrics[clean] = value
            summary = {sanitize(name): value for name, value in summary_in.items()}
            if metrics or summary:
                logs.append({"kind": "log", "step": step, "timestamp": record["timestamp"],
                             "metrics": metrics, "summary": summary, "source": record})
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
