"""`WeightAveraging`: an average of the weights (EMA, BEMA) on every engine, across resume.

The pieces: ``rules.py`` (`EMA`, `BEMA`: how much of the new weights an update takes, pure),
``shard.py`` (this rank's buffers beside its part of the trained weights: the fused update, the
file, the swap in and out), and this module: the events, the checkpoint files written inside the
trainer's save, the evaluations on the average and the end. See ``docs/weight_averaging.md``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import re
import weakref
from collections.abc import Mapping
from typing import Any, Callable, Optional, Union

from ...core.callback import weak_reference
from ...core.checkpoint_folders import checkpoint_folder
from ...core.handler import sync_history
from ...core.stateful import SelfRestoringState
from ...metrics.keys import grammar_for
from ...runtime.distributed import distributed_rank, distributed_world_size, sum_over_ranks
from ...runtime.isolated_evaluation import evaluating_weights
from ...runtime.random_state import random_state_kept
from .rules import BEMA, EMA, Rule, rule_of
from .shard import LocalAverage, per_rank

__all__ = ["BEMA", "EMA", "WeightAveraging"]

logger = logging.getLogger("hf_callbacks_plus")

EVALUATE_ON = ("average", "raw", "both")
AT_END = ("keep", "average")
#: Marks the trainer methods this callback wraps (``evaluate``, ``save_model``).
_WRAPPED = "__hf_callbacks_plus_weight_averaging__"


def file_name(label: str, rank: Optional[int]) -> str:
    """``weight_average-<label>.safetensors`` (whole), ``...-rank<R>.safetensors`` (this rank's part)."""
    return f"weight_average-{label}" + ("" if rank is None else f"-rank{rank}") + ".safetensors"


class WeightAveraging(SelfRestoringState):
    """Keep an average of the weights (EMA or BEMA) and evaluate on it; in every checkpoint.

    Each rank averages its own part of what training changes, beside it (its ZeRO fp32 master
    partition, its FSDP shard; the trainable parameters, whole, in one process or DDP): ``4 * P /
    W`` bytes per buffer, fp32 whatever the training dtype, no collective per update. The update
    follows every ``update_every``-th optimizer step the trainer applied (a step its optimizer
    skipped, ``optimizer.step_was_skipped``, is no step: fp16 overflow, ZeRO overflow, a spike
    guard's skip).

    Args:
        method: ``"ema"`` (``EMA()``), ``"bema"`` (``BEMA()``), or an `EMA` / `BEMA` with its
            settings. Defaults to ``"ema"``.
        update_every: Update every this many applied optimizer steps (>= 1; trl's
            ``update_freq``). Defaults to 1.
        update_after: Applied steps of burn-in (>= 0): until then the average is the weights,
            and the averaging (BEMA's origin) starts from the weights of that step. Defaults to 0.
        evaluate_on: What each evaluation of the trainer runs on: ``"average"`` (the averaged
            weights, keys ``eval_<label>_*``), ``"raw"`` (the training weights, ``eval_*``) or
            ``"both"`` (one after the other, each with its own record and ``on_evaluate``).
            ``TrainSubsetEvaluation`` (``train_subset_<label>_*``), ``StreamingMetrics`` and
            ``GenerationSamples`` (``step-N-<label>.jsonl``) follow. Defaults to ``"both"``.
        at_end: At train end, ``"keep"`` the training weights in the model, or put the
            ``"average"`` in (``trainer.save_model()`` / ``push_to_hub`` then save it).
            Defaults to ``"keep"``.
        export_dir: Also save the averaged model there at train end with the trainer's own
            ``save_model`` (``from_pretrained`` / ``PeftModel.from_pretrained`` load it).
            Defaults to None.
        device: Where the buffers live: None (beside the weights) or ``"cpu"`` (the host).
            Defaults to None.
        label: Names the average in keys and files (a word). Defaults to ``"ema"`` / ``"bema"``.

    Raises:
        ValueError, TypeError: At construction for bad arguments (``decay`` outside (0, 1),
            ``update_every < 1``...); at train begin for a trainer that did not bind it, a model
            with nothing trainable, a resume from a checkpoint saved with
            ``save_only_model=True``, ``load_best_model_at_end`` or ``restore_best`` meeting
            ``at_end="average"``, two instances. Messages name the fix.

    Example:
        >>> averaging = WeightAveraging(EMA(decay=0.999), update_every=1)
        >>> averaging.state_key
        'WeightAveraging[ema]'
    """

    def __init__(self, method: Union[str, Rule, Mapping[str, Any]] = "ema", *, update_every: int = 1,
                 update_after: int = 0, evaluate_on: str = "both", at_end: str = "keep",
                 export_dir: Optional[Union[str, os.PathLike]] = None, device: Optional[str] = None,
                 label: Optional[str] = None) -> None:
        self.rule = rule_of(method)
        for name, value, low in (("update_every", update_every, 1), ("update_after", update_after, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"WeightAveraging: {name} must be an int >= {low}, got {value!r}.")
        for name, value, choices in (("evaluate_on", evaluate_on, EVALUATE_ON), ("at_end", at_end, AT_END)):
            if value not in choices:
                raise ValueError(f"WeightAveraging: {name} must be one of {choices}, got {value!r}.")
        if device not in (None, "cpu"):
            raise ValueError("WeightAveraging: device must be None (beside the weights) or 'cpu', got "
                             f"{device!r}.")
        label = label if label is not None else ("bema" if isinstance(self.rule, BEMA) else "ema")
        if not isinstance(label, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", label):
            raise ValueError(f"WeightAveraging: label must be a word of letters and digits, got {label!r}.")
        self.update_every, self.update_after, self.evaluate_on = update_every, update_after, evaluate_on
        self.at_end, self.device, self.label = at_end, device, label
        self.export_dir = None if export_dir is None else os.fspath(export_dir)
        self.steps = 0  # optimizer steps applied in the run (every session)
        self.updates = 0
        self.average: Optional[LocalAverage] = None
        self._trainer: Callable[[], Any] = lambda: None
        self._model: Any = None
        self._optimizer: Any = None
        self._training = False
        self._inside = False  # an evaluation on the average is running
        self._each_node = False  # args.save_on_each_node
        self._resumed_from: Optional[str] = None

    # -- state ------------------------------------------------------------------------------
    @property
    def state_key(self) -> str:
        """``WeightAveraging[<label>]``."""
        return f"WeightAveraging[{self.label}]"

    @state_key.setter
    def state_key(self, value: str) -> None:
        """Ignored (derived)."""

    def state_args(self) -> dict[str, Any]:
        rule = {type(self.rule).__name__.lower(): dict(vars(self.rule))}
        return {"method": rule, "update_every": self.update_every, "update_after": self.update_after,
                "evaluate_on": self.evaluate_on, "at_end": self.at_end, "export_dir": self.export_dir,
                "device": self.device, "label": self.label}

    def state_attributes(self) -> dict[str, Any]:
        return {"steps": self.steps, "updates": self.updates, "world_size": distributed_world_size()}

    def load_state_attributes(self, attributes: dict[str, Any]) -> None:
        self.steps = int(attributes.get("steps", 0))
        self.updates = int(attributes.get("updates", 0))

    # -- binding: the trainer's evaluate and save_model ------------------------------------
    def bind(self, trainer: Any) -> WeightAveraging:
        """Take the trainer (every runner calls it; ``run_before_integrations`` for a stock or trl
        trainer): its evaluations run on the average, its checkpoints get the average's files."""
        self._trainer = weak_reference(trainer)
        grammar = grammar_for(trainer)
        for prefix in (f"eval_{self.label}", f"train_subset_{self.label}", f"gap_{self.label}"):
            grammar.declare_prefix(prefix)
        for name, wrap in (("evaluate", self._wrap_evaluate), ("save_model", self._wrap_save_model)):
            current = getattr(trainer, name, None)
            if callable(current) and not getattr(current, _WRAPPED, False):
                wrapped = wrap(current, weakref.ref(self), weak_reference(trainer))
                setattr(wrapped, _WRAPPED, True)
                setattr(trainer, name, wrapped)
        return self

    @staticmethod
    def _wrap_evaluate(evaluate: Any, owner: Any, trainer_ref: Any) -> Any:
        parameters = list(inspect.signature(evaluate).parameters)
        position = parameters.index("metric_key_prefix") if "metric_key_prefix" in parameters else 2
        data_name = parameters[0] if parameters and parameters[0] not in ("args", "self") else "eval_dataset"

        @functools.wraps(evaluate)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            averaging, trainer = owner(), trainer_ref()
            data = kwargs.get(data_name, args[0] if args else None)
            if data is None and trainer is not None:
                data = getattr(trainer, "eval_dataset", getattr(trainer, "eval_data", None))
            if (averaging is None or trainer is None or not averaging._evaluates_average(trainer)
                    or isinstance(data, Mapping)):  # a dict of eval sets: each call below is a leaf
                return evaluate(*args, **kwargs)
            return averaging._evaluate(trainer, evaluate, list(args), kwargs, position)

        return wrapped

    @staticmethod
    def _wrap_save_model(save_model: Any, owner: Any, trainer_ref: Any) -> Any:
        @functools.wraps(save_model)
        def wrapped(output_dir: Any = None, *args: Any, **kwargs: Any) -> Any:
            averaging = owner()
            internal = kwargs.get("_internal_call", args[0] if args else False)
            if averaging is not None and internal and averaging._training and output_dir is not None:
                averaging._write_files(os.fspath(output_dir))
            return save_model(output_dir, *args, **kwargs)

        return wrapped

    def _evaluates_average(self, trainer: Any) -> bool:
        return (self._training and self.evaluate_on != "raw" and self.average is not None
                and not getattr(trainer, "_isolated_evaluation", False) and not self._inside)

    def _evaluate(self, trainer: Any, evaluate: Any, args: list, kwargs: dict, position: int) -> Any:
        """One evaluation call of the trainer, on the average (and first on the training weights
        with ``"both"``): the average's under ``<prefix>_<label>``."""
        if "metric_key_prefix" in kwargs or len(args) <= position:
            prefix = kwargs.get("metric_key_prefix", "eval")
            kwargs = {**kwargs, "metric_key_prefix": f"{prefix}_{self.label}"}
        else:
            prefix, args[position] = args[position], f"{args[position]}_{self.label}"
        raw: dict[str, Any] = {}
        if self.evaluate_on == "both":
            original = dict(kwargs, metric_key_prefix=prefix) if "metric_key_prefix" in kwargs else kwargs
            raw_args = list(args)
            if "metric_key_prefix" not in kwargs:
                raw_args[position] = prefix
            raw = dict(evaluate(*raw_args, **original))
        self._inside = True
        try:
            roots = (getattr(trainer, "data_collator", None), getattr(trainer, "train_dataset", None),
                     getattr(trainer, "eval_dataset", None))
            kept = random_state_kept(*roots) if self.evaluate_on == "both" else contextlib.nullcontext()
            labelled = f"{prefix}_{self.label}"
            with kept, evaluating_weights(trainer, self.label), _relabelled(trainer, labelled), \
                    self.average.swapped_in(self._model, self._optimizer):
                averaged = dict(evaluate(*args, **kwargs))
        finally:
            self._inside = False
        return {**raw, **averaged}

    # -- checkpoints ------------------------------------------------------------------------
    def _write_files(self, folder: str) -> None:
        """Inside the trainer's save, before its state file: each rank writes its part (rank 0 the
        whole average in one process or DDP), then every rank waits for every file (a collective:
        every rank saves). A checkpoint with a ``trainer_state.json`` therefore has every file."""
        if self.average is None:
            return
        os.makedirs(folder, exist_ok=True)
        sharded = per_rank(self._model, self._optimizer)
        rank, world = distributed_rank(), distributed_world_size()
        metadata = {"step": str(self._global_step()), "steps": str(self.steps), "rank": str(rank),
                    "world_size": str(world), "label": self.label, "rule": repr(self.rule)}
        local_zero = int(os.environ.get("LOCAL_RANK", "0") or 0) == 0  # save_on_each_node: each node's
        if sharded or rank == 0 or (self._each_node and local_zero):
            name = file_name(self.label, rank if sharded else None)
            self.average.save(os.path.join(folder, name), metadata)
        if world > 1:
            sum_over_ranks([1.0])

    def _global_step(self) -> int:
        trainer = self._trainer()
        return int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)

    def on_resume_check(self, args: Any, state: Any, control: Any, checkpoint: Optional[str] = None,
                        **kwargs: Any) -> None:
        """(TrainerPlus / LightweightTrainer) note the checkpoint a resume reads its files from."""
        self._resumed_from = checkpoint

    def _resume_folder(self, args: Any, state: Any) -> str:
        step = int(state.global_step)
        given = self._resumed_from
        if given and os.path.basename(os.path.normpath(given)) == f"checkpoint-{step}":
            return given
        return checkpoint_folder(args.output_dir, step)

    # -- events -----------------------------------------------------------------------------
    def _check_run(self, args: Any, state: Any, model: Any) -> None:
        trainer = self._trainer()
        if trainer is None:
            raise RuntimeError("WeightAveraging is not bound to its trainer, so its evaluations and "
                               "checkpoints cannot hold the average. TrainerPlus and LightweightTrainer "
                               "bind their callbacks; with a stock transformers.Trainer (or a trl "
                               "trainer) call "
                               "run_before_integrations(trainer) once after building it.")
        others = [cb for cb in getattr(getattr(trainer, "callback_handler", None), "callbacks", ())
                  if isinstance(cb, WeightAveraging) and cb is not self]
        if others:
            raise ValueError("WeightAveraging: one average per trainer (found 2 instances); pass one "
                             "WeightAveraging(...) in callbacks.")
        if not callable(getattr(model, "named_parameters", None)):
            raise TypeError(f"WeightAveraging needs a torch.nn.Module as the trainer's model, got "
                            f"{type(model).__name__}.")
        if state.global_step > 0 and getattr(args, "save_only_model", False):
            raise ValueError("WeightAveraging: this run resumes from a checkpoint saved with "
                             "save_only_model=True, which holds no optimizer, scheduler or RNG state, so "
                             "neither the training nor its average can go on as they were. Resume from a "
                             "full checkpoint "
                             "(save_only_model=False), or start a fresh run.")
        best = getattr(args, "metric_for_best_model", None)
        if self.at_end == "average" and getattr(args, "load_best_model_at_end", False):
            raise ValueError("WeightAveraging(at_end='average') and load_best_model_at_end=True both set "
                             "the final weights; keep one (at_end='keep' to end on the best checkpoint).")
        if getattr(args, "load_best_model_at_end", False) and best and self.label in str(best).split("_"):
            raise ValueError(f"WeightAveraging: metric_for_best_model={best!r} ranks the average, but "
                             "load_best_model_at_end loads the checkpoint's training weights. Use "
                             f"EarlyStopping(monitor='eval_{self.label}_...', restore_best=True), which "
                             "restores the averaged weights of the best evaluation.")
        if self.evaluate_on == "average" and best and not str(best).startswith(f"{self.label}_") \
                and f"_{self.label}_" not in f"_{best}":
            raise ValueError("WeightAveraging(evaluate_on='average'): evaluations report "
                             f"eval_{self.label}_* keys, so metric_for_best_model={best!r} never shows "
                             "up; use "
                             f"'{self.label}_{str(best).removeprefix('eval_')}' or evaluate_on='both'.")
        if self.at_end == "average":
            restoring = [type(cb).__name__ for cb in getattr(trainer.callback_handler, "callbacks", ())
                         if getattr(cb, "restore_best", False) is True]
            if restoring:
                raise ValueError("WeightAveraging(at_end='average') and "
                                 f"{restoring[0]}(restore_best=True) both set the final weights; keep one.")

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        """Check the run, find this rank's trained tensors, start the average or read it back."""
        self.steps, self.updates = 0, 0
        self._check_run(args, state, model)
        saved = state.global_step > 0 and self.find_saved_state(state) is not None
        super().on_train_begin(args, state, control, **kwargs)
        self._model, self._optimizer = model, optimizer
        self._each_node = bool(getattr(args, "save_on_each_node", False))
        self.average = LocalAverage(self.rule, self.device)
        if not self.average.attach(model, optimizer):
            raise ValueError("WeightAveraging: the model has no trainable parameter (requires_grad) on "
                             "this rank; unfreeze what you train, or drop WeightAveraging.")
        if saved:
            sharded = per_rank(model, optimizer)
            path = os.path.join(self._resume_folder(args, state),
                                file_name(self.label, distributed_rank() if sharded else None))
            if not os.path.isfile(path):
                raise FileNotFoundError(f"WeightAveraging: the run resumed at step {state.global_step} "
                                        f"was averaging, but {path} is missing (the checkpoint was copied "
                                        "without it?); put it back, or resume from a checkpoint that has it.")
            metadata = self.average.load(path)
            if metadata.get("step") != str(state.global_step):
                raise ValueError(f"WeightAveraging: {path} holds the average of step "
                                 f"{metadata.get('step')}, not of the resumed step {state.global_step}.")
        else:
            if state.global_step > 0:
                logger.warning("WeightAveraging: the checkpoint resumed (step %s) holds no average; "
                               "averaging starts from its weights.", state.global_step)
            self.average.reset()
        self._training = True

    def on_step_end(self, args: Any, state: Any, control: Any, optimizer: Any = None, **kwargs: Any) -> None:
        """After an applied optimizer step: the burn-in's copy, or every ``update_every`` steps an update.

        At ``on_step_end`` (the weights are the step's; the schedule stepped, the gradients zeroed)
        rather than ``on_optimizer_step``: every callback's ``on_optimizer_step`` has run, so a skip a
        callback marks there (``SpikeGuard`` under a ``GradScaler``, whose step resets the flag) is
        read whatever the order of the callbacks."""
        if self.average is None or getattr(optimizer, "step_was_skipped", False):
            return
        self.steps += 1
        if self.steps <= self.update_after:
            self.average.reset()
        elif (self.steps - self.update_after) % self.update_every == 0:
            self.average.update(self.steps - self.update_after)
            self.updates += 1

    def on_exception(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """(TrainerPlus / LightweightTrainer) training failed: evaluations no longer swap the average in."""
        self._training = False

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Export the averaged model when asked; put the average in the model with ``at_end="average"``."""
        average, model, optimizer = self.average, self._model, self._optimizer
        self._training = False
        if average is None or model is None:
            return
        trainer = self._trainer()
        if self.export_dir is not None and trainer is not None:
            with average.swapped_in(model, optimizer):
                trainer.save_model(self.export_dir)
        if self.at_end == "average":
            average.put_in(model, optimizer)
            logger.info("WeightAveraging: the model now holds the average (%s, %d updates).", self.label,
                        self.updates)

    def swapped_in(self) -> Any:
        """A context in which the model holds the average (a collective under ZeRO: every rank
        enters it); after it, the training weights, bit for bit. Only during training."""
        if self.average is None or not self._training:
            raise RuntimeError("WeightAveraging.swapped_in(): only during training (after train begin).")
        return self.average.swapped_in(self._model, self._optimizer)


@contextlib.contextmanager
def _relabelled(trainer: Any, prefix: str) -> Any:
    """Within the block, a record the trainer logs has its other ``eval_*`` keys under ``prefix``:
    trainers with ``"eval_"`` hard-coded in their ``log`` (every trl trainer: ``eval_entropy``,
    ``eval_rewards/chosen``...) label the averaged evaluation's metrics as the raw one's. Renamed
    before any callback sees the record, and in ``state.log_history``."""
    handler = getattr(trainer, "callback_handler", None)
    if handler is None:
        yield
        return
    original, own = handler.on_log, vars(handler).get("on_log")

    def on_log(args: Any, state: Any, control: Any, logs: Any, **kwargs: Any) -> Any:
        if isinstance(logs, dict) and f"{prefix}_runtime" in logs:
            before = dict(logs)
            for key in [k for k in logs if isinstance(k, str) and k.startswith("eval_")
                        and not k.startswith(f"{prefix}_")]:
                logs.setdefault(f"{prefix}_{key[len('eval_'):]}", logs.pop(key))
            if logs != before:
                sync_history(state, before, logs)
        return original(args, state, control, logs, **kwargs)

    handler.on_log = on_log
    try:
        yield
    finally:
        if own is None:
            del handler.on_log
        else:
            handler.on_log = own
