"""EarlyStopping on 2 ranks (CPU, gloo): same decision, same step, no hang."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.transformers]


def every_rank_follows_rank0(out: Path) -> None:
    """EarlyStopping in a stock Trainer; the scripted metric differs between ranks on purpose
    (rank 1 sees no improvement after the first evaluation), as if metrics were not perfectly
    synchronized: with ``sync_decision`` every rank must still follow rank 0."""
    from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
    from tests.callbacks.early_stopping_helpers import RESUME_SCRIPT, scripted_trainer

    rank = int(os.environ["RANK"])

    def script(step: int) -> float:
        return RESUME_SCRIPT(step) if rank == 0 else 10.0 - (step == 2)

    stopper = EarlyStopping("eval_score", mode="min", patience=3)
    trainer = scripted_trainer(str(out / "run"), script, callbacks=[stopper], logging_steps=100,
                               ddp_backend="gloo", per_device_train_batch_size=4)
    trainer.train()
    outcome = {"rank": rank, "global_step": trainer.state.global_step, "stopped_step": stopper.stopped_step,
               "best_step": stopper.best_step, "best_value": stopper.best_value}
    (out / f"outcome-rank{rank}.json").write_text(json.dumps(outcome), encoding="utf-8")


@pytest.mark.distributed(scenario=every_rank_follows_rank0)
def test_every_rank_stops_at_rank0_step(distributed_outcome):
    folder = distributed_outcome.dir
    outcomes = [json.loads((folder / f"outcome-rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [o["rank"] for o in outcomes] == [0, 1]
    # rank 1's own metric would have stopped it at step 8 (and hung rank 0 in the next all-reduce)
    for outcome in outcomes:
        assert (outcome["global_step"], outcome["stopped_step"]) == (16, 16), outcome
        assert (outcome["best_step"], outcome["best_value"]) == (10, 2.5), outcome
    # verbose (the default): one stop line and one summary for the whole job, from rank 0 only
    output = distributed_outcome.outputs()
    assert output.count("EarlyStopping stopped training at step 16") == 1, output[-3000:]
    summary = "EarlyStopping summary: stopped at step 16 (patience); best eval_score=2.5 at step 10."
    assert output.count(summary) == 1
    assert "EarlyStopping stopped training" not in distributed_outcome.output(1)
