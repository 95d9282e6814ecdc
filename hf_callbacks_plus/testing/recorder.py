"""Record the events a trainer fires and compare two recordings.

`EventRecorder` is a callback that writes down every event it receives as a
`TraceEvent` (name, ``global_step``, ``epoch``, the control flags after the event,
the sorted keys of ``logs``/``metrics``). `diff_traces` explains the first place two
recordings disagree. Together they let you test a callback: run it, record, compare with
what you expect, or run the same configuration in ``transformers.Trainer`` and in
`LightweightTrainer` and compare both traces.

Example:
    >>> from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments
    >>> from hf_callbacks_plus.testing import EventRecorder
    >>> recorder = EventRecorder()
    >>> trainer = LightweightTrainer(
    ...     LoopArguments(max_steps=2, logging_steps=1, save_strategy="no", disable_tqdm=True),
    ...     train_step=lambda batch: 0.5, train_data=[0, 1], callbacks=[recorder])
    >>> _ = trainer.train()  # doctest: +SKIP
    >>> recorder.names()[:4]  # doctest: +SKIP
    ['on_init_end', 'on_train_begin', 'on_epoch_begin', 'on_step_begin']
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from ..core.callback import EVENTS, TrainerCallback
from ..core.handler import EVENT_KWARGS

__all__ = ["CONTROL_FLAGS", "EventRecorder", "TraceEvent", "diff_traces"]

#: The ``TrainerControl`` flags recorded after each event, in this order.
CONTROL_FLAGS = ("should_training_stop", "should_epoch_stop", "should_save", "should_evaluate", "should_log")
#: Keyword arguments every event receives (``tokenizer`` on transformers < 4.46): not recorded.
_SHARED_KWARGS = frozenset({*EVENT_KWARGS, "tokenizer"})
_FLAG_LETTERS = {"should_training_stop": "T", "should_epoch_stop": "E", "should_save": "S",
                 "should_evaluate": "V", "should_log": "L"}  # fmt: skip


@dataclass(frozen=True)
class TraceEvent:
    """One event as seen by `EventRecorder`.

    Attributes:
        event: The event name, e.g. ``"on_step_end"``.
        global_step: ``state.global_step`` when the event fired.
        epoch: ``state.epoch`` (rounded to 10 decimals), or None.
        flags: The names of the control flags that were True after the event (in the order of
            `CONTROL_FLAGS`).
        keys: Sorted keys of the event's ``logs`` or ``metrics``; for a custom event without
            them, of its own keyword arguments (``loss``, ``exception``, ``checkpoint``...).
            Empty when it has none.
        values: A shallow copy of what ``keys`` names; not compared by ``==``.
        history_length: ``len(state.log_history)`` when the event fired (tells whether a
            record was already appended, e.g. ``on_pre_log`` vs ``on_log``); not compared.
    """

    event: str
    global_step: int
    epoch: Optional[float]
    flags: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    values: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False, hash=False)
    history_length: int = field(default=0, compare=False, repr=False)

    def describe(self) -> str:
        """A one-line summary: ``on_log step=3 epoch=0.375 flags=L keys=[epoch, loss]``."""
        letters = "".join(_FLAG_LETTERS[flag] for flag in self.flags) or "-"
        text = f"{self.event:<22} step={self.global_step:<4} epoch={self.epoch!s:<8} flags={letters:<5}"
        if self.keys:
            text += f" keys=[{', '.join(self.keys)}]"
        return text

    def without_keys(self, ignore: Iterable[str]) -> TraceEvent:
        """A copy whose ``keys`` leave out ``ignore``."""
        ignored = set(ignore)
        return TraceEvent(
            self.event,
            self.global_step,
            self.epoch,
            self.flags,
            tuple(key for key in self.keys if key not in ignored),
            self.values,
            self.history_length,
        )


class EventRecorder(TrainerCallback):
    """A callback that records every event it receives, for tests.

    Put it in ``callbacks=[...]``; it records standard events always, and the custom events
    you name (``on_pre_log``, ``on_training_loss``, ``on_exception``...) when the trainer fires
    them (``LightweightTrainer`` and ``TrainerPlus`` do; a stock ``transformers.Trainer``
    cannot). The flags are read after the callbacks placed before it ran, so keep it last
    among yours to see their combined effect.

    Args:
        custom_events: Extra event names to record. Defaults to ().
        skip: Standard events not to record (e.g. ``("on_prediction_step",)``). Defaults to ().

    Example:
        >>> recorder = EventRecorder(custom_events=["on_pre_log"])
        >>> # trainer = LightweightTrainer(..., callbacks=[MyCallback(), recorder]); trainer.train()
        >>> # assert recorder.count("on_evaluate") == 3
        >>> # assert recorder.steps("on_save") == [10, 20]
    """

    def __init__(self, custom_events: Sequence[str] = (), skip: Sequence[str] = ()) -> None:
        self.events: list[TraceEvent] = []
        self.custom_events = tuple(custom_events)
        self.skip = frozenset(skip)
        for name in self.custom_events:
            setattr(self, name, functools.partial(self._record, name))

    def _record(self, event: str, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if event in self.skip:
            return
        data = kwargs.get("logs")
        if data is None:
            data = kwargs.get("metrics")
        if data is None and event not in EVENTS:  # a custom event: its own arguments
            data = {key: value for key, value in kwargs.items() if key not in _SHARED_KWARGS} or None
        epoch = state.epoch
        self.events.append(
            TraceEvent(
                event=event,
                global_step=state.global_step,
                epoch=None if epoch is None else round(float(epoch), 10),
                flags=tuple(flag for flag in CONTROL_FLAGS if getattr(control, flag, False)),
                keys=tuple(sorted(data)) if isinstance(data, Mapping) else (),
                values=dict(data) if isinstance(data, Mapping) else {},
                history_length=len(getattr(state, "log_history", None) or ()),
            )
        )

    # One explicit method per standard event, so every trainer's handler calls it.
    def on_init_end(self, args, state, control, **kwargs):
        self._record("on_init_end", args, state, control, **kwargs)

    def on_train_begin(self, args, state, control, **kwargs):
        self._record("on_train_begin", args, state, control, **kwargs)

    def on_train_end(self, args, state, control, **kwargs):
        self._record("on_train_end", args, state, control, **kwargs)

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._record("on_epoch_begin", args, state, control, **kwargs)

    def on_epoch_end(self, args, state, control, **kwargs):
        self._record("on_epoch_end", args, state, control, **kwargs)

    def on_step_begin(self, args, state, control, **kwargs):
        self._record("on_step_begin", args, state, control, **kwargs)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._record("on_pre_optimizer_step", args, state, control, **kwargs)

    def on_optimizer_step(self, args, state, control, **kwargs):
        self._record("on_optimizer_step", args, state, control, **kwargs)

    def on_substep_end(self, args, state, control, **kwargs):
        self._record("on_substep_end", args, state, control, **kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        self._record("on_step_end", args, state, control, **kwargs)

    def on_evaluate(self, args, state, control, **kwargs):
        self._record("on_evaluate", args, state, control, **kwargs)

    def on_predict(self, args, state, control, metrics=None, **kwargs):
        self._record("on_predict", args, state, control, metrics=metrics, **kwargs)

    def on_save(self, args, state, control, **kwargs):
        self._record("on_save", args, state, control, **kwargs)

    def on_log(self, args, state, control, **kwargs):
        self._record("on_log", args, state, control, **kwargs)

    def on_prediction_step(self, args, state, control, **kwargs):
        self._record("on_prediction_step", args, state, control, **kwargs)

    def on_push_begin(self, args, state, control, **kwargs):
        self._record("on_push_begin", args, state, control, **kwargs)

    # -- queries -------------------------------------------------------------------------
    def names(self) -> list[str]:
        """The recorded event names, in order."""
        return [event.event for event in self.events]

    def of(self, event: str) -> list[TraceEvent]:
        """The recorded occurrences of one event."""
        return [recorded for recorded in self.events if recorded.event == event]

    def count(self, event: str) -> int:
        """How many times ``event`` fired."""
        return len(self.of(event))

    def steps(self, event: str) -> list[int]:
        """The ``global_step`` of each occurrence of ``event``."""
        return [recorded.global_step for recorded in self.of(event)]

    def logs(self) -> list[Mapping[str, Any]]:
        """The ``logs`` of every ``on_log``, in order (copies taken when they fired)."""
        return [recorded.values for recorded in self.of("on_log")]

    def clear(self) -> None:
        """Forget everything recorded so far."""
        self.events.clear()

    def format(self) -> str:
        """The whole trace, one numbered line per event."""
        return "\n".join(f"{index:4d}  {event.describe()}" for index, event in enumerate(self.events))


def _fields_differing(left: TraceEvent, right: TraceEvent) -> list[str]:
    out = []
    for name in ("event", "global_step", "epoch", "flags", "keys"):
        if getattr(left, name) != getattr(right, name):
            out.append(f"{name}: {getattr(left, name)!r} != {getattr(right, name)!r}")
    return out


def diff_traces(
    expected: Sequence[TraceEvent] | EventRecorder,
    actual: Sequence[TraceEvent] | EventRecorder,
    *,
    ignore_keys: Iterable[str] = (),
    ignore_events: Iterable[str] = (),
    context: int = 3,
    names: tuple[str, str] = ("expected", "actual"),
) -> Optional[str]:
    """Explain the first difference between two traces, or return None when they match.

    Args:
        expected: A recorder or its ``events``.
        actual: A recorder or its ``events``.
        ignore_keys: Log/metric keys left out of the comparison (e.g. ``{"total_flos"}``).
            Defaults to ().
        ignore_events: Event names dropped from both traces before comparing. Defaults to ().
        context: Events shown before the difference. Defaults to 3.
        names: Labels of the two traces in the report. Defaults to ``("expected", "actual")``.

    Returns:
        None if the traces are equal, else a readable report: the index of the first
        difference, the fields that differ, and both traces around it.

    Example:
        >>> a = [TraceEvent("on_step_end", 1, 0.5), TraceEvent("on_log", 1, 0.5, keys=("loss",))]
        >>> b = [TraceEvent("on_step_end", 1, 0.5), TraceEvent("on_log", 1, 0.5, keys=("epoch", "loss"))]
        >>> print(diff_traces(a, b))  # doctest: +ELLIPSIS
        traces differ at event #1 ...
    """
    dropped = set(ignore_events)
    ignored = set(ignore_keys)

    def prepare(trace: Sequence[TraceEvent] | EventRecorder) -> list[TraceEvent]:
        events = trace.events if isinstance(trace, EventRecorder) else list(trace)
        return [event.without_keys(ignored) for event in events if event.event not in dropped]

    left, right = prepare(expected), prepare(actual)
    index = next((i for i, (a, b) in enumerate(zip(left, right)) if a != b), None)
    if index is None:
        if len(left) == len(right):
            return None
        index = min(len(left), len(right))
        reason = [f"{names[0]} has {len(left)} events, {names[1]} has {len(right)}"]
    else:
        reason = _fields_differing(left[index], right[index])
    start = max(0, index - context)
    lines = [f"traces differ at event #{index}: " + "; ".join(reason)]
    for label, events in zip(names, (left, right)):
        last = min(index + context, len(events) - 1)
        lines.append(f"--- {label} (events {start}..{last} of {len(events)})")
        for position in range(start, min(index + context + 1, len(events))):
            marker = ">>" if position == index else "  "
            lines.append(f"{marker}{position:4d}  {events[position].describe()}")
        if index >= len(events):
            lines.append(f">>{index:4d}  <end of trace>")
    return "\n".join(lines)
