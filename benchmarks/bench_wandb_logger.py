"""The W&B rows of ``bench_loggers.py`` only: ``WandbLogger`` vs transformers' ``WandbCallback``.

A thin wrapper (``bench_loggers.py --no-mlflow``); the measurement lives in
``bench_loggers.bench_wandb``, and ``bench_loggers.py`` prints all rows from one run.

Run:
    .venv/bin/python benchmarks/bench_wandb_logger.py [--calls 300]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_loggers import main  # noqa: E402

if __name__ == "__main__":
    sys.argv.insert(1, "--no-mlflow")
    main()
