"""Logging of the lightweight loop: the log/evaluate/save point of a step, ``log()``, the final train log.

A port of ``transformers.Trainer._maybe_log_save_evaluate``, ``Trainer.log`` and the end of
``_finalize_training`` (``train_runtime``, ``train_samples_per_second``,
``train_steps_per_second``, ``total_flos``, ``train_loss``), with our ``on_pre_log`` event
fired before a record reaches ``state.log_history`` and ``on_log``.
"""

from __future__ import annotations

from typing import Optional

from .evaluation import speed_metrics
from .plan import TrainOutput

__all__ = ["LoggingMixin"]


class LoggingMixin:
    """``log``, ``store_flos`` and the log/evaluate/save point of `LightweightTrainer` (its
    ``__init__`` sets the attributes they read)."""

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
            metrics = self.evaluate()
            is_new_best = self._determine_best_metric(metrics)
            if self.args.save_strategy == "best":
                self.control.should_save = is_new_best

        if self.control.should_save:
            self._save_checkpoint()
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def log(self, logs: dict[str, float], start_time: Optional[float] = None) -> None:
        """Add ``epoch``, append to ``state.log_history``, fire ``on_log`` (as ``Trainer.log``).

        The handler's ``on_log`` fires ``on_pre_log`` first (see `CallbackHandler.on_log`).

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
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs)

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
