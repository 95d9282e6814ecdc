"""The demo's training under a distributed launcher (CPU, gloo): same code, more processes.

    torchrun --nproc_per_node 2 examples/distributed.py
    torchrun --nproc_per_node 2 examples/distributed.py --n-train 96 --eval-steps 3   # quick

What happens on 2 ranks (see docs/distributed.md):

* one tracker run: ``MLflowLogger``, ``WandbLogger`` and ``JsonlLogger`` log from rank 0 only;
* ``EarlyStopping`` broadcasts rank 0's decision, so both ranks stop at the same step;
* ``TrainSubsetEvaluation`` evaluates through the trainer's eval dataloader, which shards
  the subset across ranks: each sample is evaluated by one rank, the metrics are gathered.

Each rank also writes ``<runs-dir>/<name>/rank<R>.json`` (its stop step and the subset
rows it evaluated) so the distributed test can check all of that. Everything else is
``examples/demo.py``: the same options are accepted.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo import parse_args, run  # noqa: E402


class SubsetRowRecorder:
    """Records the ``input_ids`` rows this rank runs through the model during subset evaluation."""

    def __init__(self, train_subset: Any) -> None:
        self.train_subset = train_subset
        self.rows: list[list[int]] = []

    def __call__(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if getattr(self.train_subset, "_running", False) and "input_ids" in kwargs:
            ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
            for row, row_mask in zip(ids.tolist(), (mask.tolist() if mask is not None else ids.tolist())):
                self.rows.append([token for token, keep in zip(row, row_mask) if keep])


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    """Entry point of ``torchrun ... examples/distributed.py``; returns this rank's report."""
    options = parse_args(argv, default_name="distributed")  # never runs/demo: that is `make demo`'s
    rank = int(os.environ.get("RANK", "0"))
    recorders: dict[str, Any] = {}

    def prepare(trainer: Any, callbacks: dict[str, Any]) -> None:
        recorder = SubsetRowRecorder(callbacks["train_subset"])
        trainer.model.register_forward_pre_hook(recorder, with_kwargs=True)
        recorders["rows"] = recorder
        recorders["callbacks"] = callbacks

    result = run(options, prepare=prepare)
    callbacks = recorders["callbacks"]
    subset = callbacks["train_subset"].subset()
    evaluations = sum(1 for record in result.get("log_history", []) if "train_subset_accuracy" in record)
    report = {
        **{key: value for key, value in result.items() if key != "log_history"},
        "rank": rank, "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "subset_rows": [list(row) for row in subset["input_ids"]],
        "evaluated_rows": recorders["rows"].rows, "subset_evaluations": evaluations,
    }
    path = Path(result["output_dir"]) / f"rank{rank}.json"
    path.write_text(json.dumps(report))
    return report


def end_process_group() -> None:
    """Destroy the process group before the interpreter exits.

    transformers never does; without it gloo's worker threads can outlive the interpreter and
    a rank dies with SIGABRT ("terminate called without an active exception") after training
    succeeded (pytorch/pytorch#190489).
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    end_process_group()
