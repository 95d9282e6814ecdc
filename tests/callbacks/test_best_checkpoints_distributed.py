"""KeepBestCheckpoints on 2 ranks (CPU, gloo), across a crash and a resume: every rank holds rank
0's ranking, and only the main process writes."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.transformers]

#: Rank 0's eval_score by step; rank 1 sees the opposite order (as if metrics were not synchronized).
SCORE = {2: 5.0, 4: 3.0, 6: 4.0, 8: 2.0, 10: 6.0, 12: 1.0}
EXPECTED = [12, 8]


def keeps_rank0s_ranking(out: Path) -> None:
    from transformers import TrainerCallback

    from hf_callbacks_plus.callbacks.best_checkpoints import KeepBestCheckpoints
    from tests.callbacks.best_checkpoints_helpers import scripted_run

    rank = int(os.environ["RANK"])
    handler = logging.StreamHandler(sys.stderr)
    logging.getLogger("hf_callbacks_plus").addHandler(handler)
    logging.getLogger("hf_callbacks_plus").setLevel(logging.DEBUG)  # "kept checkpoint-N" lines
    score = SCORE if rank == 0 else {step: -value for step, value in SCORE.items()}

    class FaultInjectingCrash(TrainerCallback):
        """Injects a crash on both ranks at the end of step 7."""

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 7:
                raise RuntimeError("injected crash")

    args = {"score": score, "max_steps": 12, "save_total_limit": 1, "ddp_backend": "gloo",
            "per_device_train_batch_size": 4}
    try:
        first = scripted_run(str(out / "run"), [KeepBestCheckpoints("eval_score", k=2, mode="min")], **args)
        first.add_callback(FaultInjectingCrash())
        try:
            first.train()
        except RuntimeError as error:
            assert "injected crash" in str(error)
        keeper = KeepBestCheckpoints("eval_score", k=2, mode="min")
        trainer = scripted_run(str(out / "run"), [keeper], **args)
        trainer.train(resume_from_checkpoint=True)
    finally:
        logging.getLogger("hf_callbacks_plus").removeHandler(handler)
        logging.getLogger("hf_callbacks_plus").setLevel(logging.NOTSET)
    outcome = {"rank": rank, "global_step": trainer.state.global_step,
               "ranking": [entry.step for entry in keeper.ranking["eval_score"]],
               "values": [entry.values["eval_score"] for entry in keeper.ranking["eval_score"]]}
    (out / f"outcome-rank{rank}.json").write_text(json.dumps(outcome), encoding="utf-8")


@pytest.mark.distributed(scenario=keeps_rank0s_ranking)
def test_every_rank_holds_rank0s_ranking_and_only_the_main_process_writes(distributed_outcome):
    from tests.callbacks.best_checkpoints_helpers import kept_steps, manifest

    folder = distributed_outcome.dir
    outcomes = [json.loads((folder / f"outcome-rank{rank}.json").read_text()) for rank in (0, 1)]
    for outcome in outcomes:  # rank 1's own values would keep steps 10 and 2
        assert (outcome["global_step"], outcome["ranking"], outcome["values"]) == (12, EXPECTED, [1.0, 2.0])
    assert kept_steps(folder / "run") == sorted(EXPECTED)
    assert manifest(folder / "run")["ranking"] == {"eval_score": EXPECTED}
    assert "KeepBestCheckpoints: kept checkpoint-12" in distributed_outcome.output(0)
    assert "KeepBestCheckpoints: kept checkpoint-" not in distributed_outcome.output(1)
