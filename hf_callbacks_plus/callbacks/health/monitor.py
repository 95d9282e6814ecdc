"""`TrainingHealth`: per-layer gradient, parameter and update norms, and memory per rank, at each
logging step, under every engine. See ``docs/health.md``."""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Optional, Union

from ...core.callback import TrainerCallback
from ...metrics.keys import is_training_record
from ...runtime.distributed import distributed_rank, distributed_world_size
from ...runtime.engines import local_gradients, local_tensors
from .hooks import DeepSpeedStep
from .memory import OomSnapshot, device_peaks, host_resident_bytes
from .norms import GroupsArg, LayerNorms, check_groups

__all__ = ["PREFIX", "TrainingHealth"]

logger = logging.getLogger("hf_callbacks_plus")

#: Prefix of every key the monitor logs.
PREFIX = "health/"
_GB = 1024.0 ** 3
#: The memory figures of each rank, in the order of the vector.
MEMORY = ("peak_allocated_gb", "peak_reserved_gb", "host_rss_gb")


class TrainingHealth(TrainerCallback):
    """Log per-layer gradient, parameter and update norms, and memory per rank, at each logging step.

    **Norms.** On each measured step (the trainer's logging steps, or every ``every`` steps), for each
    layer (the parameters' names up to the layer number: ``model.layers.3``, else their module:
    ``lm_head``) or each group of ``groups``: ``health/grad_norm/<group>`` (the step's gradients
    before clipping where the runner allows it: ``TrainerPlus`` and DeepSpeed always, a stock Trainer
    only with ``max_grad_norm=0``, since it clips before any event), ``health/param_norm/<group>``
    (after the update) and ``health/update_norm/<group>`` (the update's norm). Each rank sums its own
    elements (its ZeRO master partition, its FSDP shards: no gather), and one all-reduce of one vector
    per measured step makes them the unsharded model's (within float32 rounding). The update needs a
    device copy of this rank's trained weights from the step's begin to its update (measured steps
    only).

    **Memory.** ``health/memory/<figure>/rank<R>`` and ``.../max`` (over ranks): the CUDA device's
    ``peak_allocated_gb`` and ``peak_reserved_gb`` since the last logging step and the host's
    ``host_rss_gb`` at the logging step, gathered in the same vector. The device's peak counters are
    reset at each logging step unless transformers' own memory figures read them at the end
    (``skip_memory_metrics=False``): then, or with ``reset_peaks=False``, the peaks are since the start.
    ``oom_snapshot`` records CUDA's allocation history and writes a snapshot when CUDA runs out of
    memory (``memory_snapshot-rank<R>.pickle``, for PyTorch's memory viewer).

    Args:
        norms: Log the norms. Defaults to True.
        memory: Log the memory. Defaults to True.
        groups: ``{name: pattern or patterns}`` (``fnmatch`` on the parameter names, e.g.
            ``{"attention": "*.self_attn.*", "mlp": "*.mlp.*"}``) instead of layers. Defaults to None.
        every: Steps between measurements. Defaults to None: the trainer's ``logging_steps`` (and the
            first step with ``logging_first_step``).
        reset_peaks: Reset CUDA's peak counters at each logging step: True, False, or ``"auto"`` (unless
            transformers' memory metrics read them). Defaults to ``"auto"``.
        oom_snapshot: A folder for the out-of-memory snapshot (True: the output directory), or False.
            Recording costs some time per allocation. Defaults to False.

    Raises:
        TypeError, ValueError: At construction for bad arguments; at train begin a group that matches
            no trained parameter, or no measurement step (``logging_strategy`` not ``"steps"`` and no
            ``every``).
    """

    def __init__(self, norms: bool = True, memory: bool = True, *, groups: GroupsArg = None,
                 every: Optional[int] = None, reset_peaks: Union[bool, str] = "auto",
                 oom_snapshot: Union[bool, str, os.PathLike] = False) -> None:
        for name, value in (("norms", norms), ("memory", memory)):
            if not isinstance(value, bool):
                raise TypeError(f"TrainingHealth: {name} must be True or False, got {value!r}.")
        if not (norms or memory):
            raise ValueError("TrainingHealth: nothing to do: give norms=True or memory=True.")
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ValueError(f"TrainingHealth: every must be None or an integer >= 1, got {every!r}.")
        if reset_peaks not in (True, False, "auto"):
            raise ValueError(f"TrainingHealth: reset_peaks must be True, False or 'auto', got "
                             f"{reset_peaks!r}.")
        if not isinstance(oom_snapshot, (bool, str, os.PathLike)):
            raise TypeError(f"TrainingHealth: oom_snapshot must be a folder, True or False, got "
                            f"{oom_snapshot!r}.")
        self.norms, self.memory, self.every, self.reset_peaks = norms, memory, every, reset_peaks
        self.groups = check_groups(groups)
        self.oom_snapshot = oom_snapshot
        #: The out-of-memory snapshot of this run (its ``written`` path after an OOM).
        self.snapshot: Optional[OomSnapshot] = None
        self._reset()

    def _reset(self) -> None:
        self._plan: Optional[LayerNorms] = None
        self._model = self._optimizer = self._ds = None
        self._every, self._first, self._reset_now, self._measuring = 0, False, False, False
        self._before: Optional[dict[str, Any]] = None
        self._grads: Any = None
        self._pending: Any = None
        self._world, self._rank = 1, 0
        self._training = False

    # -- train begin ----------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        """Plan the groups, choose the measured steps, hook a DeepSpeed step, start the OOM record."""
        self._finish()
        self._reset()
        every = self.every
        if every is None:
            strategy = str(getattr(getattr(args, "logging_strategy", "steps"), "value",
                                   getattr(args, "logging_strategy", "steps")))
            if strategy != "steps":
                raise ValueError(f"TrainingHealth: logging_strategy={strategy!r} gives no logging steps to "
                                 "measure at; pass TrainingHealth(every=N).")
            every = max(1, int(getattr(args, "logging_steps", 1) or 1))
        self._every, self._first = every, bool(getattr(args, "logging_first_step", False))
        self._model, self._optimizer = model, optimizer
        self._world, self._rank = distributed_world_size(), distributed_rank()
        if self.norms:
            self._plan = LayerNorms(model, optimizer, self.groups)
            if DeepSpeedStep.applies(optimizer):
                self._ds = DeepSpeedStep(optimizer, self._on_deepspeed_update)
        if self.memory:
            transformers_reads = getattr(args, "skip_memory_metrics", True) is False
            automatic = self.reset_peaks == "auto" and not transformers_reads
            self._reset_now = self.reset_peaks is True or automatic
            if self.oom_snapshot:
                folder = getattr(args, "output_dir",
                                 ".") if self.oom_snapshot is True else os.fspath(self.oom_snapshot)
                self.snapshot = OomSnapshot(os.path.join(folder, f"memory_snapshot-rank{self._rank}.pickle"))
                if not self.snapshot.start():
                    logger.info("TrainingHealth: no CUDA device: no out-of-memory snapshot is recorded.")
        self._training = True

    # -- the measured step ------------------------------------------------------------------------
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Is this step measured? Keep a device copy of the trained weights for its update's norm."""
        if not self._training:
            return
        step = int(state.global_step) + 1
        self._measuring = step % self._every == 0 or (self._first and step == 1)
        self._grads = None
        if self._measuring and self._plan is not None:
            tensors = local_tensors(self._model, self._optimizer)
            self._before = {key: tensors[key].detach().clone() for key in self._plan.plan}

    def _measure_gradients(self) -> None:
        if self._measuring and self._plan is not None and self._grads is None and self._ds is None:
            self._grads = self._plan.squares(local_gradients(self._model, self._optimizer))

    def on_pre_clip(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """(TrainerPlus) the gradients before clipping."""
        self._measure_gradients()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The gradients (clipped already when the trainer clipped and fired no ``on_pre_clip``)."""
        self._measure_gradients()

    def _on_deepspeed_update(self, inner: Any) -> None:
        """(DeepSpeed) the master gradients of one parameter group, clipped by ZeRO: unclipped here."""
        if not self._measuring or self._plan is None:
            return
        masters = {id(p) for group in inner.param_groups for p in group["params"]}
        tensors = local_tensors(self._model, self._optimizer)
        gradients = {key: grad for key, grad in local_gradients(self._model, self._optimizer).items()
                     if grad is not None and id(tensors[key]) in masters}
        found = self._plan.squares(gradients, factor=self._ds.clip_factor())
        if found is not None:
            self._grads = found if self._grads is None else self._grads + found

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The weights after the update, the update, the memory: one vector, one all-reduce."""
        if not self._training or not self._measuring:
            return
        import torch

        parts = []
        if self._plan is not None:
            after = local_tensors(self._model, self._optimizer)
            params = self._plan.squares(after)
            before = self._before or {}
            updates = self._plan.squares({key: after[key].detach().float() - value.float()
                                          for key, value in before.items()})
            self._before = None
            missing = torch.full((len(self._plan.names),), math.nan)
            parts += [value if value is not None else missing for value in (self._grads, params, updates)]
        device = parts[0].device if parts else torch.device("cpu")
        if self.memory:
            slots = torch.zeros(self._world * len(MEMORY), dtype=torch.float32)
            peaks = device_peaks(self._reset_now)
            mine = [*(peaks if peaks is not None else (math.nan, math.nan)), host_resident_bytes()]
            slots[self._rank * len(MEMORY):(self._rank + 1) * len(MEMORY)] = torch.tensor(mine) / _GB
            parts.append(slots.to(device))
        vector = torch.cat([part.to(device=device, dtype=torch.float32) for part in parts])
        if self._world > 1:
            import torch.distributed as dist

            dist.all_reduce(vector)
        self._pending = vector

    # -- the record -------------------------------------------------------------------------------
    def on_pre_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """Add the last measurement to the training record (one read back)."""
        if self._pending is None or not isinstance(logs, dict) or not is_training_record(logs):
            return
        values, self._pending = self._pending.tolist(), None
        if self._plan is not None:
            size = len(self._plan.names)
            for offset, kind in enumerate(("grad_norm", "param_norm", "update_norm")):
                for index, group in enumerate(self._plan.names):
                    value = values[offset * size + index]
                    if not math.isnan(value):
                        logs[f"{PREFIX}{kind}/{group}"] = math.sqrt(max(value, 0.0))
            values = values[3 * size:]
        if self.memory:
            for index, figure in enumerate(MEMORY):
                per_rank = [values[rank * len(MEMORY) + index] for rank in range(self._world)]
                if any(math.isnan(v) for v in per_rank):
                    continue
                for rank, value in enumerate(per_rank):
                    logs[f"{PREFIX}memory/{figure}/rank{rank}"] = value
                logs[f"{PREFIX}memory/{figure}/max"] = max(per_rank)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """A stock Trainer without our handler: the record is completed here."""
        self.on_pre_log(args, state, control, logs=logs)

    def on_exception(self, args: Any, state: Any, control: Any, exception: Any = None, **kwargs: Any) -> None:
        """(TrainerPlus / LightweightTrainer) an out-of-memory error: write the snapshot."""
        if self.snapshot is not None and type(exception).__name__ == "OutOfMemoryError":
            self.snapshot.dump()
        self._finish()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Remove the DeepSpeed hook; stop the allocation record."""
        self._finish()

    def _finish(self) -> None:
        if getattr(self, "_ds", None) is not None:
            self._ds.remove()
            self._ds = None
        if self.snapshot is not None:
            self.snapshot.stop()
        self._training = False
