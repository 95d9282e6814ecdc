"""The steps of a training epoch: micro-batches, gradient accumulation, step events, optimizer hooks.

A port of the inner loop of ``transformers.Trainer._run_epoch`` (5.23): ``on_step_begin``
before the first micro-batch of a step, ``on_training_loss`` after each micro-batch,
``on_substep_end`` between micro-batches, then ``on_pre_optimizer_step``, the optimizer,
``on_optimizer_step``, ``on_step_end`` and the log/evaluate/save point.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import islice
from typing import Any, Optional

from ..metrics.numbers import to_float

__all__ = ["StepsMixin"]


class StepsMixin:
    """The step loop and optimizer hooks of `LightweightTrainer` (whose ``__init__`` sets the
    attributes every part of the loop reads)."""

    # The loop fires every event through the handler at every step, as transformers.Trainer
    # does (no event is skipped for callbacks that seem not to listen: a mock, a patched method
    # or a callback added mid-step must see it).

    def _run_steps(
        self,
        iterator: Any,
        epoch: int,
        step: int,
        first_update: int,
        steps_per_epoch: int,
        batches_per_epoch: int,
        start_time: float,
    ) -> tuple[int, Optional[float], Optional[float]]:
        """The optimizer steps of one epoch: each takes ``gradient_accumulation_steps`` micro-batches
        (the last step of an epoch that does not divide evenly takes the rest); ``on_substep_end``
        between micro-batches, the optimizer and the log/evaluate/save point after the last one.

        Returns:
            The index of the last batch (-1 when the data yielded none), the last grad norm and
            learning rate.
        """
        args, state, handler, train_step = self.args, self.state, self.callback_handler, self.train_step
        accumulation = args.gradient_accumulation_steps
        remainder = batches_per_epoch % accumulation or accumulation
        nan_filter = args.logging_nan_inf_filter
        count_tokens = self.num_tokens_fn is not None and args.include_num_input_tokens_seen != "no"
        plain_hooks, track_lr = self._optimizer_hooks()
        grad_norm: Optional[float] = None
        learning_rate: Optional[float] = None
        tr_loss = self._tr_loss
        control = self.control  # always self.control, read back after each event (as Trainer)
        for update_step in range(first_update, steps_per_epoch):
            num_batches = accumulation if update_step != steps_per_epoch - 1 else remainder
            batch_samples = list(islice(iterator, num_batches))
            scale = self.current_gradient_accumulation_steps = len(batch_samples)
            for inputs in batch_samples:
                step += 1
                if step % accumulation == 0:
                    control = self.control = handler.on_step_begin(args, state, self.control)
                output = train_step(inputs)
                step_grad_norm = None
                if type(output) is not float:
                    if isinstance(output, Mapping):
                        step_grad_norm = output.get("grad_norm")
                        output = output["loss"]
                    output = to_float(output, strict=True, what="the loss returned by train_step")
                loss = output / scale
                control = self.control = handler.call_event(
                    "on_training_loss", args, state, self.control, loss=loss)
                if nan_filter and not math.isfinite(loss):
                    tr_loss += tr_loss / (1 + state.global_step - self._globalstep_last_logged)
                else:
                    tr_loss += loss
                self._tr_loss = tr_loss  # current after each micro-batch, as Trainer's (SpikeGuard, Deadline)
                if count_tokens:
                    state.num_input_tokens_seen += int(self.num_tokens_fn(inputs))

                if (step + 1) % accumulation == 0 or (step + 1) == batches_per_epoch:  # the sync step
                    grad_norm = (None if step_grad_norm is None
                                 else to_float(step_grad_norm, strict=True, what="grad_norm"))
                    control = self.control = handler.on_pre_optimizer_step(args, state, self.control)
                    if plain_hooks:
                        self._optimizer_step()
                    control = self.control = handler.on_optimizer_step(args, state, self.control)
                    learning_rate = self._get_learning_rate() if track_lr else None
                    if plain_hooks:
                        self._after_optimizer_step()
                    state.global_step += 1
                    state.epoch = epoch + (step + 1) / batches_per_epoch
                    control = self.control = handler.on_step_end(args, state, self.control)
                    if control.should_log or control.should_evaluate or control.should_save:
                        self._maybe_log_save_evaluate(grad_norm, start_time, learning_rate)
                        tr_loss, control = self._tr_loss, self.control
                else:
                    control = self.control = handler.on_substep_end(args, state, self.control)
                if control.should_epoch_stop or control.should_training_stop:
                    break
            if control.should_epoch_stop or control.should_training_stop:
                break
        self._tr_loss = tr_loss
        return step, grad_norm, learning_rate

    # -- optimizer hooks -------------------------------------------------------------------
    def _optimizer_hooks(self) -> tuple[bool, bool]:
        """Whether a step calls the optimizer/scheduler hooks, and whether it reads the learning rate."""
        plain_hooks = (
            self.optimizer_step_fn is not None or self.optimizer is not None or self.lr_scheduler is not None
        )
        track_lr = self.learning_rate_fn is not None or callable(
            getattr(self.lr_scheduler, "get_last_lr", None)
        )
        return plain_hooks, track_lr

    def _optimizer_step(self) -> None:
        if self.optimizer_step_fn is not None:
            self.optimizer_step_fn()
        elif self.optimizer is not None:
            self.optimizer.step()

    def _after_optimizer_step(self) -> None:
        if self.optimizer_step_fn is not None:
            return
        if self.lr_scheduler is not None and not getattr(self.optimizer, "step_was_skipped", False):
            self.lr_scheduler.step()  # as transformers: a skipped step leaves the schedule where it is
        if self.optimizer is not None and hasattr(self.optimizer, "zero_grad"):
            self.optimizer.zero_grad()

    def _get_learning_rate(self) -> Optional[float]:
        if self.learning_rate_fn is not None:
            return to_float(self.learning_rate_fn(), strict=True, what="learning_rate_fn()")
        get_last_lr = getattr(self.lr_scheduler, "get_last_lr", None)
        if callable(get_last_lr):
            return to_float(get_last_lr()[0], strict=True, what="lr_scheduler.get_last_lr()[0]")
        return None
