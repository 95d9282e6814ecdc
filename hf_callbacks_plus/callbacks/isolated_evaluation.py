"""Evaluate extra data with a trainer's own metrics, leaving no trace in the trainer.

`hf_callbacks_plus.callbacks.train_subset.TrainSubsetEvaluation` evaluates the
train subset *while* the trainer is between two of its own logs, often in the middle of
its evaluation record. Trainer subclasses that keep their own metric accumulators (trl's
``SFTTrainer`` collects token accuracy and entropy in ``compute_loss`` into
``self._metrics[mode]`` and averages them in ``log``; ``DPOTrainer`` its rewards and
log-probs; ``GRPOTrainer`` completions as well) would average the subset's batches into
their own numbers. `isolated_evaluate` avoids this in general:

* the subset is evaluated by the trainer's **own** ``evaluate`` (its dataset preparation,
  collator, ``prediction_step``, ``compute_loss``, ``compute_metrics`` and the metrics its
  ``log`` adds), so the subset's metrics are the trainer's metrics on the subset;
* around it, everything the evaluation would change is put back: the accumulators named in
  `TRAINER_ACCUMULATORS` are replaced by empty ones of the same shape for the
  duration and the originals restored after (the single place that knows trainer-specific
  attributes; `register_trainer_accumulator` adds your own), ``state.log_history``,
  the ``control`` flags, the train/eval mode of every module, and the random number
  generators (Python, NumPy, torch CPU and CUDA): a run with the subset evaluation trains
  exactly like the same run without it;
* the callbacks see nothing of it (no ``on_log``, ``on_evaluate``, ``on_pre_log``) except
  ``on_prediction_step``, so progress bars show the subset's progress.

Trainers with ``"eval_"`` hard-coded in their ``log`` (every trl trainer) label their added
metrics ``eval_<name>`` whatever ``metric_key_prefix`` is; those keys are renamed to the
requested prefix (inside the sandbox every metric is the subset's).
"""

from __future__ import annotations

import contextlib
import random
import sys
from collections import defaultdict, deque
from collections.abc import Iterator, Mapping
from typing import Any

from ..metrics.keys import TIMING_NAMES

__all__ = [
    "RUN_COUNTERS",
    "TRAINER_ACCUMULATORS",
    "accumulators_set_aside",
    "close_prediction_bars",
    "isolated_evaluate",
    "register_trainer_accumulator",
    "relabel_metrics",
    "trainer_sandbox",
]

#: Trainer attributes that accumulate metrics (or other per-log data) between two logs.
#: ``"fresh"``: replaced by an empty container of the same shape during an isolated
#: evaluation, the original put back after. ``"restore"``: kept during it, the original
#: object put back after (it may be reassigned). The trainers that use them:
#: trl >= 0.20 trainers ``_metrics`` ({"train"/"eval": {name: [values]}}); trl < 0.20
#: ``_stored_metrics``; trl ``GRPOTrainer``/``RLOOTrainer`` ``_logs`` (completions table),
#: ``_pending_metrics``, ``_pending_extra_logs``; ``Seq2SeqTrainer`` ``_gen_kwargs``.
TRAINER_ACCUMULATORS: dict[str, str] = {
    "_metrics": "fresh",
    "_stored_metrics": "fresh",
    "_logs": "fresh",
    "_pending_metrics": "fresh",
    "_pending_extra_logs": "fresh",
    "_gen_kwargs": "restore",
}



#: Counters of training progress a trainer's ``log`` attaches to every record (trl's
#: ``num_tokens``: tokens trained on so far): not measurements of the evaluated data.
RUN_COUNTERS = ("num_tokens", "num_input_tokens_seen")


def register_trainer_accumulator(attribute: str, policy: str = "fresh") -> None:
    """Declare a trainer attribute that an isolated evaluation must not change.

    Args:
        attribute: Attribute name on the trainer (e.g. ``"_my_metrics"``).
        policy: ``"fresh"`` (empty during the evaluation, original restored) or
            ``"restore"`` (original object restored after). Defaults to ``"fresh"``.

    Raises:
        ValueError: ``attribute`` is empty or ``policy`` is not one of the two.
    """
    if not isinstance(attribute, str) or not attribute:
        raise ValueError(
            f"register_trainer_accumulator: attribute must be a non-empty name, got {attribute!r}."
        )
    if policy not in ("fresh", "restore"):
        raise ValueError(
            f"register_trainer_accumulator: policy must be 'fresh' or 'restore', got {policy!r}."
        )
    TRAINER_ACCUMULATORS[attribute] = policy


def _empty_like(value: Any) -> Any:
    """An empty container of the same shape (a dict of containers keeps its keys)."""
    if isinstance(value, defaultdict):
        return defaultdict(value.default_factory)
    if isinstance(value, dict):
        return {key: _empty_like(item) if _is_container(item) else item for key, item in value.items()}
    if isinstance(value, deque):
        return deque(maxlen=value.maxlen)
    if isinstance(value, (list, set)):
        return type(value)()
    return value


def _is_container(value: Any) -> bool:
    return isinstance(value, (dict, list, set, deque))


