"""Deadline: end a training on time and cleanly: at a deadline, on a signal, or at its last step,
with a complete checkpoint, a resume that continues, and an exit code a job script can test.

The parts:

* ``rule.py``: when to stop (pure): go on while the next check still has room for a save;
* ``limits.py``: the durations and times it takes, the process's age;
* ``signals.py``: handlers that only record a signal;
* ``window.py``: the logging window carried through a stop's checkpoint;
* ``ending.py``: the end's reason, exit code and status file;
* this module: the events, the agreement of the ranks, the state in every checkpoint.

See ``docs/deadline.md`` (with the comparison to ``enable_jit_checkpoint``, Lightning's ``Timer``
and SLURM requeueing).
"""

from __future__ import annotations

import logging
import math
import os
import time
import weakref
from typing import Any, Callable, Iterable, Optional, Union

from ...core.callback import weak_reference
from ...core.checkpoint_folders import checkpoint_folder
from ...core.claims import TrainBeginClaims
from ...core.stateful import SelfRestoringState
from ...metrics.keys import KeyGrammar
from ...runtime.console import tell
from ...runtime.distributed import cpu_group, distributed_world_size, sum_over_ranks
from . import window as logging_window
from .ending import REQUEUE_EXIT_CODE, Ending, EndReason, read_status, write_status
from .limits import DurationArg, InstantArg, parse_at, parse_duration, process_age, show_seconds
from .rule import Measurements, Plan, Schedule, plan_boundary, plan_stop
from .signals import SignalArg, SignalFlag, signal_names

__all__ = ["REQUEUE_EXIT_CODE", "Deadline", "EndReason", "read_status"]

logger = logging.getLogger("hf_callbacks_plus")

_CLAIMS = TrainBeginClaims()
_SAME_KEY = ("and both would handle the same signals and stop the same training. Use one Deadline: it "
             "takes a duration, a budget, an absolute time and signals at once.")
#: The report key of the end record (``deadline/reason`` in every tracker).
REASON_KEY = "deadline/reason"


def _strategy(value: Any) -> str:
    return str(getattr(value, "value", value))


