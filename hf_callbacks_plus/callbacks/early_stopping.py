"""Stateful early stopping for ``transformers.Trainer``, ``TrainerPlus`` and ``LightweightTrainer``.

The callback is the I/O part: it finds the metric in what the trainer reports, asks the pure
`StoppingPolicy` (``early_stopping_policy.py``) what one observation means, stores the
answer, reports it and tells the user. What counts as an improvement is the `Monitor`'s
(``metrics/monitor.py``); the checks of the run against the metric are in
``early_stopping_diagnosis.py``; ``StopReason``/``Decision`` and the stop sentence in
``stop_reason.py``.

See ``docs/early_stopping.md`` for the feature table against transformers, Lightning and
Keras, and the migration from ``transformers.EarlyStoppingCallback``.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any, Callable, Optional

from ..core.claims import TrainBeginClaims
from ..core.stateful import SelfRestoringState
from ..metrics.keys import KeyGrammar, grammar_for
from ..metrics.monitor import Monitor, check_mode, infer_mode
from ..metrics.numbers import to_float
from .best_weights import BestWeights, step_checkpoint
from .console import tell
from .distributed import broadcast_from_rank0, distributed_world_size
from .early_stopping_diagnosis import (
    check_against_args,
    check_against_trainer,
    expected_prefix,
    missing_metric_problem,
    misspelt_against_args,
    monitor_from_args,
    typo_suggestion,
)
from .early_stopping_policy import Progress, StoppingPolicy
from .stop_reason import Decision, StopReason, stop_message, summary_message

__all__ = ["Decision", "EarlyStopping", "StopReason"]

logger = logging.getLogger("hf_callbacks_plus")

_ARGUMENTS = (
    "monitor", "mode", "patience", "min_delta", "min_delta_mode", "baseline", "start_from_step",
    "start_from_epoch", "stopping_threshold", "divergence_threshold", "check_finite", "strict",
    "restore_best", "reset_on_resume", "sync_decision", "report", "log_name", "verbose",
)
_FLAGS = ("strict", "restore_best", "reset_on_resume", "sync_decision", "report", "verbose")
#: The settings of the rule (`StoppingPolicy`) and of the improvement test (`Monitor`).
_POLICY = ("patience", "baseline", "stopping_threshold", "divergence_threshold", "start_from_step",
           "start_from_epoch", "check_finite")
#: The state keys claimed at the train begin of the current ``train()`` (duplicates refused).
_CLAIMS = TrainBeginClaims()
_SAME_KEY = ("the same monitor and mode, so their states would mix on resume and their reports would "
             "overwrite each other. Give each a distinct log_name, e.g. EarlyStopping(..., "
             "log_name='patient') and EarlyStopping(..., log_name='strict').")


def _setting(name: str) -> property:
    """A constructor argument as an attribute: read from the one store (``_options``); a write is
    validated like the constructor argument and takes effect at the next observation."""

    def get(self: EarlyStopping) -> Any:
        return self._options[name]

    def set_(self: EarlyStopping, value: Any) -> None:
        self._configure({name: value})

    return property(get, set_, doc=f"The ``{name}`` argument (settable; validated, effective at once).")


def _fixed(name: str) -> property:
    """A constructor argument that names the instance's saved state: read-only."""

    def get(self: EarlyStopping) -> Any:
        return self._options[name]

    def set_(self: EarlyStopping, value: Any) -> None:
        raise AttributeError(
            f"EarlyStopping.{name} is read-only: with monitor, mode and log_name it names the instance's "
            f"saved state (state_key={self.state_key!r}). Create a new EarlyStopping({name}={value!r}, ...)."
        )

    return property(get, set_, doc=f"The ``{name}`` argument (read-only: part of ``state_key``).")


