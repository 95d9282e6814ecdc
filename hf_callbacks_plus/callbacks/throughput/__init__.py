"""`ThroughputMonitor`: sequences/s, tokens/s (three ways), TFLOP/s and MFU per logging window.

**What it counts.** A forward pre-hook on the model, registered at train begin, reads the
keyword arguments of every training forward pass (``model.training`` and gradients enabled:
each micro-batch of a gradient-accumulation step, on every rank; evaluation, generation and a
trainer's extra no-grad passes are not counted) and adds up sequences, tokens, non-padding
tokens and loss tokens (`hf_callbacks_plus.callbacks.throughput.batch_counts`) without
synchronising the device.

**When it times.** What the user's wall clock sees, data loading included: a window runs from
the end of one logging step to the end of the next, and only the work of the log, evaluation
and save points inside it is left out, each piece timed from the step's end (or the previous
piece) to the monitor's own event that ends it: the training record's ``on_log`` (logging),
an evaluation record's ``on_log`` and ``on_evaluate`` (evaluation), ``on_save`` (saving). What
follows the last piece, the next step's data fetch (transformers and ``LightweightTrainer``
fetch a step's micro-batches before ``on_step_begin``), is training time. The monitor moves
itself to the end of the callback list at train begin when a runner gave it the trainer
(``TrainerPlus``, ``LightweightTrainer``, ``run_before_integrations``), so every other
callback's work at those events is left out too; in a stock Trainer without that it stays where
it was put. A step end that announces a point (``should_log``, ``should_evaluate``,
``should_save``) is marked after one device synchronisation (the point synchronises anyway);
other marks wait for nothing. The first ``warmup_steps`` steps of each ``train()`` call
(compilation, allocator and data loader warm-up) are in no window. Under DDP the counts of
every rank are summed once per window (one ``all_reduce`` of one small tensor, at the logging
step); the times are each rank's own.

**The record.** Keys under ``throughput/`` in the training log record (``train/loss``'s record):
``sequences_per_second`` (``samples_per_second``, its 0.2 name, carries the same value),
``tokens_per_second`` (all positions), ``non_padding_tokens_per_second``,
``loss_tokens_per_second``, the same under ``throughput/device/`` (the total divided by the
number of processes), ``tflops_per_second`` and ``device/tflops_per_second`` (model FLOPs of the
non-padding tokens: `hf_callbacks_plus.callbacks.throughput.flops`), ``mfu`` (FLOP/s over the
peak of all devices), ``window_seconds``, ``window_steps``, ``logging_seconds``,
``evaluation_seconds``, ``save_seconds`` and their sum ``left_out_seconds``. A figure that
cannot be computed (no ``input_ids``/``inputs_embeds``, no ``labels``, no FLOP count, no peak)
is left out, and one warning says which and why.

How it reaches the record: ``TrainerPlus`` and a trainer passed to ``run_before_integrations``
fire ``on_pre_log``, so the figures reach every report_to integration; in a stock Trainer
without it they are added in ``on_log``: to ``state.log_history`` and to the callbacks after
this one, not to the integrations before it (one warning says so when there are any).
"""

from __future__ import annotations

import logging
import math
import numbers
import time
from typing import Any, Optional, Union

from ...core.callback import TrainerCallback
from ...core.checks import check_choice, check_int
from ...metrics.keys import evaluation_prefix, is_training_record
from ...runtime.distributed import distributed_world_size, sum_over_ranks
from ...runtime.engines import sharding_engine
from .batch_counts import COUNTS, BatchCounts
from .flops import (
    PRECISIONS,
    TrainingFlops,
    loss_shifts_labels,
    measure_training_flops,
    peak_flops,
    reentrant_checkpointing,
    training_flops,
    training_precision,
)

__all__ = ["FLOPS_CHOICES", "LEFT_OUT", "ThroughputMonitor"]

logger = logging.getLogger("hf_callbacks_plus")

