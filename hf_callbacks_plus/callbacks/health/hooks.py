"""Where `SpikeGuard` and `TrainingHealth` see a step: its loss, its gradients before clipping, and
the moment before the update, per runner and engine. See ``docs/health.md`` for the table.

* Without DeepSpeed the update happens in ``optimizer.step()``, between ``on_pre_optimizer_step``
  and ``on_optimizer_step``: the step's loss is the growth of the trainer's running loss
  (``_tr_loss``, a device tensor in ``transformers.Trainer`` 5.x, a float in ``LightweightTrainer``)
  since ``on_step_begin``; the gradients are clipped already there unless ``max_grad_norm`` is 0,
  except in ``TrainerPlus``, which keeps the norm transformers computed before clipping
  (``pre_clip_grad_norm``) and fires ``on_pre_clip`` before it clips.
* Under DeepSpeed the update happens inside the trainer's backward (accelerate calls the engine's
  ``step`` there), before any event. `DeepSpeedStep` hooks the step of the torch optimizer behind
  ZeRO (``register_step_pre_hook``, torch's own hook): its first call in a step comes after ZeRO
  computed its gradient norm (before clipping: ``_global_grad_norm``) and before any parameter
  changes. The loss reaches it through ZeRO's ``scale_if_loss``, which the engine's ``backward``
  calls with each micro-batch's loss: an instance attribute wrapping it, removed at train end.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ...runtime.engines import torch_optimizer, zero_optimizer

__all__ = ["DeepSpeedStep", "running_loss", "skip_update", "unskip"]


def running_loss(trainer: Any) -> Any:
    """A copy of the trainer's running loss (a device tensor or a float), or None."""
    value = getattr(trainer, "_tr_loss", None)
    return value.detach().clone() if hasattr(value, "detach") else value


class DeepSpeedStep:
    """Hooks into a DeepSpeed ZeRO step (module docstring): ``on_update(inner_optimizer)`` runs before
    each call of the torch optimizer behind ZeRO (once per parameter group), ``first`` tells the first
    call of a step; the micro-batch losses of the step are in `losses`.

    Args:
        optimizer: The optimizer callbacks receive (accelerate's wrapper of the ZeRO optimizer).
        on_update: Called with the torch optimizer before each of its steps.
        record_losses: Wrap ``scale_if_loss`` to record the losses. Defaults to False.
    """

    def __init__(self, optimizer: Any, on_update: Callable[[Any], None], record_losses: bool = False) -> None:
        self.zero = zero_optimizer(optimizer)
        self.inner = torch_optimizer(optimizer)
        self.losses: list[Any] = []
        self.first = True
        self._on_update = on_update
        self._handle = self.inner.register_step_pre_hook(self._pre_hook)
        self._wrapped: Optional[Callable[..., Any]] = None
        if record_losses:
            original = self.zero.scale_if_loss

            def scale_if_loss(value: Any) -> Any:
                if hasattr(value, "detach"):
                    self.losses.append(value.detach())
                return original(value)

            self.zero.scale_if_loss = self._wrapped = scale_if_loss

    @staticmethod
    def applies(optimizer: Any) -> bool:
        """Whether ``optimizer`` is DeepSpeed ZeRO's."""
        return zero_optimizer(optimizer) is not None

    def begin_step(self) -> None:
        """A new step: its losses and its first update call are still to come."""
        self.losses = []
        self.first = True

    def _pre_hook(self, inner: Any, args: Any, kwargs: Any) -> None:
        self._on_update(inner)
        self.first = False

    def grad_norm(self) -> Any:
        """ZeRO's gradient norm of the step, before clipping (set before its first update call)."""
        return getattr(self.zero, "_global_grad_norm", None)

    def clip_factor(self) -> float:
        """What ZeRO divided the gradients by to clip them (1 without clipping): its own formula."""
        clip = float(getattr(self.zero, "clip_grad", 0.0) or 0.0)
        norm = self.grad_norm()
        if clip <= 0 or norm is None:
            return 1.0
        return max(1.0, (float(norm) + 1e-6) / clip)

    def remove(self) -> None:
        """Remove the hook and the wrapper."""
        self._handle.remove()
        if self._wrapped is not None and vars(self.zero).get("scale_if_loss") is self._wrapped:
            del self.zero.scale_if_loss


def skip_update(optimizer: Any, params: Any = None) -> None:
    """Make the coming update of ``optimizer`` change nothing, and read as skipped.

    Every parameter of the torch optimizer (or those of ``params``) loses its gradient: torch's
    optimizers pass over a parameter without one, so its values, its moments and its step count stay
    as they are. ``step_was_skipped`` then reads True
    on ``optimizer`` (accelerate's wrapper: its ``_is_overflow``; DeepSpeed: ZeRO's ``overflow``, so
    the engine counts a skipped step and does not step its scheduler; any other optimizer: an
    attribute of that name), which ``transformers.Trainer`` and ``LightweightTrainer`` read to leave
    the learning-rate scheduler where it is.
    """
    inner = torch_optimizer(optimizer)
    groups = inner.param_groups if params is None else [{"params": list(params)}]
    for group in groups:
        for parameter in group["params"]:
            parameter.grad = None
    zero = zero_optimizer(optimizer)
    if zero is not None:
        zero.overflow = True
    elif hasattr(type(optimizer), "step_was_skipped") and hasattr(optimizer, "_is_overflow"):
        optimizer._is_overflow = True  # accelerate's AcceleratedOptimizer
    elif optimizer is not None:
        optimizer.step_was_skipped = True


def unskip(optimizer: Any) -> None:
    """Undo the flag `skip_update` set outside DeepSpeed (ZeRO resets its own at its next step)."""
    if optimizer is None or zero_optimizer(optimizer) is not None:
        return
    if hasattr(type(optimizer), "step_was_skipped") and hasattr(optimizer, "_is_overflow"):
        if getattr(optimizer, "scaler", None) is None:  # with a scaler accelerate sets it at each step
            optimizer._is_overflow = False
    elif "step_was_skipped" in vars(optimizer):
        optimizer.step_was_skipped = False
