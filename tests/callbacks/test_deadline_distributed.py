"""Deadline on 2 ranks (CPU, gloo), in the session's one torchrun launch: a real signal to one rank,
then to both at different moments; every rank stops at the same step, saves once; the resumed
training ends bit-identical to an uninterrupted one on every rank (weights; ``log_history`` and the
JSONL tracker on rank 0), the per-rank logging window included. A stock Trainer (``callbacks=`` only)
whose saves take 1.6 s (a sleep injected into rank 0's model save) with the deadline within one save
after the first: the stop keeps that first checkpoint, complete before the deadline on both ranks
(issue 40). A signal that reaches rank 0 while it waits in the agreement counts as its own (issue 41)."""

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


# -- a deadline within one save after the first save (issue 40) ---------------------------------------

#: The injected save time and the margin that covers it (the user's report: 1.6 s saves, margin 2 s).
SAVE_SECONDS, MARGIN = 1.6, 2.0
#: The deadline, from train begin: step 5 ends 0.05-0.5 s in, its save (the first) 1.6 s later, so the
#: deadline falls within one save after that first save (the report's case). Before the fix the rule went
#: on at step 5 (an unmeasured save counted as 0), stopped at step 6 and saved after the deadline.
DEADLINE_IN = 2.7


def slow_model_save(trainer, seconds: float) -> None:
    """Fault injection: rank 0's model save of every checkpoint takes ``seconds`` more (a sleep), as a
    large model's would; the other ranks wait for it at their next collective."""
    import time

    original = trainer.save_model

    def save_model(output_dir=None, _internal_call=False):
        original(output_dir, _internal_call=_internal_call)
        if _internal_call and os.environ["RANK"] == "0":
            time.sleep(seconds)

    trainer.save_model = save_model


def first_save_then_deadline(out: Path) -> None:
    """A stock Trainer (``callbacks=`` only), saves every 5 steps that take 1.6 s on rank 0, the deadline
    within one save after the first save's end, ``margin=2.0``: where each rank's stop checkpoint was
    complete against the deadline."""
    import time

    import torch.distributed as dist

    from hf_callbacks_plus import Deadline
    from hf_callbacks_plus.core.callback import TrainerCallback
    from tests.tiny_models import make_trainer

    class SaveTimes(TrainerCallback):
        def __init__(self) -> None:
            self.times: dict[int, float] = {}

        def on_save(self, args, state, control, **kwargs):
            self.times[state.global_step] = time.time()

    class DeadlineFromTrainBegin(TrainerCallback):
        """Sets ``deadline.at`` (before Deadline reads it) to one instant for both ranks."""

        def on_train_begin(self, args, state, control, **kwargs):
            at = [time.time() + DEADLINE_IN]
            dist.broadcast_object_list(at, src=0)
            deadline.at = at[0]

    deadline, saves = Deadline(at=time.time(), margin=MARGIN, signals=()), SaveTimes()
    trainer = make_trainer(
        out / "run", callbacks=[DeadlineFromTrainBegin(), deadline, saves], **{**ARGS, "save_steps": 5}
    )  # SaveTimes after Deadline: the checkpoint's end
    slow_model_save(trainer, SAVE_SECONDS)
    trainer.train()
    at = deadline.at
    rank = int(os.environ["RANK"])
    outcome = {
        "at": at,
        "saves": saves.times,
        "stopped": deadline.stopped_step,
        "label": deadline.ending.label,
        "code": deadline.exit_code,
        "checkpoint": deadline.ending.checkpoint,
        "global_step": trainer.state.global_step,
    }
    (out / f"outcome-rank{rank}.json").write_text(json.dumps(outcome), encoding="utf-8")


@pytest.mark.distributed(scenario=first_save_then_deadline)
def test_a_margin_of_one_save_lands_the_checkpoint_before_the_deadline_after_the_first_save(
    distributed_outcome,
):
    folder = distributed_outcome.dir
    outcomes = [json.loads((folder / f"outcome-rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank, outcome in enumerate(outcomes):
        stopped = outcome["stopped"]
        assert (outcome["label"], outcome["code"]) == ("deadline", 75), outcome
        assert outcome["checkpoint"] == str(folder / "run" / f"checkpoint-{stopped}"), outcome
        late = outcome["saves"][str(stopped)] - outcome["at"]
        assert late <= 0, f"rank {rank}: checkpoint-{stopped} complete {late:.2f} s after the deadline"
    assert outcomes[0]["stopped"] == outcomes[1]["stopped"] == 5  # the first save is the stop's: no second
    output = distributed_outcome.output(0)
    assert "came sooner than one save" not in output and "stopping after step 5" in output, output[-2000:]


# -- every rank gets the signal, rank 0 while it waits in the agreement (issue 41) ---------------------


def signal_during_the_agreement(out: Path) -> None:
    """Rank 1 waits 0.5 s at the end of step 3 (rank 0 is then inside the check's ``all_reduce``,
    waiting for it), sends SIGUSR1 to rank 0 and to itself, then joins the check. Python runs rank 0's
    handler only when the collective returns: after it read its flag."""
    import signal
    import time

    import torch.distributed as dist

    from hf_callbacks_plus import Deadline
    from hf_callbacks_plus.core.callback import TrainerCallback
    from tests.tiny_models import make_trainer

    pids = [None, None]
    dist.all_gather_object(pids, os.getpid())
    rank = int(os.environ["RANK"])

    class SignalBothWhileRank0Waits(TrainerCallback):
        """Fault injection: the signal lands on rank 0 while it waits in Deadline's agreement."""

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3 and rank == 1:
                time.sleep(0.5)
                os.kill(pids[0], signal.SIGUSR1)
                os.kill(pids[1], signal.SIGUSR1)

    deadline = Deadline(margin=0, status_file=out / "status.json")
    trainer = make_trainer(out / "run", callbacks=[SignalBothWhileRank0Waits(), deadline], **ARGS)
    trainer.train()
    outcome = {
        "stop": trainer.state.global_step,
        "received": deadline._flag.all_received,
        "signal_to_checkpoint": deadline.signal_to_checkpoint,
    }
    (out / f"outcome-rank{rank}.json").write_text(json.dumps(outcome), encoding="utf-8")


@pytest.mark.distributed(scenario=signal_during_the_agreement)
def test_a_signal_that_came_during_the_agreement_is_this_ranks(distributed_outcome):
    folder = distributed_outcome.dir
    for rank in (0, 1):
        outcome = json.loads((folder / f"outcome-rank{rank}.json").read_text())
        assert outcome["stop"] == 3 and outcome["received"] == ["SIGUSR1"], outcome
        assert outcome["signal_to_checkpoint"] is not None and outcome["signal_to_checkpoint"] >= 0, outcome
    output = distributed_outcome.output(0)
    assert "Deadline: SIGUSR1 received" in output and "by another rank" not in output, output[-2000:]
    status = json.loads((folder / "status.json").read_text())
    assert status["extra"]["signal_to_checkpoint_seconds"] >= 0 and status["exit_code"] == 75, status