#: The words ``flops_per_token`` accepts besides a number and None.
FLOPS_CHOICES = ("auto", "measure")

#: Prefix of every key the monitor logs.
PREFIX = "throughput/"

#: What is left out of a window, each reported as ``throughput/<name>_seconds``.
LEFT_OUT = ("logging", "evaluation", "save")


class ThroughputMonitor(TrainerCallback):
    """Log sequences/s, tokens/s, TFLOP/s and MFU of each logging window (module docstring).

    Args:
        flops_per_token: How the FLOPs are counted: ``"auto"`` counts them from the model's
            weights and config (trained and frozen weights told apart, so LoRA is counted
            right, plus attention; `hf_callbacks_plus.callbacks.throughput.flops.training_flops`);
            ``"measure"`` counts the first training micro-batch's forward and backward once with
            ``torch.utils.flop_counter`` (an extra pass during warm-up; FLOPs per token at that
            batch's length; refused at train begin under FSDP and with reentrant activation
            checkpointing, whose backward the pass cannot follow); a number is your own training
            FLOPs per token; None logs no FLOPs. The counts use the full parameter shapes under
            DeepSpeed ZeRO-3 and FSDP.
            Defaults to ``"auto"``.
        peak_flops: Peak FLOP/s of one device, for the MFU. Defaults to None: the dense peak of
            a known accelerator for ``precision`` (`hf_callbacks_plus.callbacks.throughput.flops.PEAK_FLOPS`),
            else no MFU (a CPU has no entry: give its peak).
        precision: The precision of the matrix products, to look the peak up: one of
            ``"fp32"``, ``"tf32"``, ``"bf16"``, ``"fp16"``, or ``"auto"`` (``bf16``/``fp16``
            from the training arguments or the weights' dtype, ``tf32`` when PyTorch allows it).
            Defaults to ``"auto"``.
        warmup_steps: Optimizer steps at the start of each ``train()`` call left out of every
            window. Defaults to 1.

    Raises:
        ValueError: ``flops_per_token``, ``peak_flops``, ``precision`` or ``warmup_steps`` is
            not one of the values above; at train begin, ``flops_per_token="measure"`` with a
            model sharded by FSDP or with reentrant activation checkpointing.

    Note:
        The figures go into each training log record under ``throughput/``: sequences/s, tokens/s
        (all positions, non-padding, loss tokens), their per-device share, TFLOP/s of the
        non-padding tokens, MFU, and the window's ``window_seconds``, ``window_steps``, and the
        seconds left out of it (``logging_seconds``, ``evaluation_seconds``, ``save_seconds``,
        ``left_out_seconds``). The window is what the wall clock sees, data loading included;
        the log, evaluation and save points and the first ``warmup_steps`` are left out; under
        DDP the counts of every rank are summed once per window. A figure that cannot be
        computed is left out and one warning says which and why.

    Example:
        >>> monitor = ThroughputMonitor(peak_flops=312e12)   # your device's peak, e.g. A100 bf16
        >>> trainer = Trainer(model=model, args=args, train_dataset=train, callbacks=[monitor])
        >>> run_before_integrations(trainer)   # the figures reach report_to too
    """

    def __init__(self, flops_per_token: Union[str, float, None] = "auto", peak_flops: Optional[float] = None,
                 precision: str = "auto", warmup_steps: int = 1) -> None:
        if isinstance(flops_per_token, str):
            valid = flops_per_token in FLOPS_CHOICES
        else:
            valid = flops_per_token is None or _positive(flops_per_token)
        if not valid:
            raise ValueError(
                f"ThroughputMonitor: flops_per_token must be one of {list(FLOPS_CHOICES)}, a number > 0 "
                f"or None, got {flops_per_token!r}."
            )
        if peak_flops is not None and not _positive(peak_flops):
            raise ValueError(
                f"ThroughputMonitor: peak_flops must be a number > 0 (FLOP/s of one device) or None, "
                f"got {peak_flops!r}."
            )
        check_choice("ThroughputMonitor", "precision", precision, ["auto", *PRECISIONS])
        check_int("ThroughputMonitor", "warmup_steps", warmup_steps, minimum=0)
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self.precision = precision
        self.warmup_steps = warmup_steps
        #: The FLOP count in use (None before train begin, or when there is none).
        self.flops: Optional[TrainingFlops] = None
        #: Peak FLOP/s of one device in use for the MFU (None: no MFU).
        self.device_peak_flops: Optional[float] = None
        self.counts = BatchCounts()
        self._trainer: Any = None
        self._hook: Any = None
        self._device: Any = None
        self._grad_enabled: Any = None
        self._measure_pending = False
        self._measuring = False
        self._world_size = 1
        self._warm_until = 0
        self._window_step: Optional[int] = None  # global_step at the window's start; None: no window yet
        self._clock = 0.0  # the window's start
        self._step_end = 0.0  # the last step's (or epoch's) end: where a point's work begins
        self._pause: Optional[float] = None  # the start of the point under way (None: training)
        self._mark = 0.0  # the end of the last piece of the point under way
        self._open = dict.fromkeys(LEFT_OUT, 0.0)  # the point under way, by kind
        self._closed = dict.fromkeys(LEFT_OUT, 0.0)  # the window's finished points, by kind
        self._handled: Any = None
        self._warned: set[str] = set()

    def bind(self, trainer: Any) -> ThroughputMonitor:
        """Give the monitor its trainer (every runner does; see ``bind_trainer``), so that it can
        run last in each event from train begin on.

        Returns:
            self.
        """
        self._trainer = trainer
        return self

    # -- train begin: the hook, the FLOP count, the peak ----------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Hook the model, choose the FLOP count and the peak, run last, start the warm-up."""
        if not hasattr(model, "register_forward_pre_hook"):
            raise TypeError(
                "ThroughputMonitor needs the torch model in on_train_begin (model=...), which "
                f"transformers.Trainer, TrainerPlus and LightweightTrainer pass; got {type(model).__name__}."
            )
        import torch

        self._remove_hook()
        self._run_last()
        self._grad_enabled = torch.is_grad_enabled
        self._device = getattr(args, "device", None) or next((p.device for p in model.parameters()), None)
        self._world_size = distributed_world_size()
        self.counts = BatchCounts(shifts_labels=loss_shifts_labels(model))
        self.flops, self._measure_pending = None, False
        if self.flops_per_token == "auto":
            counted = training_flops(model)
            self.flops = counted if counted.parameters else None
            if self.flops is None:
                self._missing("flops", ["tflops_per_second", "mfu"],
                              f"flops_per_token='auto' found no weight matrix (a parameter of 2 or more "
                              f"dimensions outside an embedding) in {type(model).__name__}; pass "
                              "flops_per_token=<training FLOPs per token>")
        elif self.flops_per_token == "measure":
            _refuse_measure(model)
            self._measure_pending = True
        elif self.flops_per_token is not None:
            self.flops = TrainingFlops(per_token=float(self.flops_per_token), source="given")
        self.device_peak_flops = self.peak_flops
        if self.device_peak_flops is None and self.flops_per_token is not None:
            self.device_peak_flops = self._table_peak(args, model)
        self._hook = model.register_forward_pre_hook(self._on_forward, with_kwargs=True)
        self._handled = None
        self._window_step, self._pause = None, None
        self._warm_until = int(state.global_step) + self.warmup_steps
        if self.warmup_steps == 0:
            self._open_window(state)

    def _run_last(self) -> None:
        """Move to the end of the bound trainer's callback list (a new list: the walk of the
        event under way goes on over the old one), so that the pieces of a point end after
        every other callback's work."""
        handler = getattr(self._trainer, "callback_handler", None)
        callbacks = getattr(handler, "callbacks", None)
        if isinstance(callbacks, list) and any(c is self for c in callbacks) and callbacks[-1] is not self:
            handler.callbacks = [c for c in callbacks if c is not self] + [self]

    def _table_peak(self, args: Any, model: Any) -> Optional[float]:
        """The dense peak of one device from the table, or None (and one warning)."""
        kind = getattr(self._device, "type", None)
        if kind != "cuda":
            self._missing("peak", ["mfu"], f"the peak FLOP/s of a {kind or 'unknown'} device is not in the "
                                           "table; pass peak_flops=<FLOP/s of one device>")
            return None
        import torch

        precision = training_precision(args, model) if self.precision == "auto" else self.precision
        name = torch.cuda.get_device_name(self._device)
        peak = peak_flops(name, precision)
        if peak is None:
            self._missing("peak", ["mfu"], f"no known peak for {name!r} in {precision}; pass "
                                           "peak_flops=<FLOP/s of one device>")
        return peak

    def _on_forward(self, module: Any, args: Any, kwargs: Any) -> None:
        if not module.training or self._measuring or not self._grad_enabled():
            return
        if self._measure_pending:
            self._measure(module, kwargs)
        self.counts.add(kwargs, args)

    def _measure(self, module: Any, kwargs: Any) -> None:
        """Count one forward and backward pass of this micro-batch with ``torch.utils.flop_counter``."""
        self._measure_pending = False
        probe = BatchCounts()
        probe.add(kwargs)
        tokens = probe.totals()[COUNTS.index("tokens")]
        if not tokens:
            self._missing("flops", ["tflops_per_second", "mfu"],
                          "flops_per_token='measure' counts FLOPs per token, and the training batches have "
                          "no input_ids or inputs_embeds")
            return
        self._measuring = True
        try:
            measured = measure_training_flops(module, kwargs)
        except ValueError as error:
            self._missing("flops", ["tflops_per_second", "mfu"], str(error).rstrip("."))
            return
        finally:
            self._measuring = False
        self.flops = TrainingFlops(per_token=measured / tokens, source="measured")

    # -- the window clock ------------------------------------------------------------------------
    def _open_window(self, state: Any) -> None:
        self._synchronize()
        self.counts.reset()
        now = time.perf_counter()
        self._window_step = int(state.global_step)
        self._clock = self._step_end = now
        self._pause = None
        self._open = dict.fromkeys(LEFT_OUT, 0.0)
        self._closed = dict.fromkeys(LEFT_OUT, 0.0)

    def _synchronize(self) -> None:
        """Wait for the device's queued work (CUDA, XPU, MPS; nothing to wait for on CPU)."""
        kind = getattr(self._device, "type", "cpu")
        if kind in ("cuda", "xpu", "mps"):
            import torch

            getattr(torch, kind).synchronize()

    def _mark_step_end(self, control: Any) -> None:
        """Where the training of a step (or epoch) ends and a point's work may begin; after one
        device synchronisation when the step end announces a point."""
        if self._window_step is None or self._pause is not None:
            return
        if control.should_log or control.should_evaluate or control.should_save:
            self._synchronize()
        self._step_end = time.perf_counter()

    def _piece(self, kind: str) -> None:
        """A piece of a point (logging, evaluation, save) ends now."""
        if self._window_step is None:
            return
        now = time.perf_counter()
        if self._pause is None:
            self._pause = self._mark = self._step_end
        self._open[kind] += now - self._mark
        self._mark = now

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The point before this step (if any) is over: its pieces join the window's."""
        if self._pause is not None:
            for kind in LEFT_OUT:
                self._closed[kind] += self._open[kind]
            self._open = dict.fromkeys(LEFT_OUT, 0.0)
            self._pause = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Open the first window after the warm-up; mark the step's end."""
        if self._window_step is None:
            if state.global_step >= self._warm_until:
                self._open_window(state)
            return
        self._mark_step_end(control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Mark the epoch's end (an evaluation or save by epoch follows it)."""
        self._mark_step_end(control)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """An evaluation (of one eval set) ends: a piece of evaluation."""
        self._piece("evaluation")

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """A save ends: a piece of saving."""
        self._piece("save")

    # -- the record --------------------------------------------------------------------------------
    def on_pre_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """Add the window's figures to a training record (before any ``on_log``)."""
        if isinstance(logs, dict) and is_training_record(logs):
            logs.update(self._close_window(state))
            self._handled = logs

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """End a piece of logging (the training record) or of evaluation (an evaluation record);
        without ``on_pre_log`` (a stock Trainer), first add the figures to the training record and
        to ``state.log_history``."""
        handled, self._handled = self._handled, None
        record = logs if isinstance(logs, dict) else {}
        if is_training_record(record) and logs is not handled:
            self._add_in_on_log(args, state, record)
        self._piece("evaluation" if evaluation_prefix(record) is not None else "logging")

    def _add_in_on_log(self, args: Any, state: Any, logs: dict) -> None:
        figures = self._close_window(state)
        if not figures:
            return
        history = getattr(state, "log_history", None)
        if history and isinstance(history[-1], dict) and history[-1].get("loss") is logs.get("loss"):
            history[-1].update(figures)
        logs.update(figures)
        if [name for name in (getattr(args, "report_to", None) or []) if name != "none"]:
            self._warn_once(
                "pre_log",
                "ThroughputMonitor: this trainer does not fire on_pre_log, so the report_to integrations, "
                "which run before this callback, do not get the throughput figures (they are in "
                "state.log_history). Use TrainerPlus, or run_before_integrations(trainer) once after "
                "building it.",
            )

    def _close_window(self, state: Any) -> dict[str, float]:
        """The figures of the window ending where this logging step's training ended; the next
        window starts there (the point under way is in it)."""
        if self._window_step is None:
            return {}
        if self._pause is None:
            self._pause = self._mark = self._step_end
        steps = int(state.global_step) - self._window_step
        if steps <= 0:
            return {}
        left_out = dict(self._closed)
        seconds = self._pause - self._clock - sum(left_out.values())
        totals = dict(zip(COUNTS, sum_over_ranks(self.counts.totals())))
        self._warn_missing_counts(totals)
        self.counts.reset()
        self._window_step = int(state.global_step)
        self._clock = self._pause
        self._closed = dict.fromkeys(LEFT_OUT, 0.0)
        return self._figures(totals, seconds, steps, left_out)

    def _figures(self, totals: dict[str, float], seconds: float, steps: int,
                 left_out: dict[str, float]) -> dict[str, float]:
        figures = {f"{PREFIX}window_seconds": seconds, f"{PREFIX}window_steps": float(steps),
                   f"{PREFIX}left_out_seconds": sum(left_out.values()),
                   **{f"{PREFIX}{kind}_seconds": left_out[kind] for kind in LEFT_OUT}}
        if seconds <= 0 or not totals["micro_batches"]:
            return figures
        world = self._world_size
        rates = {"sequences": totals["sequences"], "samples": totals["sequences"]}  # samples: the 0.2 name
        if totals["token_batches"] == totals["micro_batches"]:
            rates["tokens"] = totals["tokens"]
            rates["non_padding_tokens"] = totals["non_padding_tokens"]
        if totals["label_batches"] == totals["micro_batches"]:
            rates["loss_tokens"] = totals["loss_tokens"]
        for name, count in rates.items():
            figures[f"{PREFIX}{name}_per_second"] = count / seconds
            figures[f"{PREFIX}device/{name}_per_second"] = count / seconds / world
        if self.flops is not None and "tokens" in rates:
            flops = self.flops.flops(totals["non_padding_tokens"], totals["squared_lengths"])
            flops_per_second = flops / seconds
            figures[f"{PREFIX}tflops_per_second"] = flops_per_second / 1e12
            figures[f"{PREFIX}device/tflops_per_second"] = flops_per_second / 1e12 / world
            if self.device_peak_flops:
                figures[f"{PREFIX}mfu"] = flops_per_second / (self.device_peak_flops * world)
        return figures

    def _warn_missing_counts(self, totals: dict[str, float]) -> None:
        """One warning per figure a window's batches cannot give."""
        passes = totals["micro_batches"]
        if totals["token_batches"] < passes:
            missing = ["tokens_per_second", "non_padding_tokens_per_second"]
            if self.flops is not None or self._measure_pending:
                missing += ["tflops_per_second", "mfu" if self.device_peak_flops else ""]
            self._missing("tokens", [m for m in missing if m],
                          f"{passes - totals['token_batches']:.0f} of {passes:.0f} training forward passes "
                          f"of a window had no input_ids or inputs_embeds (a pass got "
                          f"{_listed(self.counts.untokenized)}), so their tokens are unknown; "
                          "sequences_per_second counts their rows")
        if totals["label_batches"] < passes:
            self._missing("loss_tokens", ["loss_tokens_per_second"],
                          f"{passes - totals['label_batches']:.0f} of {passes:.0f} training forward passes "
                          f"of a window had no labels or shift_labels (a pass got "
                          f"{_listed(self.counts.unlabelled)}): the loss is computed outside the model's "
                          "forward (a compute_loss_func, trl's SFTTrainer with label smoothing)")

    # -- the end -------------------------------------------------------------------------------------
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Remove the hook."""
        self._remove_hook()

    def on_exception(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Remove the hook (``TrainerPlus`` and ``LightweightTrainer`` fire this event)."""
        self._remove_hook()

    def _remove_hook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._window_step, self._pause = None, None

    def _missing(self, key: str, figures: list[str], why: str) -> None:
        """Say once that ``figures`` are not logged, and why."""
        names = ", ".join(f"throughput/{figure}" for figure in figures)
        self._warn_once(key, f"ThroughputMonitor: {names} {'is' if len(figures) == 1 else 'are'} not logged: "
                             f"{why}.")

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)


