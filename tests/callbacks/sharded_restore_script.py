"""Run by test_restore_best_sharded.py under torchrun (2 CPU ranks, gloo): a model whose
parameters are sharded with torch FSDP2 ``fully_shard`` (DTensor shards, half on each rank)
trained by LightweightTrainer with EarlyStopping(restore_best=True)."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.getcwd())

from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping  # noqa: E402
from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments  # noqa: E402


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    fully_shard(model)
    local = sum(p.to_local().numel() for p in model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [{"x": torch.randn(4, 8), "y": torch.randn(4, 1)} for _ in range(4)]

    def train_step(batch):
        loss = torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])
        loss.backward()
        return float(loss.detach())

    args = LoopArguments(output_dir=sys.argv[1], max_steps=4, eval_strategy="steps", eval_steps=2,
                         logging_steps=2)
    trainer = LightweightTrainer(args, train_step=train_step, train_data=data, model=model,
                                 optimizer=optimizer, eval_fn=lambda _: {"loss": 1.0},
                                 callbacks=[EarlyStopping("eval_loss", patience=2, restore_best=True)])
    report = {"rank": rank, "local_numel": local, "total_numel": 8 * 8 + 8 + 8 + 1}
    try:
        trainer.train()
        report["error"] = None
    except RuntimeError as error:
        report["error"] = str(error)
    report["global_step"] = trainer.state.global_step
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(report, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    from tests.tiny_models import exit_distributed_script

    main()
    exit_distributed_script()
