"""`StreamingMetrics`: exact metrics batch by batch, in evaluation and in training.

**Evaluation.** ``transformers.Trainer`` concatenates every batch's logits before calling
``compute_metrics`` (samples x tokens x vocabulary floats for a language model). With
``TrainingArguments(batch_eval_metrics=True)`` it calls ``compute_metrics`` once per batch
instead, with ``compute_result=True`` on the last one, and keeps no logits. `StreamingMetrics`
is that per-batch ``compute_metrics``: each batch updates metrics that keep exact sufficient
statistics (`hf_callbacks_plus.metrics.streaming`), and the last one returns their values,
the same numbers a ``compute_metrics`` over every logit at once returns. They are reset when
an evaluation starts, so an interrupted one leaves nothing behind. Under ``torchrun`` the Trainer
hands every rank the gathered batch (duplicates of the last uneven batch dropped); every rank
counts it and computes without synchronising, which is exact for every kind of metric state.

**Training.** A forward hook on the model reads the logits and labels of every training
forward pass the Trainer already runs (each micro-batch of a gradient-accumulation step, on
every rank) and the metrics of the logging window are added to the training log record
(``accuracy`` -> ``train/accuracy``), then reset, like the loss. No extra forward pass.

How it reaches the trainer: ``TrainerPlus`` and ``LightweightTrainer`` bind their callbacks;
with a stock or trl trainer, ``run_before_integrations(trainer)`` does (it also makes the
training metrics reach the report_to integrations in the same record).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Optional, Union

from ..core.callback import TrainerCallback
from ..core.wrapping import wrap_method
from ..metrics.streaming import (
    IGNORE_INDEX,
    MetricSet,
    check_task,
    labelled_blocks,
    rank,
    standard_metrics,
    top_classes,
    world_size,
)

__all__ = ["StreamingMetrics"]

logger = logging.getLogger("hf_callbacks_plus")

#: Rows per predictions file when ``save_predictions=True``.
DEFAULT_MAX_PREDICTIONS = 10_000

#: Marks the functions this callback installs, so a second bind does not wrap them twice.
_INSTALLED_BY = "__streaming_metrics__"

#: The methods where a trainer starts an evaluation: transformers' (``prediction_loop`` before 5.0)
#: and the lightweight loop's.
_EVALUATION_STARTS = ("evaluation_loop", "prediction_loop", "_evaluation_loop")


class StreamingMetrics(TrainerCallback):
    """Exact evaluation metrics without holding the logits, and running training metrics for free.

    Args:
        metrics: The evaluation metrics: ``{name: metric}``, a torchmetrics
            ``MetricCollection`` or one metric; each metric has ``update(scores, target)``,
            ``compute()`` and ``reset()`` (torchmetrics metrics, or your own). Defaults to
            None: `standard_metrics(task, num_classes)`.
        task: How logits and labels become ``(scores [n, classes], target [n])``:
            ``"classification"``, ``"token_classification"`` or ``"causal_lm"`` (next-token,
            labels shifted as the model's loss does); labels equal to ``ignore_index`` are left
            out. Defaults to ``"classification"``.
        num_classes: Number of classes, for the default metrics of a classifier. Defaults to None.
        train_metrics: Metrics of the training forward passes, logged at each logging step:
            ``"same"`` (a copy of ``metrics``; for ``task="causal_lm"`` with default metrics only
            ``token_accuracy``, since the training perplexity is ``exp(loss)``), a mapping like
            ``metrics``, or None for none. Defaults to ``"same"``.
        ignore_index: Label of positions no metric counts. Defaults to -100.
        save_predictions: Write each evaluation's predictions, one JSON line per example
            (``id``, ``label``, ``prediction``, ``score``), on rank 0: True for at most
            10,000 rows per evaluation, an int for another bound, False for none.
            Defaults to False.
        predictions_dir: Folder of the prediction files. Defaults to
            ``<output_dir>/predictions``.
        log_predictions: Also upload each predictions file to the runs of this package's
            loggers that keep files (``MLflowLogger``: folder ``predictions_<file name>``;
            ``WandbLogger``: a ``predictions`` artifact with that alias). Defaults to False.

    Raises:
        ValueError: ``task`` is unknown, ``train_metrics`` is not "same"/None/metrics,
            ``save_predictions`` is negative, or the default metrics lack ``num_classes``.
        TypeError: A metric lacks ``update``/``compute``/``reset``.
        ModuleNotFoundError: Default metrics without torchmetrics
            (``pip install 'hf-callbacks-plus[metrics]'``).

    Note:
        Your own ``compute_metrics`` keeps working beside it, called as the trainer calls it
        without us: its results are merged with these (a name both produce is an error). With
        ``batch_eval_metrics=True`` both run per batch. With it off (the trainer holds every
        logit for your function) these metrics are computed from the held predictions, with
        the same results; bind says so (INFO; a WARNING if your function takes
        ``compute_result``, since it is then called once, without it). Without a
        ``compute_metrics`` of yours, ``batch_eval_metrics`` is switched on at bind.

    Example:
        >>> metrics = StreamingMetrics(task="classification", num_classes=3)
        >>> trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val,
        ...                   callbacks=[metrics])
        >>> run_before_integrations(trainer)   # binds it: eval_accuracy, eval_f1_macro, accuracy...
    """

    def __init__(
        self,
        metrics: Any = None,
        *,
        task: str = "classification",
        num_classes: Optional[int] = None,
        train_metrics: Any = "same",
        ignore_index: int = IGNORE_INDEX,
        save_predictions: Union[bool, int] = False,
        predictions_dir: Optional[Union[str, os.PathLike]] = None,
        log_predictions: bool = False,
    ) -> None:
        self.task = check_task(task, "StreamingMetrics")
        if isinstance(save_predictions, bool):
            self.max_predictions = DEFAULT_MAX_PREDICTIONS if save_predictions else 0
        elif isinstance(save_predictions, int) and save_predictions >= 0:
            self.max_predictions = save_predictions
        else:
            raise ValueError(
                f"StreamingMetrics: save_predictions must be True, False or an int >= 0 (rows per "
                f"evaluation), got {save_predictions!r}."
            )
        defaults = metrics is None
        self.eval_metrics = MetricSet(standard_metrics(task, num_classes) if defaults else metrics)
        if isinstance(train_metrics, str) and train_metrics == "same":
            self.train_metrics: Optional[MetricSet] = self.eval_metrics.copy()
            if defaults and task == "causal_lm":
                self.train_metrics = MetricSet(
                    {"token_accuracy": self.train_metrics.metrics["token_accuracy"]}
                )
        elif train_metrics is None or train_metrics is False:
            self.train_metrics = None
        elif isinstance(train_metrics, str):
            raise ValueError(
                f"StreamingMetrics: train_metrics must be 'same', None or metrics, got {train_metrics!r}."
            )
        else:
            self.train_metrics = MetricSet(train_metrics)
        self.ignore_index = ignore_index
        self.predictions_dir = None if predictions_dir is None else Path(predictions_dir)
        if log_predictions and not self.max_predictions:
            raise ValueError(
                "StreamingMetrics: log_predictions=True needs save_predictions (True or a row bound)."
            )
        self.log_predictions = bool(log_predictions)
        self.trainer: Any = None
        self.user_compute_metrics: Optional[Callable[..., Any]] = None
        self.prediction_files: list[Path] = []
        self._hook: Any = None
        self._warned: set[str] = set()
        self._writer: Optional[_PredictionWriter] = None
        self._prefix = "eval"  # the metric_key_prefix of the evaluation in progress

    # -- binding ---------------------------------------------------------------------------
    def bind(self, trainer: Any) -> StreamingMetrics:
        """Install the per-batch evaluation (and, in the loop, the training) hooks on ``trainer``.

        Returns:
            self.
        """
        self.trainer = trainer
        in_loop = hasattr(trainer, "metrics_fn") and hasattr(trainer, "train_step")  # LightweightTrainer
        if not in_loop and not hasattr(trainer, "compute_metrics"):
            raise TypeError(
                f"StreamingMetrics: cannot bind to {type(trainer).__name__}: it has neither "
                "compute_metrics (transformers.Trainer) nor metrics_fn (LightweightTrainer)."
            )
        name = "metrics_fn" if in_loop else "compute_metrics"
        compute = self._loop_metrics if in_loop else self._compute_metrics
        if getattr(getattr(trainer, name), _INSTALLED_BY, None) is self:
            return self
        self._adopt(getattr(trainer, name), trainer.args, name)

        def installed(predictions: Any, compute_result: Optional[bool] = None) -> dict[str, Any]:
            return compute(predictions, compute_result)

        setattr(installed, _INSTALLED_BY, self)
        setattr(trainer, name, installed)
        self._reset_at_evaluation_start(trainer)
        if in_loop and self.train_metrics is not None and trainer.train_step is not None:
            self._count_train_steps(trainer)
        return self

    def _count_train_steps(self, trainer: Any) -> None:
        """Wrap the loop's ``train_step``: its returned logits and labels update the training metrics."""
        wrap_method(trainer, "train_step", self._counting, marker=_INSTALLED_BY, owner=self)

    def _counting(self, user_step: Callable[..., Any]) -> Callable[..., Any]:
        def train_step(batch: Any) -> Any:
            output = user_step(batch)
            if isinstance(output, Mapping) and "logits" in output and "labels" in output:
                self._update_train(output["logits"], output["labels"])
                output = {k: v for k, v in output.items() if k not in ("logits", "labels")}
            else:
                self._warn_once(
                    "loop-train",
                    "StreamingMetrics: train_step returns no 'logits' and 'labels', "
                    "so there are no training metrics; return them in its dict.",
                )
            return output

        return train_step

    def _adopt(self, user: Optional[Callable[..., Any]], args: Any, name: str) -> None:
        """Keep the user's metrics function (called as the trainer would call it) and settle
        ``batch_eval_metrics``: on when there is none, left as it is otherwise."""
        self.user_compute_metrics = user
        if user is None:
            args.batch_eval_metrics = True
        elif not args.batch_eval_metrics and "compute_result" in _parameters(user):
            logger.warning(
                "StreamingMetrics: your %s takes compute_result but batch_eval_metrics is False, so the "
                "trainer calls it once, after the last batch, with every prediction and without "
                "compute_result (as transformers does). Set batch_eval_metrics=True to have it called per "
                "batch.",
                name,
            )
        elif not args.batch_eval_metrics:
            logger.info(
                "StreamingMetrics: your %s takes no compute_result, so the trainer holds every logit for it "
                "(batch_eval_metrics=False); the streaming metrics are computed from them.",
                name,
            )

    def _reset_at_evaluation_start(self, trainer: Any) -> None:
        """Wrap the trainer's evaluation loop so every evaluation starts from empty metrics (no
        callback event marks the start of an evaluation) and names its predictions file after
        its ``metric_key_prefix``."""
        for name in _EVALUATION_STARTS:
            signature = _signature(getattr(trainer, name, None))

            def starting(loop: Callable[..., Any], signature: Any = signature) -> Callable[..., Any]:
                def evaluation(*args: Any, **kwargs: Any) -> Any:
                    self._reset_eval(_prefix(signature, args, kwargs))
                    return loop(*args, **kwargs)
                return evaluation

            wrap_method(trainer, name, starting, marker=_INSTALLED_BY, owner=self)

    # -- evaluation ------------------------------------------------------------------------
    def _compute_metrics(self, eval_pred: Any, compute_result: Optional[bool]) -> dict[str, Any]:
        """The installed ``compute_metrics``: per batch (``compute_result`` given) or all at once."""
        if compute_result is None:
            args = getattr(self.trainer, "args", None)
            held = _held_batches(
                eval_pred.predictions,
                eval_pred.label_ids,
                concatenated=getattr(args, "eval_do_concat_batches", True),
                size=getattr(args, "eval_batch_size", None),
            )
            for logits, labels in held:
                self._update_eval(logits, labels)
        else:
            self._update_eval(eval_pred.predictions, eval_pred.label_ids)
        return self._result(eval_pred, compute_result)

    def _loop_metrics(self, outputs: list, compute_result: Optional[bool]) -> dict[str, Any]:
        for output in outputs:
            if not (isinstance(output, Mapping) and "logits" in output and "labels" in output):
                raise TypeError(
                    "StreamingMetrics: in a LightweightTrainer, eval_step must return a dict with "
                    f"'logits' and 'labels' (and optionally 'loss'), got {type(output).__name__}."
                )
            self._update_eval(output["logits"], output["labels"])
        return self._result(outputs, compute_result)

    def _result(self, predictions: Any, compute_result: Optional[bool]) -> dict[str, Any]:
        """Call the user's function as the trainer calls it; on the last call, merge our metrics."""
        user = self.user_compute_metrics
        if compute_result is None:
            return self._merge(self._finish_eval(), user(predictions) if user is not None else {})
        theirs = user(predictions, compute_result=compute_result) if user is not None else None
        if not compute_result:
            return {}
        return self._merge(self._finish_eval(), theirs or {})

    def _update(self, metrics: MetricSet, logits: Any, labels: Any) -> None:
        for scores, target in labelled_blocks(logits, labels, self.task, self.ignore_index):
            metrics.update(scores, target)

    def _update_eval(self, logits: Any, labels: Any) -> None:
        self._update(self.eval_metrics, logits, labels)
        if self.max_predictions and rank() == 0:
            if self._writer is None:
                self._writer = _PredictionWriter(self._predictions_folder(), self.max_predictions)
            self._writer.add(logits, labels, self.task, self.ignore_index)

    def _reset_eval(self, prefix: str) -> None:
        """Forget a previous, interrupted evaluation: its counts and its predictions file."""
        self._prefix = prefix
        self.eval_metrics.reset()
        if self._writer is not None:
            self._writer.discard()
            self._writer = None

    def _finish_eval(self) -> dict[str, float]:
        values = self.eval_metrics.compute(sync=False)  # every rank saw every (gathered) batch
        self.eval_metrics.reset()
        if self._writer is not None:
            step = getattr(getattr(self.trainer, "state", None), "global_step", 0)
            path = self._writer.close(f"{self._prefix}-step-{step}.jsonl")  # a re-run replaces it
            self._writer = None
            if path not in self.prediction_files:
                self.prediction_files.append(path)
            if self.log_predictions:
                self._upload(path)
        return values

    @staticmethod
    def _merge(ours: dict[str, float], theirs: Mapping[str, Any]) -> dict[str, Any]:
        clash = sorted(set(ours) & set(theirs))
        if clash:
            raise ValueError(
                f"StreamingMetrics: your compute_metrics also returns {clash}; rename your metrics or "
                "pass StreamingMetrics other names (metrics={name: metric})."
            )
        return {**theirs, **ours}

    def _predictions_folder(self) -> Path:
        if self.predictions_dir is not None:
            return self.predictions_dir
        output_dir = getattr(getattr(self.trainer, "args", None), "output_dir", None) or "."
        return Path(output_dir) / "predictions"

    def _upload(self, path: Path) -> None:
        """Hand a predictions file to every logger of the trainer that keeps files."""
        handler = getattr(self.trainer, "callback_handler", None)
        for callback in getattr(handler, "callbacks", []):
            log_file = getattr(callback, "log_file", None)
            if callable(log_file) and not isinstance(callback, StreamingMetrics):
                log_file(path, f"predictions_{path.stem}")

    # -- training --------------------------------------------------------------------------
    def _update_train(self, logits: Any, labels: Any) -> None:
        self._update(self.train_metrics, logits, labels)

    def _on_forward(self, module: Any, args: Any, kwargs: Mapping[str, Any], output: Any) -> None:
        if not module.training:
            return
        labels = kwargs.get("labels")
        logits = output.get("logits") if isinstance(output, Mapping) else getattr(output, "logits", None)
        if logits is None or labels is None:
            missing = "logits" if logits is None else "labels"
            self._warn_once(
                "forward",
                f"StreamingMetrics: the training forward pass has no {missing} "
                f"({type(module).__name__}), so there are no training metrics. trl's SFTTrainer builds no "
                "logits in training (fused LM head) and logs mean_token_accuracy itself; a label smoother "
                "or compute_loss_func takes the labels out of the model's inputs.",
            )
            return
        self._update_train(logits, labels)

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Start counting training batches (a fresh window, as the loss after a resume)."""
        if self.trainer is None:
            self._unbound()
        if self.train_metrics is None:
            return
        self.train_metrics.reset()
        in_loop = hasattr(self.trainer, "metrics_fn")  # the loop's train_step hands over its logits
        if self._hook is None and not in_loop and hasattr(model, "register_forward_hook"):
            self._hook = model.register_forward_hook(self._on_forward, with_kwargs=True)

    def on_pre_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """Add the training window's metrics to a training record, then reset them."""
        if self.train_metrics is None or not isinstance(logs, dict) or "loss" not in logs:
            return
        if any(isinstance(key, str) and key.startswith("eval_") for key in logs):
            return
        if self.train_metrics.updates == 0 and world_size() == 1:
            return
        values = self.train_metrics.compute()  # empty when no rank had a labelled row
        self.train_metrics.reset()
        clash = sorted(set(values) & set(logs))
        if clash:
            self._warn_once(
                "train-clash",
                f"StreamingMetrics: the training record already has {clash}; "
                "keeping the trainer's values (name your metrics differently).",
            )
        for key, value in values.items():
            logs.setdefault(key, value)

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Stop an evaluation at its first batch when this callback is not bound (no metrics)."""
        if self.trainer is None:
            self._unbound()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Remove the forward hook."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    @staticmethod
    def _unbound() -> None:
        raise RuntimeError(
            "StreamingMetrics is not bound to a trainer, so it has no metrics to give. TrainerPlus and "
            "LightweightTrainer bind their callbacks; with a stock transformers.Trainer (or a trl trainer), "
            "call run_before_integrations(trainer) once after building it."
        )

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message)


def _signature(function: Any) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):
        return None


def _parameters(function: Callable[..., Any]) -> Mapping[str, Any]:
    signature = _signature(function)
    return signature.parameters if signature is not None else {}


def _prefix(signature: Optional[inspect.Signature], args: tuple, kwargs: Mapping[str, Any]) -> str:
    """The ``metric_key_prefix`` of one call of an evaluation loop (transformers' names it so, the
    lightweight loop ``prefix``)."""
    try:
        bound = signature.bind(*args, **kwargs)  # type: ignore[union-attr]
        bound.apply_defaults()
    except (AttributeError, TypeError):
        return "eval"
    prefix = bound.arguments.get("metric_key_prefix", bound.arguments.get("prefix"))
    return prefix if isinstance(prefix, str) and prefix else "eval"


def _first(values: Any) -> Any:
    """Of a model's outputs ``(logits, hidden states, ...)`` (or labels ``(labels, ...)``), the first."""
    return values[0] if isinstance(values, (tuple, list)) else values


