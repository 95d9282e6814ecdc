"""Read W&B offline runs back, to test what a training really logged.

The reader lives on the library side (`hf_callbacks_plus.loggers.wandb_runfile`, the W&B
logger uses it on resume); this module is the test kit's name for it: the same names
(`read_wandb_run`, `find_wandb_runs`, `WandbRun`, ...).
"""

from __future__ import annotations

from ..loggers import wandb_runfile
from ..loggers.wandb_runfile import *  # noqa: F403  (the test kit's name for the same API)

__all__ = list(wandb_runfile.__all__)
