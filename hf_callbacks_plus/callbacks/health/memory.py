"""Memory per rank: the device's peaks since the last logging step (CUDA's allocator counters) and the
host's resident memory, and a memory snapshot written when CUDA runs out of memory. See
``docs/health.md``."""

from __future__ import annotations

import logging
import os
import resource
from typing import Optional

__all__ = ["OomSnapshot", "device_peaks", "host_resident_bytes"]

logger = logging.getLogger("hf_callbacks_plus")


def host_resident_bytes() -> float:
    """This process's resident memory now (Linux ``/proc/self/statm``), else its peak (``ru_maxrss``)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            return float(int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def device_peaks(reset: bool) -> Optional[tuple[float, float]]:
    """The current CUDA device's peak allocated and reserved bytes since its counters were last reset,
    then reset them when ``reset`` (None without CUDA). Host-side counters: no device sync."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    peaks = (float(torch.cuda.max_memory_allocated()), float(torch.cuda.max_memory_reserved()))
    if reset:
        torch.cuda.reset_peak_memory_stats()
    return peaks


class OomSnapshot:
    """Record CUDA's allocation history from train begin and, when an allocation fails, write the
    snapshot ``torch.cuda.memory._dump_snapshot`` makes (open it at https://pytorch.org/memory_viz).

    Args:
        path: The file to write (one per rank).
        max_entries: Allocation events kept. Defaults to 100,000.
    """

    def __init__(self, path: str, max_entries: int = 100_000) -> None:
        self.path, self.max_entries = path, max_entries
        self.written: Optional[str] = None
        self._recording = False

    def start(self) -> bool:
        """Start recording (CUDA only); attach the out-of-memory observer. False without CUDA."""
        import torch

        if not torch.cuda.is_available():
            return False
        torch.cuda.memory._record_memory_history(max_entries=self.max_entries)
        self._recording = True
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if callable(attach):
            attach(lambda *args: self.dump())
        return True

    def dump(self) -> Optional[str]:
        """Write the snapshot (once); its path, or None when nothing is recorded."""
        if self.written is not None or not self._recording:
            return self.written
        import torch

        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        try:
            torch.cuda.memory._dump_snapshot(self.path)
        except Exception as error:  # noqa: BLE001 - an out-of-memory report must not raise again
            logger.warning("TrainingHealth: could not write the memory snapshot %s: %s", self.path, error)
            return None
        self.written = self.path
        logger.warning("TrainingHealth: CUDA ran out of memory; memory snapshot written to %s (open it at "
                       "https://pytorch.org/memory_viz).", self.path)
        return self.path

    def stop(self) -> None:
        """Stop recording (when this object started it)."""
        if self._recording:
            import torch

            torch.cuda.memory._record_memory_history(enabled=None)
            self._recording = False
