"""Shared test configuration."""

import os

os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DISABLE_MLFLOW_INTEGRATION", "TRUE")
