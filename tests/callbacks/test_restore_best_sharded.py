"""restore_best refuses a model whose parameters are sharded across processes (FSDP2 DTensor
shards on 2 CPU ranks) with a clear error at train begin, instead of copying one rank's shard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed.fsdp")


def sharded_model_with_restore_best(out: Path) -> None:
    """A model sharded with torch FSDP2 ``fully_shard`` (DTensor shards, half on each rank) trained
    by LightweightTrainer with EarlyStopping(restore_best=True); each rank reports what it got."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
    from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments

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

    args = LoopArguments(output_dir=str(out / "run"), max_steps=4, eval_strategy="steps", eval_steps=2,
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
    (out / f"rank{rank}.json").write_text(json.dumps(report), encoding="utf-8")


@pytest.mark.distributed(scenario=sharded_model_with_restore_best)
def test_sharded_model_is_refused_on_every_rank(distributed_outcome):
    reports = [json.loads((distributed_outcome.dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for report in reports:
        assert report["local_numel"] < report["total_numel"]  # really sharded: each rank holds a part
        assert report["global_step"] == 0  # refused before any step
        assert "restore_best=True" in report["error"] and "DTensors" in report["error"]
        assert "load_best_model_at_end" in report["error"]
