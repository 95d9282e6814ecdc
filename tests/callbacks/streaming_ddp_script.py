"""Run under ``torchrun --nproc_per_node 2``: StreamingMetrics in a stock Trainer on CPU (gloo).

Each rank records the logits and labels of its own training forward passes and writes them, its
log history and the final model to ``<output_dir>`` (``outcome-rank<N>.json``); the test
compares them with the reference metrics computed in one process.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from transformers import Trainer  # noqa: E402

from hf_callbacks_plus import run_before_integrations  # noqa: E402
from hf_callbacks_plus.callbacks.streaming_metrics import StreamingMetrics  # noqa: E402
from tests.tiny_models import TinyClassifier, classification_rows, exit_distributed_script, training_args  # noqa: E402


def main() -> None:
    output_dir = Path(sys.argv[1])
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
        callbacks=[StreamingMetrics(task="classification", num_classes=3, save_predictions=True)],
    )
    run_before_integrations(trainer)
    trainer.train()
    if rank == 0:
        torch.save(model.state_dict(), output_dir / "final.pt")
    outcome = {"rank": rank, "log_history": trainer.state.log_history, "recorded": recorded}
    (output_dir / f"outcome-rank{rank}.json").write_text(json.dumps(outcome), encoding="utf-8")
    torch.distributed.destroy_process_group()  # else gloo threads can SIGABRT a rank at exit (pytorch#190489)


if __name__ == "__main__":
    main()
    exit_distributed_script()