class Deadline(SelfRestoringState):
    """Stop at the last step boundary from which a complete save fits before a deadline, or at the
    next one after a signal; save once, on every rank together; tell how it ended.

    **Deadlines.** ``duration`` (this process, counted from its start, like SLURM's ``--time``),
    ``budget`` (total training time across resumes, kept in the checkpoint) and ``at`` (an absolute
    time): the earliest counts. The callback measures how long a step, an evaluation and a save take
    (the longest of the last 16 of each, kept across resumes) and goes on only while the next
    check still leaves room for a save ``margin`` seconds before the deadline. It decides again
    right after every save, where a stop keeps the checkpoint just written (no second save).

    **Signals.** The handlers (``signals``, installed at train begin on the main thread, the
    previous ones put back at train end) only record the signal. At the next check every rank
    agrees (one ``all_reduce`` of a few floats on a CPU group, every ``check_every`` steps, at
    each epoch's end and after every save), then all save once (or keep the checkpoint just
    written) and stop. A rank that did not receive the signal stops too.

    **The end.** A line on the console; ``deadline/reason`` in the end-of-training record (the
    trackers); `exit_code` (0, or ``requeue_exit_code`` when the run stopped on a deadline or a
    signal and should be resumed); ``status_file`` for job scripts behind a launcher that swallows
    exit codes (``hf-callbacks-plus stop-status <file>`` exits with the code).

    **Final evaluation.** ``final_evaluation=True`` evaluates (and saves, unless
    ``save_strategy="no"``) the weights of the last step when it is not an evaluation step: at
    ``max_steps``, at a stop by another callback known at the step's end, and, with
    ``evaluate_before_stop=True``, before a deadline or signal stop when it fits.

    Args:
        duration: This process's time: seconds, ``"H:MM:SS"``, ``"D-H:MM:SS"`` (SLURM's
            ``--time``), ``"DD:HH:MM:SS"`` (minutes and seconds 00-59, hours after days 0-23), a
            ``timedelta`` or a dict of ``timedelta`` arguments, counted from the process's start
            (Linux; elsewhere from the callback's creation). Defaults to None.
        budget: Total training time across resumes (same forms), counted from each train begin
            and kept in the checkpoint; when spent the run is done (exit code 0). Defaults to None.
        at: An absolute time: a ``datetime`` (naive = local time) or UNIX seconds. Defaults to None.
        signals: Signals that stop training gracefully (names or numbers; SIGINT is left to Python).
            Defaults to ``("SIGTERM", "SIGUSR1")``. ``()`` handles none.
        margin: Seconds kept free before the deadline (and before the end of ``grace``); covers
            what was never measured (counted as 0 until it happened): the first save, and the first
            evaluation when the training evaluates. Raise it above them for large checkpoints.
            Defaults to 10.
        grace: Seconds a signal leaves before the hard kill (Kubernetes' default grace period,
            SLURM's default ``KillWait`` and torchrun's ``--shutdown-timeout`` are 30 s): decides
            whether an evaluation at a signal stop (scheduled there, or asked for) fits. Defaults
            to 30.
        final_evaluation: Evaluate the last step's weights when training ends at a step that is
            not an evaluation step (and save them unless ``save_strategy="no"``). Defaults to False.
        evaluate_before_stop: Also evaluate before a deadline or signal stop, when the evaluation
            and the save fit. Defaults to False.
        check_every: Steps between two checks (the ranks agree at multiples of it, at each epoch's
            end and at the last step). Defaults to 1.
        requeue_exit_code: `exit_code` of a run stopped by a deadline or a signal (1-255).
            Defaults to 75 (``EX_TEMPFAIL``).
        status_file: A file rank 0 writes at train begin (``running``) and train end (the reason
            and the exit code), for ``hf-callbacks-plus stop-status``. Defaults to None.
        report: Add ``deadline/reason`` to the end-of-training record. Defaults to True.
        verbose: Print the stop line and a summary at train end to stderr (main process).
            Defaults to True.

    Raises:
        TypeError, ValueError: At construction for bad arguments; at train begin (and trainer
            creation) with ``TrainingArguments(enable_jit_checkpoint=True)`` when both would handle
            SIGTERM, ``final_evaluation`` or ``evaluate_before_stop`` without an eval dataset (or, in a
            stock Trainer not given to this callback, with ``eval_strategy="no"``: bind it with
            ``run_before_integrations``), or two instances in one trainer.

    Example:
        >>> deadline = Deadline("3:50:00", signals=["SIGTERM", "SIGUSR1"], status_file="runs/x/stop.json")
        >>> deadline.signals
        ('SIGTERM', 'SIGUSR1')
    """

    def __init__(
        self,
        duration: DurationArg = None,
        *,
        budget: DurationArg = None,
        at: InstantArg = None,
        signals: Optional[Iterable[SignalArg]] = ("SIGTERM", "SIGUSR1"),
        margin: float = 10.0,
        grace: float = 30.0,
        final_evaluation: bool = False,
        evaluate_before_stop: bool = False,
        check_every: int = 1,
        requeue_exit_code: int = REQUEUE_EXIT_CODE,
        status_file: Union[str, os.PathLike, None] = None,
        report: bool = True,
        verbose: bool = True,
    ) -> None:
        self.duration = parse_duration(duration, "duration")
        self.budget = parse_duration(budget, "budget")
        self.at = parse_at(at)
        self.signals = signal_names(signals)
        for name, value in (("margin", margin), ("grace", grace)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ValueError(f"Deadline: {name} must be a number of seconds >= 0, got {value!r}.")
        self.margin, self.grace = float(margin), float(grace)
        flags = {"final_evaluation": final_evaluation, "evaluate_before_stop": evaluate_before_stop,
                 "report": report, "verbose": verbose}
        for name, value in flags.items():
            if not isinstance(value, bool):
                raise TypeError(f"Deadline: {name} must be True or False, got {value!r}.")
        self.final_evaluation, self.evaluate_before_stop = final_evaluation, evaluate_before_stop
        self.report, self.verbose = report, verbose
        if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 1:
            raise ValueError(f"Deadline: check_every must be an integer >= 1, got {check_every!r}.")
        self.check_every = check_every
        if isinstance(requeue_exit_code, bool) or not isinstance(requeue_exit_code, int) \
                or not 1 <= requeue_exit_code <= 255:
            raise ValueError(f"Deadline: requeue_exit_code must be an integer from 1 to 255, got "
                             f"{requeue_exit_code!r}.")
        self.requeue_exit_code = requeue_exit_code
        if status_file is not None and not isinstance(status_file, (str, os.PathLike)):
            raise TypeError(f"Deadline: status_file must be a path or None, got {status_file!r}.")
        self.status_file = None if status_file is None else os.fspath(status_file)
        if not (self.signals or self.limited or final_evaluation):
            raise ValueError("Deadline: nothing to do: give a duration, budget or at, signals, or "
                             "final_evaluation=True.")
        self._clock: Callable[[], float] = time.monotonic
        self._created = self._clock()
        self._trainer: Any = None
        self._flag = SignalFlag(self.signals, clock=lambda: self._clock())
        self.measurements = Measurements()
        self.elapsed = 0.0  # training time of the sessions before this one (budget)
        self.window: Optional[dict[str, Any]] = None  # the logging window of a stop's checkpoint
        self.stopped_step: Optional[int] = None
        self.reason = EndReason.RUNNING
        self.stopped_signal: Optional[str] = None
        self.ending = Ending()
        self._reset_session()

    # -- settings ---------------------------------------------------------------------------
    @property
    def limited(self) -> bool:
        """Whether a duration, a budget or an absolute time is set."""
        return any(value is not None for value in (self.duration, self.budget, self.at))

    @property
    def exit_code(self) -> int:
        """0 for a completed (or otherwise stopped) training, ``requeue_exit_code`` for one stopped on
        a deadline or a signal with its checkpoint saved; 1 while training or after a failure."""
        return self.ending.exit_code

    def _check_args(self, args: Any) -> None:
        """Refuse what cannot work with these ``TrainingArguments``/``LoopArguments``."""
        if getattr(args, "enable_jit_checkpoint", False) and "SIGTERM" in self.signals:
            raise ValueError(
                "Deadline: TrainingArguments(enable_jit_checkpoint=True) saves on SIGTERM too, on the rank "
                "that got it and without the other ranks (transformers' trainer_jit_checkpoint.py); both "
                "would answer one signal. Keep one: enable_jit_checkpoint=False (Deadline then saves on "
                "SIGTERM, every rank together), or Deadline(signals=['SIGUSR1']) to leave SIGTERM to the JIT "
                "checkpoint.")

    def _check_evaluation(self, args: Any, trainer: Any) -> None:
        """At train begin: refuse an evaluation asked for (``final_evaluation``,
        ``evaluate_before_stop``) that could only fail, after the last step and before its save."""
        names = [name for name in ("final_evaluation", "evaluate_before_stop") if getattr(self, name)]
        if not names:
            return
        asked, off = " and ".join(f"{name}=True" for name in names), ", ".join(f"{n}=False" for n in names)
        if trainer is None:  # a stock trainer given Deadline in callbacks= only
            if _strategy(getattr(args, "eval_strategy", "no")) != "no":
                return  # transformers refuses an evaluation strategy without an eval dataset at init
            raise ValueError(
                f"Deadline: {asked} with eval_strategy='no' in a trainer Deadline was not given: it cannot "
                "check that there is an eval dataset, and without one the trainer would fail in that "
                "evaluation, before saving. Call run_before_integrations(trainer, deadline) once after "
                f"building the trainer (TrainerPlus and LightweightTrainer do it), or Deadline({off}).")
        if hasattr(trainer, "eval_dataset"):  # transformers
            nothing = trainer.eval_dataset is None
        else:  # LightweightTrainer
            nothing = getattr(trainer, "eval_data", 1) is None and getattr(trainer, "eval_fn", 1) is None
        if nothing:
            raise ValueError(
                f"Deadline: {asked} but the trainer has nothing to evaluate (no eval dataset): pass "
                "eval_dataset=... to the trainer (eval_data=... or eval_fn=... to LightweightTrainer), or "
                f"Deadline({off}).")

    def bind(self, trainer: Any) -> Deadline:
        """Keep the trainer (weakly): its logging window travels through a stop's checkpoint; and
        make its ``train()`` put the previous signal handlers back however it ends (a stock Trainer
        that raises fires no end event)."""
        self._trainer = weak_reference(trainer)
        restore_handlers_after_train(trainer, self)
        return self

    def restore_signal_handlers(self) -> None:
        """Put back the signal handlers found at train begin (done at train end and when ``train()``
        raises in a bound trainer; call it after a stock Trainer not bound to this callback raised)."""
        self._flag.restore()
        self._training = False

    @property
    def trainer(self) -> Any:
        """The bound trainer, or None (a stock Trainer binds nothing)."""
        return self._trainer() if self._trainer is not None else None

    # -- state ------------------------------------------------------------------------------
    def state_args(self) -> dict[str, Any]:
        return {"duration": self.duration, "budget": self.budget, "at": self.at,
                "signals": list(self.signals), "margin": self.margin, "grace": self.grace,
                "final_evaluation": self.final_evaluation,
                "evaluate_before_stop": self.evaluate_before_stop, "check_every": self.check_every,
                "requeue_exit_code": self.requeue_exit_code, "status_file": self.status_file,
                "report": self.report, "verbose": self.verbose}

    def state_attributes(self) -> dict[str, Any]:
        spent = self.budget if self.reason is EndReason.BUDGET else None
        return {"elapsed": self.elapsed_now(), "durations": self.measurements.to_dict(),
                "window": self.window, "stopped_step": self.stopped_step, "reason": self.reason.value,
                "stopped_signal": self.stopped_signal, "spent_budget": spent}

    def load_state_attributes(self, attributes: dict[str, Any]) -> None:
        elapsed = attributes.get("elapsed")
        self.elapsed = float(elapsed) if isinstance(elapsed, (int, float)) and math.isfinite(elapsed) else 0.0
        self.measurements.load(attributes.get("durations"))
        window = attributes.get("window")
        self.window = window if isinstance(window, dict) else None
        self._resumed_from = (attributes.get("reason"), attributes.get("stopped_signal"),
                              attributes.get("stopped_step"))

    def _spent_in(self, attributes: Optional[dict[str, Any]]) -> bool:
        """Whether ``attributes`` (a checkpoint's) leave no budget: the run stopped on this budget (or
        a larger one), or its training time reaches the budget less the margin."""
        if self.budget is None or not attributes:
            return False
        spent, elapsed = attributes.get("spent_budget"), attributes.get("elapsed")
        if isinstance(spent, (int, float)) and self.budget <= spent:
            return True
        return isinstance(elapsed, (int, float)) and elapsed >= self.budget - self.margin

    def elapsed_now(self) -> float:
        """Training time spent: the sessions before this one, plus this one so far."""
        if self._session_start is None:
            return self.elapsed
        return self.elapsed + max(0.0, self._clock() - self._session_start)

    def _reset_session(self) -> None:
        self._session_start: Optional[float] = None
        self._deadline, self._deadline_kind = math.inf, None
        self._mark: Optional[float] = None
        self._group: Any = None
        self._training = False
        self._stop: Optional[dict[str, Any]] = None
        self._saved_step = self._evaluated_step = -1
        self._spent = False
        self._resumed_from: tuple[Any, Any, Any] = (None, None, None)
        #: Seconds from the signal (this rank's) to the stop's checkpoint being complete.
        self.signal_to_checkpoint: Optional[float] = None
        #: Seconds from the stop decision to the stop's checkpoint being complete.
        self.decision_to_checkpoint: Optional[float] = None

    # -- the deadline -----------------------------------------------------------------------
    def _deadlines(self) -> dict[str, float]:
        """Each limit as an instant of ``self._clock``."""
        now, found = self._clock(), {}
        if self.duration is not None:
            age = process_age()
            start = now - age if age is not None else self._created
            found["duration"] = start + self.duration
        if self.at is not None:
            found["at"] = now + (self.at - time.time())
        if self.budget is not None:
            found["budget"] = now + (self.budget - self.elapsed)
        return found

    def time_left(self) -> float:
        """Seconds until the earliest deadline (``math.inf`` without one)."""
        return self._deadline - self._clock()

    # -- events -----------------------------------------------------------------------------
    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Refuse a conflict with ``enable_jit_checkpoint`` as soon as the trainer exists."""
        self._check_args(args)

    def on_resume_check(self, args: Any, state: Any, control: Any, reasons: Any = None,
                        **kwargs: Any) -> None:
        """(TrainerPlus / LightweightTrainer) veto a resumed run whose budget is spent: no step runs."""
        saved = self.find_saved_state(state)
        if self._spent_in(saved):
            control.should_training_stop = True
            elapsed = saved.get("elapsed") if saved else None
            self.elapsed = float(elapsed) if isinstance(elapsed, (int, float)) else 0.0
            self._end(state, EndReason.BUDGET, int(getattr(state, "global_step", 0)))
            self._write_status(state)
            if isinstance(reasons, list):
                reasons.append(f"Deadline: the training budget of {show_seconds(self.budget)} is spent "
                               f"({show_seconds(self.elapsed)} used, margin {show_seconds(self.margin)}); "
                               "raise Deadline(budget=...) to train on.")

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Check the settings, restore the state (elapsed time, durations, logging window), set the
        deadline, install the signal handlers, write ``running`` to the status file."""
        self._check_args(args)
        self._check_evaluation(args, self.trainer)
        _CLAIMS.claim(state, self.state_key, self, _SAME_KEY)
        if getattr(args, "save_only_model", False) and (self.signals or self.limited):
            logger.warning("Deadline: save_only_model=True: a stop's checkpoint holds the model only (no "
                           "optimizer, scheduler or RNG state), so the resumed training is not the one that "
                           "would have run on.")
        self.stopped_step, self.reason, self.stopped_signal, self.window = None, EndReason.RUNNING, None, None
        self.elapsed = 0.0
        self.measurements = Measurements()
        self._reset_session()
        self.ending = Ending(step=int(getattr(state, "global_step", 0)), max_steps=int(state.max_steps or 0))
        super().on_train_begin(args, state, control, **kwargs)  # restores the saved attributes
        step = int(getattr(state, "global_step", 0))
        self._spent = spent = step > 0 and self._spent_in(self.find_saved_state(state))
        if self.window is not None:
            if logging_window.restore(self.trainer, self.window, step):
                logger.debug("Deadline: the logging window since step %s goes on.", self.window.get("since"))
            self.window = None
        self._training = True
        self._session_start = self._mark = self._clock()
        deadlines = self._deadlines()
        if deadlines:
            self._deadline_kind, self._deadline = min(deadlines.items(), key=lambda item: item[1])
        if distributed_world_size() > 1 and (self.signals or deadlines):
            self._group = cpu_group()  # a collective the first time: every rank is here
        self._flag.install()
        self._write_status(state)
        reason, name, stopped = self._resumed_from
        if stopped is not None and reason in (EndReason.DEADLINE.value, EndReason.SIGNAL.value):
            logger.info("Deadline: resuming at step %s after a stop on %s.", step,
                        name if reason == EndReason.SIGNAL.value else reason)
        if spent:
            tell(f"Deadline: the training budget of {show_seconds(self.budget)} is spent "
                 f"({show_seconds(self.elapsed)} used); a stock Trainer stops after one step (TrainerPlus "
                 "and LightweightTrainer veto such a resume before any step). Raise the budget to train on.",
                 state, verbose=self.verbose, level=logging.WARNING)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Measure the step; at a check, agree with the other ranks and stop when needed; add the
        final evaluation when training ends here."""
        if not self._training:
            return
        now = self._clock()
        if self._mark is not None:
            self.measurements.add("step", now - self._mark)
        self._mark = now
        step = int(state.global_step)
        epoch = float(getattr(state, "epoch", 0) or 0)
        checks = bool(self.signals or self._deadline_kind)
        # the same on every rank: the step, the last step, a stop another callback decided (synced)
        last = bool(state.max_steps and step >= state.max_steps)
        due = self._spent or step % self.check_every == 0 or last or bool(control.should_training_stop)
        if checks and due:
            self._boundary(args, state, control, epoch_ends_here=epoch > 0 and epoch == int(epoch))
        elif control.should_training_stop:
            self._natural_end(args, state, control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """At a stop: no second save or evaluation of the step just saved (but the evaluation a stop
        decided right after the save, and the save that keeps it). Else a check."""
        if not self._training:
            return
        self._mark = self._clock()
        step = int(state.global_step)
        if control.should_training_stop:
            ours = self._stop is not None and self._stop["step"] == step
            evaluates = ours and self._stop["evaluate"] and self._evaluated_step != step  # decided at on_save
            if self._saved_step == step and not evaluates:
                control.should_save = False
            if self._evaluated_step == step or (ours and not self._stop["evaluate"]):
                control.should_evaluate = False
            return
        if self.signals or self._deadline_kind:
            self._boundary(args, state, control, epoch_end=True)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Measure the evaluation (from the step's end)."""
        if self._training and self._mark is not None:
            now = self._clock()
            self.measurements.add("evaluate", now - self._mark)
            self._mark = now
            self._evaluated_step = int(state.global_step)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Measure the save; at a stop, note when its checkpoint was complete; else a check: the
        checkpoint just written can be the stop's (no second save)."""
        super().on_save(args, state, control, **kwargs)
        if not self._training or self._mark is None:
            return
        now = self._clock()
        self.measurements.add("save", now - self._mark)
        self._mark = now
        step = int(state.global_step)
        self._saved_step = step
        self._checkpoint_complete(step, checkpoint_folder(args.output_dir, step), now)
        # the same on every rank: the step, the last step, a stop decided before this save
        ends = self._stop is not None or bool(state.max_steps and step >= state.max_steps) \
            or bool(control.should_training_stop)
        if (self.signals or self._deadline_kind) and not ends:
            self._boundary(args, state, control)

    def _checkpoint_complete(self, step: int, folder: str, now: Optional[float] = None) -> None:
        """The stop's checkpoint is complete: note where, and how long it took (from this rank's
        signal too, whenever it came before)."""
        stop = self._stop
        if stop is None or stop["step"] != step:
            return
        now = self._clock() if now is None else now
        self.decision_to_checkpoint = now - stop["decided"]
        received = self._flag.received
        if received is not None and received[1] <= now:
            self.signal_to_checkpoint = now - received[1]
        stop["checkpoint"] = folder

    def on_pre_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """Add ``deadline/reason`` to the end-of-training record."""
        if self.report and self._training and isinstance(logs, dict) and KeyGrammar.is_summary_record(logs):
            logs[REASON_KEY] = self._ending_now(state).label

    on_log = on_pre_log  # a stock Trainer without our handler: the loggers after this callback see it

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Put the previous signal handlers back, record the end (exit code, status file), tell it."""
        self._flag.restore()
        _CLAIMS.release(state, self.state_key, self)
        if not self._training:
            return
        self._training = False
        ending = self._ending_now(state)
        self.ending = ending
        self._write_status(state)
        if ending.reason is not EndReason.COMPLETED or self._flag.received is not None:
            tell(ending.message, state, verbose=self.verbose)

    def on_exception(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """(TrainerPlus / LightweightTrainer) training raised: put the previous handlers back."""
        self._flag.restore()
        _CLAIMS.release(state, self.state_key, self)
        self._training = False

    # -- the decision -----------------------------------------------------------------------
    def _schedule(self, args: Any, state: Any) -> Schedule:
        evals = _strategy(getattr(args, "eval_strategy", "no")) == "steps"
        saves = _strategy(getattr(args, "save_strategy", "no")) == "steps"
        return Schedule(eval_every=int(getattr(state, "eval_steps", 0) or 0) if evals else 0,
                        save_every=int(getattr(state, "save_steps", 0) or 0) if saves else 0,
                        max_steps=int(getattr(state, "max_steps", 0) or 0))

    def _boundary(self, args: Any, state: Any, control: Any, *, epoch_ends_here: bool = False,
                  epoch_end: bool = False) -> None:
        """One check: this rank's view, the agreement of all ranks, then the stop (or not). After this
        step's save (at its ``on_save``, or the epoch's end that follows) a stop keeps that checkpoint."""
        step = int(state.global_step)
        saved = self._saved_step == step
        now = self._clock()
        durations = self.measurements.estimate()
        ends_anyway = bool(state.max_steps and step >= state.max_steps) or bool(control.should_training_stop)
        left = self._deadline - now - self.margin
        before_stop = self.evaluate_before_stop and self._evaluated_step != step
        if self._spent:
            deadline_plan = plan_stop(-math.inf, durations, evaluate=False)
        else:
            deadline_plan = plan_boundary(
                left, step, durations, self._schedule(args, state), check_every=self.check_every,
                evaluates_now=bool(control.should_evaluate), saves_now=bool(control.should_save),
                epoch_ends_here=epoch_ends_here and not epoch_end,
                evaluate_before_stop=before_stop, saved=saved)
        received = self._flag.received
        since = 0.0 if received is None else max(0.0, now - received[1])
        wants = bool(control.should_evaluate) or before_stop
        stop_plan = plan_stop(left, durations, evaluate=wants, saved=saved)
        signal_plan = plan_stop(min(left, self.grace - since - self.margin), durations, evaluate=wants,
                                saved=saved)
        end_plan = plan_stop(left, durations, evaluate=bool(control.should_evaluate) or self.final_evaluation)
        mine = [1.0 if received is not None and received[0] == name else 0.0 for name in self.signals]
        by_budget = self._deadline_kind == "budget"
        budget_stop = self._spent or (deadline_plan.stop and not ends_anyway and by_budget)
        other_stop = deadline_plan.stop and not ends_anyway and not budget_stop
        mine += [float(other_stop), float(budget_stop), float(not stop_plan.evaluate),
                 float(not signal_plan.evaluate), float(not end_plan.evaluate)]
        agreed = sum_over_ranks(mine, group=self._group) if self._group is not None else mine
        n = len(self.signals)
        signalled = [name for name, count in zip(self.signals, agreed[:n]) if count > 0]
        other, budget, no_deadline_eval, no_signal_eval, no_end_eval = (value > 0 for value in agreed[n:])
        if ends_anyway and not signalled:
            self._natural_end(args, state, control, evaluate_fits=not no_end_eval)
            return
        if signalled and not ends_anyway:
            reason, evaluate = EndReason.SIGNAL, not no_signal_eval and wants
        elif signalled:  # the last step: training is complete, the signal changes nothing
            self._natural_end(args, state, control, evaluate_fits=not no_end_eval)
            return
        elif budget or other:
            reason = EndReason.BUDGET if budget else EndReason.DEADLINE
            evaluate = not no_deadline_eval and wants and not self._spent
        else:
            return
        if _strategy(getattr(args, "save_strategy", "no")) == "best" and evaluate:
            evaluate = False  # "best" would let the evaluation decide whether the stop's checkpoint is saved
        self._stop_here(args, state, control, reason, signalled[0] if signalled else None, evaluate,
                        deadline_plan, now)

    def _natural_end(self, args: Any, state: Any, control: Any, evaluate_fits: bool = True) -> None:
        """Training ends at this step anyway: add the final evaluation (and its save) when asked."""
        if self.final_evaluation and not control.should_evaluate and evaluate_fits:
            control.should_evaluate = True
            if _strategy(getattr(args, "save_strategy", "no")) not in ("no", "best"):
                control.should_save = True
        elif control.should_evaluate and not evaluate_fits and self._deadline_kind:
            control.should_evaluate = False
            tell(f"Deadline: the evaluation of the last step {state.global_step} would not end before the "
                 f"deadline; skipping it.", state, verbose=self.verbose, level=logging.WARNING)

    def _stop_here(self, args: Any, state: Any, control: Any, reason: EndReason, name: Optional[str],
                   evaluate: bool, deadline_plan: Plan, now: float) -> None:
        step = int(state.global_step)
        skipped = bool(control.should_evaluate) and not evaluate
        evaluate = evaluate and self._evaluated_step != step
        saved = self._saved_step == step and not evaluate  # right after this step's save: no second one
        control.should_training_stop = True
        control.should_save = not saved
        control.should_evaluate = evaluate
        trainer = self.trainer
        logs_now = bool(control.should_log) and trainer is not None \
            and step > int(getattr(trainer, "_globalstep_last_logged", step))
        self.window = logging_window.capture(trainer, step, logs_now, group=self._group)
        self.stopped_step, self.reason, self.stopped_signal = step, reason, name
        self._stop = {"step": step, "reason": reason, "evaluate": evaluate, "decided": now,
                      "checkpoint": None, "kept": saved}
        if saved:  # this stop's state goes into the checkpoint just written
            folder = checkpoint_folder(args.output_dir, step)
            if getattr(state, "is_world_process_zero", True):
                self.write_state_into_checkpoint(folder)
            self._checkpoint_complete(step, folder)
        tell(self._stop_line(reason, name, step, evaluate, saved, deadline_plan, now)
             + ("; the scheduled evaluation is skipped (it would not fit)" if skipped else "") + ".",
             state, verbose=self.verbose, level=logging.WARNING)

    def _stop_line(self, reason: EndReason, name: Optional[str], step: int, evaluate: bool, saved: bool,
                   deadline_plan: Plan, now: float) -> str:
        """Why training stops here, what the stop does, and whether that ends in time: from the numbers."""
        until, limit, margin = self._deadline - now, "the deadline", show_seconds(self.margin)
        if reason is EndReason.SIGNAL:
            got = self._flag.received  # read again: it may have come while this rank waited for the others
            ago = show_seconds(max(0.0, self._clock() - got[1])) if got is not None else ""
            why = (f"{name} received {ago} ago" if got is not None and got[0] == name else
                   f"{name} received by another rank" + (f" ({got[0]} here, {ago} ago)" if got else ""))
            grace = self.grace - (max(0.0, now - got[1]) if got is not None else 0.0)
            if grace < until:
                until, limit = grace, "the end of the grace period"
        elif self._spent:
            why = f"the training budget of {show_seconds(self.budget)} is spent"
        else:
            what = {"duration": f"the duration of {show_seconds(self.duration)}",
                    "budget": f"the budget of {show_seconds(self.budget)}"}.get(self._deadline_kind or "",
                                                                              "the deadline (at)")
            ahead = show_seconds(deadline_plan.ahead)
            why = f"{what} ends in {show_seconds(until)}; " + (
                f"going on to the next check and saving there (~{ahead}) would not leave the margin of "
                f"{margin}" if deadline_plan.stop else
                f"another rank's estimates leave no room to go on within the margin of {margin}")
        durations = self.measurements.estimate()
        needed = (durations.evaluate if evaluate else 0.0) + (0.0 if saved else durations.save)
        todo = (f"keeping checkpoint-{step}, just saved" if saved else
                ("evaluating, then saving" if evaluate else "saving") + f" checkpoint-{step}")
        took = f" (~{show_seconds(needed)}, {show_seconds(until)} before {limit}: "
        if needed and needed > until:
            todo += took + "it may end after it)"
        elif needed and needed > until - self.margin:
            todo += took + f"into the margin of {margin})"
        return f"Deadline: {why}; stopping after step {step}: {todo}"

    # -- the end ----------------------------------------------------------------------------
    def _ending_now(self, state: Any) -> Ending:
        step = int(getattr(state, "global_step", 0))
        max_steps = int(getattr(state, "max_steps", 0) or 0)
        stop = self._stop
        if stop is not None and not (max_steps and step >= max_steps):
            reason, name = stop["reason"], self.stopped_signal
        elif self.reason is EndReason.BUDGET:
            reason, name = EndReason.BUDGET, None
        else:
            reason = EndReason.COMPLETED if (max_steps and step >= max_steps) else EndReason.STOPPED
            name = None
        ending = self._end(state, reason, step, name)
        return ending

    def _end(self, state: Any, reason: EndReason, step: int, name: Optional[str] = None) -> Ending:
        stop = self._stop or {}
        checkpoint = stop.get("checkpoint")
        saved = checkpoint is not None
        code = self.requeue_exit_code if reason.resumable and saved else (1 if reason.resumable else 0)
        ending = Ending(reason=reason, step=step, signal=name, checkpoint=checkpoint,
                        max_steps=int(getattr(state, "max_steps", 0) or 0), exit_code=code)
        used = f"training time {show_seconds(self.elapsed_now())}" + (
            f" of the budget of {show_seconds(self.budget)}" if self.budget is not None else "")
        if reason.resumable:
            timing = (f" {show_seconds(self.signal_to_checkpoint)} after the signal"
                      if self.signal_to_checkpoint is not None else " (saved just before the decision)"
                      if stop.get("kept") else
                      f" {show_seconds(self.decision_to_checkpoint)} after the decision"
                      if self.decision_to_checkpoint is not None else "")
            done = (f"checkpoint-{step} complete{timing}; resume with train(resume_from_checkpoint=True)"
                    if saved else "its checkpoint was NOT saved")
            ending.message = (f"Deadline summary: stopped at step {step} of {ending.max_steps} on "
                              f"{ending.label}; {done}; {used}; exit code {code}.")
        else:
            ending.message = (f"Deadline summary: training {reason.value} at step {step} of "
                              f"{ending.max_steps}; {used}; exit code {code}.")
        if self.signal_to_checkpoint is not None:
            ending.extra["signal_to_checkpoint_seconds"] = round(self.signal_to_checkpoint, 6)
        ending.extra["elapsed_seconds"] = round(self.elapsed_now(), 3)
        self.ending = ending
        return ending

    def _write_status(self, state: Any) -> None:
        if self.status_file is None or not getattr(state, "is_world_process_zero", True):
            return
        try:
            write_status(self.status_file, self.ending)
        except OSError as error:  # a status file must never stop a training
            logger.warning("Deadline: could not write the status file %s: %s", self.status_file, error)


#: Marks the ``train`` that `restore_handlers_after_train` put on a trainer.
_RESTORES = "_hf_callbacks_plus_restores_signal_handlers"


def restore_handlers_after_train(trainer: Any, deadline: Deadline) -> None:
    """Give ``trainer`` (once) a ``train`` of its own (an instance attribute) that runs the one it had
    and then puts ``deadline``'s previous signal handlers back, whether it returned or raised. It
    holds the trainer and the callback weakly."""
    current = getattr(trainer, "train", None)
    if not callable(current) or getattr(vars(trainer).get("train"), _RESTORES, False):
        return
    owner, holder = weak_reference(trainer), weakref.ref(deadline)
    function = current.__func__ if getattr(current, "__self__", None) is trainer else None

    def train(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(owner(), *args, **kwargs) if function is not None else current(*args, **kwargs)
        finally:
            callback = holder()
            if callback is not None:
                callback.restore_signal_handlers()

    train.__doc__ = current.__doc__
    setattr(train, _RESTORES, True)
    trainer.train = train
