"""Stateful early stopping for ``transformers.Trainer``, ``TrainerPlus`` and ``LightweightTrainer``.

The callback is the I/O around two pure pieces: the `Monitor` (``metrics/monitor.py``: which
key, which direction, what counts as better, did-you-mean, can this run produce the metric)
and the `StoppingPolicy` (``early_stopping_policy.py``: what one observation means). It feeds
them observations, stores the answer, reports it, tells the user, keeps the best weights when
asked (``best_weights.py``) and saves its state in every checkpoint (`SelfRestoringState`).

See ``docs/early_stopping.md`` for the feature table against transformers, Lightning and
Keras, and the migration from ``transformers.EarlyStoppingCallback``.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Optional

from ...core.checks import check_bool, check_name
from ...core.state import saved_attributes
from ...core.stateful import SelfRestoringState
from ...metrics.monitor import Monitor, check_mode
from ...metrics.numbers import to_float
from ...runtime.console import tell
from ...runtime.distributed import distributed_world_size, from_rank0
from ...runtime.isolated_evaluation import evaluated_weights
from ..monitoring import MonitoringCallback
from .best_weights import BestWeights, step_checkpoint
from .policy import (
    Decision,
    Progress,
    StoppingPolicy,
    StopReason,
    stop_message,
    summary_message,
)

__all__ = ["Decision", "EarlyStopping", "StopReason"]

logger = logging.getLogger("hf_callbacks_plus")

_OWNER = "EarlyStopping"
_FLAGS = ("strict", "restore_best", "reset_on_resume", "sync_decision", "report", "verbose")
_SAME_KEY = ("the same monitor and mode, so their states would mix on resume and their reports would "
             "overwrite each other. Give each a distinct log_name, e.g. EarlyStopping(..., "
             "log_name='patient') and EarlyStopping(..., log_name='strict').")


class EarlyStopping(MonitoringCallback, SelfRestoringState):
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
        strict: Refuse a metric that cannot show up, as early as that is known: at train begin
            (``args``, the bound trainer), before the first step (no `TrainSubsetEvaluation` for
            a ``train_subset_*`` metric), else at the first evaluation that should hold it (the
            keys present, a "did you mean"): the trainer saves that step first and ``train()``
            raises naming the checkpoint to resume from. Later evaluations without it are
            skipped observations. False warns once and keeps training. Defaults to True.
        restore_best: At the end of training, load the best weights: from the checkpoint of
            the best step when it exists, else from an in-memory CPU copy (one copy of the
            ``state_dict``, kept until a checkpoint safe from rotation holds the same
            weights). Under DeepSpeed ZeRO-1/2/3 and FSDP each rank keeps a CPU copy of its
            own part (its ZeRO master partition, its FSDP shards: no gather, one shard of
            memory) and puts it back at the end; the model then holds the best step's
            weights as the engine saved them (see ``docs/distributed.md``). Loaded after
            ``load_best_model_at_end``'s: on different metrics, a warning says so. Defaults to False.
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

    Every argument is a plain attribute of the same name, validated at construction and again
    at every train begin (a setting changed in between takes effect, or raises, there).

    Raises:
        TypeError, ValueError: At construction (and train begin) for bad arguments (a misspelt
            monitor gets a "did you mean"); at train begin for a metric the trainer cannot
            produce, two instances with one ``state_key`` or one instance listed twice.
            Messages name the argument, the value and the valid choices.

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
        self.monitor, self.mode, self.patience = monitor, mode, patience
        self.min_delta, self.min_delta_mode, self.baseline = min_delta, min_delta_mode, baseline
        self.start_from_step, self.start_from_epoch = start_from_step, start_from_epoch
        self.stopping_threshold, self.divergence_threshold = stopping_threshold, divergence_threshold
        self.check_finite, self.strict, self.restore_best = check_finite, strict, restore_best
        self.reset_on_resume, self.sync_decision, self.report = reset_on_resume, sync_decision, report
        self.log_name, self.verbose = log_name, verbose
        super().__init__()
        self._given_name: Optional[str] = None  # metric_for_best_model as written (monitor=None)
        self._best_weights = BestWeights()
        self._check_settings()
        if self._monitor is not None and mode != "auto":
            self._monitor.warn_if_misspelt()
        self.reset()

    def _check_settings(self, args: Any = None) -> None:
        """Validate every setting; build the `Monitor` (from ``args`` when ``monitor=None``) and
        the `StoppingPolicy` from them. Called at construction and at train begin."""
        monitor, log_name = self.monitor, self.log_name
        check_name(_OWNER, "monitor", monitor, example="eval_loss", none="use args.metric_for_best_model")
        for name in _FLAGS:
            check_bool(_OWNER, name, getattr(self, name))
        if log_name is not None and (not isinstance(log_name, str) or not log_name or "/" in log_name):
            raise ValueError(f"EarlyStopping: log_name must be None or a non-empty string without '/', "
                             f"got {log_name!r}.")
        check_mode(self.mode, self.min_delta, self.min_delta_mode, owner=_OWNER)
        policy = StoppingPolicy(self.patience, self.baseline, self.stopping_threshold,
                                self.divergence_threshold, self.start_from_step, self.start_from_epoch,
                                self.check_finite)
        settings = {"mode": self.mode, "min_delta": self.min_delta, "min_delta_mode": self.min_delta_mode,
                    "grammar": self.grammar, "owner": _OWNER}
        if monitor is not None:
            self._monitors = [Monitor(monitor, **settings)]
        elif args is not None:
            self._monitors = [Monitor.from_args(args, **settings)]
            self._given_name = getattr(args, "metric_for_best_model", None)
        policy.check_for(self.resolved_mode or (None if self.mode == "auto" else self.mode))
        self.policy = policy

    @property
    def _monitor(self) -> Optional[Monitor]:
        return self._monitors[0] if self._monitors else None

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
        self._keys_seen: set[str] = set()
        self._evaluations_seen = 0
        self._best_weights.drop_snapshot()
        self._pending_report: dict[str, Any] = {}

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
        return self._key(self.grammar.canonical(name) if name else "metric_for_best_model")

    @state_key.setter
    def state_key(self, value: str) -> None:
        """Ignored (derived); transformers' restore flag sets every saved attribute, this one too."""

    def _key(self, monitor: str) -> str:
        suffix = "" if self.log_name is None else f",{self.log_name}"
        return f"EarlyStopping[{monitor},{self.resolved_mode or self.mode}{suffix}]"

    def find_saved_state(self, trainer_state: Any) -> Optional[dict[str, Any]]:
        """This instance's saved attributes; also under the key of a checkpoint written before the
        monitor was canonical (``EarlyStopping[eval/loss,min]``, ``EarlyStopping[accuracy,max]`` for
        ``metric_for_best_model="accuracy"``), so such a run resumes with its state."""
        found = super().find_saved_state(trainer_state)
        given = self._given_name or self.monitor
        if found is not None or not given or self.resolved_mode is None or self._key(given) == self.state_key:
            return found
        return saved_attributes(trainer_state, _OWNER, self._key(given))

    def state_args(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in ARGUMENTS}

    def state_attributes(self) -> dict[str, Any]:
        best_checkpoint = None  # as it stands now: rotation may have deleted the folder
        if self.best_step is not None:
            best_checkpoint = step_checkpoint(self.best_step, getattr(self, "_output_dir", None),
                                              self.best_checkpoint)
        return {
            "wait": self.wait, "best_value": self.best_value, "best_step": self.best_step,
            "best_epoch": self.best_epoch, "stopped": self.stopped, "stopped_step": self.stopped_step,
            "reason": self.reason.value, "message": self.message, "best_checkpoint": best_checkpoint,
        }

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

    # -- observing metrics ---------------------------------------------------------------
    def _observe(self, values: Any, state: Any, control: Any, model: Any, from_evaluate: bool,
                 optimizer: Any = None) -> None:
        if self._monitor is None or not isinstance(values, dict):
            return
        if from_evaluate:
            self._evaluations_seen += 1
            self.grammar.learn_from_metrics(values)
            if len(self._keys_seen) < 1000:
                self._keys_seen.update(k for k in values if isinstance(k, str))
        key, raw = self.lookup(self._monitor, values, from_evaluate)
        if key is None:
            self.check_record(values, from_evaluate, state, control)
            return
        self._confirmed.add(self._monitor.monitor)
        step = int(getattr(state, "global_step", 0))
        if self.stopped:
            control.should_training_stop = True
            return
        if self._last_observed == (step, key):
            return
        self._last_observed = (step, key)
        value = to_float(raw)
        if value is None:
            self.refuse(TypeError, f"EarlyStopping: the monitored metric {key!r} is not a number: "
                                   f"{raw!r} ({type(raw).__name__}).", state, control)
            return
        decision = self.decide(value, step, float(getattr(state, "epoch", 0) or 0.0))
        if self.sync_decision:  # rank 0's decision on every rank
            decision = from_rank0(lambda: decision)
        self.wait, self.best_value, self.best_step, self.best_epoch = (
            decision.wait, decision.best_value, decision.best_step, decision.best_epoch)
        if decision.improved and self.restore_best:
            trainer = self._trainer() if self._trainer is not None else None
            averaged = evaluated_weights(trainer) is not None  # WeightAveraging's average is in the model
            self._best_weights.take_snapshot(model, step, optimizer, averaged=averaged)
        if decision.should_stop:
            self.stopped, self.stopped_step, self.reason = True, step, decision.reason
            self.message = stop_message(decision.reason, self.monitor_name, value, step, wait=self.wait,
                                        best_value=self.best_value, best_step=self.best_step,
                                        options=self.state_args())
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
            report.update({f"{head}/best_value": self.best_value, f"{head}/best_step": self.best_step})
        if self.stopped:
            report.update({f"{head}/stopped_step": self.stopped_step, f"{head}/reason": self.reason.value})
        self._pending_report = report

    def _inject_report(self, logs: Any) -> None:
        if self._pending_report and isinstance(logs, dict):
            logs.update(self._pending_report)
            self._pending_report = {}

    # -- events --------------------------------------------------------------------------
    def on_resume_check(self, args: Any, state: Any, control: Any, reasons: Any = None,
                        **kwargs: Any) -> None:
        """(TrainerPlus / LightweightTrainer) before a resumed run trains: veto it if it already stopped.

        ``state`` is the checkpoint's. Unless ``reset_on_resume``, a saved stop sets
        ``control.should_training_stop`` (the trainer then runs no step at all), restores the
        saved state into this instance and appends the reason to ``reasons``.
        """
        self._check_settings(args)
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
        """Validate the settings, resolve the monitor, check the run can produce it, restore the
        state when resuming."""
        self.reset()
        self._check_settings(args)
        if self._monitor is None:
            raise RuntimeError("EarlyStopping: monitor could not be resolved.")
        self.watch_begin(args, state, claim=_SAME_KEY)
        super().on_train_begin(args, state, control, **kwargs)
        self._output_dir = getattr(args, "output_dir", None)
        if self.restore_best:
            self._say_which_weights_win(args)
            self._best_weights.key = self.state_key
            self._best_weights.on_train_begin(args, state, kwargs.get("model"), self.best_step,
                                              kwargs.get("optimizer"))
            if self._best_weights.per_rank and not self.sync_decision and distributed_world_size() > 1:
                raise ValueError(
                    "EarlyStopping(restore_best=True, sync_decision=False): the model's weights are sharded "
                    "across the ranks (DeepSpeed ZeRO or FSDP), so every rank must keep its part of the same "
                    "step: use sync_decision=True (the default) or restore_best=False.")
        if not self.stopped:
            return
        where = (self.monitor_name, self.stopped_step, self.reason.value)
        if self.reset_on_resume:
            logger.info("EarlyStopping[%s]: the resumed run had stopped at step %s (%s); "
                        "reset_on_resume=True, training on.", *where)
            self.stopped, self.stopped_step, self.wait = False, None, 0
            self.reason, self.message = StopReason.NOT_STOPPED, ""
        else:  # a stock Trainer (no on_resume_check) still runs one step before it stops
            logger.warning("EarlyStopping[%s]: this run already stopped early at step %s (%s); stopping "
                           "again at once. Pass EarlyStopping(..., reset_on_resume=True) to continue "
                           "training.", *where)
            control.should_training_stop = True
            self._queue_report()

    def _say_which_weights_win(self, args: Any) -> None:
        """One warning (by the first restorer) when ``load_best_model_at_end`` and ``restore_best``
        instances load the best weights of different metrics at train end; the last loaded stays."""
        callbacks = getattr(getattr(self.trainer, "callback_handler", None), "callbacks", None) or [self]
        restorers = [cb for cb in callbacks if isinstance(cb, EarlyStopping) and cb.restore_best] or [self]
        best = [(f"restore_best of EarlyStopping({cb.monitor_name!r}, mode={cb.resolved_mode!r})",
                 (self.grammar.canonical(cb.monitor_name or ""), cb.resolved_mode)) for cb in restorers]
        wanted = getattr(args, "metric_for_best_model", None)
        if getattr(args, "load_best_model_at_end", False) and isinstance(wanted, str) and wanted:
            trainer = Monitor.from_args(args, grammar=self.grammar)
            best.insert(0, (f"load_best_model_at_end (metric_for_best_model={wanted!r}, greater_is_better="
                            f"{bool(getattr(args, 'greater_is_better', False))})",
                            (self.grammar.canonical(trainer.monitor), trainer.mode)))
        if restorers[0] is self and len({metric for _, metric in best}) > 1:
            logger.warning("EarlyStopping: %d mechanisms load their best weights at the end of training, "
                           "by different metrics, in this order: %s. The model ends with the weights of the "
                           "last: %s. Keep one of them (or let them watch the same metric and mode).",
                           len(best), "; then ".join(said for said, _ in best), best[-1][0])

    def observe_record(self, args: Any, state: Any, control: Any, logs: dict, **kwargs: Any) -> None:
        """Observe the record and add the report to it (at ``on_pre_log``: every ``on_log`` sees it;
        with a stock Trainer at ``on_log``: the callbacks after this one see it)."""
        self._observe(logs, state, control, kwargs.get("model"), from_evaluate=False,
                      optimizer=kwargs.get("optimizer"))
        self._inject_report(logs)

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        """Observe evaluation metrics (each evaluation counts once even if also logged)."""
        self._observe(metrics, state, control, kwargs.get("model"), from_evaluate=True,
                      optimizer=kwargs.get("optimizer"))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Remember the checkpoint of the best step; drop the memory copy once it is safe."""
        super().on_save(args, state, control, **kwargs)
        if self.best_step is None or (state.global_step != self.best_step and not self.restore_best):
            return
        path = self._best_weights.after_save(args, state, self.best_step)
        if path is not None:
            self.best_checkpoint = path

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Raise the refusal training stopped for; check the metric showed up; restore the best
        weights when asked; print the summary."""
        self.watch_end(args, state, claim=True)
        if self.verbose and self._monitor is not None:
            tell(summary_message(self.monitor_name, reason=self.reason, stopped_step=self.stopped_step,
                                 last_step=int(getattr(state, "global_step", 0)), best_value=self.best_value,
                                 best_step=self.best_step, label=self.log_name, options=self.state_args()),
                 state, verbose=True)
        monitor = self._monitor
        if monitor is not None and monitor.monitor not in self._confirmed and self._evaluations_seen > 0 \
                and monitor.prefix:
            # never raise here: the training is done and the user's save_model() comes next
            logger.warning("EarlyStopping: no evaluation of this run returned the monitored metric, so early "
                           "stopping never acted. %s", monitor.explain_missing(self._keys_seen))
        model = kwargs.get("model")
        if not (self.restore_best and self.best_step is not None and model is not None):
            return
        checkpoint = BestWeights.checkpoint_for(self.best_step, args, state, self.best_checkpoint)
        source = self._best_weights.restore(model, self.best_step, checkpoint, kwargs.get("optimizer"))
        if source:
            logger.info("EarlyStopping: restored the best weights (step %s, %s=%r) from %s.",
                        self.best_step, self.monitor_name, self.best_value, source)
        else:
            logger.warning("EarlyStopping: cannot restore the best weights of step %s: no checkpoint of that "
                           "step is left in %s and no copy of them was found in memory or in the checkpoint "
                           "this run resumed from; the model keeps its last weights.",
                           self.best_step, getattr(args, "output_dir", None))


#: The constructor arguments, saved with the state (``state_args``) and attributes of the same name.
ARGUMENTS = tuple(inspect.signature(EarlyStopping.__init__).parameters)[1:]
