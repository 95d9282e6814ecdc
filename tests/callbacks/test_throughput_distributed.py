"""ThroughputMonitor under ``torchrun --nproc_per_node 2`` (CPU, gloo; the suite's one launch,
tests/distributed.py): each window's counts are the sum of both ranks' batches (counted by hand
on each rank from its collator), the same on every rank, from one collective per window;
per-device figures are the total over 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.transformers]
STEPS, ACCUMULATION = 6, 2
COUNTED = ("sequences", "tokens", "non_padding_tokens", "loss_tokens")


def throughput_two_ranks(out: Path) -> None:
    """Train a tiny causal LM on both ranks with the monitor; write each rank's log history, the
    hand counts of its own micro-batches per step, and how often the monitor summed over ranks."""
    import torch.distributed as dist
    from transformers import Trainer

    from hf_callbacks_plus import run_before_integrations
    from hf_callbacks_plus.callbacks import throughput
    from hf_callbacks_plus.callbacks.throughput import ThroughputMonitor
    from tests.callbacks.throughput_helpers import Counts, RecordingCollator, lm_rows, tiny_llama
    from tests.tiny_models import training_args

    rank = dist.get_rank()
    calls = []
    summed = throughput.sum_over_ranks

    def counting_sum(values):
        calls.append(len(values))
        return summed(values)

    throughput.sum_over_ranks = counting_sum
    collator = RecordingCollator()
    args = training_args(out / "run", per_device_train_batch_size=4, per_device_eval_batch_size=4,
                         gradient_accumulation_steps=ACCUMULATION, max_steps=STEPS, logging_steps=2,
                         eval_strategy="steps", eval_steps=3, save_strategy="steps", save_steps=4,
                         learning_rate=0.01, ddp_backend="gloo", remove_unused_columns=False)
    trainer = Trainer(model=tiny_llama(), args=args, train_dataset=lm_rows(32, seed=1),
                      eval_dataset=lm_rows(6, seed=2, split="eval"), data_collator=collator,
                      callbacks=[ThroughputMonitor()])
    run_before_integrations(trainer)
    try:
        trainer.train()
    finally:
        throughput.sum_over_ranks = summed
    per_step = []
    for step in range(STEPS):  # 32 rows, 2 ranks, batches of 4: 4 batches an epoch, 2 steps
        counts = Counts()
        for batch in collator.batches[ACCUMULATION * step:ACCUMULATION * (step + 1)]:
            counts.add(batch, shifts=True)
        per_step.append({name: getattr(counts, name) for name in COUNTED})
    outcome = {"rank": rank, "log_history": trainer.state.log_history, "per_step": per_step, "calls": calls,
               "batches": len(collator.batches)}
    (out / f"outcome-rank{rank}.json").write_text(json.dumps(outcome), encoding="utf-8")


@pytest.mark.distributed(scenario=throughput_two_ranks)
def test_two_ranks_sum_their_counts_once_per_window(distributed_outcome):
    tmp_path = distributed_outcome.dir
    outcomes = [json.loads((tmp_path / f"outcome-rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [o["batches"] for o in outcomes] == [STEPS * ACCUMULATION] * 2

    def records(outcome):
        return [r for r in outcome["log_history"] if "throughput/window_seconds" in r]

    windows = [(r["step"], int(r["throughput/window_steps"])) for r in records(outcomes[0])]
    assert windows == [(2, 1), (4, 2), (6, 2)]  # step 1 is the warm-up
    for outcome in outcomes:
        assert outcome["calls"] == [8, 8, 8]  # one sum over ranks per window, of the 8 counts
    for index, (step, steps) in enumerate(windows):
        expected = {name: sum(o["per_step"][s][name] for o in outcomes for s in range(step - steps, step))
                    for name in COUNTED}
        assert sum(o["per_step"][step - 1]["sequences"] for o in outcomes) == 2 * ACCUMULATION * 4
        for outcome in outcomes:  # the same totals on both ranks; the seconds are each rank's own
            record = records(outcome)[index]
            seconds = record["throughput/window_seconds"]
            for name in COUNTED:
                count = record[f"throughput/{name}_per_second"] * seconds
                assert count == pytest.approx(expected[name], rel=1e-9)
                assert record[f"throughput/device/{name}_per_second"] == pytest.approx(
                    record[f"throughput/{name}_per_second"] / 2, rel=1e-12)
            assert record["throughput/tflops_per_second"] > 0

