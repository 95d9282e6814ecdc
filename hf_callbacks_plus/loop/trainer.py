"""LightweightTrainer: a transformers-free loop firing Trainer's events in Trainer's order.

The flow is a port of ``transformers.Trainer`` 5.23 (``_inner_training_loop``,
``_run_epoch``, ``_maybe_log_save_evaluate``, ``_finalize_training``, ``log``; the step
loop lives in ``steps.py``, logging and the final train log in ``logs.py``, evaluation in
``evaluation.py``, checkpoints in ``checkpoints.py``, each a part of the class whose
``__init__`` sets every attribute they read): the same
events with the same ``global_step``/``epoch``/control flags, the same log keys, the same
checkpoint folders. Parity is tested against a real Trainer in
``tests/loop/test_parity_transformers.py``. The model, the optimizer and the data are
yours: the loop only calls ``train_step(batch)`` and your optional hooks.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping
from itertools import islice
from typing import Any, Callable, Iterable, Optional, Union

from ..core.callback import bind_trainer
from ..core.handler import CallbackHandler, CallbackRef
from ..core.resume_check import run_resume_check, skipped_metrics
from ..core.state import TrainerControl, TrainerState
from .arguments import LoopArguments
from .checkpoints import CheckpointMixin
from .default_callbacks import DefaultFlowCallback, PrinterCallback, ProgressCallback
from .evaluation import EvaluationMixin
from .logs import LoggingMixin
from .plan import TrainOutput, plan_training
from .steps import StepsMixin

__all__ = ["LightweightTrainer", "TrainOutput"]

logger = logging.getLogger("hf_callbacks_plus")


class LightweightTrainer(StepsMixin, LoggingMixin, EvaluationMixin, CheckpointMixin):
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
        #: Set by the first evaluation of a trainer that has not trained (see
        #: ``_prepare_model_for_evaluation``); from then on every evaluation reports it.
        self.model_preparation_time: Optional[float] = None
        self._model_prepared = False
        for callback in list(self.callback_handler.callbacks):
            bind_trainer(callback, self)
        self.control = self.callback_handler.on_init_end(self.args, self.state, self.control)

    # -- callbacks -------------------------------------------------------------------------
    def add_callback(self, callback: CallbackRef, **where: Any) -> Any:
        """Add a callback (instance or class); ``first=True``/``before=``/``after=`` place it.

        A callback with a ``bind(trainer)`` method receives this trainer (see ``bind_trainer``).
        """
        added = self.callback_handler.add_callback(callback, **where)
        bind_trainer(added, self)
        return added

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

        Before resuming, the custom event ``on_resume_check`` lets a callback veto the run
        (see ``hf_callbacks_plus.core.resume_check``): then no training event fires,
        ``self.state`` is the checkpoint's and the metrics hold ``train_skipped=1.0``.

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
            vetoed = run_resume_check(self.callback_handler, self.args, checkpoint,
                                      trainer_name=type(self).__name__)
            if vetoed is not None:  # a callback's on_resume_check: do not train at all
                self.state = vetoed
                return TrainOutput(vetoed.global_step, 0.0, skipped_metrics(vetoed))
            return self._inner_training_loop(checkpoint)
        except BaseException as error:
            self.callback_handler.on_exception(self.args, self.state, self.control, exception=error)
            raise
        finally:
            self.is_in_train = False

    def _inner_training_loop(self, checkpoint: Optional[str]) -> TrainOutput:
        self._model_prepared = True  # as Trainer's accelerator.prepare: evaluations add no preparation
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
            self.evaluate()
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
        accumulation = self.args.gradient_accumulation_steps
        if hasattr(self.train_data, "set_epoch"):
            self.train_data.set_epoch(epoch)
        iterator = iter(self.train_data)
        step, first_update = -1, 0
        if skip > 0:
            for _ in islice(iterator, skip):
                pass
            step, first_update = skip - 1, skip // accumulation
        step, grad_norm, learning_rate = self._run_steps(
            iterator, epoch, step, first_update, steps_per_epoch, batches_per_epoch, start_time
        )
        if step < 0:
            logger.warning(
                "train_data yielded no batch in this epoch; stopping training at step %d.",
                self.state.global_step,
            )
            self.control.should_training_stop = True
        self.control = self.callback_handler.on_epoch_end(self.args, self.state, self.control)
        self._maybe_log_save_evaluate(grad_norm, start_time, learning_rate)
