"""Read W&B offline runs back, to test what a training really logged.

The reader lives on the library side (`hf_callbacks_plus.loggers.wandb_runfile`, the W&B
logger uses it on resume); this module is the test kit's name for it.
"""

from __future__ import annotations

from ..loggers.wandb_runfile import (
    BLOCK_LEN,
    WandbLogFormatError,
    WandbRun,
    find_wandb_runs,
    iter_wandb_records,
    read_wandb_run,
    split_records,
)

__all__ = [
    "BLOCK_LEN",
    "WandbLogFormatError",
    "WandbRun",
    "find_wandb_runs",
    "iter_wandb_records",
    "read_wandb_run",
    "split_records",
]