class _MutedHandler:
    """Stands in for the trainer's callback handler during an isolated evaluation.

    Only ``on_prediction_step`` reaches the callbacks (progress bars size themselves on the
    subset's dataloader); logging and evaluation events are swallowed; custom events are
    not fired. Attributes the trainer sets (``eval_dataloader``) stay on this object.
    """

    def __init__(self, handler: Any) -> None:
        self._handler = handler
        self.eval_dataloader = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handler, name)

    def on_prediction_step(self, args: Any, state: Any, control: Any, *rest: Any, **kwargs: Any) -> Any:
        handler = self._handler
        saved = getattr(handler, "eval_dataloader", None)
        handler.eval_dataloader = self.eval_dataloader
        try:
            return handler.on_prediction_step(args, state, control, *rest, **kwargs)
        finally:
            handler.eval_dataloader = saved

    def on_evaluate(self, args: Any, state: Any, control: Any, *rest: Any, **kwargs: Any) -> Any:
        close_prediction_bars(self._handler)
        return control

    def on_log(self, args: Any, state: Any, control: Any, *rest: Any, **kwargs: Any) -> Any:
        return control

    on_predict = on_evaluate

    def call_event(self, event: str, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        return control

    def listens(self, event: str) -> bool:
        return False


def close_prediction_bars(handler: Any) -> None:
    """Close the evaluation progress bar of ``ProgressCallback`` (transformers' or ours)."""
    for callback in getattr(handler, "callbacks", ()):
        bar = getattr(callback, "prediction_bar", None)
        if bar is not None and hasattr(bar, "close"):
            bar.close()
            callback.prediction_bar = None


def _rng_states() -> list[tuple[Any, Any]]:
    """(restore function, state) for every random generator an evaluation might draw from."""
    states: list[tuple[Any, Any]] = [(random.setstate, random.getstate())]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states.append((numpy.random.set_state, numpy.random.get_state()))
    torch = sys.modules.get("torch")
    if torch is not None:
        states.append((torch.set_rng_state, torch.get_rng_state()))
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            states.append((torch.cuda.set_rng_state_all, torch.cuda.get_rng_state_all()))
    return states


def _module_modes(trainer: Any) -> list[tuple[Any, bool]]:
    seen: dict[int, tuple[Any, bool]] = {}
    for name in ("model", "model_wrapped"):
        model = getattr(trainer, name, None)
        modules = getattr(model, "modules", None)
        if callable(modules):
            for module in modules():
                seen.setdefault(id(module), (module, bool(getattr(module, "training", False))))
    return list(seen.values())


@contextlib.contextmanager
def accumulators_set_aside(trainer: Any) -> Iterator[None]:
    """Within this block the accumulators of `TRAINER_ACCUMULATORS` are empty ones
    ("fresh") or the trainer's own ("restore"); afterwards the trainer's originals are back."""
    saved: dict[str, Any] = {}
    for attribute, policy in TRAINER_ACCUMULATORS.items():
        if attribute in getattr(trainer, "__dict__", {}):
            original = trainer.__dict__[attribute]
            saved[attribute] = original
            if policy == "fresh":
                setattr(trainer, attribute, _empty_like(original))
    try:
        yield
    finally:
        for attribute, original in saved.items():
            setattr(trainer, attribute, original)


@contextlib.contextmanager
def trainer_sandbox(trainer: Any) -> Iterator[None]:
    """Within this block the trainer may evaluate; afterwards it is as it was before.

    Restores: the accumulators of `TRAINER_ACCUMULATORS` (emptied during the block
    for the ``"fresh"`` ones), ``state.log_history``, the ``control`` flags, every module's
    train/eval mode and the random generators. Callbacks receive only
    ``on_prediction_step`` during the block.
    """
    state = getattr(trainer, "state", None)
    history = getattr(state, "log_history", None)
    history_length = len(history) if isinstance(history, list) else None
    control = getattr(trainer, "control", None)
    control_flags = dict(vars(control)) if control is not None and hasattr(control, "__dict__") else None
    handler = getattr(trainer, "callback_handler", None)
    modes = _module_modes(trainer)
    rng = _rng_states()
    if handler is not None:
        close_prediction_bars(handler)  # the subset gets its own bar, sized to it
        trainer.callback_handler = _MutedHandler(handler)
    try:
        with accumulators_set_aside(trainer):
            yield
    finally:
        if handler is not None:
            close_prediction_bars(handler)
            trainer.callback_handler = handler
        for restore, value in rng:
            restore(value)
        for module, training in modes:
            module.training = training
        if control_flags is not None and getattr(trainer, "control", None) is not None:
            trainer.control = control
            vars(control).update(control_flags)
        if history_length is not None and isinstance(getattr(state, "log_history", None), list):
            del state.log_history[history_length:]


def isolated_evaluate(trainer: Any, dataset: Any, metric_key_prefix: str) -> dict[str, float]:
    """``trainer.evaluate(dataset, metric_key_prefix=...)`` inside `trainer_sandbox`.

    Works with any ``transformers.Trainer`` subclass (trl's, ``Seq2SeqTrainer``, yours).

    Args:
        trainer: The trainer.
        dataset: The data to evaluate, in the form ``trainer.evaluate`` accepts.
        metric_key_prefix: Prefix of the returned metrics.

    Returns:
        ``{"<prefix>_<metric>": value}``: every metric the trainer's evaluation reports for
        ``dataset`` (also those its ``log`` adds), without timing keys, ``epoch`` and run
        counters such as trl's ``num_tokens``.
    """
    with trainer_sandbox(trainer):
        raw = dict(trainer.evaluate(dataset, metric_key_prefix=metric_key_prefix))
    return relabel_metrics(raw, metric_key_prefix)


def relabel_metrics(raw: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """Keep ``<prefix>_*`` keys, rename ``eval_*`` ones to ``<prefix>_*``, drop timing keys and
    the run counters (`RUN_COUNTERS`)."""
    own = f"{prefix}_"
    result: dict[str, Any] = {}
    for key, value in raw.items():
        if key.startswith(own):
            result[key] = value
    for key, value in raw.items():
        if not key.startswith(own) and key.startswith("eval_"):
            result.setdefault(own + key[len("eval_"):], value)
    return {
        key: value for key, value in result.items()
        if key[len(own):] not in TIMING_NAMES and key[len(own):] not in RUN_COUNTERS
    }
