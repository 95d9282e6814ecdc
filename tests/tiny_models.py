"""Tiny real models, datasets and Trainer factories shared by the tests.

Everything here is real (torch modules, ``transformers.Trainer``); nothing is faked.
Importing this module needs torch and transformers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn


class TinyRegressionModel(nn.Module):
    """``y = a * x + b`` with an MSE loss; returns ``{"loss", "logits"}`` like HF models."""

    def __init__(self, a: float = 0.0, b: float = 0.0) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.tensor(a))
        self.b = nn.Parameter(torch.tensor(b))

    def forward(self, input_x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        y = input_x * self.a + self.b
        if labels is None:
            return {"logits": y}
        return {"loss": nn.functional.mse_loss(y, labels), "logits": y}


class RegressionDataset(torch.utils.data.Dataset):
    """``n`` samples of ``y = 2x + 3 + noise``, seeded."""

    def __init__(self, n: int = 64, seed: int = 42) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, generator=generator)
        self.y = 2.0 * self.x + 3.0 + 0.1 * torch.randn(n, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_x": self.x[index], "labels": self.y[index]}


def regression_metrics(eval_pred: Any) -> dict[str, float]:
    """``compute_metrics`` for the regression model: mean squared and absolute error."""
    predictions, labels = eval_pred
    predictions = torch.as_tensor(predictions)
    labels = torch.as_tensor(labels)
    return {
        "mse": float(((predictions - labels) ** 2).mean()),
        "mae": float((predictions - labels).abs().mean()),
    }


def training_args(output_dir: str | Path, **overrides: Any):
    """``TrainingArguments`` for fast, quiet, CPU-only test runs."""
    from transformers import TrainingArguments

    defaults: dict[str, Any] = {
        "output_dir": str(output_dir),
        "per_device_train_batch_size": 8,
        "per_device_eval_batch_size": 8,
        "learning_rate": 0.1,
        "num_train_epochs": 2,
        "report_to": "none",
        "use_cpu": True,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "seed": 42,
        "save_strategy": "no",
    }
    defaults.update(overrides)
    return TrainingArguments(**defaults)


def make_trainer(output_dir: str | Path, callbacks=(), n_train: int = 64, n_eval: int = 16,
                 trainer_class: Any = None, compute_metrics: Any = regression_metrics,
                 **args_overrides: Any):
    """A real ``transformers.Trainer`` (or ``trainer_class``) on the tiny regression task."""
    from transformers import Trainer

    trainer_class = trainer_class or Trainer
    return trainer_class(
        model=TinyRegressionModel(),
        args=training_args(output_dir, **args_overrides),
        train_dataset=RegressionDataset(n_train, seed=1),
        eval_dataset=RegressionDataset(n_eval, seed=2),
        compute_metrics=compute_metrics,
        callbacks=list(callbacks),
    )