def _refuse_measure(model: Any) -> None:
    """``flops_per_token="measure"`` asks autograd for the trained weights' gradients of one extra
    pass; it cannot count a backward pass that autograd does not run there: under FSDP (FSDP2,
    FSDP1 with ``use_orig_params=True``: the computation uses gathered copies of the sharded
    weights, so the pass counted the forward only; FSDP1 without: FSDP's gradient hooks are
    skipped) and with reentrant activation checkpointing (the checkpointed layers' backward is not
    followed: about a third of the FLOPs were counted)."""
    engine = sharding_engine(model)
    if engine in ("fsdp1", "fsdp2"):
        raise ValueError(
            f"ThroughputMonitor(flops_per_token='measure') cannot measure a model sharded by "
            f"{'FSDP2 (fully_shard)' if engine == 'fsdp2' else 'FSDP1 (flat parameters)'}: its extra "
            "forward and backward pass would count the forward only (FSDP computes with gathered copies "
            "of the sharded weights, which the pass does not reach) and skip FSDP's gradient hooks. "
            "Use flops_per_token='auto' (counted from the full parameter shapes, right under FSDP) or "
            "a number (your training FLOPs per token)."
        )
    if reentrant_checkpointing(model):
        raise ValueError(
            "ThroughputMonitor(flops_per_token='measure') cannot measure a model with reentrant "
            "activation checkpointing (gradient_checkpointing_kwargs={'use_reentrant': True}; trl sets it "
            "for a PEFT model under DeepSpeed ZeRO-3): autograd does not follow the checkpointed layers' "
            "backward in its extra pass, which would count about a third of the FLOPs. Use "
            "flops_per_token='auto', a number, or use_reentrant=False."
        )


def _positive(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 < value < math.inf


def _listed(names: Optional[tuple[str, ...]]) -> str:
    return ", ".join(names) if names else "no arguments"
