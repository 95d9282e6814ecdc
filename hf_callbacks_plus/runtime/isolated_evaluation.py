"""Evaluate extra data with a trainer's own metrics, leaving no trace in the trainer.

`hf_callbacks_plus.callbacks.train_subset.TrainSubsetEvaluation` evaluates the
train subset *while* the trainer is between two of its own logs, often in the middle of
its evaluation record. Trainer subclasses that keep their own metric accumulators (trl's
``SFTTrainer`` collects token accuracy and entropy in ``compute_loss`` into
``self._metrics[mode]`` and averages them in ``log``; ``DPOTrainer`` its rewards and
log-probs; ``GRPOTrainer`` completions as well) would average the subset's batches into
their own numbers. `isolated_evaluate` avoids this in general:

* the subset is evaluated by the trainer's **own** ``evaluate`` (its ``prediction_step``,
  ``compute_loss``, ``compute_metrics`` and the metrics its ``log`` adds), so the subset's
  metrics are the trainer's metrics on the subset, **from its own dataloader**: built at each
  evaluation by the trainer's ``get_eval_dataloader`` (as ``evaluate`` builds one per call),
  from the rows as they were prepared for training
  (tokenized, packed with their ``seq_lengths``, with precomputed reference log-probs), never
  placed in the trainer's loader cache (persistent workers), and handed to ``evaluate`` under
  a split name, so a subclass's ``evaluate`` does not prepare the rows a second time (trl's
  SFT packing, DPO's reference log-probs);
* around it, everything the evaluation would change is put back: the accumulators named in
  `TRAINER_ACCUMULATORS` are replaced by empty ones of the same shape for the
  duration and the originals restored after (the single place that knows trainer-specific
  attributes; `register_trainer_accumulator` adds your own), ``state.log_history``,
  the ``control`` flags, the train/eval mode of every module, and every random generator the
  training observes: the global ones (Python, NumPy, torch CPU and CUDA) and the private ones
  of its collator, datasets and dataloader (`random_state_kept`): a run with the subset
  evaluation trains exactly like the same run without it;
* the user's arguments of the evaluation in progress (``ignore_keys``, a ``Seq2SeqTrainer``'s
  generation settings) apply to the subset too (`evaluation_arguments`: recorded where the
  ``evaluate()`` call passes through, `evaluate_call`);
* the callbacks see nothing of it (no ``on_log``, ``on_evaluate``, ``on_pre_log``) except
  ``on_prediction_step``, so progress bars show the subset's progress.

Trainers with ``"eval_"`` hard-coded in their ``log`` (every trl trainer) label their added
metrics ``eval_<name>`` whatever ``metric_key_prefix`` is; those keys are renamed to the
requested prefix (inside the sandbox every metric is the subset's).
"""

from __future__ import annotations

import contextlib
import inspect
from collections import defaultdict, deque
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Optional

from ..core.callback import weak_reference
from ..core.wrapping import wrap_method
from ..metrics.keys import RUN_COUNTERS, TIMING_NAMES
from .random_state import random_state_kept

