"""`SpikeGuard`: a loss or gradient-norm spike caught on the step it happens, the same on every rank,
and acted on: logged, its update skipped, the weights rolled back, or training stopped with a
checkpoint. See ``docs/health.md``."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable
from typing import Any, Optional

from ...core.callback import weak_reference
from ...core.checkpoint_folders import checkpoint_folder
from ...core.stateful import SelfRestoringState
from ...metrics.keys import is_training_record
from ...runtime.console import tell
from ...runtime.distributed import distributed_rank, distributed_world_size
from ...runtime.engines import (
    copy_local,
    copy_optimizer_state,
    holds_a_share,
    load_local,
    load_optimizer_state,
    local_gradients,
)
from ..deadline import window as logging_window
from .hooks import DeepSpeedStep, running_loss, skip_update, unskip
from .rule import SIGNALS, SpikeWindow

__all__ = ["ACTIONS", "PREFIX", "SpikeGuard"]

logger = logging.getLogger("hf_callbacks_plus")

#: What the guard does at a spike.
ACTIONS = ("log", "skip", "rollback", "stop")
#: Prefix of the keys the guard adds to the training records.
PREFIX = "spike_guard/"


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"SpikeGuard: {name} must be an integer >= {low}, got {value!r}.")
    return value


class SpikeGuard(SelfRestoringState):
    """Catch loss and gradient-norm spikes against a robust running statistic, and act on them.

    **The rule.** Each optimizer step gives two values: the step's loss (the mean over ranks of what
    the trainer adds to its running loss) and its gradient norm before clipping. A step is a spike
    when a watched value is not finite, or lies more than ``threshold`` robust standard deviations
    (1.4826 times the median absolute deviation) above the median of the last ``window`` values,
    once the window holds ``warmup`` of them. The window lives on the device: a step that logs
    nothing reads nothing back to the host with ``action="log"``; the other actions read one flag per
    step (they must know before the update, or at the step's end). Every rank takes the same decision:
    the loss is summed over ranks (one all-reduce of one or two numbers per step), and the rest is
    the same arithmetic on the same numbers.

    **The actions.**

    * ``"log"``: ``spike_guard/spikes`` (spikes since the last log), ``spike_guard/last_spike_step``
      and the spike's robust z-scores in the next training record (every tracker).
    * ``"skip"``: the step's update is not applied: parameters, optimizer moments and step counts
      stay bit-identical to a run whose optimizer step at that batch is bypassed; the batch is
      consumed, ``global_step`` counts the step, the learning-rate schedule does not advance (the
      step reads as skipped: ``optimizer.step_was_skipped``, as transformers and DeepSpeed treat an
      overflowed fp16 step) and the data order goes on.
    * ``"rollback"``: at the step's end every rank puts back its own copy of the last good state:
      its shard of the trained weights (ZeRO fp32 master partition, FSDP local shards, trainable
      parameters) and its optimizer state, taken every ``rollback_every`` steps in host memory with
      no gather; bit-exact. The schedule, ``global_step`` and the data go on.
    * ``"stop"``: training stops at the step's end with a complete checkpoint of that step, as
      `Deadline` stops (the logging window is carried through it).

    The window, the spikes, the skipped steps, the rollbacks and the copy's step are in every
    checkpoint (each rank's copy in its own file when it is older than the checkpoint), so a resumed
    run decides as the uninterrupted one.

    Args:
        action: One of ``"log"``, ``"skip"``, ``"rollback"``, ``"stop"``. Defaults to ``"log"``.
        window: Values kept per signal. Defaults to 128.
        warmup: Values the window must hold before a step is judged (at most ``window``); non-finite
            values are spikes from the first step. Defaults to 32.
        threshold: Robust standard deviations above the median that make a spike. Defaults to 6.
        watch: The signals judged: ``"loss"``, ``"grad_norm"`` or both. Defaults to both.
        rollback_every: Steps between two copies of the good state (``action="rollback"``).
            Defaults to 50.
        verbose: Print a line to stderr at each action (main process). Defaults to True.

    Raises:
        ValueError, TypeError: At construction for an unknown action, a window shorter than the
            warm-up, a bad threshold or signal. At train begin: a trainer the guard cannot read the
            loss from (a stock Trainer not given to ``run_before_integrations``), ``"skip"`` without
            an optimizer object (``LightweightTrainer(optimizer_step_fn=...)``).

    Example:
        >>> guard = SpikeGuard("skip", window=64, warmup=16, threshold=6.0)
        >>> guard.action, guard.window
        ('skip', 64)
    """

    def __init__(self, action: str = "log", *, window: int = 128, warmup: int = 32, threshold: float = 6.0,
                 watch: Iterable[str] = SIGNALS, rollback_every: int = 50, verbose: bool = True) -> None:
        if action not in ACTIONS:
            raise ValueError(f"SpikeGuard: action must be one of {list(ACTIONS)}, got {action!r}.")
        self.window = _check_int("window", window, 3)
        self.warmup = _check_int("warmup", warmup, 1)
        if warmup > window:
            raise ValueError(f"SpikeGuard: window={window} is shorter than warmup={warmup}: the window could "
                             f"never hold the {warmup} values judging needs. Give window >= warmup, e.g. "
                             f"window={warmup} or warmup={window}.")
        if isinstance(threshold, bool) or not isinstance(threshold, (int,
                                                                     float)) or not math.isfinite(threshold) \
                or threshold <= 0:
            raise ValueError(f"SpikeGuard: threshold must be a number > 0 (robust standard deviations), got "
                             f"{threshold!r}.")
        watched = (watch,) if isinstance(watch, str) else tuple(watch)
        unknown = [name for name in watched if name not in SIGNALS]
        if not watched or unknown:
            raise ValueError(f"SpikeGuard: watch must name some of {list(SIGNALS)}, got {watch!r}.")
        if not isinstance(verbose, bool):
            raise TypeError(f"SpikeGuard: verbose must be True or False, got {verbose!r}.")
        self.action, self.threshold, self.watch, self.verbose = action, float(threshold), watched, verbose
        self.rollback_every = _check_int("rollback_every", rollback_every, 1)
        self.rule = SpikeWindow(window, warmup, self.threshold)
        #: Steps judged spikes, skipped steps, rolled-back steps (``(step, to_step)``), in order.
        self.spike_steps: list[int] = []
        self.skipped_steps: list[int] = []
        self.rollbacks: list[list[int]] = []
        self._trainer: Any = None
        self._reset_session()

    def _reset_session(self) -> None:
        self._mark: Any = None
        self._ds: Optional[DeepSpeedStep] = None
        self._decision: Optional[bool] = None  # this step's spike (acting modes), None: not judged
        self._report: Any = None  # device: [spikes since the last log, last spike step, z loss, z grad]
        self._model: Any = None
        self._optimizer: Any = None
        self._group: Any = None
        self._world = 1
        self._pre_clip = False
        self._skip_flagged = False
        self._copy: Optional[tuple[dict[str, Any], list[dict[str, Any]]]] = None
        self._copy_step: Optional[int] = None
        self._stop_window: Optional[dict[str, Any]] = None
        self._training = False

    @property
    def state_key(self) -> str:
        return f"SpikeGuard[{self.action}]"

    @state_key.setter
    def state_key(self, value: str) -> None:
        pass

    def bind(self, trainer: Any) -> SpikeGuard:
        """Keep the trainer (weakly): its running loss is the step's loss (every runner calls this)."""
        self._trainer = weak_reference(trainer)
        return self

    @property
    def trainer(self) -> Any:
        return self._trainer() if self._trainer is not None else None

    # -- state ------------------------------------------------------------------------------------
    def state_args(self) -> dict[str, Any]:
        return {"action": self.action, "window": self.window, "warmup": self.warmup,
                "threshold": self.threshold,
                "watch": list(self.watch), "rollback_every": self.rollback_every, "verbose": self.verbose}

    def state_attributes(self) -> dict[str, Any]:
        return {"rule": self.rule.to_dict(), "spike_steps": list(self.spike_steps),
                "skipped_steps": list(self.skipped_steps), "rollbacks": [list(r) for r in self.rollbacks],
                "copy_step": self._copy_step, "stop_window": self._stop_window}

    def load_state_attributes(self, attributes: dict[str, Any]) -> None:
        self.rule.load(attributes.get("rule"))
        for name in ("spike_steps", "skipped_steps", "rollbacks"):
            value = attributes.get(name)
            if isinstance(value, list):
                setattr(self, name, list(value))
        copy_step = attributes.get("copy_step")
        self._saved_copy_step = copy_step if isinstance(copy_step, int) else None
        window = attributes.get("stop_window")
        self._stop_window = window if isinstance(window, dict) else None

    @property
    def copy_file(self) -> str:
        """Name of this rank's copy of the good state in a checkpoint."""
        return f"spike_guard-rank{distributed_rank()}.pt"

    # -- train begin --------------------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        """Check the runner, hook a DeepSpeed step, restore the window (and the good state's copy)."""
        self.rule = SpikeWindow(self.window, self.warmup, self.threshold)
        self.spike_steps, self.skipped_steps, self.rollbacks = [], [], []
        self._saved_copy_step = None
        self._reset_session()
        super().on_train_begin(args, state, control, **kwargs)
        trainer = self.trainer
        if trainer is None or not hasattr(trainer, "_tr_loss"):
            raise RuntimeError(
                "SpikeGuard reads each step's loss from the trainer's running loss (_tr_loss), and has no "
                f"trainer here ({type(trainer).__name__ if trainer is not None else 'not bound'}): use "
                "TrainerPlus or LightweightTrainer, or pass a transformers >= 5 Trainer (or trl's) to "
                "hf_callbacks_plus.run_before_integrations(trainer) before train().")
        if self.action == "skip" and optimizer is None:
            raise ValueError("SpikeGuard(action='skip') needs the optimizer the trainer steps (events get "
                             "optimizer=None: LightweightTrainer(optimizer_step_fn=...) steps it out of "
                             "sight); "
                             "pass LightweightTrainer(optimizer=...), or use action='rollback' or 'stop'.")
        self._model, self._optimizer, self._training = model, optimizer, True
        self._world = distributed_world_size()
        if self._world > 1:
            import torch.distributed as dist

            self._group = dist.group.WORLD
        if DeepSpeedStep.applies(optimizer):
            self._ds = DeepSpeedStep(optimizer, self._on_deepspeed_update, record_losses=True)
        else:
            self._pre_clip = bool(getattr(trainer, "records_pre_clip_grad_norm", False)) and \
                hasattr(type(trainer), "_get_grad_norm")
            clips = float(getattr(args, "max_grad_norm", 0) or 0) > 0
            unseen = clips and not self._pre_clip and hasattr(trainer, "_clip_grad_norm")
            if "grad_norm" in self.watch and unseen:
                logger.warning(
                    "SpikeGuard: this Trainer clips the gradients (max_grad_norm=%s) before any event, so "
                    "the gradient norm the guard sees is the clipped one: a spike above max_grad_norm is "
                    "not seen. "
                    "TrainerPlus (or TrainerPlusMixin) keeps the norm before clipping.", args.max_grad_norm)
        if self.action == "rollback":
            self._start_copy(args, state, model, optimizer)
        if self._stop_window is not None:
            logging_window.restore(trainer, self._stop_window, int(state.global_step))
            self._stop_window = None

    def _start_copy(self, args: Any, state: Any, model: Any, optimizer: Any) -> None:
        """The copy of the good state at train begin: the resumed step's when it is the copy's step (or a
        fresh run), else this rank's file in the checkpoint."""
        step = int(state.global_step)
        wanted = getattr(self, "_saved_copy_step", None)
        if step == 0 or wanted is None or wanted == step:
            self._take_copy(model, optimizer, step)
            return
        import torch

        path = os.path.join(checkpoint_folder(args.output_dir, step), self.copy_file)
        if not os.path.isfile(path):
            logger.warning("SpikeGuard: the copy of the good state of step %s is not in %s (it is looked for "
                           "in checkpoint-%s of output_dir); the copy starts again at step %s.", wanted, path,
                           step, step)
            self._take_copy(model, optimizer, step)
            return
        saved = torch.load(path, map_location="cpu", weights_only=True)
        self._copy, self._copy_step = (saved["weights"], saved["optimizer"]), int(saved["step"])

    def _take_copy(self, model: Any, optimizer: Any, step: int) -> None:
        self._copy = (copy_local(model, optimizer), copy_optimizer_state(optimizer))
        self._copy_step = step

    # -- the step ---------------------------------------------------------------------------------
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Mark the running loss; forget last step's skip flag."""
        if not self._training:
            return
        if self._skip_flagged:
            unskip(self._optimizer)
            self._skip_flagged = False
        self._decision = None
        if self._ds is not None:
            self._ds.begin_step()
        else:
            self._mark = running_loss(self.trainer)

    def _grad_norm_squared(self) -> Any:
        """This rank's share of the squared gradient norm (all of it where every rank holds whole
        gradients: rank 0 counts them)."""
        import torch

        gradients = [g for g in local_gradients(self._model, self._optimizer).values() if g is not None]
        if not gradients:
            return None
        total = torch.stack([n.float() for n in torch._foreach_norm(gradients)]).square().sum()
        if self._world > 1 and not holds_a_share(self._model, self._optimizer) and distributed_rank() != 0:
            total = total * 0
        return total

    def _judge(self, loss: Any, grad_norm: Any, norm_squared: Any, state: Any) -> None:
        """Sum over ranks, judge, keep the report; in acting modes read the decision back (one sync)."""
        import torch

        device = loss.device if hasattr(loss, "device") else (
            grad_norm.device if hasattr(grad_norm, "device") else torch.device("cpu"))

        def as_tensor(v: Any) -> Any:
            if hasattr(v, "full_tensor"):  # FSDP2: transformers' norm is a DTensor (a collective: every rank)
                v = v.full_tensor()
            if hasattr(v, "detach"):
                return v.detach().float().reshape(()).to(device)
            return torch.tensor(math.nan if v is None else float(v), device=device)

        parts = [as_tensor(loss) / self._world,
                 as_tensor(norm_squared) if norm_squared is not None else torch.zeros((), device=device)]
        vector = torch.stack(parts)
        if self._group is not None:
            import torch.distributed as dist

            dist.all_reduce(vector, group=self._group)
        norm = vector[1].sqrt() if norm_squared is not None else as_tensor(grad_norm)
        values = torch.stack([vector[0], norm])
        watched = torch.tensor([name in self.watch for name in SIGNALS], device=device)
        spike, z = self.rule.judge(values, watched)
        step = float(int(state.global_step) + 1)
        if self._report is None or self._report.device != device:
            self._report = torch.zeros(4, device=device)
        fresh = torch.cat([self._report[:1] + 1, torch.tensor([step], device=device), z])
        self._report = torch.where(spike, fresh, self._report)
        if self.action != "log":
            self._decision = bool(spike.item())
            if self._decision:
                self.spike_steps.append(int(step))

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """(without DeepSpeed) judge the step before its update; skip it when asked."""
        if not self._training or self._ds is not None:
            return
        trainer = self.trainer
        loss = running_loss(trainer)
        loss = loss - self._mark if self._mark is not None and loss is not None else loss
        grad_norm = norm_squared = None
        if "grad_norm" in self.watch:
            if self._pre_clip and getattr(trainer, "pre_clip_grad_norm", None) is not None:
                grad_norm = trainer.pre_clip_grad_norm
            else:
                norm_squared = self._grad_norm_squared()
        self._judge(loss, grad_norm, norm_squared, state)
        if self._decision and self.action == "skip":
            skip_update(self._optimizer)
            self._skip_flagged = True

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """With a GradScaler accelerate sets ``step_was_skipped`` inside the step: set it again."""
        if self._skip_flagged and self._ds is None:
            skip_update(self._optimizer, params=())

    def _on_deepspeed_update(self, inner: Any) -> None:
        """(DeepSpeed) before each update call of the step: judge at the first, skip each when asked."""
        ds = self._ds
        if ds.first:
            import torch

            losses = ds.losses
            loss = torch.stack([value.float().reshape(()) for value in losses]).sum() if losses else None
            state = self.trainer.state if self.trainer is not None else None
            self._judge(loss, ds.grad_norm(), None, state)
        if self._decision and self.action == "skip":
            skip_update(self._optimizer, params=[p for group in inner.param_groups for p in group["params"]])

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                    **kwargs: Any) -> None:
        """Act: note a skip, roll back, or stop with a checkpoint; keep a copy of a good step."""
        if not self._training or self._decision is None:
            return
        step = int(state.global_step)
        if not self._decision:
            if self.action == "rollback" and step % self.rollback_every == 0:
                self._take_copy(self._model, self._optimizer, step)
            return
        if self.action == "skip":
            self.skipped_steps.append(step)
            self._say(f"SpikeGuard: spike at step {step}; its update was skipped.", state)
        elif self.action == "rollback":
            weights, moments = self._copy
            load_local(self._model, self._optimizer, weights)
            load_optimizer_state(self._optimizer, moments)
            self.rollbacks.append([step, int(self._copy_step)])
            self._say(f"SpikeGuard: spike at step {step}; rolled back to the state of step "
                      f"{self._copy_step}.",
                      state)
        elif self.action == "stop":
            control.should_training_stop = True
            control.should_save = True
            trainer = self.trainer
            logs_now = bool(control.should_log) and step > int(getattr(trainer, "_globalstep_last_logged",
                                                                       step))
            self._stop_window = logging_window.capture(trainer, step, logs_now)
            self._say(f"SpikeGuard: spike at step {step}; stopping with checkpoint-{step}.", state)

    def _say(self, message: str, state: Any) -> None:
        tell(message, state, verbose=self.verbose, level=logging.WARNING)

    # -- the record, the checkpoint, the end ------------------------------------------------------------
    def on_pre_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """Add the spikes since the last log to the training record (one read back)."""
        if not self._training or not isinstance(logs, dict) or not is_training_record(logs):
            return
        if self._report is None:
            logs[PREFIX + "spikes"] = 0.0
            return
        spikes, step, z_loss, z_grad = self._report.tolist()
        logs[PREFIX + "spikes"] = spikes
        if spikes:
            logs[PREFIX + "last_spike_step"] = step
            logs[PREFIX + "last_loss_z"] = z_loss
            logs[PREFIX + "last_grad_norm_z"] = z_grad
        self._report = self._report * 0
        if self.action == "skip":
            logs[PREFIX + "skipped_steps"] = float(len(self.skipped_steps))
        elif self.action == "rollback":
            logs[PREFIX + "rollbacks"] = float(len(self.rollbacks))

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """A stock Trainer without our handler: the record is completed here (after the integrations
        before this callback)."""
        if isinstance(logs, dict) and PREFIX + "spikes" not in logs:
            self.on_pre_log(args, state, control, logs=logs)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Write this rank's copy of the good state when it is older than the checkpoint."""
        super().on_save(args, state, control, **kwargs)
        step = int(state.global_step)
        if self.action != "rollback" or self._copy is None or self._copy_step == step:
            return
        import torch

        folder = checkpoint_folder(args.output_dir, step)
        if os.path.isdir(folder):
            weights, moments = self._copy
            torch.save({"step": self._copy_step, "weights": weights, "optimizer": moments},
                       os.path.join(folder, self.copy_file))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Remove the DeepSpeed hook; tell what was done."""
        self._finish()
        if self.spike_steps and self.action != "log":
            done = {"skip": f"skipped {len(self.skipped_steps)}",
                    "rollback": f"rolled back {len(self.rollbacks)}",
                    "stop": "stopped at the first"}[self.action]
            self._say(f"SpikeGuard summary: {len(self.spike_steps)} spike(s) at steps "
                      f"{self.spike_steps[:10]}; "
                      f"{done}.", state)

    def on_exception(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """(TrainerPlus / LightweightTrainer) training raised: remove the hook."""
        self._finish()

    def _finish(self) -> None:
        if self._ds is not None:
            self._ds.remove()
        if self._skip_flagged:
            unskip(self._optimizer)
        self._ds, self._skip_flagged, self._training = None, False, False
        self._copy = None
