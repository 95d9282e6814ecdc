"""Evaluate a fixed, seeded subset of the training set at every evaluation.

The copied workaround (``trainer.evaluate(train_ds, metric_key_prefix="train")`` in
``on_epoch_end``) recurses through ``on_evaluate``, corrupts ``control``, feeds ``train_*``
metrics to early stopping, logs a second record and evaluates the whole training set.
`TrainSubsetEvaluation` instead evaluates a subset chosen once with the trainer's own
evaluation (``trainer.evaluate``: its dataset preparation, collator, ``compute_metrics``, the
metrics its ``log`` adds, eval batch size, device and sharding across ranks) inside a sandbox
that leaves no trace (see `hf_callbacks_plus.runtime.isolated_evaluation`), and adds
the metrics to the evaluation's own log record from ``on_pre_log``, before any integration
sees it: no recursion, ``control`` untouched, one record per evaluation, and the trainer's
own numbers (trl's token accuracy, DPO rewards...) exactly as without the callback.

How it reaches the trainer (it needs the trainer object to evaluate):

* ``TrainerPlus`` / ``TrainerPlusMixin``: automatic (the trainer calls `bind`).
* stock ``transformers.Trainer``: ``run_before_integrations(trainer, TrainSubsetEvaluation(...))``
  binds it and makes ``on_pre_log`` fire before the report_to integrations.
* ``LightweightTrainer``: automatic, like ``TrainerPlus``.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any, Optional, Union

from ...core.callback import TrainerCallback
from ...core.checks import check_int, check_name
from ...metrics.monitor import gap_is_meaningful
from ...runtime.isolated_evaluation import (
    accumulators_set_aside,
    evaluated_weights,
    evaluation_arguments,
    isolated_evaluate,
    record_evaluate_calls,
    relabel_metrics,
)
from ..monitoring import announce_metrics
from .sampling import take_subset

__all__ = ["TrainSubsetEvaluation"]

#: Below this many samples (an int ``size``), a warning says the metrics are mostly noise.
_FEW_SAMPLES = 8

logger = logging.getLogger("hf_callbacks_plus")


class TrainSubsetEvaluation(TrainerCallback):
    """Reports ``train_subset_<metric>`` (and optionally ``gap_<metric>``) at every evaluation.

    Args:
        size: Number of training samples (an int >= 1) or a fraction of the training set
            (a float in (0, 1]). Defaults to 0.1.
        seed: Seed of the subset choice; the subset is chosen once and kept for the whole
            run. Defaults to 42.
        stratify_by: Label column (key of each sample, or column of a ``datasets.Dataset``)
            whose class proportions the subset keeps. Defaults to None (uniform).
        every: ``"eval"`` to evaluate with each evaluation and add the metrics to its log
            record (same step), or an int N to evaluate every N optimizer steps and log a
            record of its own. Defaults to ``"eval"``.
        prefix: Prefix of the reported metrics. Defaults to ``"train_subset"``
            (``train_subset_accuracy``, rendered ``train_subset/accuracy`` by the key grammar).
        gap_metrics: Also report ``gap_<metric>`` = train minus eval: True for every metric both
            have whose gap means something (a measure with a known better direction: loss,
            accuracy, F1, perplexity...; not confusion counts, counters or trl's ``entropy``, see
            ``hf_callbacks_plus.metrics.monitor.gap_is_meaningful``), a list for exactly the given
            metric names (e.g. ``["loss", "accuracy"]``), or False for none.
            ``EarlyStopping(monitor="gap_loss")`` can watch them. Defaults to False.
        dataset: Data to take the subset from instead of the trainer's training set.
            Defaults to None.

    Raises:
        ValueError: An argument is out of range (the message names it and the valid values).
        TypeError: An argument has the wrong type.

    Note:
        ``transformers.Trainer`` selects the best model only from ``eval_*`` metrics, so the
        train-subset metrics never affect it; ``EarlyStopping`` uses them only when told to
        monitor ``train_subset_*``/``gap_*``. In a ``LightweightTrainer`` whose ``train_data`` is a
        sequence of batches (not a DataLoader), ``size`` counts batches.

        The metrics are the trainer's own evaluation metrics on the subset (trl's
        ``SFTTrainer``: loss, ``mean_token_accuracy``, ``entropy``; ``DPOTrainer``: its
        rewards and log-probs...), and the trainer's own numbers stay exactly as without
        this callback (see ``hf_callbacks_plus.runtime.isolated_evaluation``). One WARNING
        is logged when ``every="eval"`` meets ``eval_strategy="no"`` (at train begin) and
        when the subset yields no metric (unlabeled samples and no ``compute_metrics``).

    Example:
        >>> callback = TrainSubsetEvaluation(size=512, stratify_by="label", gap_metrics=True)
        >>> trainer = TrainerPlus(model=model, args=args, train_dataset=train,
        ...                       eval_dataset=val, callbacks=[callback])
    """

    def __init__(
        self,
        size: Union[int, float] = 0.1,
        *,
        seed: int = 42,
        stratify_by: Optional[str] = None,
        every: Union[str, int] = "eval",
        prefix: str = "train_subset",
        gap_metrics: Union[bool, Iterable[str]] = False,
        dataset: Any = None,
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, numbers.Real):
            raise TypeError(f"TrainSubsetEvaluation: size must be an int or a float, got {size!r}.")
        if isinstance(size, numbers.Integral):
            if size < 1:
                raise ValueError(f"TrainSubsetEvaluation: size must be >= 1 as a count, got {size!r}.")
        elif not (0.0 < float(size) <= 1.0) or math.isnan(size):
            raise ValueError(
                f"TrainSubsetEvaluation: size as a fraction must be in (0, 1], got {size!r}; "
                "pass an int for a number of samples."
            )
        check_int("TrainSubsetEvaluation", "seed", seed)
        check_name("TrainSubsetEvaluation", "stratify_by", stratify_by, example="label", none="uniform")
        if every != "eval" and (
            isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1
        ):
            raise ValueError(f"TrainSubsetEvaluation: every must be 'eval' or an int >= 1, got {every!r}.")
        if not isinstance(prefix, str) or not prefix or "/" in prefix or prefix in ("eval", "test", "gap"):
            raise ValueError(
                f"TrainSubsetEvaluation: prefix must be a non-empty name without '/' other than "
                f"'eval', 'test' and 'gap', got {prefix!r}."
            )
        if isinstance(gap_metrics, str):
            raise TypeError(
                f"TrainSubsetEvaluation: gap_metrics must be a bool or a list of metric names, got "
                f"{gap_metrics!r}; did you mean [{gap_metrics!r}]?"
            )
        if isinstance(size, numbers.Integral) and size < _FEW_SAMPLES:
            logger.warning(
                "TrainSubsetEvaluation(size=%d): metrics over %d sample(s) are mostly noise; the usual "
                "choice is a few hundred samples (or a fraction such as size=0.05).", size, size)
        self.size = size
        self.seed = int(seed)
        self.stratify_by = stratify_by
        self.every = every
        self.prefix = prefix
        self.gap_metrics: Union[bool, tuple[str, ...]] = (
            gap_metrics if isinstance(gap_metrics, bool) else tuple(gap_metrics)
        )
        self.dataset = dataset
        self.trainer: Any = None
        self.indices: Optional[list[int]] = None
        self._subset: Any = None
        self._running = False
        self._handled: Optional[dict] = None
        self._warned_unfired = False
        self._warned_empty = False
        self._warned_no_eval = False

    # -- wiring ------------------------------------------------------------------------------
    def bind(self, trainer: Any) -> TrainSubsetEvaluation:
        """Give the callback its trainer (``TrainerPlus`` and ``run_before_integrations`` do it).

        Returns:
            self, so ``trainer.add_callback(TrainSubsetEvaluation(...).bind(trainer))`` works.
        """
        if self.trainer is not None and self.trainer is not trainer:
            self._subset = None
            self.indices = None
        self.trainer = trainer
        if callable(getattr(trainer, "get_eval_dataloader", None)):  # a transformers.Trainer
            record_evaluate_calls(trainer)  # the subset evaluates with the arguments of evaluate()
        return self

    def _require_trainer(self) -> Any:
        if self.trainer is None:
            raise RuntimeError(
                "TrainSubsetEvaluation is not bound to a trainer. TrainerPlus and LightweightTrainer "
                "bind their callbacks; with a stock transformers.Trainer (or a trl trainer), call "
                "run_before_integrations(trainer) once after building it."
            )
        return self.trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any):
        """Check everything knowable now: the binding, one prefix per instance, the training data
        (sized, indexable, the ``stratify_by`` column: the subset is chosen here); warn once when
        training will run no evaluation to join."""
        trainer = self._require_trainer()
        for other in getattr(getattr(trainer, "callback_handler", None), "callbacks", ()):
            if other is not self and isinstance(other, TrainSubsetEvaluation) and other.prefix == self.prefix:
                raise ValueError(
                    f"TrainSubsetEvaluation: two instances report under prefix={self.prefix!r}, so one "
                    "would overwrite the other's metrics; give each its own prefix "
                    "(e.g. prefix='train_subset_small')."
                )
        self.subset()
        announce_metrics(state, [self.prefix, "gap"] if self.gap_metrics else [self.prefix])
        strategy = getattr(args, "eval_strategy", None)
        strategy = getattr(strategy, "value", strategy)
        if self.every == "eval" and strategy == "no" and not self._warned_no_eval:
            self._warned_no_eval = True
            logger.warning(
                "TrainSubsetEvaluation(every='eval') runs with each evaluation, but eval_strategy='no': "
                "this training reports no train-subset metric (only a later trainer.evaluate() call "
                "will). Set eval_strategy='steps' or 'epoch' (with an eval_dataset), or pass every=N "
                "to evaluate the subset every N steps."
            )
        return None

    # -- the subset --------------------------------------------------------------------------
    def _source(self) -> Any:
        if self.dataset is not None:
            return self.dataset
        trainer = self._require_trainer()
        for name in ("train_dataset", "train_data"):
            source = getattr(trainer, name, None)
            if source is not None:
                return source
        raise RuntimeError(
            "TrainSubsetEvaluation: the trainer has no training data (train_dataset/train_data); "
            "pass dataset=... to TrainSubsetEvaluation."
        )

    def subset(self) -> Any:
        """The fixed subset (chosen on first use), in the form the trainer evaluates."""
        if self._subset is None:
            source = self._source()
            self.indices, self._subset = take_subset(
                source, self.size, self.seed, self.stratify_by, self._lightweight_batch_size()
            )
        return self._subset

    def _lightweight_batch_size(self) -> Optional[int]:
        trainer = self.trainer
        if trainer is not None and not hasattr(trainer, "evaluation_loop"):
            return int(getattr(trainer.args, "eval_batch_size", 0) or 8)
        return None

    # -- evaluation --------------------------------------------------------------------------
    def compute(self, prefix: Optional[str] = None) -> dict[str, float]:
        """Evaluate the subset now and return ``{"<prefix>_<metric>": value}`` (``prefix`` defaults to
        the callback's own).

        The metrics are the trainer's own evaluation metrics on the subset (for trl's
        ``SFTTrainer``: loss, mean token accuracy, entropy...), computed without any trace in
        the trainer: no log record, no ``on_evaluate``, ``control``, accumulators, module
        modes and every random generator as they were. For a ``transformers.Trainer`` (any
        subclass) it is `hf_callbacks_plus.runtime.isolated_evaluation.isolated_evaluate` of
        the rows as prepared for training, from a dataloader built for this evaluation, with
        the arguments of the ``evaluate()`` call in progress (``ignore_keys``, generation
        settings); ``LightweightTrainer`` evaluates with its own ``isolated_evaluate``.
        """
        trainer = self._require_trainer()
        subset = self.subset()
        prefix = prefix or self.prefix
        self._running = True
        try:
            if callable(getattr(trainer, "get_eval_dataloader", None)):  # a transformers.Trainer
                metrics = isolated_evaluate(trainer, subset, prefix, prepared=True,
                                            **evaluation_arguments(trainer))
            else:  # LightweightTrainer: whatever it returns keeps only what a subset reports
                metrics = relabel_metrics(trainer.isolated_evaluate(subset, metric_key_prefix=prefix), prefix)
        finally:
            self._running = False
        if not metrics and not self._warned_empty:
            self._warned_empty = True
            if getattr(trainer, "compute_metrics", None) is None:
                why = "the trainer has no compute_metrics"
            else:
                why = "the trainer's compute_metrics returned nothing for them"
            logger.warning(
                "TrainSubsetEvaluation: evaluating the %d-sample train subset produced no metric: the "
                "samples carry no labels (so the model returns no loss) and %s. Give the training "
                "samples labels (or label_names), or pass dataset=... with labeled samples.",
                len(self.indices or ()), why,
            )
        return metrics

    def _trigger_prefix(self) -> str:
        trainer = self.trainer
        eval_data = getattr(trainer, "eval_dataset", None)
        if eval_data is None:
            eval_data = getattr(trainer, "eval_data", None)
        if isinstance(eval_data, Mapping) and eval_data:
            return f"eval_{next(iter(eval_data))}"
        return "eval"

    def _gaps(self, train: Mapping[str, Any], logs: Mapping[str, Any], eval_prefix: str,
              prefix: str, suffix: str = "") -> dict[str, float]:
        if not self.gap_metrics:
            return {}
        names = [key[len(prefix) + 1:] for key in train]
        if self.gap_metrics is True:
            names = [name for name in names if gap_is_meaningful(name)]
        else:
            names = [name for name in names if name in self.gap_metrics]
        gaps = {}
        for name in names:
            train_value, eval_value = train.get(f"{prefix}_{name}"), logs.get(f"{eval_prefix}_{name}")
            if _is_number(train_value) and _is_number(eval_value):
                gaps[f"gap{suffix}_{name}"] = float(train_value) - float(eval_value)
        return gaps

    # -- events ------------------------------------------------------------------------------
    def on_pre_log(self, args: Any, state: Any, control: Any, logs: Optional[dict] = None, **kwargs: Any):
        """Add the train-subset (and gap) metrics to an evaluation's log record (on averaged weights,
        `WeightAveraging`'s, under ``<prefix>_<label>_`` and ``gap_<label>_``)."""
        if self.every != "eval" or self._running or not isinstance(logs, dict) or self.trainer is None:
            return None
        label = evaluated_weights(self.trainer)
        suffix = f"_{label}" if label else ""
        eval_prefix = self._trigger_prefix() + suffix
        if f"{eval_prefix}_runtime" not in logs:
            return None
        train = self.compute(self.prefix + suffix)
        logs.update(train)
        logs.update(self._gaps(train, logs, eval_prefix, self.prefix + suffix, suffix))
        self._handled = logs
        return None

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[dict] = None, **kwargs: Any):
        if (
            self.every == "eval"
            and not self._warned_unfired
            and isinstance(logs, dict)
            and logs is not self._handled
            and f"{self._trigger_prefix() if self.trainer is not None else 'eval'}_runtime" in logs
        ):
            self._warned_unfired = True
            logger.warning(
                "TrainSubsetEvaluation: this trainer did not fire on_pre_log, so no train-subset "
                "metrics were added. Use TrainerPlus, or run_before_integrations(trainer, callback) "
                "with a stock transformers.Trainer."
            )
        return None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any):
        """With ``every=N``: evaluate every N steps and log one record of its own."""
        if self.every == "eval" or self._running or state.global_step % self.every != 0:
            return None
        trainer = self._require_trainer()
        metrics = self.compute()
        should_log = control.should_log
        with accumulators_set_aside(trainer):  # a trl trainer's log would take its running metrics
            trainer.log(metrics)
        # the handler's on_log clears should_log: the trainer's own record of this step must stay
        control.should_log = should_log
        trainer_control = getattr(trainer, "control", None)
        if trainer_control is not None:
            trainer_control.should_log = should_log
        return None


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)