__all__ = [
    "EVALUATE_CALLS",
    "ISOLATED_SPLIT",
    "RUN_COUNTERS",
    "TRAINER_ACCUMULATORS",
    "TRAINER_SWITCHES",
    "accumulators_set_aside",
    "close_prediction_bars",
    "evaluate_call",
    "evaluated_weights",
    "evaluating_weights",
    "evaluation_arguments",
    "isolated_evaluate",
    "record_evaluate_calls",
    "register_trainer_accumulator",
    "isolated_dataloader",
    "relabel_metrics",
    "trainer_sandbox",
    "WEIGHTS_LABEL",
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



#: Trainer attributes switched off during an isolated evaluation (the original value put back
#: after): side outputs of an evaluation that are not metrics. trl ``GRPOTrainer``/``RLOOTrainer``
#: ``log_completions`` prints (and sends) a completions table at each evaluation.
TRAINER_SWITCHES: dict[str, Any] = {
    "log_completions": False,
}

#: The split name under which an isolated evaluation hands its own dataloader to ``evaluate``.
ISOLATED_SPLIT = "hf_callbacks_plus_isolated"



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
def trainer_sandbox(trainer: Any, *data: Any) -> Iterator[None]:
    """Within this block the trainer may evaluate; afterwards it is as it was before.

    Restores: the accumulators of `TRAINER_ACCUMULATORS` (emptied during the block
    for the ``"fresh"`` ones), ``state.log_history``, the ``control`` flags, every module's
    train/eval mode and every random generator the training observes: the global ones and
    those of its collator, datasets and training dataloader (and of ``data``), see
    `random_state_kept`. Callbacks receive only ``on_prediction_step`` during the block.
    """
    state = getattr(trainer, "state", None)
    history = getattr(state, "log_history", None)
    history_length = len(history) if isinstance(history, list) else None
    control = getattr(trainer, "control", None)
    control_flags = dict(vars(control)) if control is not None and hasattr(control, "__dict__") else None
    handler = getattr(trainer, "callback_handler", None)
    modes = _module_modes(trainer)
    roots = (getattr(trainer, "data_collator", None), getattr(trainer, "train_dataset", None),
             getattr(trainer, "eval_dataset", None), getattr(handler, "train_dataloader", None), *data)
    if handler is not None:
        close_prediction_bars(handler)  # the subset gets its own bar, sized to it
        trainer.callback_handler = _MutedHandler(handler)
    switches = {name: trainer.__dict__[name] for name in TRAINER_SWITCHES if name in vars(trainer)}
    for name in switches:
        setattr(trainer, name, TRAINER_SWITCHES[name])
    marked = "_isolated_evaluation" in vars(trainer)
    previous_mark = vars(trainer).get("_isolated_evaluation")
    trainer._isolated_evaluation = True  # TrainerPlus: no key-grammar learning from these logs
    try:
        with random_state_kept(*roots), accumulators_set_aside(trainer):
            yield
    finally:
        for name, value in switches.items():
            setattr(trainer, name, value)
        if marked:
            trainer._isolated_evaluation = previous_mark
        else:
            del trainer._isolated_evaluation
        if handler is not None:
            close_prediction_bars(handler)
            trainer.callback_handler = handler
        for module, training in modes:
            module.training = training
        if control_flags is not None and getattr(trainer, "control", None) is not None:
            trainer.control = control
            vars(control).update(control_flags)
        if history_length is not None and isinstance(getattr(state, "log_history", None), list):
            del state.log_history[history_length:]


_MISSING = object()

#: Dataloader settings an isolated loader uses instead of the trainer's: load in the main process.
_MAIN_PROCESS_LOADING: dict[str, Any] = {
    "dataloader_num_workers": 0,
    "dataloader_persistent_workers": False,
    "dataloader_prefetch_factor": None,
}


def isolated_dataloader(trainer: Any, dataset: Any) -> Any:
    """The trainer's own evaluation dataloader for ``dataset``, kept out of its loader cache.

    ``get_eval_dataloader`` collates, removes unused columns and shards like for the
    trainer's eval set (a subclass's override, e.g. GRPO's, applies). transformers caches eval
    loaders under ``"eval"`` when ``dataloader_persistent_workers`` is set and returns the cached
    one for *any* dataset: the cache is hidden during the call and restored unchanged after, so
    the subset never gets the eval loader and the eval set never gets the subset's. The
    subset (a few hundred rows) is loaded in the main process (no dataloader worker processes,
    persistent or not, beside the trainer's own); the rows, collator and batches are the
    trainer's. Build one per evaluation, as ``evaluate`` does: a sampler of its own (e.g. the
    ``LengthGroupedSampler`` of ``group_by_length``) then draws the same order at each one.
    """
    saved = vars(trainer).pop("_eval_dataloaders", _MISSING)
    args = trainer.args
    loading = {name: getattr(args, name) for name in _MAIN_PROCESS_LOADING if hasattr(args, name)}
    try:
        for name in loading:
            setattr(args, name, _MAIN_PROCESS_LOADING[name])
        return trainer.get_eval_dataloader(dataset)
    finally:
        for name, value in loading.items():
            setattr(args, name, value)
        vars(trainer).pop("_eval_dataloaders", None)
        if saved is not _MISSING:
            trainer._eval_dataloaders = saved


@contextlib.contextmanager
def _serving(trainer: Any, dataloader: Any) -> Iterator[None]:
    """``trainer.get_eval_dataloader(ISOLATED_SPLIT)`` returns ``dataloader`` within the block."""
    own = vars(trainer).get("get_eval_dataloader", _MISSING)
    original = trainer.get_eval_dataloader

    def get_eval_dataloader(eval_dataset: Any = None) -> Any:
        if isinstance(eval_dataset, str) and eval_dataset == ISOLATED_SPLIT:
            return dataloader
        return original(eval_dataset)

    trainer.get_eval_dataloader = get_eval_dataloader
    try:
        yield
    finally:
        if own is _MISSING:
            del trainer.get_eval_dataloader
        else:
            trainer.get_eval_dataloader = own


#: Where a trainer keeps the arguments of its ``evaluate()`` calls in progress, innermost last:
#: ``{name: value}`` of each call (see `evaluate_call`). Set by our code only.
EVALUATE_CALLS = "hf_callbacks_plus_evaluate_calls"
#: Arguments of ``evaluate`` that say which data and under which name, not how: never passed on.
_WHICH_DATA = frozenset({"eval_dataset", "metric_key_prefix"})
#: Marks the instance-level ``evaluate`` that `record_evaluate_calls` installs.
_RECORDER = "__hf_callbacks_plus_records_evaluate__"


def _signature(function: Any) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):  # no readable signature
        return None


