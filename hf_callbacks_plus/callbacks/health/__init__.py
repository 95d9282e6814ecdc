"""Training health: `SpikeGuard` (loss and gradient-norm spikes caught and acted on) and
`TrainingHealth` (per-layer gradient, parameter and update norms, and memory), under every engine.

The parts: ``rule.py`` (the spike rule, on the device), ``hooks.py`` (where a step's loss,
gradients and update are seen, per runner and engine), ``guard.py`` (`SpikeGuard`), ``norms.py``
(per-layer norms from each rank's share), ``memory.py`` (device and host memory, the OOM snapshot),
``monitor.py`` (`TrainingHealth`). See ``docs/health.md``.
"""

from .guard import SpikeGuard
from .monitor import TrainingHealth

__all__ = ["SpikeGuard", "TrainingHealth"]
