"""Deadline on 2 ranks (CPU, gloo), in the session's one torchrun launch: a real signal to one rank,
then to both at different moments; every rank stops at the same step, saves once; the resumed
training ends bit-identical to an uninterrupted one on every rank (weights; ``log_history`` and the
JSONL tracker on rank 0), the per-rank logging window included."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.callbacks.deadline_helpers import ARGS as SCHEDULE
from tests.callbacks.deadline_helpers import DISTRIBUTED

pytestmark = [pytest.mark.transformers]

ARGS = {**SCHEDULE, **DISTRIBUTED}


def one_rank_then_both(out: Path) -> None:
    """Session 1: rank 1 alone gets SIGUSR1 inside step 3. Session 2 (resumed): rank 0 gets SIGTERM during
    the evaluation after step 12, rank 1 SIGTERM inside step 13. Session 3 resumes to the end; a fourth
    run is uninterrupted."""
    from hf_callbacks_plus import Deadline, JsonlLogger, run_before_integrations
    from tests.callbacks.deadline_helpers import SignalAt, comparable, jsonl_points
    from tests.tiny_models import make_trainer

    rank = int(os.environ["RANK"])

    def run(folder: str, gates: list, resume: bool = False):
        deadline = Deadline(margin=0, status_file=out / folder / "status.json")
        trainer = make_trainer(out / folder, callbacks=[deadline, *gates, JsonlLogger()], **ARGS)
        run_before_integrations(trainer, deadline)
        trainer.train(resume_from_checkpoint=True if resume else None)
        return trainer, deadline

    first, d1 = run("run", [SignalAt(3, "step")] if rank == 1 else [])
    second, d2 = run(
        "run",
        [SignalAt(12, "evaluation", signal.SIGTERM)] if rank == 0 else [SignalAt(13, "step", signal.SIGTERM)],
        resume=True,
    )
    third, _ = run("run", [], resume=True)
    reference, _ = run("reference", [])
    weights = {name: p.detach().tolist() for name, p in third.model.named_parameters()}
    same = all(
        p.detach().equal(q.detach()) for p, q in zip(third.model.parameters(), reference.model.parameters())
    )
    outcome = {
        "stops": [first.state.global_step, second.state.global_step],
        "labels": [d1.ending.label, d2.ending.label],
        "codes": [d1.exit_code, d2.exit_code],
        "same_weights": same,
        "weights": weights,
        "received": [d1._flag.all_received, d2._flag.all_received],
    }
    if rank == 0:
        outcome["history"] = comparable(third.state.log_history) == comparable(reference.state.log_history)
        outcome["jsonl"] = jsonl_points(out / "run" / "metrics.jsonl") == jsonl_points(
            out / "reference" / "metrics.jsonl"
        )
        outcome["checkpoints"] = sorted(p.name for p in (out / "run").glob("checkpoint-*"))
        outcome["files"] = sorted(p.name for p in (out / "run" / "checkpoint-3").iterdir())
    (out / f"outcome-rank{rank}.json").write_text(json.dumps(outcome), encoding="utf-8")


@pytest.mark.distributed(scenario=one_rank_then_both)
def test_every_rank_stops_together_and_the_resume_ends_bit_identical(distributed_outcome):
    folder = distributed_outcome.dir
    outcomes = [json.loads((folder / f"outcome-rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank, outcome in enumerate(outcomes):
        assert outcome["stops"] == [3, 13], outcome["stops"]  # the rank without the signal stopped too
        assert outcome["labels"] == ["SIGUSR1", "SIGTERM"] and outcome["codes"] == [75, 75]
        assert outcome["same_weights"], (
            f"rank {rank}: the resumed weights differ from the uninterrupted run's"
        )
    assert outcomes[0]["received"] == [[], ["SIGTERM"]] and outcomes[1]["received"] == [
        ["SIGUSR1"],
        ["SIGTERM"],
    ]
    assert outcomes[0]["weights"] == outcomes[1]["weights"]  # DDP: one model
    rank0 = outcomes[0]
    assert rank0["history"] and rank0["jsonl"]
    assert rank0["checkpoints"] == ["checkpoint-13", "checkpoint-16", "checkpoint-3", "checkpoint-8"]
    assert {"rng_state_0.pth", "rng_state_1.pth", "trainer_state.json", "optimizer.pt"} <= set(rank0["files"])
    output = distributed_outcome.outputs()
    assert output.count("Deadline: SIGUSR1 received by another rank; stopping after step 3") == 1
    assert output.count("Deadline: SIGTERM received") == 1 and "stopping after step 13" in output
