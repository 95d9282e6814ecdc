"""Tiny real models, datasets and Trainer factories shared by the tests.

Everything here is real (torch modules, ``transformers.Trainer``); nothing is faked.
Importing this module needs torch and transformers.
"""

from __future__ import annotations

import contextlib
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


class TinyClassifier(nn.Module):
    """A linear classifier over 4 features; ``{"loss", "logits"}`` like HF models."""

    def __init__(self, num_classes: int = 3, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.linear = nn.Linear(4, num_classes)

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        logits = self.linear(features)
        if labels is None:
            return {"logits": logits}
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def classification_rows(n: int, seed: int = 0, num_classes: int = 3) -> list[dict[str, torch.Tensor]]:
    """``n`` rows ``{"features", "labels"}`` whose label depends on the features (learnable)."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(n, 4, generator=generator)
    labels = ((features[:, 0] > 0).long() + (features[:, 1] > 0.5).long()).clamp(max=num_classes - 1)
    return [{"features": features[i], "labels": labels[i]} for i in range(n)]


class TinyTagger(nn.Module):
    """Token classification: embedding + linear; labels ``-100`` are ignored by the loss."""

    def __init__(self, vocab_size: int = 20, num_classes: int = 4, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embedding = nn.Embedding(vocab_size, 8)
        self.linear = nn.Linear(8, num_classes)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        logits = self.linear(self.embedding(input_ids))
        if labels is None:
            return {"logits": logits}
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                           ignore_index=-100)
        return {"loss": loss, "logits": logits}


def tagging_rows(n: int, seed: int = 0, length: int = 6, vocab_size: int = 20,
                 num_classes: int = 4) -> list[dict[str, torch.Tensor]]:
    """``n`` rows of ``length`` tokens; tag = token % classes; the last positions of some rows
    are padding (label -100)."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        ids = torch.randint(0, vocab_size, (length,), generator=generator)
        labels = ids % num_classes
        pad = int(torch.randint(0, 3, (1,), generator=generator))
        if pad:
            labels[-pad:] = -100
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def tiny_causal_lm(vocab_size: int = 48, seed: int = 0) -> Any:
    """A seeded 1-layer Llama (hidden 16) built from a config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                         pad_token_id=0)
    return LlamaForCausalLM(config)


def lm_rows(n: int, seed: int = 0, length: int = 10, vocab_size: int = 48) -> list[dict[str, torch.Tensor]]:
    """``n`` rows of random tokens; labels = input ids with a prompt of 2 and some padding as -100."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        ids = torch.randint(1, vocab_size, (length,), generator=generator)
        labels = ids.clone()
        labels[:2] = -100
        pad = int(torch.randint(0, 3, (1,), generator=generator))
        if pad:
            labels[-pad:] = -100
        mask = torch.ones(length, dtype=torch.long)
        rows.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return rows


@contextlib.contextmanager
def one_torch_thread():
    """Run tiny models on one intra-op thread: on a loaded machine, several threads contend for
    the cores and a forward pass of a 16-wide model takes 10x longer."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