def _call_arguments(signature: Optional[inspect.Signature], args: tuple,
                    kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``{name: value}`` of one ``evaluate`` call, its ``**kwargs`` (generation settings) spread,
    without the data and prefix and without arguments left at None (their default)."""
    try:
        bound = signature.bind_partial(*args, **kwargs).arguments if signature is not None else dict(kwargs)
    except TypeError:  # a call the method refuses: it raises its own error
        signature, bound = None, dict(kwargs)
    named: dict[str, Any] = {}
    for name, value in bound.items():
        kind = signature.parameters[name].kind if signature is not None else None
        if kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        elif kind is not inspect.Parameter.VAR_POSITIONAL:
            named[name] = value
    return {name: value for name, value in named.items() if name not in _WHICH_DATA and value is not None}


@contextlib.contextmanager
def evaluate_call(trainer: Any, function: Any, args: tuple, kwargs: Mapping[str, Any]) -> Iterator[None]:
    """Within this block, `evaluation_arguments` of ``trainer`` gives this ``evaluate`` call's
    arguments. ``TrainerPlusMixin.evaluate`` wraps its call in it; `record_evaluate_calls` makes
    any other trainer do the same.

    Args:
        trainer: The trainer whose ``evaluate`` is called.
        function: The ``evaluate`` called, or its ``inspect.Signature`` (it names the positional
            arguments).
        args: The call's positional arguments.
        kwargs: The call's keyword arguments.
    """
    signature = function if isinstance(function, inspect.Signature) else _signature(function)
    calls = vars(trainer).setdefault(EVALUATE_CALLS, [])
    calls.append(_call_arguments(signature, args, kwargs))
    try:
        yield
    finally:
        calls.pop()


def record_evaluate_calls(trainer: Any) -> None:
    """Make ``trainer`` record the arguments of its ``evaluate()`` calls while they run.

    A class that records them itself says so with ``records_evaluate_calls = True``
    (``TrainerPlusMixin``) and is left as it is; any other trainer gets, once, an ``evaluate`` of
    its own (an instance attribute) that runs the one it had inside `evaluate_call`. The
    trainer's loop calls ``self.evaluate`` (``train(ignore_keys_for_eval=...)`` included), so every
    evaluation passes through it. It holds the trainer weakly (no reference cycle).

    Args:
        trainer: A ``transformers.Trainer`` (or subclass: trl's, ``Seq2SeqTrainer``, yours).
    """
    if getattr(type(trainer), "records_evaluate_calls", False) is True:
        return
    signature, owner = _signature(trainer.evaluate), weak_reference(trainer)

    def recording(call: Callable[..., Any]) -> Callable[..., Any]:
        def evaluate(*args: Any, **kwargs: Any) -> Any:
            with evaluate_call(owner(), signature, args, kwargs):
                return call(*args, **kwargs)
        return evaluate

    wrap_method(trainer, "evaluate", recording, marker=_RECORDER)


def evaluation_arguments(trainer: Any) -> dict[str, Any]:
    """The user's arguments of the ``evaluate()`` call of ``trainer`` in progress, for an extra
    evaluation to use the same ones: ``ignore_keys`` (also ``train(ignore_keys_for_eval=...)``) and
    a ``Seq2SeqTrainer``'s generation settings (``evaluate(max_new_tokens=6, num_beams=2)``; its
    ``evaluate`` adds ``generation_max_length``... to them again for the extra evaluation). Recorded
    where the call passes through (`evaluate_call`); empty when ``trainer`` is not evaluating."""
    calls = vars(trainer).get(EVALUATE_CALLS) if hasattr(trainer, "__dict__") else None
    return dict(calls[-1]) if calls else {}


def isolated_evaluate(trainer: Any, dataset: Any, metric_key_prefix: str, *, prepared: bool = False,
                      **evaluate_kwargs: Any) -> dict[str, float]:
    """The trainer's own ``evaluate`` of ``dataset``, inside `trainer_sandbox`.

    Works with any ``transformers.Trainer`` subclass (trl's, ``Seq2SeqTrainer``, yours). The
    trainer's loader cache is hidden during the call and restored unchanged after.

    Args:
        trainer: The trainer.
        dataset: The rows to evaluate.
        metric_key_prefix: Prefix of the returned metrics.
        prepared: ``dataset`` holds rows as the trainer prepared them for training (e.g. a
            selection of ``trainer.train_dataset``): they are evaluated from a new dataloader
            built by `isolated_dataloader` for this call (as ``evaluate`` builds one per call),
            handed to ``evaluate`` under the split name `ISOLATED_SPLIT`, so a subclass's
            ``evaluate`` does not prepare them again. Defaults to False: ``dataset`` goes to
            ``evaluate`` as any eval dataset would (a trl trainer prepares raw rows).
        **evaluate_kwargs: More arguments of ``evaluate`` (``ignore_keys``, a
            ``Seq2SeqTrainer``'s generation settings; see `evaluation_arguments`).

    Returns:
        ``{"<prefix>_<metric>": value}``: every metric the trainer's evaluation reports for
        ``dataset`` (also those its ``log`` adds), without timing keys, ``epoch`` and run
        counters such as trl's ``num_tokens``.
    """
    with trainer_sandbox(trainer, dataset):
        cache = vars(trainer).pop("_eval_dataloaders", _MISSING)
        try:
            if prepared:
                with _serving(trainer, isolated_dataloader(trainer, dataset)):
                    raw = dict(trainer.evaluate(ISOLATED_SPLIT, metric_key_prefix=metric_key_prefix,
                                                **evaluate_kwargs))
            else:
                raw = dict(trainer.evaluate(dataset, metric_key_prefix=metric_key_prefix, **evaluate_kwargs))
        finally:
            vars(trainer).pop("_eval_dataloaders", None)
            if cache is not _MISSING:
                trainer._eval_dataloaders = cache
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


#: Set on a trainer while its evaluation runs on other weights than the trained ones: their label
#: (``"ema"``: `WeightAveraging` swapped its average in). Read with `evaluated_weights`.
WEIGHTS_LABEL = "hf_callbacks_plus_weights_label"


def evaluated_weights(trainer: Any) -> Optional[str]:
    """The label of the weights the evaluation of ``trainer`` in progress runs on (``"ema"`` for
    `WeightAveraging`'s average), or None for the trained weights. An evaluation on other weights
    names what it reports after them (``eval_ema_loss``, ``train_subset_ema_loss``, the generation
    file ``step-N-ema.jsonl``)."""
    return vars(trainer).get(WEIGHTS_LABEL) if hasattr(trainer, "__dict__") else None


@contextlib.contextmanager
def evaluating_weights(trainer: Any, label: str) -> Iterator[None]:
    """Within this block `evaluated_weights` of ``trainer`` is ``label``."""
    previous = evaluated_weights(trainer)
    setattr(trainer, WEIGHTS_LABEL, label)
    try:
        yield
    finally:
        if previous is None:
            vars(trainer).pop(WEIGHTS_LABEL, None)
        else:
            setattr(trainer, WEIGHTS_LABEL, previous)
