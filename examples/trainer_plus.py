"""``TrainerPlus`` as a base class, and ``TrainerPlusMixin`` on a Trainer subclass you already have.

    python examples/trainer_plus.py [output_dir]

``TrainerPlus`` fires our extra events (``on_pre_log`` before the report_to integrations,
``on_training_loss`` with the raw loss, ``on_exception``) and hands the trainer to callbacks
that need it, so ``TrainSubsetEvaluation`` goes straight into ``callbacks=[...]``.

Two ways shown here:

1. ``LabelSmoothingTrainer(TrainerPlus)``: subclass ``TrainerPlus`` instead of ``Trainer``;
2. ``WeightedLossTrainer`` is an existing ``transformers.Trainer`` subclass (think trl's
   ``SFTTrainer``): ``class WeightedLossTrainerPlus(TrainerPlusMixin, WeightedLossTrainer)``,
   mixin first.

Both run a custom callback whose ``on_pre_log`` adds ``eval_error_rate`` to each evaluation
record before any logger sees it: ``JsonlLogger`` writes it as ``eval/error_rate``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from demo_pipeline import (  # noqa: E402
    build_datasets,
    build_model,
    build_tokenizer,
    compute_metrics,
    data_collator,
    example_sizes,
    output_dir_argument,
    training_arguments,
)
from transformers import Trainer  # noqa: E402

from hf_callbacks_plus import (  # noqa: E402
    EarlyStopping,
    JsonlLogger,
    TrainerCallback,
    TrainerPlus,
    TrainerPlusMixin,
    TrainSubsetEvaluation,
)


class LabelSmoothingTrainer(TrainerPlus):
    """Way 1: a ``TrainerPlus`` subclass overriding ``compute_loss``."""

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, **kwargs: Any):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        loss = torch.nn.functional.cross_entropy(outputs.logits, labels, label_smoothing=0.1)
        return (loss, outputs) if return_outputs else loss


class WeightedLossTrainer(Trainer):
    """An existing ``transformers.Trainer`` subclass (class-weighted loss)."""

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, **kwargs: Any):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        weight = torch.tensor([1.0, 1.5], device=outputs.logits.device)
        loss = torch.nn.functional.cross_entropy(outputs.logits, labels, weight=weight)
        return (loss, outputs) if return_outputs else loss


class WeightedLossTrainerPlus(TrainerPlusMixin, WeightedLossTrainer):
    """Way 2: the mixin first, the existing subclass second. Nothing else to write."""


class ErrorRate(TrainerCallback):
    """Adds ``eval_error_rate`` to evaluation records before the loggers see them."""

    def on_pre_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if logs is not None and "eval_accuracy" in logs:
            logs["eval_error_rate"] = 1.0 - logs["eval_accuracy"]


def train(trainer_class: type, output_dir: Path) -> list[dict[str, Any]]:
    sizes = example_sizes()
    tokenizer = build_tokenizer()
    train_data, eval_data = build_datasets(tokenizer, n_train=sizes["n_train"], n_eval=sizes["n_eval"])
    trainer = trainer_class(
        model=build_model(tokenizer, hidden_size=sizes["hidden_size"]),
        args=training_arguments(str(output_dir)),
        train_dataset=train_data, eval_dataset=eval_data, data_collator=data_collator(tokenizer),
        compute_metrics=compute_metrics,
        callbacks=[TrainSubsetEvaluation(size=sizes["subset"]), ErrorRate(),
                   EarlyStopping("eval_loss", patience=3), JsonlLogger(str(output_dir / "metrics.jsonl"))],
    )
    trainer.train()
    lines = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if line["event"] == "log" and "eval/loss" in line["curves"]]


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: ``argv`` is ``[output_dir]`` (a new temporary folder when empty)."""
    output_dir = output_dir_argument(argv, "trainer-plus-", __doc__.split("\n")[0])
    for trainer_class in (LabelSmoothingTrainer, WeightedLossTrainerPlus):
        records = train(trainer_class, Path(output_dir) / trainer_class.__name__)
        last = records[-1]["curves"]
        print(f"{trainer_class.__name__}: {len(records)} evaluations logged; last at step "
              f"{records[-1]['step']}: eval/error_rate {last['eval/error_rate']:.3f}, "
              f"train_subset/accuracy {last['train_subset/accuracy']:.3f}, "
              f"eval/accuracy {last['eval/accuracy']:.3f}")


if __name__ == "__main__":
    main()
