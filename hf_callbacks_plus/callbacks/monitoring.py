"""`MonitoringCallback`: what the callbacks watching a metric share (`EarlyStopping`,
`KeepBestCheckpoints`, `ConsoleSummary`, `TerminateOnNonFinite`), as Keras's ``MonitorCallback``.

Their `Monitor` objects (``metrics/monitor.py``) say which key, which direction, did you mean and
can this run produce it; this base owns the rest: the binding (the trainer, weakly, and its key
grammar), the checks at train begin (`watch_begin`) and before the first step (the producer of a
``train_subset_``/``gap_`` metric, which announces itself at train begin: `announce_metrics`),
strict or not (`fail`), the first record that should hold each metric (`check_record`), the
bare-name rule (`lookup`), a refusal only the first evaluation can make (`refuse`: the trainer
saves that step first, and `watch_end` raises naming the checkpoint), and one observation per log
record (`observe_record`: at ``on_pre_log``, or at ``on_log`` in a stock Trainer).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Callable, Optional

from ..core.callback import TrainerCallback, weak_reference
from ..core.checkpoint_folders import checkpoint_folder, get_last_checkpoint
from ..core.claims import TrainBeginClaims
from ..metrics.keys import TRAIN_SUBSET_PREFIX, KeyGrammar, grammar_for
from ..metrics.monitor import Monitor

__all__ = ["MonitoringCallback", "announce_metrics"]

logger = logging.getLogger("hf_callbacks_plus")

_CLAIMS = TrainBeginClaims()
#: Sections of metrics a callback makes, and that callback.
_PRODUCERS = {TRAIN_SUBSET_PREFIX: "TrainSubsetEvaluation(...)",
              "gap": "TrainSubsetEvaluation(gap_metrics=True)"}
#: Where the run's ``TrainerState`` (one per ``train()``, shared by its callbacks) holds the
#: announced sections; not a dataclass field, so never saved.
SECTIONS = "hf_callbacks_plus_sections"


def announce_metrics(state: Any, sections: Iterable[str]) -> None:
    """Say, in ``on_train_begin``, which sections of keys this callback adds (``"train_subset"``)."""
    vars(state).setdefault(SECTIONS, set()).update(sections)


def _choice(value: Any) -> str:
    return str(getattr(value, "value", value))


class MonitoringCallback(TrainerCallback):
    """Base of the callbacks that watch metrics (see the module docstring).

    Subclasses fill ``self._monitors`` (sharing ``self.grammar``), call `watch_begin` in
    ``on_train_begin`` and `watch_end` in ``on_train_end``, and implement `observe_record` to read
    log records. ``strict``: a metric that cannot show up raises (True) or warns once.
    """

    strict: bool = True
    #: Said after a missing metric's message: what the callback cannot do without it.
    without_it: str = ""

    def __init__(self) -> None:
        self.grammar = KeyGrammar()
        self._trainer: Callable[[], Any] = lambda: None
        self._monitors: list[Monitor] = []
        self._confirmed: set[str] = set()
        self._warned: set[str] = set()
        self._pre_logged: Any = None
        self._refusal: Optional[tuple[type, str]] = None
        self._refusal_checkpoint: Optional[str] = None
        self._producers_checked, self._training, self._evaluates = True, False, False

    def bind(self, trainer: Any) -> MonitoringCallback:
        """Share the trainer's key grammar (called by every runner; see ``bind_trainer``)."""
        self._trainer = weak_reference(trainer)
        self.grammar = grammar_for(trainer)
        for monitor in self._monitors:
            monitor.grammar = self.grammar
        return self

    @property
    def trainer(self) -> Any:
        """The bound trainer, or None."""
        return self._trainer()

    # -- train begin and end ---------------------------------------------------------------
    def watch_begin(self, args: Any, state: Any, *, claim: Optional[str] = None) -> None:
        """Forget the last run; check each monitor against this one (`Monitor.check_run`,
        `run_problem`); claim ``self.state_key`` when ``claim`` says why two instances clash."""
        self._confirmed, self._pre_logged, self._refusal, self._refusal_checkpoint = set(), None, None, None
        self._producers_checked, self._training = False, True
        self._evaluates = _choice(getattr(args, "eval_strategy", "no")) != "no"
        for monitor in self._monitors:
            problem = monitor.check_run(args, self.trainer) or self.run_problem(args, monitor)
            if problem is not None:
                self.fail(ValueError, problem)
        if claim is not None:
            _CLAIMS.claim(state, self.state_key, self, claim)  # type: ignore[attr-defined]

    def run_problem(self, args: Any, monitor: Monitor) -> Optional[str]:
        """Why this callback cannot work with ``monitor`` in the run ``args`` configures, or None."""
        return None

    def watch_end(self, args: Any, state: Any, claim: bool = False) -> None:
        """Release the claim; raise the refusal the run stopped for (see `refuse`)."""
        self._training = False
        if claim:
            _CLAIMS.release(state, self.state_key, self)  # type: ignore[attr-defined]
        if self._refusal is None:
            return
        (error, message), self._refusal = self._refusal, None
        step, checkpoint = int(getattr(state, "global_step", 0)), self._refusal_checkpoint
        if checkpoint is not None:
            raise error(f"{message} Training stopped at step {step} after saving {checkpoint}: fix it, then "
                        f"resume with trainer.train(resume_from_checkpoint={checkpoint!r}).")
        last = get_last_checkpoint(args.output_dir) if getattr(args, "output_dir", None) else None
        newest = f"the newest checkpoint is {last}." if last else "there is no checkpoint to resume from."
        raise error(f"{message} Training stopped at step {step}, unsaved (save_strategy="
                    f"{_choice(getattr(args, 'save_strategy', None))!r} saved no checkpoint there); {newest}")

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Remember the checkpoint a refusal waited for."""
        super().on_save(args, state, control, **kwargs)
        if self._refusal is not None and self._refusal_checkpoint is None:
            self._refusal_checkpoint = checkpoint_folder(args.output_dir, int(state.global_step))

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Before the first step, every producer has announced itself: `producer_problem`."""
        if not self._producers_checked:
            self._producers_checked = True
            for monitor in self._monitors:
                problem = self.producer_problem(monitor, state)
                if problem is not None:
                    self.fail(ValueError, problem)

    on_step_begin = on_epoch_begin

    def producer_problem(self, monitor: Monitor, state: Any) -> Optional[str]:
        """A ``train_subset_``/``gap_`` metric that no callback of the run announced, or None."""
        raw = self.grammar.canonical(self.grammar.candidates(monitor.monitor)[0])
        section = next((section for section in _PRODUCERS if raw.startswith(f"{section}_")), None)
        if section is None or any(raw.startswith(f"{made}_") for made in vars(state).get(SECTIONS, ())):
            return None
        return (f"{type(self).__name__}: monitor={monitor.monitor!r} is a {section}_* metric, which only "
                f"{_PRODUCERS[section]} reports, and no callback of this trainer does. Add "
                f"{_PRODUCERS[section]} to the trainer's callbacks (with a stock Trainer, "
                f"run_before_integrations(trainer) too).")

    # -- failures --------------------------------------------------------------------------
    def fail(self, error: type, message: str) -> None:
        """Raise ``error(message)`` when strict; else warn once per message and go on."""
        if self.strict:
            raise error(message)
        if message not in self._warned:
            self._warned.add(message)
            logger.warning("%s (strict=False: continuing.)", message)

    def refuse(self, error: type, message: str, state: Any, control: Any) -> None:
        """A refusal during training (strict): the trainer saves this step and stops; `watch_end`
        raises. Not strict, as `fail`; outside training, a warning."""
        if not self.strict:
            self.fail(error, message)
        elif not self._training:
            logger.warning("%s (outside training: not raised.)", message)
        elif self._refusal is None:
            self._refusal = (error, message)
            control.should_save = control.should_training_stop = True
            logger.warning("%s Stopping: the trainer saves checkpoint-%s first, then train() raises.",
                           message, int(getattr(state, "global_step", 0)))

    # -- records ---------------------------------------------------------------------------
    def lookup(self, monitor: Monitor, values: Mapping[str, Any],
               from_evaluate: bool) -> tuple[Optional[str], Any]:
        """``(key, raw value)`` of ``monitor`` in a record, or ``(None, None)``. A bare name means
        ``eval_<name>`` in a run that evaluates, never a training record's key of that name."""
        key, raw = monitor.lookup(values)
        if key is not None and not from_evaluate and self._evaluates and key == monitor.monitor \
                and not self.grammar.has_section(monitor.monitor):
            return None, None
        return key, raw

    def check_record(self, values: Any, from_evaluate: bool, state: Any, control: Any) -> None:
        """The first record that should hold a monitored metric and does not: `refuse` (the keys
        present, a "did you mean"). Once a record held it, later ones may lack it."""
        if not isinstance(values, Mapping):
            return
        for monitor in self._monitors:
            if monitor.monitor in self._confirmed:
                continue
            problem = None
            if self.lookup(monitor, values, from_evaluate)[0] is None:
                problem = monitor.missing_problem(values, from_evaluate)
                if problem is None:
                    continue
            self._confirmed.add(monitor.monitor)
            if problem is not None:
                self.refuse(RuntimeError, problem + self.without_it, state, control)

    def observe_record(self, args: Any, state: Any, control: Any, logs: dict, **kwargs: Any) -> None:
        """Read one log record, once (at ``on_pre_log``, else at ``on_log``)."""

    def on_pre_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """`observe_record`, before any ``on_log`` reads the record."""
        if isinstance(logs, dict):
            self._pre_logged = logs
            self.observe_record(args, state, control, logs, **kwargs)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """`observe_record` when ``on_pre_log`` did not (a stock Trainer)."""
        if isinstance(logs, dict) and logs is not self._pre_logged:
            self.observe_record(args, state, control, logs, **kwargs)
        self._pre_logged = None
