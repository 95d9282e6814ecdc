"""LightweightTrainer: a transformers-free loop firing Trainer's events in Trainer's order.

The flow is a port of ``transformers.Trainer`` 5.23 (``_inner_training_loop``,
``_run_epoch``, ``_maybe_log_save_evaluate``, ``_finalize_training``, ``log``): the same
events with the same ``global_step``/``epoch``/control flags, the same log keys, the same
checkpoint folders. Parity is tested against a real Trainer in
``tests/loop/test_parity_transformers.py``. The model, the optimizer and the data are
yours: the loop only calls ``train_step(batch)`` and your optional hooks.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Mapping
from itertools import islice
from typing import Any, Callable, Iterable, Optional, Union

from .arguments import LoopArguments
from .callback import CallbackHandler, CallbackRef
from .checkpoints import CheckpointMixin
from .evaluation import EvaluationMixin, speed_metrics, to_float
from .flow import DefaultFlowCallback, PrinterCallback, ProgressCallback
from .plan import TrainOutput, plan_training
from .state import TrainerControl, TrainerState

__all__ = ["LightweightTrainer", "TrainOutput"]

logger = logging.getLogger("hf_callbacks_plus")


class LightweightTrainer(EvaluationMixin, CheckpointMixin):
    """Run callbacks exactly as ``transformers.Trainer`` does, around your own training step.

    Args:
        args: The flow arguments. Defaults to ``LoopArguments()``.
        train_step: ``batch -> loss`` for one micro-batch; you compute gradients. The loss is
            a float, anything with ``.item()``, or a dict with ``"loss"`` and optionally
            ``"grad_norm"`` (logged as ``grad_norm`` like Trainer does). Return the batch's own
            loss: the loop divides it by the number of micro-batches of the step for logging.
        train_data: A sized iterable of batches (``len`` = batches per epoch), iterated once per
            epoch; unsized iterables need ``args.max_steps > 0``. Defaults to None (evaluate only).
        eval_data: Batches to evaluate, or ``{name: batches}`` (metrics ``eval_<name>_*``).
            Defaults to None.
        eval_step: ``batch -> output`` during evaluation (a loss, or a dict with ``"loss"``
            gives ``eval_loss``); fires ``on_prediction_step`` per batch. Defaults to None.
        metrics_fn: ``list of eval_step outputs -> dict of metrics`` (prefixed for you).
            Defaults to None.
        eval_fn: ``eval_data -> dict of metrics`` computed in one call (no per-batch events),
            used when no ``eval_step`` is given. Defaults to None.
        callbacks: Callbacks (instances or classes), after ``DefaultFlowCallback`` and before
            the progress/printer callback, as in transformers. Defaults to None.
        model: Passed to events as ``model``; saved/loaded with checkpoints through
            ``state_dict()``/``load_state_dict()`` when no hooks are given. Defaults to None.
        optimizer: Anything with ``step()``/``zero_grad()``: stepped at each optimizer step
            (between ``on_pre_optimizer_step`` and ``on_optimizer_step``). Defaults to None.
        lr_scheduler: Anything with ``step()`` (and ``get_last_lr()`` for logging); stepped after
            the optimizer. Defaults to None.
        processing_class: Passed to events as ``processing_class``. Defaults to None.
        optimizer_step_fn: Called instead of the optimizer/scheduler steps. Defaults to None.
        learning_rate_fn: ``() -> float`` logged as ``learning_rate``; defaults to the
            scheduler's ``get_last_lr()[0]`` when available, else the key is omitted.
        save_model_fn: ``checkpoint_dir -> None`` saving your model. Defaults to None.
        load_model_fn: ``checkpoint_dir -> None`` loading it (resume, best model). Defaults to None.
        num_tokens_fn: ``batch -> int`` for ``include_num_input_tokens_seen``. Defaults to None.

    Raises:
        ValueError: ``eval_strategy`` is not ``"no"`` but there is nothing to evaluate.

    Example:
        >>> args = LoopArguments(output_dir="runs/demo", max_steps=6, logging_steps=2,
        ...                      save_strategy="no", disable_tqdm=True)
        >>> trainer = LightweightTrainer(args, train_step=lambda batch: sum(batch) / len(batch),
        ...                              train_data=[[1.0, 2.0], [3.0, 4.0]])
        >>> trainer.train().global_step  # doctest: +SKIP
        6
    """

    def __init__(
        self,
        args: Optional[LoopArguments] = None,
        train_step: Optional[Callable[[Any], Any]] = None,
        train_data: Optional[Iterable[Any]] = None,
        *,
        eval_data: Any = None,
        eval_step: Optional[Callable[[Any], Any]] = None,
        metrics_fn: Optional[Callable[[list], Mapping[str, float]]] = None,
        eval_fn: Optional[Callable[[Any], Mapping[str, float]]] = None,
        callbacks: Optional[Iterable[CallbackRef]] = None,
        model: Any = None,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        processing_class: Any = None,
        optimizer_step_fn: Optional[Callable[[], Any]] = None,
        learning_rate_fn: Optional[Callable[[], float]] = None,
        save_model_fn: Optional[Callable[[str], Any]] = None,
        load_model_fn: Optional[Callable[[str], Any]] = None,
        num_tokens_fn: Optional[Callable[[Any], int]] = None,
    ) -> None:
        self.args = args if args is not None else LoopArguments()
        if not isinstance(self.args, LoopArguments):
            raise TypeError(
                f"LightweightTrainer: args must be LoopArguments, got {type(self.args).__name__}; convert "
                "TrainingArguments with LoopArguments.from_training_arguments(args)."
            )
        random.seed(self.args.seed)
        self.train_step = train_step
        self.train_data = train_data
        self.eval_data = eval_data
        self.eval_step = eval_step
        self.metrics_fn = metrics_fn
        self.eval_fn = eval_fn
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.optimizer_step_fn = optimizer_step_fn
        self.learning_rate_fn = learning_rate_fn
        self.save_model_fn = save_model_fn
        self.load_model_fn = load_model_fn
        self.num_tokens_fn = num_tokens_fn
        if self.args.eval_strategy != "no" and eval_data is None and eval_fn is None:
            raise ValueError(
                f"LightweightTrainer: eval_strategy={self.args.eval_strategy!r} needs eval_data or eval_fn; "
                "pass one, or set eval_strategy='no'."
            )
        if self.args.save_strategy == "best" and self.args.metric_for_best_model is None:
            raise ValueError("LightweightTrainer: save_strategy='best' needs args.metric_for_best_model.")

        self.callback_handler = CallbackHandler(
            [DefaultFlowCallback, *(callbacks or [])], model, processing_class, optimizer, lr_scheduler
        )
        self.add_callback(PrinterCallback if self.args.disable_tqdm else ProgressCallback)
        self.control = TrainerControl()
        self.state = TrainerState(stateful_callbacks=self._stateful_callbacks())
        self.is_in_train = False
        self.current_flos = 0.0
        self.current_gradient_accumulation_steps = 1
        self._tr_loss = 0.0
        self._total_loss_scalar = 0.0
        self._globalstep_last_logged = 0
        self._initial_global_step = 0
        self._initial_num_input_tokens_seen = 0
        self.control = self.callback_handler.on_init_end(self.args, self.state, self.control)

    # -- callbacks -------------------------------------------------------------------------
    def add_callback(self, callback: CallbackRef, **where: Any) -> Any:
        """Add a callback (instance or class); ``first=True``/``before=``/``after=`` place it."""
        return self.callback_handler.add_callback(callback, **where)

    def pop_callback(self, callback: CallbackRef) -> Any:
        """Remove and return a callback (class: first match; instance), or None."""
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback: CallbackRef) -> None:
        """Remove a callback (class: first match; instance)."""
        self.callback_handler.remove_callback(callback)

    # -- training ----------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: Union[str, bool, None] = None) -> TrainOutput:
        """Train, firing every event like ``transformers.Trainer.train``.

        Args:
            resume_from_checkpoint: A ``checkpoint-N`` folder, True for the newest one in
                ``args.output_dir``, or None. Defaults to None.

        Returns:
            ``TrainOutput(global_step, training_loss, metrics)``.

        Raises:
            ValueError: No ``train_step``/``train_data``, an unsized ``train_data`` without
                ``max_steps``, or no checkpoint to resume from. Whatever the training step
                raises is re-raised after ``on_exception``.
        """
        if self.train_step is None or self.train_data is None:
            raise ValueError("LightweightTrainer.train: pass train_step and train_data to the trainer first.")
        self.is_in_train = True
        try:
            checkpoint = self._resolve_checkpoint(resume_from_checkpoint)
            if checkpoint is not None:
                self._load_model(checkpoint)
            return self._inner_training_loop(checkpoint)
        except BaseException as error:
            self.callback_handler.on_exception(self.args, self.state, self.control, exception=error)
            raise
        finally:
            self.is_in_train = False

    def _inner_training_loop(self, checkpoint: Optional[str]) -> TrainOutput:
        num_epochs, steps_per_epoch, num_samples, batches_per_epoch, max_steps = plan_training(
            self.args, self.train_data
        )
        epochs_trained, batches_to_skip = self._init_training_state(
            max_steps, steps_per_epoch, num_epochs, checkpoint
        )
        handler = self.callback_handler
        handler.model, handler.optimizer, handler.lr_scheduler = self.model, self.optimizer, self.lr_scheduler
        handler.train_dataloader = self.train_data

        start_time = time.time()
        self._initial_num_input_tokens_seen = self.state.num_input_tokens_seen
        self._initial_global_step = self.state.global_step
        self._tr_loss = 0.0
        self._total_loss_scalar = 0.0
        self._globalstep_last_logged = self.state.global_step

        self.control = handler.on_train_begin(self.args, self.state, self.control)
        if self.args.eval_on_start:
            self._evaluate(skip_scheduler=True)
        for epoch in range(epochs_trained, num_epochs):
            self.control = handler.on_epoch_begin(self.args, self.state, self.control)
            skip = batches_to_skip if (epoch == epochs_trained and checkpoint is not None) else 0
            self._run_epoch(epoch, steps_per_epoch, batches_per_epoch, start_time, skip)
            if self.control.should_training_stop:
                break
        return self._finalize_training(num_samples, start_time)

    def _run_epoch(
        self, epoch: int, steps_per_epoch: int, batches_per_epoch: int, start_time: float, skip: int
    ) -> None:
        args, handler = self.args, self.callback_handler
        accumulation = args.gradient_accumulation_steps
        step = -1
        grad_norm: Optional[float] = None
        learning_rate: Optional[float] = None
        first_update = 0
        if hasattr(self.train_data, "set_epoch"):
            self.train_data.set_epoch(epoch)
        iterator = iter(self.train_data)
        if skip > 0:
            for _ in islice(iterator, skip):
                pass
            step = skip - 1
            first_update = skip // accumulation
        remainder = batches_per_epoch % accumulation or accumulation
        fire_loss = handler.has_handlers("on_training_loss")
        plain_hooks = (
            self.optimizer_step_fn is not None or self.optimizer is not None or self.lr_scheduler is not None
        )
        track_lr = self.learning_rate_fn is not None or callable(
            getattr(self.lr_scheduler, "get_last_lr", None)
        )

        # Locals keep the per-step overhead low (see benchmarks/bench_loop.py).
        state, train_step, nan_filter = self.state, self.train_step, args.logging_nan_inf_filter
        count_tokens = self.num_tokens_fn is not None and args.include_num_input_tokens_seen != "no"
        on_step_begin, on_step_end = handler.on_step_begin, handler.on_step_end
        on_pre_optimizer_step, on_optimizer_step = handler.on_pre_optimizer_step, handler.on_optimizer_step
        on_substep_end = handler.on_substep_end
        # The handler's dispatch table ([] = no callback overrides the event; missing = not built yet,
        # cleared whenever the callback list changes): events that reset no flag are skipped when empty.
        dispatch = handler._dispatch
        for update_step in range(first_update, steps_per_epoch):
            num_batches = accumulation if update_step != steps_per_epoch - 1 else remainder
            batch_samples = list(islice(iterator, num_batches))
            scale = self.current_gradient_accumulation_steps = len(batch_samples)
            for inputs in batch_samples:
                step += 1
                if step % accumulation == 0:
                    self.control = on_step_begin(args, state, self.control)
                output = train_step(inputs)
                step_grad_norm = None
                if type(output) is not float:
                    if isinstance(output, Mapping):
                        step_grad_norm = output.get("grad_norm")
                        output = output["loss"]
                    output = to_float(output)
                loss = output / scale
                if fire_loss:
                    self.control = handler.call_event(
                        "on_training_loss", args, state, self.control, loss=loss
                    )
                if nan_filter and not math.isfinite(loss):
                    self._tr_loss += self._tr_loss / (1 + state.global_step - self._globalstep_last_logged)
                else:
                    self._tr_loss += loss
                if count_tokens:
                    state.num_input_tokens_seen += int(self.num_tokens_fn(inputs))

                if (step + 1) % accumulation == 0 or (step + 1) == batches_per_epoch:  # sync step
                    grad_norm = None if step_grad_norm is None else to_float(step_grad_norm)
                    if dispatch.get("on_pre_optimizer_step", True):
                        self.control = on_pre_optimizer_step(args, state, self.control)
                    if plain_hooks:
                        self._optimizer_step()
                    if dispatch.get("on_optimizer_step", True):
                        self.control = on_optimizer_step(args, state, self.control)
                    learning_rate = self._get_learning_rate() if track_lr else None
                    if plain_hooks:
                        self._after_optimizer_step()
                    state.global_step += 1
                    state.epoch = epoch + (step + 1) / batches_per_epoch
                    control = self.control = on_step_end(args, state, self.control)
                    if control.should_log or control.should_evaluate or control.should_save:
                        self._maybe_log_save_evaluate(grad_norm, start_time, learning_rate)
                elif dispatch.get("on_substep_end", True):
                    self.control = on_substep_end(args, state, self.control)
                if self.control.should_epoch_stop or self.control.should_training_stop:
                    break
            if self.control.should_epoch_stop or self.control.should_training_stop:
                break

        if step < 0:
            logger.warning(
                "train_data yielded no batch in this epoch; stopping training at step %d.",
                self.state.global_step,
            )
            self.control.should_training_stop = True
        self.control = handler.on_epoch_end(args, self.state, self.control)
        self._maybe_log_save_evaluate(grad_norm, start_time, learning_rate)

    # -- optimizer hooks -------------------------------------------------------------------
    def _optimizer_step(self) -> None:
        if self.optimizer_step_fn is not None:
            self.optimizer_step_fn()
        elif self.optimizer is not None:
            self.optimizer.step()

    def _after_optimizer_step(self) -> None:
        if self.optimizer_step_fn is not None:
            return
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        if self.optimizer is not None and hasattr(self.optimizer, "zero_grad"):
            self.optimizer.zero_grad()

    def _get_learning_rate(self) -> Optional[float]:
        if self.learning_rate_fn is not None:
            return to_float(self.learning_rate_fn())
        get_last_lr = getattr(self.lr_scheduler, "get_last_lr", None)
        if callable(get_last_lr):
            return to_float(get_last_lr()[0])
        return None

    # -- log / evaluate / save ------------------------------------------------------------
    def _maybe_log_save_evaluate(
        self, grad_norm: Optional[float], start_time: float, learning_rate: Optional[float]
    ) -> None:
        if self.control.should_log and self.state.global_step > self._globalstep_last_logged:
            logs: dict[str, float] = {}
            tr_loss = self._tr_loss
            self._tr_loss -= self._tr_loss
            logs["loss"] = tr_loss / (self.state.global_step - self._globalstep_last_logged)
            if grad_norm is not None:
                logs["grad_norm"] = grad_norm
            if learning_rate is None:
                learning_rate = self._get_learning_rate()
            if learning_rate is not None:
                logs["learning_rate"] = learning_rate
            self._total_loss_scalar += tr_loss
            self._globalstep_last_logged = self.state.global_step
            self.store_flos()
            self.log(logs, start_time)

        if self.control.should_evaluate:
            metrics = self._evaluate()
            is_new_best = self._determine_best_metric(metrics)
            if self.args.save_strategy == "best":
                self.control.should_save = is_new_best

        if self.control.should_save:
            self._save_checkpoint()
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def log(self, logs: dict[str, float], start_time: Optional[float] = None) -> None:
        """Add ``epoch``, fire ``on_pre_log``, append to ``state.log_history``, fire ``on_log``.

        Args:
            logs: The values to log; ``on_pre_log`` callbacks may change them in place.
            start_time: Start of training, for ``train_tokens_per_second``. Defaults to None.
        """
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        if self.args.include_num_input_tokens_seen != "no":
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
            if start_time is not None:
                seen = self.state.num_input_tokens_seen - self._initial_num_input_tokens_seen
                logs.update(speed_metrics("train", start_time, num_tokens=seen))
        handler = self.callback_handler
        if handler.has_handlers("on_pre_log"):
            self.control = handler.call_event("on_pre_log", self.args, self.state, self.control, logs=logs)
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = handler.on_log(self.args, self.state, self.control, logs)

    def store_flos(self) -> None:
        """Move the floating-point operations counted so far into ``state.total_flos``."""
        self.state.total_flos += self.current_flos
        self.current_flos = 0.0

    def _finalize_training(self, num_samples: float, start_time: float) -> TrainOutput:
        self._total_loss_scalar += self._tr_loss
        steps_trained = self.state.global_step - self._initial_global_step
        train_loss = self._total_loss_scalar / max(steps_trained, 0.001)
        metrics = speed_metrics(
            "train",
            start_time,
            num_samples=num_samples * steps_trained / max(self.state.max_steps, 1),
            num_steps=steps_trained,
        )
        self.store_flos()
        metrics["total_flos"] = self.state.total_flos
        metrics["train_loss"] = train_loss
        self.log(metrics)
        if self.args.load_best_model_at_end and self.state.best_model_checkpoint is not None:
            self._load_best_model()
        self._finalize_checkpoints()
        self.control = self.callback_handler.on_train_end(self.args, self.state, self.control)
        return TrainOutput(self.state.global_step, train_loss, metrics)