def _check_own_arguments(monitor: Any, flags: dict[str, Any], log_name: Any) -> None:
    """The callback's own arguments (the metric's and the rule's are checked where they live)."""
    if monitor is not None and (not isinstance(monitor, str) or not monitor):
        raise TypeError(
            f"EarlyStopping: monitor must be a non-empty string (e.g. 'eval_loss') or None "
            f"(use args.metric_for_best_model), got {monitor!r}."
        )
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"EarlyStopping: {name} must be True or False, got {value!r}.")
    if log_name is not None and (not isinstance(log_name, str) or not log_name or "/" in log_name):
        raise ValueError(f"EarlyStopping: log_name must be None or a non-empty string without '/', "
                         f"got {log_name!r}.")


def _weak(trainer: Any) -> Callable[[], Any]:
    """A weak reference to the trainer (a strong one for objects that refuse weak references)."""
    try:
        return weakref.ref(trainer)
    except TypeError:
        return lambda: trainer


class EarlyStopping(SelfRestoringState):
    """Stop training when a monitored metric stops improving; survives checkpoint/resume.

    Patience counts *observations of the monitored metric*: evaluations for eval/train-subset
    metrics, logging steps for the training loss. Training stops once ``patience``
    consecutive observations did not improve on the best by more than ``min_delta``.

    Args:
        monitor: The metric: ``"eval_loss"``, ``"eval_<dataset>_accuracy"``, ``"train_subset_accuracy"``,
            ``"gap_loss"``, ``"loss"`` (training loss), a bare name resolved like
            ``metric_for_best_model`` or a rendered name (``"eval/accuracy"``). Defaults to
            None: ``args.metric_for_best_model`` (drop-in for ``EarlyStoppingCallback``).
        mode: ``"min"``, ``"max"`` or ``"auto"`` (from the name; with ``monitor=None`` from
            ``args.greater_is_better``). Defaults to ``"auto"``.
        patience: Observations without improvement before stopping; 0 behaves like 1
            (stop at the first one, as in Keras). Defaults to 3.
        min_delta: Margin an improvement must exceed (>= 0). Defaults to 0.0.
        min_delta_mode: ``"absolute"`` or ``"relative"`` (fraction of ``abs(best)``).
            Defaults to ``"absolute"``.
        baseline: A value to beat before anything counts as best; training stops with
            ``BASELINE_NOT_REACHED`` when ``patience`` observations fail to beat it. Defaults to None.
        start_from_step: Warm-up: observations at ``global_step <= start_from_step`` are
            ignored (except the non-finite check). Defaults to 0 (no warm-up).
        start_from_epoch: Warm-up in epochs: observations at ``epoch <= start_from_epoch``
            are ignored. Defaults to 0.
        stopping_threshold: Stop as soon as the value reaches it (good enough). Defaults to None.
        divergence_threshold: Stop as soon as the value is worse than it (hopeless).
            Defaults to None.
        check_finite: Stop when the value is NaN/Inf. A non-finite value is never best
            either way. Defaults to True.
        strict: Raise when the metric cannot show up, as early as that is known: at train begin
            (from ``args`` and the bound trainer) or at the first evaluation that should hold it
            (listing the keys present, with a "did you mean"). Later evaluations without it are
            skipped observations; nothing raises once training is over (a warning instead).
            False warns once and keeps training. Defaults to True.
        restore_best: At the end of training, load the best weights: from the checkpoint of
            the best step when it exists, else from an in-memory CPU copy (one copy of the
            ``state_dict``, kept until a checkpoint safe from rotation holds the same
            weights). Defaults to False.
        reset_on_resume: When resuming from a checkpoint written after this callback
            stopped training, forget the stop and the counter (keep the best) and train on.
            Defaults to False: stop again (no step in TrainerPlus/LightweightTrainer, one in a Trainer).
        sync_decision: Under ``torch.distributed``, broadcast rank 0's decision so every
            rank stops at the same step. Defaults to True.
        report: Add ``early_stopping/...`` keys (best value, best step, wait, stopped step,
            reason) to the next log record. Defaults to True.
        log_name: Report under ``early_stopping/<log_name>/...`` (give each instance its
            own when using several). Defaults to None (``early_stopping/...``).
        verbose: Print one line to stderr when training stops (which rule, the value, the
            best so far) and a summary at train end (stop step, reason, best value and
            step), on the main process only; the lines also go to the ``hf_callbacks_plus``
            logger at DEBUG. False: the stop line is only logged (INFO, WARNING for a
            non-finite or diverging value) and there is no summary. Defaults to True.

    Every argument is also an attribute: settings can be changed later (validated like the
    argument, effective at the next observation); ``monitor``, ``mode`` and ``log_name`` name
    the saved state (`state_key`) and are read-only.

    Raises:
        TypeError, ValueError: At construction for bad arguments (a misspelt monitor gets a
            "did you mean"); at train begin for a metric the trainer cannot produce, two
            instances with one ``state_key`` or one instance listed twice. Messages name the
            argument, the value and the valid choices.

    Example:
        >>> stopper = EarlyStopping("eval_loss", patience=2, min_delta=0.01)
        >>> stopper.state_key
        'EarlyStopping[eval_loss,min]'
    """

    def __init__(
        self,
        monitor: Optional[str] = None,
        mode: str = "auto",
        patience: int = 3,
        min_delta: float = 0.0,
        min_delta_mode: str = "absolute",
        baseline: Optional[float] = None,
        start_from_step: int = 0,
        start_from_epoch: float = 0,
        stopping_threshold: Optional[float] = None,
        divergence_threshold: Optional[float] = None,
        check_finite: bool = True,
        strict: bool = True,
        restore_best: bool = False,
        reset_on_resume: bool = False,
        sync_decision: bool = True,
        report: bool = True,
        log_name: Optional[str] = None,
        verbose: bool = True,
    ) -> None:
        # the constructor arguments, saved with the state (``state_args``): first statement
        options = dict(locals())
        self.grammar = KeyGrammar()
        self._trainer: Any = None
        self._given_name: Optional[str] = None  # metric_for_best_model as written (monitor=None)
        self._monitor: Optional[Monitor] = None
        #: The one store of the settings; ``policy`` and the monitor are derived from it.
        self._options: dict[str, Any] = {}
        self._configure({name: options[name] for name in _ARGUMENTS})
        self._best_weights = BestWeights()
        self._pending_report: dict[str, Any] = {}
        self.reset()

    monitor = _fixed("monitor")
    mode = _fixed("mode")
    log_name = _fixed("log_name")
    patience = _setting("patience")
    min_delta = _setting("min_delta")
    min_delta_mode = _setting("min_delta_mode")
    baseline = _setting("baseline")
    start_from_step = _setting("start_from_step")
    start_from_epoch = _setting("start_from_epoch")
    stopping_threshold = _setting("stopping_threshold")
    divergence_threshold = _setting("divergence_threshold")
    check_finite = _setting("check_finite")
    strict = _setting("strict")
    restore_best = _setting("restore_best")
    reset_on_resume = _setting("reset_on_resume")
    sync_decision = _setting("sync_decision")
    report = _setting("report")
    verbose = _setting("verbose")

    @property
    def policy(self) -> StoppingPolicy:
        """The stopping rule built from the settings (read-only; set ``patience``... instead)."""
        return self._policy

    def _configure(self, changes: dict[str, Any]) -> None:
        """Validate ``changes`` to the settings with the others, then store them (all or nothing)."""
        options = {**self._options, **changes}
        flags = {name: options[name] for name in _FLAGS}
        _check_own_arguments(options["monitor"], flags, options["log_name"])
        check_mode(options["mode"], options["min_delta"], options["min_delta_mode"], owner="EarlyStopping")
        policy = StoppingPolicy(**{name: options[name] for name in _POLICY})
        monitor = self._monitor
        if monitor is not None:  # keep the resolved name and mode (from args when monitor=None)
            monitor = self._build_monitor(monitor.monitor, monitor.mode, options)
        elif options["monitor"] is not None:
            monitor = self._build_monitor(options["monitor"], options["mode"], options)
        policy.check_for(monitor.mode if monitor is not None
                         else None if options["mode"] == "auto" else options["mode"])
        self._options, self._policy, self._monitor = options, policy, monitor

    def bind(self, trainer: Any) -> EarlyStopping:
        """Share the trainer's key grammar (called by every runner; see ``bind_trainer``)."""
        self._trainer = _weak(trainer)
        self.grammar = grammar_for(trainer)
        if self._monitor is not None:
            self._monitor.grammar = self.grammar
        return self

    def _build_monitor(self, monitor: str, mode: str, options: Optional[dict[str, Any]] = None) -> Monitor:
        options = self._options if options is None else options
        if infer_mode(monitor) is None:
            suggestion = typo_suggestion(monitor, self.grammar)
            if suggestion is not None and mode == "auto":  # a typo first: "cannot tell" would mislead
                raise ValueError(
                    f"EarlyStopping: monitor={monitor!r} looks like a misspelt metric name. Did you mean "
                    f"{suggestion!r}? (If {monitor!r} is your own metric, pass mode='min' or mode='max'.)"
                )
            if suggestion is not None and not self._options:  # at construction only (mode given)
                logger.warning("EarlyStopping: monitor=%r looks like a misspelt %r (ignore this if it is "
                               "your own metric; a missing metric raises at the first evaluation).",
                               monitor, suggestion)
        return Monitor(monitor, mode=mode, min_delta=options["min_delta"],
                       min_delta_mode=options["min_delta_mode"], grammar=self.grammar, owner="EarlyStopping")

    # -- state ---------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget everything observed (best, counter, stop). Called at every fresh ``train()``."""
        self.wait = 0
        self.best_value: Optional[float] = None
        self.best_step: Optional[int] = None
        self.best_epoch: Optional[float] = None
        self.stopped = False
        self.stopped_step: Optional[int] = None
        self.reason = StopReason.NOT_STOPPED
        self.message = ""
        self.best_checkpoint: Optional[str] = None
        self._last_observed: Optional[tuple[int, str]] = None
        self._bare_means_eval = False  # set at train begin (see _observe)
        self._found = False
        self._first_checked = False
        self._warned_missing = False
        self._keys_seen: set[str] = set()
        self._evaluations_seen = 0
        self._best_weights.drop_snapshot()
        self._pending_report = {}

    @property
    def monitor_name(self) -> Optional[str]:
        """The resolved monitored metric (None before train begin when taken from args)."""
        return self._monitor.monitor if self._monitor is not None else self.monitor

    @property
    def resolved_mode(self) -> Optional[str]:
        """``"min"`` or ``"max"`` once known."""
        return None if self._monitor is None else self._monitor.mode

    @property
    def state_key(self) -> str:
        """``EarlyStopping[<monitor>,<mode>(,<log_name>)]``: tells instances apart on resume.

        The monitor is written in its canonical (raw) spelling: ``"eval/loss"`` and
        ``"eval_loss"`` give one key (see ``KeyGrammar.canonical``).
        """
        name = self.monitor_name
        monitor = self.grammar.canonical(name) if name else "metric_for_best_model"
        suffix = "" if self.log_name is None else f",{self.log_name}"
        return f"EarlyStopping[{monitor},{self.resolved_mode or self.mode}{suffix}]"

    @state_key.setter
    def state_key(self, value: str) -> None:
        """Ignored (derived); transformers' restore flag sets every saved attribute, this one too."""

    def find_saved_state(self, trainer_state: Any) -> Optional[dict[str, Any]]:
        """This instance's saved attributes; also under the key of a checkpoint written before the
        monitor was canonical (``EarlyStopping[eval/loss,min]``, ``EarlyStopping[accuracy,max]`` for
        ``metric_for_best_model="accuracy"``), so such a run resumes with its state."""
        found = super().find_saved_state(trainer_state)
        given = self._given_name or self.monitor
        if found is not None or not given or self.resolved_mode is None:
            return found
        suffix = "" if self.log_name is None else f",{self.log_name}"
        old_key = f"{type(self).__name__}[{given},{self.resolved_mode}{suffix}]"
        entries = (getattr(trainer_state, "stateful_callbacks", None) or {}).get(type(self).__name__)
        if old_key == self.state_key or entries is None:
            return None
        for entry in reversed(entries if isinstance(entries, list) else [entries]):
            attributes = entry.get("attributes", {}) if isinstance(entry, dict) else {}
            if attributes.get(self.STATE_KEY_FIELD) == old_key:
                return attributes
        return None

    def state_args(self) -> dict[str, Any]:
        return dict(self._options)

    def state_attributes(self) -> dict[str, Any]:
        return {
            "wait": self.wait, "best_value": self.best_value, "best_step": self.best_step,
            "best_epoch": self.best_epoch, "stopped": self.stopped, "stopped_step": self.stopped_step,
            "reason": self.reason.value, "message": self.message,
            "best_checkpoint": self._live_best_checkpoint(),
        }

    def _live_best_checkpoint(self) -> Optional[str]:
        """The checkpoint holding the best step's weights as it stands now (the trainer exports
        the state while it saves, before ``on_save``; rotation may have deleted the folder)."""
        if self.best_step is None:
            return None
        return step_checkpoint(self.best_step, getattr(self, "_output_dir", None), self.best_checkpoint)

    def load_state_attributes(self, attributes: dict[str, Any]) -> None:
        self.wait = int(attributes.get("wait", 0))
        self.best_value = attributes.get("best_value")
        self.best_step = attributes.get("best_step")
        self.best_epoch = attributes.get("best_epoch")
        self.stopped = bool(attributes.get("stopped", False))
        self.stopped_step = attributes.get("stopped_step")
        self.reason = StopReason(attributes.get("reason", StopReason.NOT_STOPPED.value))
        self.message = attributes.get("message", "")
        self.best_checkpoint = attributes.get("best_checkpoint")

    # -- the decision (pure, see StoppingPolicy) ------------------------------------------
    @property
    def progress(self) -> Progress:
        """The counter and best value so far, as the policy reads them."""
        return Progress(self.wait, self.best_value, self.best_step, self.best_epoch)

    def decide(self, value: float, step: int, epoch: float) -> Decision:
        """What one observation means, given the current state; changes nothing.

        Order: non-finite check, warm-up, divergence, improvement (against the best, else the
        baseline), stopping threshold, patience (see `StoppingPolicy.decide`).

        Raises:
            RuntimeError: Called before the monitor is known (``monitor=None`` before train begin).
        """
        if self._monitor is None:
            raise RuntimeError("EarlyStopping.decide() needs a resolved monitor (call it after train begin).")
        return self.policy.decide(self._monitor, value, step, epoch, self.progress)

    def _synchronized(self, decision: Decision) -> Decision:
        """Rank 0's decision on every rank (unchanged when not distributed)."""
        if not self.sync_decision or distributed_world_size() <= 1:
            return decision
        return Decision.from_floats(broadcast_from_rank0(decision.to_floats()))

    # -- observing metrics ---------------------------------------------------------------
    def _observe(self, values: Any, state: Any, control: Any, model: Any, from_evaluate: bool) -> None:
        if self._monitor is None or not isinstance(values, dict):
            return
        if from_evaluate:
            self._evaluations_seen += 1
            self.grammar.learn_from_metrics(values)
            if len(self._keys_seen) < 1000:
                self._keys_seen.update(k for k in values if isinstance(k, str))
        key, raw = self._monitor.lookup(values)
        if key is not None and not from_evaluate and self._bare_means_eval and key == self._monitor.monitor \
                and "loss" in values:
            return  # a bare name means eval_<name> in a run that evaluates, never the training record's
        step = int(getattr(state, "global_step", 0))
        if key is None:
            self._check_missing(values, from_evaluate)
            return
        self._found = self._first_checked = True
        if self.stopped:
            control.should_training_stop = True
            return
        if self._last_observed == (step, key):
            return
        self._last_observed = (step, key)
        value = to_float(raw)
        if value is None:
            self._fail(TypeError, f"EarlyStopping: the monitored metric {key!r} is not a number: "
                                  f"{raw!r} ({type(raw).__name__}).")
            return
        decision = self._synchronized(self.decide(value, step, float(getattr(state, "epoch", 0) or 0.0)))
        self.wait, self.best_value, self.best_step, self.best_epoch = (
            decision.wait, decision.best_value, decision.best_step, decision.best_epoch)
        if decision.improved and self.restore_best:
            self._best_weights.take_snapshot(model, step)
        if decision.should_stop:
            self.stopped, self.stopped_step, self.reason = True, step, decision.reason
            self.message = stop_message(decision.reason, self.monitor_name, value, step, wait=self.wait,
                                        best_value=self.best_value, best_step=self.best_step,
                                        options=self._options)
            control.should_training_stop = True
            warn = decision.reason in (StopReason.NON_FINITE, StopReason.DIVERGENCE_THRESHOLD)
            tell(self.message, state, verbose=self.verbose, level=logging.WARNING if warn else logging.INFO)
        self._queue_report()

    def _queue_report(self) -> None:
        if not self.report:
            return
        head = "early_stopping" if self.log_name is None else f"early_stopping/{self.log_name}"
        report: dict[str, Any] = {f"{head}/wait": self.wait}
        if self.best_value is not None:
            report[f"{head}/best_value"] = self.best_value
            report[f"{head}/best_step"] = self.best_step
        if self.stopped:
            report[f"{head}/stopped_step"] = self.stopped_step
            report[f"{head}/reason"] = self.reason.value
        self._pending_report = report

    def _inject_report(self, logs: Any) -> None:
        if self._pending_report and isinstance(logs, dict):
            logs.update(self._pending_report)
            self._pending_report = {}

    def _fail(self, error: type, message: str) -> None:
        if self.strict:
            raise error(message)
        if not self._warned_missing:
            self._warned_missing = True
            logger.warning("%s (strict=False: early stopping ignores it.)", message)

    def _check_missing(self, values: dict, from_evaluate: bool) -> None:
        if self._monitor is not None:
            problem = missing_metric_problem(self._monitor, self.grammar, values, from_evaluate)
            if problem is None:
                return
            if not self._first_checked:  # the first record that should hold it: the strict check
                self._first_checked = True
                self._fail(RuntimeError, problem)
            else:  # later records without it: skipped observations (documented rule)
                logger.debug("%s (a skipped observation: the metric was seen before.)", problem)

    # -- events --------------------------------------------------------------------------
    def _resolve_monitor(self, args: Any) -> str:
        """Build the monitor (from ``args.metric_for_best_model`` when ``monitor=None``); its name."""
        if self.monitor is None:
            monitor, mode = monitor_from_args(args, self.mode)
            self._monitor = self._build_monitor(monitor, mode)
            self.policy.check_for(self._monitor.mode)
            self._given_name = getattr(args, "metric_for_best_model", None)
        if self._monitor is None:
            raise RuntimeError("EarlyStopping: monitor could not be resolved.")
        return self._monitor.monitor

    def on_resume_check(self, args: Any, state: Any, control: Any, reasons: Any = None,
                        **kwargs: Any) -> None:
        """(TrainerPlus / LightweightTrainer) before a resumed run trains: veto it if it already stopped.

        ``state`` is the checkpoint's. Unless ``reset_on_resume``, a saved stop sets
        ``control.should_training_stop`` (the trainer then runs no step at all), restores the
        saved state into this instance and appends the reason to ``reasons``.
        """
        self._resolve_monitor(args)
        saved = self.find_saved_state(state)
        if not saved or not saved.get("stopped") or self.reset_on_resume:
            return
        self.reset()
        self.restore_from_trainer_state(state)
        control.should_training_stop = True
        if isinstance(reasons, list):
            said = self.message or f"{self.state_key} stopped at step {self.stopped_step}."
            reasons.append(f"{said} Pass EarlyStopping(..., reset_on_resume=True) to continue training.")

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Resolve the monitor from ``args``, validate, restore the state when resuming."""
        self.reset()
        name = self._resolve_monitor(args)
        problem = check_against_args(name, expected_prefix(name, self.grammar), args)
        if problem is None:
            problem = misspelt_against_args(name, self.grammar, args)
        if problem is None:
            trainer = self._trainer() if self._trainer is not None else None
            problem = check_against_trainer(name, self.grammar, trainer)
        if problem is not None:
            if self.strict:
                raise ValueError(problem)
            logger.warning("%s (strict=False: continuing.)", problem)
        _CLAIMS.claim(state, self.state_key, self, _SAME_KEY)
        strategy = getattr(args, "eval_strategy", "no")
        evaluates = str(getattr(strategy, "value", strategy)) != "no"
        self._bare_means_eval = evaluates and not self.grammar.has_section(name)
        super().on_train_begin(args, state, control, **kwargs)
        self._output_dir = getattr(args, "output_dir", None)
        if self.restore_best:
            self._best_weights.key = self.state_key
            self._best_weights.on_train_begin(args, state, kwargs.get("model"), self.best_step)
        if self.stopped:
            if self.reset_on_resume:
                logger.info("EarlyStopping[%s]: the resumed run had stopped at step %s (%s); "
                            "reset_on_resume=True, training on.", self.monitor_name, self.stopped_step,
                            self.reason.value)
                self.stopped, self.stopped_step, self.wait = False, None, 0
                self.reason, self.message = StopReason.NOT_STOPPED, ""
            else:  # a stock Trainer (no on_resume_check) still runs one step before it stops
                logger.warning(
                    "EarlyStopping[%s]: this run already stopped early at step %s (%s); stopping again at "
                    "once. Pass EarlyStopping(..., reset_on_resume=True) to continue training.",
                    self.monitor_name, self.stopped_step, self.reason.value)
                control.should_training_stop = True
                self._queue_report()

    def on_pre_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """(TrainerPlus / LightweightTrainer) observe the record and add the report to it."""
        self._observe(logs, state, control, kwargs.get("model"), from_evaluate=False)
        self._inject_report(logs)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """Observe the record; add a pending report (seen by callbacks that run after this one)."""
        self._observe(logs, state, control, kwargs.get("model"), from_evaluate=False)
        self._inject_report(logs)

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        """Observe evaluation metrics (each evaluation counts once even if also logged)."""
        self._observe(metrics, state, control, kwargs.get("model"), from_evaluate=True)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Remember the checkpoint of the best step; drop the memory copy once it is safe."""
        super().on_save(args, state, control, **kwargs)
        if self.best_step is None or (state.global_step != self.best_step and not self.restore_best):
            return
        path = self._best_weights.after_save(args, state, self.best_step)
        if path is not None:
            self.best_checkpoint = path

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Check the metric showed up; restore the best weights when asked; print the summary."""
        if self.verbose and self._monitor is not None:
            tell(summary_message(self.monitor_name, reason=self.reason, stopped_step=self.stopped_step,
                                 last_step=int(getattr(state, "global_step", 0)), best_value=self.best_value,
                                 best_step=self.best_step, label=self.log_name, options=self._options),
                 state, verbose=True)
        _CLAIMS.release(state, self.state_key, self)
        if self._monitor is not None and not self._first_checked and self._evaluations_seen > 0:
            if expected_prefix(self._monitor.monitor, self.grammar) != "":
                # never raise here: the training is done and the user's save_model() comes next
                logger.warning("EarlyStopping: no evaluation of this run returned the monitored metric, so "
                               "early stopping never acted. %s",
                               self._monitor.explain_missing(self._keys_seen))
        model = kwargs.get("model")
        if self.restore_best and self.best_step is not None and model is not None:
            checkpoint = BestWeights.checkpoint_for(self.best_step, args, state, self.best_checkpoint)
            source = self._best_weights.restore(model, self.best_step, checkpoint)
            if source:
                logger.info("EarlyStopping: restored the best weights (step %s, %s=%r) from %s.",
                            self.best_step, self.monitor_name, self.best_value, source)
            else:
                logger.warning("EarlyStopping: cannot restore the best weights of step %s: no checkpoint "
                               "of that step is left in %s and no copy of them was found in memory or in "
                               "the checkpoint this run resumed from; the model keeps its last weights.",
                               self.best_step, getattr(args, "output_dir", None))
