"""Evaluation and prediction of the lightweight loop (``evaluate``, ``predict``).

Events, in transformers 5.x order: ``on_prediction_step`` after each batch, then for
``evaluate`` the log (``on_pre_log``, ``on_log``) followed by ``on_evaluate``; for
``predict`` only ``on_predict``. Metric keys get the ``metric_key_prefix`` and the speed
metrics ``<prefix>_runtime``, ``<prefix>_samples_per_second``, ``<prefix>_steps_per_second``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any, NamedTuple, Optional

from ..metrics.keys import add_prefix, did_you_mean
from ..metrics.numbers import to_float

__all__ = ["EvaluationMixin", "PredictionOutput", "speed_metrics"]


#: Marks the end of the evaluation data (the loop looks one batch ahead to know the last one).
_END = object()


class PredictionOutput(NamedTuple):
    """What `LightweightTrainer.predict` returns (same fields as transformers')."""

    predictions: list[Any]
    label_ids: Optional[Any]
    metrics: dict[str, float]


def speed_metrics(
    split: str,
    start_time: float,
    num_samples: Optional[float] = None,
    num_steps: Optional[float] = None,
    num_tokens: Optional[float] = None,
) -> dict[str, float]:
    """``<split>_runtime`` and throughput metrics, exactly like ``transformers.trainer_utils``."""
    runtime = time.time() - start_time
    result = {f"{split}_runtime": round(runtime, 4)}
    if runtime == 0:
        return result
    if num_samples is not None:
        result[f"{split}_samples_per_second"] = round(num_samples / runtime, 3)
    if num_steps is not None:
        result[f"{split}_steps_per_second"] = round(num_steps / runtime, 3)
    if num_tokens is not None:
        result[f"{split}_tokens_per_second"] = round(num_tokens / runtime, 3)
    return result


def batch_length(batch: Any, default: int) -> int:
    """Samples in a batch: ``len(batch)``, the length of a dict batch's first value, or ``default``."""
    if isinstance(batch, Mapping):
        batch = next(iter(batch.values()), None)
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    if shape is None and hasattr(batch, "__len__") and not isinstance(batch, (str, bytes)):
        try:
            return len(batch)
        except TypeError:
            return default
    return default


def _output_loss(output: Any) -> Optional[float]:
    if isinstance(output, Mapping):
        loss = output.get("loss")
        return None if loss is None else to_float(loss, strict=True, what="the eval loss")
    if isinstance(output, (int, float)) or (hasattr(output, "item") and getattr(output, "ndim", 0) == 0):
        return to_float(output, strict=True, what="the eval loss")
    return None


class EvaluationMixin:
    """``evaluate``/``predict`` of `LightweightTrainer` (its ``__init__`` sets the attributes they read)."""

    def evaluate(self, eval_data: Any = None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Evaluate, log the metrics and fire ``on_evaluate``.

        Args:
            eval_data: Batches to evaluate, or a dict ``{name: batches}`` evaluated one by one
                with the prefix ``<metric_key_prefix>_<name>``. Defaults to the trainer's
                ``eval_data``.
            metric_key_prefix: Prefix of every metric name. Defaults to ``"eval"``.

        Returns:
            The metrics, prefixed, with ``<prefix>_runtime``/``_samples_per_second``/
            ``_steps_per_second`` and ``epoch``.

        Raises:
            ValueError: There is nothing to evaluate (no ``eval_data`` and no ``eval_fn``).
        """
        data = eval_data if eval_data is not None else self.eval_data
        if isinstance(data, Mapping):
            metrics: dict[str, float] = {}
            for name, dataset in data.items():
                metrics.update(self.evaluate(dataset, metric_key_prefix=f"{metric_key_prefix}_{name}"))
            return metrics
        metrics, _ = self._timed_evaluation_loop(data, metric_key_prefix, "evaluate")
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def predict(self, test_data: Any, metric_key_prefix: str = "test") -> PredictionOutput:
        """Run ``eval_step`` over ``test_data``, fire ``on_predict`` (no log), return outputs.

        Args:
            test_data: Batches to predict on.
            metric_key_prefix: Prefix of every metric name. Defaults to ``"test"``.

        Returns:
            ``PredictionOutput(predictions=[eval_step outputs], label_ids=None, metrics=...)``.
        """
        metrics, outputs = self._timed_evaluation_loop(test_data, metric_key_prefix, "predict")
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics)
        return PredictionOutput(predictions=outputs, label_ids=None, metrics=metrics)

    def isolated_evaluate(self, eval_data: Any, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Evaluate ``eval_data`` and return its metrics, leaving no trace in the trainer.

        No log record, no ``on_evaluate``; callbacks see only ``on_prediction_step`` (the
        progress bar); ``control``, the handler's ``eval_dataloader`` and every random generator
        the training observes (global, and those of ``train_data`` and ``eval_data``: a
        ``collate_fn`` with its own generator...) are as before.
        ``TrainSubsetEvaluation`` uses it.

        Args:
            eval_data: Batches to evaluate.
            metric_key_prefix: Prefix of every metric name. Defaults to ``"eval"``.

        Returns:
            The prefixed metrics, without timing keys and run counters (`relabel_metrics`).
        """
        from ..runtime.isolated_evaluation import close_prediction_bars, relabel_metrics
        from ..runtime.random_state import random_state_kept

        handler = self.callback_handler
        control, flags = self.control, dict(vars(self.control))
        saved_loader = getattr(handler, "eval_dataloader", None)
        preparation = (self._model_prepared, self.model_preparation_time)
        close_prediction_bars(handler)
        try:
            with random_state_kept(self.train_data, eval_data):
                metrics, _, _ = self._evaluation_loop(eval_data, metric_key_prefix, "isolated_evaluate")
        finally:
            close_prediction_bars(handler)
            self.control = control
            vars(control).update(flags)
            handler.eval_dataloader = saved_loader
            self._model_prepared, self.model_preparation_time = preparation
        return relabel_metrics(metrics, metric_key_prefix)

    def _timed_evaluation_loop(self, data: Any, prefix: str, caller: str) -> tuple[dict[str, float], list]:
        """`_evaluation_loop` plus ``<prefix>_runtime`` / samples / steps per second."""
        start_time = time.time()
        metrics, num_samples, outputs = self._evaluation_loop(data, prefix, caller)
        num_steps = math.ceil(num_samples / self.args.eval_batch_size)
        metrics.update(speed_metrics(prefix, start_time, num_samples=num_samples, num_steps=num_steps))
        return metrics, outputs

    def _prepare_model_for_evaluation(self) -> None:
        """transformers prepares the model at the first evaluation of a trainer that has not
        trained (``train()`` prepares it otherwise) and from then on reports the time it took as
        ``<prefix>_model_preparation_time`` in every evaluation and prediction. The loop wraps
        nothing, so that time is 0.0; the key is reported at the same moments.
        """
        if not self._model_prepared:
            self._model_prepared = True
            self.model_preparation_time = 0.0

    def _add_model_preparation_time(self, metrics: dict[str, Any]) -> dict[str, Any]:
        if self.model_preparation_time is not None:
            metrics["model_preparation_time"] = self.model_preparation_time
        return metrics

    def _evaluation_loop(self, data: Any, prefix: str, caller: str) -> tuple[dict[str, float], int, list]:
        self._prepare_model_for_evaluation()
        if self.eval_fn is not None and (data is None or self.eval_step is None):
            raw = self.eval_fn(data)
            if not isinstance(raw, Mapping):
                raise TypeError(f"{caller}: eval_fn must return a dict of metrics, got {type(raw).__name__}.")
            return add_prefix(self._add_model_preparation_time(dict(raw)), prefix), 0, []
        if data is None:
            raise ValueError(
                f"{caller}: nothing to evaluate; pass eval_data (with eval_step and/or metrics_fn) or "
                "eval_fn "
                "to LightweightTrainer, or data to this call."
            )
        handler = self.callback_handler
        handler.eval_dataloader = data
        outputs: list[Any] = []
        losses: list[tuple[float, int]] = []
        num_samples = 0
        metrics: dict[str, Any] = {}
        # transformers' batch_eval_metrics: metrics_fn per batch, no outputs kept (predict keeps them)
        per_batch = bool(self.args.batch_eval_metrics) and self.metrics_fn is not None
        keep_outputs = not per_batch or caller == "predict"
        batches = iter(data)
        batch = next(batches, _END)
        while batch is not _END:
            following = next(batches, _END)
            output = self.eval_step(batch) if self.eval_step is not None else batch
            size = batch_length(batch, self.args.eval_batch_size)
            loss = _output_loss(output) if self.eval_step is not None else None
            if loss is not None:
                losses.append((loss, size))
            if keep_outputs:
                outputs.append(output)
            num_samples += size
            self.control = handler.on_prediction_step(self.args, self.state, self.control)
            if per_batch:
                raw = self.metrics_fn([output], compute_result=following is _END)
                metrics = dict(self._checked_metrics(raw, caller))
            batch = following
        if self.metrics_fn is not None and not per_batch:
            metrics.update(self._checked_metrics(self.metrics_fn(outputs), caller))
        if losses:
            finite = [(loss, size) for loss, size in losses if math.isfinite(loss)]
            if self.args.logging_nan_inf_filter and finite:
                losses = finite
            total = sum(size for _, size in losses)
            metrics[f"{prefix}_loss"] = sum(loss * size for loss, size in losses) / max(total, 1)
        return add_prefix(self._add_model_preparation_time(metrics), prefix), num_samples, outputs

    @staticmethod
    def _checked_metrics(raw: Any, caller: str) -> Mapping[str, Any]:
        if not isinstance(raw, Mapping):
            raise TypeError(f"{caller}: metrics_fn must return a dict of metrics, got {type(raw).__name__}.")
        return raw

    def _determine_best_metric(self, metrics: Mapping[str, float]) -> bool:
        """Update ``state.best_metric``/``best_global_step``; True on a new best (transformers' rule)."""
        if self.args.metric_for_best_model is None:
            return False
        key = self.args.metric_for_best_model
        if not key.startswith("eval_"):
            key = f"eval_{key}"
        if key not in metrics:
            suggestions = did_you_mean(key, metrics)
            hint = f" Did you mean {suggestions}?" if suggestions else ""
            raise KeyError(
                f"metric_for_best_model={self.args.metric_for_best_model!r} (looked up as {key!r}) is not in "
                f"the evaluation metrics {sorted(metrics)}.{hint}"
            )
        value = metrics[key]
        greater = bool(self.args.greater_is_better)
        if self.state.best_metric is None:
            self.state.best_metric = float("-inf") if greater else float("inf")
        improved = value > self.state.best_metric if greater else value < self.state.best_metric
        if improved:
            self.state.best_metric = value
            if self.args.save_strategy in ("steps", "epoch", "best"):
                self.state.best_global_step = self.state.global_step
            return True
        return False
