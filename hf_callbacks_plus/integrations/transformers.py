"""``TrainerPlus``: a ``transformers.Trainer`` that fires our custom events.

``TrainerPlusMixin`` works on any ``transformers.Trainer`` subclass (``Seq2SeqTrainer``,
trl's trainers, your own): put it first in the bases. It

* replaces ``trainer.callback_handler`` with our `CallbackHandler` (a transformers
  ``CallbackHandler`` subclass dispatching exactly like it, same callbacks, same order), so
  custom events (``call_event``) work and ``on_pre_log`` fires before every ``on_log``
  (after a subclass's own ``log``, e.g. trl's, added its metrics);
* flattens nested metric dicts in `log`;
* fires ``on_training_loss`` with the raw per-micro-batch loss (only when a callback
  listens) and ``on_exception`` when ``train()`` raises (then re-raises);
* keeps the gradient norm transformers computed before clipping (``pre_clip_grad_norm``) and
  fires ``on_pre_clip`` before it clips (only when a callback listens): a stock Trainer's
  callbacks see the gradients only after clipping (``on_pre_optimizer_step``);
* fires ``on_resume_check`` before resuming (only when a callback listens): a callback can
  veto the run, which then ends at the checkpoint's step without any training step;
* records custom ``metric_key_prefix`` values and eval dataset names in
  ``trainer.key_grammar``;
* overrides ``_maybe_log_save_evaluate``, ``log`` and ``training_step`` with
  ``*args, **kwargs`` forwarding, so it runs unchanged on transformers 4.41 to 5.x
  although their signatures differ (``grad_norm``, ``start_time``, ``learning_rate``...).
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .._compat import require
from ..core.checkpoint_folders import newest_complete_checkpoint
from ..core.resume_check import RESUME_CHECK_EVENT, run_resume_check, skipped_metrics
from ..metrics.keys import BUILTIN_SECTIONS, KeyGrammar, flatten_metrics, grammar_for
from ..runtime.isolated_evaluation import evaluate_call, isolated_evaluate
from .notebook import fit_notebook_table
from .ordering import bind_trainer, is_integration_callback, run_before_integrations, use_our_handler

transformers = require("transformers", "TrainerPlus")

__all__ = [
    "TrainerPlus",
    "TrainerPlusMixin",
    "is_integration_callback",
    "run_before_integrations",
]

logger = logging.getLogger("hf_callbacks_plus")


def _metric_key_prefix(args: tuple, kwargs: Mapping[str, Any], position: int) -> str:
    if "metric_key_prefix" in kwargs:
        return kwargs["metric_key_prefix"]
    if len(args) > position:
        return args[position]
    return "eval"


class TrainerPlusMixin:
    """Adds our events and log normalization to a ``transformers.Trainer`` subclass.

    Use it as the first base: ``class MyTrainer(TrainerPlusMixin, Seq2SeqTrainer): ...``.
    Callbacks with a ``bind(trainer)`` method (e.g.
    `TrainSubsetEvaluation`) receive the
    trainer at construction and in `add_callback`.

    Attributes:
        key_grammar: The `KeyGrammar` of this
            trainer: eval dataset names (when ``eval_dataset`` is a dict) and every custom
            ``metric_key_prefix`` passed to `evaluate`/`predict`.
        loop_context: Read-only mapping of the arguments of the current
            ``_maybe_log_save_evaluate`` call by name (``tr_loss``, ``grad_norm``,
            ``epoch``, ``start_time``, ``learning_rate``... whichever the installed
            transformers passes), empty outside of it.
    """

    key_grammar: KeyGrammar
    #: The gradient norm of the last step before clipping (transformers' own, a tensor or a float;
    #: transformers >= 5.0), for ``SpikeGuard``; None before the first step.
    pre_clip_grad_norm: Any = None
    records_pre_clip_grad_norm = True
    #: `evaluate` records its arguments while it runs (``evaluation_arguments`` reads them), so
    #: ``record_evaluate_calls`` leaves this trainer's ``evaluate`` as it is.
    records_evaluate_calls = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        use_our_handler(self)
        fit_notebook_table(self)
        self.key_grammar = grammar_for(self)
        self.loop_context: Mapping[str, Any] = MappingProxyType({})
        for callback in list(self.callback_handler.callbacks):
            bind_trainer(callback, self)

    # -- callbacks -------------------------------------------------------------------------
    def add_callback(self, callback: Any) -> None:
        """Add a callback (class or instance) and give it the trainer if it asks (``bind``)."""
        super().add_callback(callback)
        added = self.callback_handler.callbacks[-1]
        bind_trainer(added, self)
        fit_notebook_table(self)

    # -- logging ---------------------------------------------------------------------------
    def log(self, logs: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        """Flatten nested metrics, then ``Trainer.log`` (whose ``on_log`` fires ``on_pre_log``).

        ``logs`` is modified in place (``Trainer.evaluate`` passes the same dict to
        ``on_evaluate`` and returns it), so callbacks' additions reach ``state.log_history``,
        ``on_log`` (every report_to integration) and ``on_evaluate``.
        """
        if any(isinstance(value, Mapping) for value in logs.values()):
            flat = flatten_metrics(logs)
            logs.clear()
            logs.update(flat)
        if not getattr(self, "_isolated_evaluation", False):
            self.key_grammar.learn_from_metrics(logs)
        return super().log(logs, *args, **kwargs)

    # -- evaluation prefixes ---------------------------------------------------------------
    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """``Trainer.evaluate``; a custom ``metric_key_prefix`` is declared in the grammar, and the
        call's arguments are recorded while it runs (``ignore_keys``, generation settings: the
        train-subset evaluation uses the same ones)."""
        self._declare_prefix(_metric_key_prefix(args, kwargs, 2))
        parent = super().evaluate
        with evaluate_call(self, parent, args, kwargs):
            return parent(*args, **kwargs)

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.predict``; a custom ``metric_key_prefix`` is declared in the grammar."""
        prefix = kwargs.get("metric_key_prefix", args[2] if len(args) > 2 else "test")
        self._declare_prefix(prefix)
        return super().predict(*args, **kwargs)

    def isolated_evaluate(self, eval_dataset: Any, metric_key_prefix: str = "eval") -> dict[str, float]:
        """This trainer's own evaluation of ``eval_dataset``, leaving no trace in it.

        Runs `evaluate` in the sandbox of
        ``hf_callbacks_plus.runtime.isolated_evaluation`` (no log record, no
        ``on_evaluate``/``on_pre_log``, accumulators, ``control``, module modes, random
        generators and the key grammar as before). ``TrainSubsetEvaluation`` uses it.

        Args:
            eval_dataset: The data to evaluate.
            metric_key_prefix: Prefix of the returned metrics. Defaults to ``"eval"``.

        Returns:
            Every metric the evaluation reports, prefixed, without timing keys and ``epoch``.
        """
        return isolated_evaluate(self, eval_dataset, metric_key_prefix)

    def _declare_prefix(self, prefix: Any) -> None:
        if getattr(self, "_isolated_evaluation", False):
            return
        if isinstance(prefix, str) and prefix and prefix not in BUILTIN_SECTIONS and "/" not in prefix:
            self.key_grammar.declare_prefix(prefix)

    # -- the training loop ----------------------------------------------------------------
    def _maybe_log_save_evaluate(self, *args: Any, **kwargs: Any) -> Any:
        """Forward every argument unchanged; expose them by name in `loop_context`."""
        self.loop_context = MappingProxyType(self._bind_loop_arguments(args, kwargs))
        try:
            return super()._maybe_log_save_evaluate(*args, **kwargs)
        finally:
            self.loop_context = MappingProxyType({})

    def _bind_loop_arguments(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        signature = _parent_signature(type(self), "_maybe_log_save_evaluate")
        try:
            bound = signature.bind_partial(*args, **kwargs)
        except TypeError:  # a subclass changed the signature: still forward, just unnamed
            return {"args": args, **kwargs}
        return dict(bound.arguments)

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.training_step``, then ``on_training_loss`` with the micro-batch loss.

        The loss is the value ``Trainer`` adds to its running loss (already divided by
        ``gradient_accumulation_steps`` where transformers does so), read before
        ``logging_nan_inf_filter`` could replace a NaN/Inf. Fired only when a callback
        defines ``on_training_loss``, so there is no ``.item()`` sync otherwise.
        """
        loss = super().training_step(*args, **kwargs)
        handler = self.callback_handler
        if handler.listens("on_training_loss"):
            value = float(loss.detach().float().mean().item()) if hasattr(loss, "detach") else float(loss)
            self.control = handler.call_event(
                "on_training_loss", self.args, self.state, self.control, loss=value
            )
        return loss

    def _clip_grad_norm(self, *args: Any, **kwargs: Any) -> Any:
        """Fire ``on_pre_clip`` (the step's gradients, whole and not yet clipped), then clip."""
        handler = self.callback_handler
        if handler.listens("on_pre_clip"):
            self.control = handler.call_event("on_pre_clip", self.args, self.state, self.control)
        return super()._clip_grad_norm(*args, **kwargs)

    def _get_grad_norm(self, *args: Any, **kwargs: Any) -> Any:
        """Keep the norm transformers returns (computed before clipping) as `pre_clip_grad_norm`."""
        norm = super()._get_grad_norm(*args, **kwargs)
        self.pre_clip_grad_norm = norm
        return norm

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``; on an exception, fire ``on_exception`` then re-raise it.

        ``resume_from_checkpoint=True`` resumes from the newest *complete* checkpoint in
        ``output_dir`` (newer folders without a readable ``trainer_state.json``, left by an
        interrupted save, are skipped with a warning; see
        ``hf_callbacks_plus.core.checkpoint_folders``), where transformers would take the
        highest-numbered folder and fail loading it.

        When resuming, ``on_resume_check`` fires first (see
        ``hf_callbacks_plus.core.resume_check``); if a callback vetoes the run, the
        checkpoint's weights and state are loaded, no training event fires and the
        ``TrainOutput`` metrics hold ``train_skipped=1.0``.
        """
        try:
            args, kwargs = self._resolve_newest_complete(args, kwargs)
            skipped = self._resume_check(args[0] if args else kwargs.get("resume_from_checkpoint"))
            if skipped is not None:
                return skipped
            return super().train(*args, **kwargs)
        except (Exception, KeyboardInterrupt) as error:
            self.callback_handler.on_exception(self.args, self.state, self.control, exception=error)
            raise

    def _resolve_newest_complete(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """``train``'s arguments with ``resume_from_checkpoint=True`` replaced by the newest
        complete checkpoint (kept True when there is none: Trainer raises its own error)."""
        positional = bool(args)
        if (args[0] if positional else kwargs.get("resume_from_checkpoint")) is not True:
            return args, kwargs
        found = newest_complete_checkpoint(self.args.output_dir, trainer_name=type(self).__name__)
        if found is None:
            return args, kwargs
        if positional:
            return (found, *args[1:]), kwargs
        return args, {**kwargs, "resume_from_checkpoint": found}

    def _resume_check(self, resume_from_checkpoint: Any) -> Any:
        """The vetoed run's ``TrainOutput``, or None to train (also when nothing listens)."""
        if resume_from_checkpoint is None or resume_from_checkpoint is False:
            return None
        if not self.callback_handler.listens(RESUME_CHECK_EVENT):
            return None
        if resume_from_checkpoint is True:  # no checkpoint folder at all: Trainer.train raises
            return None
        from transformers.trainer_utils import TrainOutput
        from transformers.utils import is_sagemaker_mp_enabled

        checkpoint = os.fspath(resume_from_checkpoint)
        state = run_resume_check(
            self.callback_handler, self.args, checkpoint, trainer_name=type(self).__name__,
            state_class=transformers.TrainerState, control_class=transformers.TrainerControl,
        )
        if state is None:
            return None
        # Trainer.train loads the weights here too; DeepSpeed/FSDP/SageMaker-MP load them only
        # once the model is prepared for training, which a vetoed run never is.
        if not (is_sagemaker_mp_enabled() or getattr(self, "is_deepspeed_enabled", False)
                or getattr(self, "is_fsdp_enabled", False)):
            self._load_from_checkpoint(checkpoint)
        self.state = state
        return TrainOutput(state.global_step, 0.0, skipped_metrics(state))


_SIGNATURES: dict[tuple[type, str], inspect.Signature] = {}


def _parent_signature(cls: type, name: str) -> inspect.Signature:
    """The signature of the first ``name`` after ``TrainerPlusMixin`` in the MRO (cached)."""
    key = (cls, name)
    signature = _SIGNATURES.get(key)
    if signature is None:
        mro = cls.__mro__
        start = mro.index(TrainerPlusMixin) + 1 if TrainerPlusMixin in mro else 0
        function = next(vars(base)[name] for base in mro[start:] if name in vars(base))
        parameters = list(inspect.signature(function).parameters.values())[1:]  # drop self
        signature = inspect.Signature(parameters)
        _SIGNATURES[key] = signature
    return signature


class TrainerPlus(TrainerPlusMixin, transformers.Trainer):
    """``transformers.Trainer`` with our custom events, fixed logs and a key grammar.

    Takes exactly the arguments of ``transformers.Trainer``.

    Example:
        >>> trainer = TrainerPlus(model=model, args=args, train_dataset=train,
        ...                       eval_dataset=val, callbacks=[TrainSubsetEvaluation(size=256)])
        >>> trainer.train()
    """

