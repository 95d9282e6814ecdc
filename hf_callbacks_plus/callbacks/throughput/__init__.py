"""`ThroughputMonitor`: samples/s, tokens/s (three ways), TFLOP/s and MFU per logging window.

**What it counts.** A forward pre-hook on the model, registered at train begin, reads the
keyword arguments of every training forward pass (``model.training`` and gradients enabled:
each micro-batch of a gradient-accumulation step, on every rank; evaluation, generation and a
trainer's extra no-grad passes are not counted) and adds up samples, tokens, non-padding tokens
and loss tokens (`hf_callbacks_plus.callbacks.throughput.batch_counts`) without synchronising the device.

**When it times.** Only at the logging steps, after the trainer read the loss (a device
synchronisation it does anyway): the window is the time since the previous logging step minus
what is left out. Left out, and reported as ``throughput/left_out_seconds``: everything from a
logging step, an evaluation or a checkpoint save to the start of the next step (the evaluation,
the save, the loggers' work); an evaluation or save on a step that does not log is marked by
one device synchronisation at that step's end (the evaluation or save synchronises anyway).
The first ``warmup_steps`` steps of each ``train()`` call (compilation, allocator and data
loader warm-up) are in no window: records logged before the first window has a step carry no
figures. Under DDP the counts of every rank are summed once per window (one ``all_reduce`` of
one small tensor, at the logging step); the times are each rank's own.

**The record.** Keys under ``throughput/`` in the training log record (``train/loss``'s record):
``samples_per_second``, ``tokens_per_second`` (all positions), ``non_padding_tokens_per_second``,
``loss_tokens_per_second``, the same under ``throughput/device/`` (the total divided by the number
of processes), ``tflops_per_second`` and ``device/tflops_per_second`` (model FLOPs of the
non-padding tokens: `hf_callbacks_plus.callbacks.throughput.flops`), ``mfu`` (FLOP/s over the peak of all
devices), ``window_seconds``, ``window_steps`` and ``left_out_seconds``. A figure whose count is
unknown (no ``input_ids``, no ``labels`` in a micro-batch, no FLOP count, no peak) is left out.

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
from ...runtime.distributed import distributed_world_size, sum_over_ranks
from .batch_counts import COUNTS, BatchCounts
from .flops import (
    PRECISIONS,
    TrainingFlops,
    loss_shifts_labels,
    measure_training_flops,
    peak_flops,
    training_flops,
    training_precision,
)

__all__ = ["FLOPS_CHOICES", "ThroughputMonitor"]

logger = logging.getLogger("hf_callbacks_plus")

#: The words ``flops_per_token`` accepts besides a number and None.
FLOPS_CHOICES = ("auto", "measure")

#: Prefix of every key the monitor logs.
PREFIX = "throughput/"


class ThroughputMonitor(TrainerCallback):
    """Log samples/s, tokens/s, TFLOP/s and MFU of each logging window (module docstring).

    Args:
        flops_per_token: How the FLOPs are counted: ``"auto"`` counts them from the model's
            weights and config (trained and frozen weights told apart, so LoRA is counted
            right, plus attention; `hf_callbacks_plus.callbacks.throughput.flops.training_flops`);
            ``"measure"`` counts the first training micro-batch's forward and backward once with
            ``torch.utils.flop_counter`` (an extra pass during warm-up; FLOPs per token at that
            batch's length); a number is your own training FLOPs per token; None logs no FLOPs.
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
            not one of the values above.

    Note:
        The figures go into each training log record under ``throughput/``: samples/s, tokens/s
        (all positions, non-padding, loss tokens), their per-device share, TFLOP/s of the
        non-padding tokens, MFU, and the window's ``window_seconds``, ``window_steps`` and
        ``left_out_seconds``. The window is timed only at logging steps; evaluation, saving,
        logging and the first ``warmup_steps`` are left out of it; under DDP the counts of every
        rank are summed once per window. A figure whose count is unknown is left out.

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
        if precision != "auto" and precision not in PRECISIONS:
            raise ValueError(
                f"ThroughputMonitor: precision must be one of {['auto', *PRECISIONS]}, got {precision!r}."
            )
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"ThroughputMonitor: warmup_steps must be an int >= 0, got {warmup_steps!r}.")
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self.precision = precision
        self.warmup_steps = warmup_steps
        #: The FLOP count in use (None before train begin, or when there is none).
        self.flops: Optional[TrainingFlops] = None
        #: Peak FLOP/s of one device in use for the MFU (None: no MFU).
        self.device_peak_flops: Optional[float] = None
        self.counts = BatchCounts()
        self._hook: Any = None
        self._device: Any = None
        self._grad_enabled: Any = None
        self._measure_pending = False
        self._measuring = False
        self._world_size = 1
        self._warm_until = 0
        self._window_step: Optional[int] = None  # global_step at the window's start; None: no window yet
        self._clock = 0.0
        self._left_out = 0.0
        self._pause_began: Optional[float] = None
        self._handled: Any = None
        self._warned: set[str] = set()

    # -- train begin: the hook, the FLOP count, the peak ----------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Hook the model, choose the FLOP count and the peak, start the warm-up."""
        if not hasattr(model, "register_forward_pre_hook"):
            raise TypeError(
                "ThroughputMonitor needs the torch model in on_train_begin (model=...), which "
                f"transformers.Trainer, TrainerPlus and LightweightTrainer pass; got {type(model).__name__}."
            )
        import torch

        self._remove_hook()
        self._grad_enabled = torch.is_grad_enabled
        self._device = getattr(args, "device", None) or next((p.device for p in model.parameters()), None)
        self._world_size = distributed_world_size()
        self.counts = BatchCounts(shifts_labels=loss_shifts_labels(model))
        self.flops, self._measure_pending = None, False
        if self.flops_per_token == "auto":
            counted = training_flops(model)
            self.flops = counted if counted.parameters else None
        elif self.flops_per_token == "measure":
            self._measure_pending = True
        elif self.flops_per_token is not None:
            self.flops = TrainingFlops(per_token=float(self.flops_per_token), source="given")
        self.device_peak_flops = self.peak_flops
        if self.device_peak_flops is None and getattr(self._device, "type", None) == "cuda":
            precision = training_precision(args, model) if self.precision == "auto" else self.precision
            name = torch.cuda.get_device_name(self._device)
            self.device_peak_flops = peak_flops(name, precision)
            if self.device_peak_flops is None:
                self._warn_once("peak", f"ThroughputMonitor: no known peak for {name!r} in {precision}; "
                                        "no MFU is logged (pass peak_flops=<FLOP/s of one device>).")
        self._hook = model.register_forward_pre_hook(self._on_forward, with_kwargs=True)
        self._handled = None
        self._window_step, self._pause_began = None, None
        self._warm_until = int(state.global_step) + self.warmup_steps
        if self.warmup_steps == 0:
            self._open_window(state)

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
            self._warn_once("measure", "ThroughputMonitor: the training batches have no input_ids, so there "
                                       "are no FLOPs per token to measure; no FLOPs are logged.")
            return
        self._measuring = True
        try:
            measured = measure_training_flops(module, kwargs)
        except ValueError as error:
            self._warn_once("measure", f"ThroughputMonitor: {error} No FLOPs are logged.")
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
        self._clock, self._left_out, self._pause_began = now, 0.0, now

    def _synchronize(self) -> None:
        """Wait for the device's queued work (CUDA, XPU, MPS; nothing to wait for on CPU)."""
        kind = getattr(self._device, "type", "cpu")
        if kind in ("cuda", "xpu", "mps"):
            import torch

            getattr(torch, kind).synchronize()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Close what was left out (logging, evaluation, saving) since the previous step."""
        if self._pause_began is not None:
            self._left_out += time.perf_counter() - self._pause_began
            self._pause_began = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Open the first window after the warm-up; mark where an evaluation or save begins."""
        if self._window_step is None:
            if state.global_step >= self._warm_until:
                self._open_window(state)
            return
        pausing = control.should_evaluate or control.should_save
        if self._pause_began is None and not control.should_log and pausing:
            self._synchronize()
            self._pause_began = time.perf_counter()

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        """An evaluation no step end announced (a callback after this one asked for it): leave its
        ``<prefix>_runtime`` out, and what follows until the next step."""
        if self._window_step is None or self._pause_began is not None:
            return
        runtime = next((v for k, v in (metrics or {}).items() if str(k).endswith("_runtime")), None)
        if _positive(runtime):
            self._left_out += float(runtime)
        self._pause_began = time.perf_counter()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """A save no step end announced: leave out what follows it until the next step."""
        if self._window_step is not None and self._pause_began is None:
            self._pause_began = time.perf_counter()

    # -- the record --------------------------------------------------------------------------------
    def on_pre_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """Add the window's figures to a training record (before any ``on_log``)."""
        if _is_training_record(logs):
            logs.update(self._close_window(state))
            self._handled = logs

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """Without ``on_pre_log`` (a stock Trainer): add the figures here, to the record and to
        ``state.log_history``."""
        handled, self._handled = self._handled, None
        if not _is_training_record(logs) or logs is handled:
            return
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
        """The figures of the window ending now; a new window starts (what follows is left out
        until the next step)."""
        if self._window_step is None:
            return {}
        now = time.perf_counter()
        steps = int(state.global_step) - self._window_step
        if steps <= 0:
            return {}
        left_out = self._left_out + (now - self._pause_began if self._pause_began is not None else 0.0)
        seconds = now - self._clock - left_out
        totals = dict(zip(COUNTS, sum_over_ranks(self.counts.totals())))
        self.counts.reset()
        self._window_step = int(state.global_step)
        self._clock, self._left_out, self._pause_began = now, 0.0, now
        return self._figures(totals, seconds, steps, left_out)

    def _figures(self, totals: dict[str, float], seconds: float, steps: int,
                 left_out: float) -> dict[str, float]:
        figures = {f"{PREFIX}window_seconds": seconds, f"{PREFIX}window_steps": float(steps),
                   f"{PREFIX}left_out_seconds": left_out}
        if seconds <= 0 or not totals["micro_batches"]:
            return figures
        world = self._world_size
        rates = {"samples": totals["samples"]}
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
        self._window_step, self._pause_began = None, None

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)


def _positive(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 < value < math.inf


def _is_training_record(logs: Any) -> bool:
    """A record of the training loop: it has the running ``loss`` (the end-of-training summary has
    ``train_loss``; with ``include_num_input_tokens_seen`` every training record also carries
    ``train_runtime``) and no evaluation key."""
    return (isinstance(logs, dict) and "loss" in logs
            and not any(isinstance(key, str) and key.startswith("eval_") for key in logs))