def _held_batches(predictions: Any, labels: Any, concatenated: bool, size: Optional[int]) -> Any:
    """``(logits, labels)`` batch by batch from the predictions a Trainer holds for a non-streaming
    ``compute_metrics``: one array per batch in a list (``eval_do_concat_batches=False``), else
    slices of ``size`` rows of the concatenated arrays (so no step costs more than a batch)."""
    if not concatenated:
        yield from zip(predictions, labels)
        return
    logits, target = _first(predictions), _first(labels)
    size = size or len(target) or 1
    for start in range(0, len(target), size):
        yield logits[start : start + size], target[start : start + size]


class _PredictionWriter:
    """One evaluation's predictions, a JSON line per example, at most ``limit`` lines."""

    def __init__(self, folder: Path, limit: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.limit, self.rows, self.seen = folder, limit, 0, 0
        self.path = folder / f".evaluation-{os.getpid()}-{id(self)}.jsonl.partial"
        self.file = open(self.path, "w", encoding="utf-8")

    def add(self, logits: Any, labels: Any, task: str, ignore_index: int) -> None:
        import torch

        scores = torch.as_tensor(_first(logits)).detach()
        target = torch.as_tensor(_first(labels))
        count = int(target.shape[0])
        room = self.limit - self.rows
        if room > 0:
            predicted, confidence = top_classes(scores[:room])
            for row in range(min(room, count)):
                self.file.write(
                    json.dumps(
                        _row(
                            self.seen + row, target[row], predicted[row], confidence[row], task, ignore_index
                        )
                    )
                    + "\n"
                )
            self.rows += min(room, count)
        self.seen += count

    def discard(self) -> None:
        """Close and delete the partial file (an evaluation that did not finish)."""
        self.file.close()
        self.path.unlink(missing_ok=True)

    def close(self, name: str) -> Path:
        """Close the file and give it its ``name`` (replacing a file of that name)."""
        self.file.close()
        target = self.folder / name
        self.path.replace(target)
        if self.seen > self.rows:
            logger.info(
                "StreamingMetrics: %s holds the first %d of %d predictions (save_predictions bound).",
                target,
                self.rows,
                self.seen,
            )
        return target


def _row(
    index: int, label: Any, predicted: Any, confidence: Any, task: str, ignore_index: int
) -> dict[str, Any]:
    if task == "classification":
        return {"id": index, "label": int(label), "prediction": int(predicted), "score": float(confidence)}
    if task == "causal_lm":  # position t predicts label t + 1
        label, predicted, confidence = label[1:], predicted[:-1], confidence[:-1]
    keep = label != ignore_index
    return {
        "id": index,
        "label": label[keep].tolist(),
        "prediction": predicted[keep].tolist(),
        "score": [round(float(value), 6) for value in confidence[keep]],
    }
