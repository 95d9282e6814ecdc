"""Run under ``torchrun --nproc_per_node 2``: StreamingMetrics in a stock Trainer on CPU (gloo).

Two scenarios in one launch, each training and evaluating a TinyClassifier (40 train rows, 30
eval rows: uneven shards, the last gathered eval batch holds 6 rows, not 8):

* ``standard``: the default metrics (sum states: a confusion matrix), with a predictions file;
  in ``<output_dir>``;
* ``list_states``: the docs' ``MulticlassAUROC`` (list states) and `ScoreRange` (max and min
  states), in ``<output_dir>/list_states``.

Each rank records the logits and labels of its own training forward passes and writes them and
its log history (``outcome-rank<N>.json``) and rank 0 the final model (``final.pt``); the test
compares them with the reference metrics computed in one process.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from torchmetrics import Metric  # noqa: E402
from torchmetrics.classification import MulticlassAUROC  # noqa: E402
from transformers import Trainer  # noqa: E402

from hf_callbacks_plus import run_before_integrations  # noqa: E402
from hf_callbacks_plus.callbacks.streaming_metrics import StreamingMetrics  # noqa: E402
from tests.tiny_models import TinyClassifier, classification_rows, exit_distributed_script, training_args  # noqa: E402


class ScoreRange(Metric):
    """The largest and the smallest score seen: states reduced across ranks by max and by min."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("high", default=torch.tensor(float("-inf")), dist_reduce_fx="max")
        self.add_state("low", default=torch.tensor(float("inf")), dist_reduce_fx="min")

    def update(self, scores: torch.Tensor, target: torch.Tensor) -> None:
        self.high = torch.maximum(self.high, scores.max())
        self.low = torch.minimum(self.low, scores.min())

    def compute(self) -> dict[str, torch.Tensor]:
        return {"max_score": self.high, "min_score": self.low}


def run(output_dir: Path, streaming: StreamingMetrics) -> None:
    output_dir.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", "0"))
    model = TinyClassifier()
    recorded = []

    def record(module, args, kwargs, output):
        if module.training:
            recorded.append((output["logits"].detach().tolist(), kwargs["labels"].tolist()))

    model.register_forward_hook(record, with_kwargs=True)
    args = training_args(
        output_dir,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        max_steps=5,
        logging_steps=2,
        eval_strategy="steps",
        eval_steps=5,
        learning_rate=0.05,
        ddp_backend="gloo",
        gradient_accumulation_steps=1,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=classification_rows(40, seed=1),
        eval_dataset=classification_rows(30, seed=2),
        callbacks=[streaming],
    )
    run_before_integrations(trainer)
    trainer.train()
    if rank == 0:
        torch.save(model.state_dict(), output_dir / "final.pt")
    outcome = {"rank": rank, "log_history": trainer.state.log_history, "recorded": recorded}
    (output_dir / f"outcome-rank{rank}.json").write_text(json.dumps(outcome), encoding="utf-8")


def main() -> None:
    output_dir = Path(sys.argv[1])
    run(output_dir, StreamingMetrics(task="classification", num_classes=3, save_predictions=True))
    metrics = {"auroc": MulticlassAUROC(num_classes=3), "range": ScoreRange()}
    run(output_dir / "list_states", StreamingMetrics(metrics, task="classification"))
    torch.distributed.destroy_process_group()  # else gloo threads can SIGABRT a rank at exit (pytorch#190489)


if __name__ == "__main__":
    main()
    exit_distributed_script()
