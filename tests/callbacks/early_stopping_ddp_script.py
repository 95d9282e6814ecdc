"""Run under ``torchrun --nproc_per_node 2``: EarlyStopping in a stock Trainer on CPU (gloo).

The scripted metric differs between ranks on purpose (rank 1 sees no improvement after the
first evaluation), as if metrics were not perfectly synchronized: with ``sync_decision`` every
rank must still follow rank 0 and stop at the same step, without a hang. Each rank writes its
outcome to ``<output_dir>/outcome-rank<N>.json`` (printing would interleave the ranks' lines).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping  # noqa: E402
from tests.callbacks.early_stopping_helpers import RESUME_SCRIPT, scripted_trainer  # noqa: E402


def main() -> None:
    rank = int(os.environ.get("RANK", "0"))

    def script(step: int) -> float:
        return RESUME_SCRIPT(step) if rank == 0 else 10.0 - (step == 2)

    stopper = EarlyStopping("eval_score", mode="min", patience=3)
    trainer = scripted_trainer(sys.argv[1], script, callbacks=[stopper], logging_steps=100,
                               ddp_backend="gloo", per_device_train_batch_size=4)
    trainer.train()
    outcome = {"rank": rank, "global_step": trainer.state.global_step, "stopped_step": stopper.stopped_step,
               "best_step": stopper.best_step, "best_value": stopper.best_value}
    Path(sys.argv[1], f"outcome-rank{rank}.json").write_text(json.dumps(outcome), encoding="utf-8")
    torch.distributed.destroy_process_group()  # else gloo threads can SIGABRT a rank at exit (pytorch#190489)


if __name__ == "__main__":
    from tests.tiny_models import exit_distributed_script

    main()
    exit_distributed_script()
