"""ThroughputMonitor's windows across runners and schedules, on a simulated clock (issue 32, item 4).

Each run has a slow data loader (every batch takes `LOAD` simulated seconds to build, in the
collator of a real DataLoader), logging, evaluation and saving at various frequencies, by steps
and by epoch, with and without gradient accumulation, in a stock ``Trainer`` (the monitor where
the user put it: after the work it leaves out), a stock ``Trainer`` after
``run_before_integrations``, ``TrainerPlus`` and ``LightweightTrainer`` (the monitor given first:
it moves itself last). The expected window and left-out seconds come from the clock's trace alone
(``throughput_helpers.expected_window``), the counts from the collator's batches: every window
holds its steps' training and data loading, and leaves out exactly the logging, evaluation and
save work. The first tier runs one schedule per runner; ``--tier 2`` the whole matrix.
"""

from __future__ import annotations

import math

import pytest
import torch

from hf_callbacks_plus import LightweightTrainer, LoopArguments, TrainerPlus, run_before_integrations
from hf_callbacks_plus.callbacks import throughput
from hf_callbacks_plus.callbacks.throughput import ThroughputMonitor
from tests.callbacks.throughput_helpers import (
    RecordingCollator,
    SimulatedClock,
    assert_counts,
    assert_window_seconds,
    clock_callback,
    drive_clock,
    lm_rows,
    step_of_batches,
    throughput_records,
    tiny_llama,
    window_counts,
)
from tests.tiny_models import training_args

pytestmark = pytest.mark.transformers

ROWS, EVAL_ROWS, BATCH, EPOCHS = 30, 6, 4, 2

#: Schedules: logging, evaluation and saving (by steps or by epoch), gradient accumulation.
SCHEDULES = {
    "log-every-step": {"logging_steps": 1, "accumulation": 1},
    "log2-eval3-save5-ga2": {"logging_steps": 2, "eval_steps": 3, "save_steps": 5, "accumulation": 2},
    "log3-eval2-save4": {"logging_steps": 3, "eval_steps": 2, "save_steps": 4, "accumulation": 1},
    "log2-by-epoch-ga3": {"logging_steps": 2, "eval_steps": "epoch", "save_steps": "epoch",
                          "accumulation": 3},
    "log1-eval-on-start-warmup0": {"logging_steps": 1, "eval_steps": 4, "accumulation": 2,
                                   "eval_on_start": True, "warmup_steps": 0},
}
RUNNERS = ("Trainer", "Trainer+run_before_integrations", "TrainerPlus", "LightweightTrainer")
FIRST_TIER = {("Trainer", "log2-eval3-save5-ga2"), ("Trainer+run_before_integrations", "log3-eval2-save4"),
              ("TrainerPlus", "log2-by-epoch-ga3"), ("LightweightTrainer", "log1-eval-on-start-warmup0")}


def flow(schedule: dict) -> dict:
    """The trainer arguments of a schedule (transformers' names, which LoopArguments shares)."""
    values = {"logging_steps": schedule["logging_steps"],
              "gradient_accumulation_steps": schedule["accumulation"], "num_train_epochs": EPOCHS,
              "eval_on_start": schedule.get("eval_on_start", False)}
    for what in ("eval", "save"):
        every = schedule.get(f"{what}_steps")
        if every is None:
            values[f"{what}_strategy"] = "no"
        elif every == "epoch":
            values[f"{what}_strategy"] = "epoch"
        else:
            values[f"{what}_strategy"], values[f"{what}_steps"] = "steps", every
    return values


def run_transformers(tmp_path, runner: str, schedule: dict, monitor, clock) -> tuple[list[dict], list[dict]]:
    from transformers import Trainer

    collator = RecordingCollator(clock=clock)
    work = clock_callback(clock)
    # a stock Trainer calls its callbacks where they are: the left-out work before the monitor
    callbacks = [work, monitor] if runner == "Trainer" else [monitor, work]
    trainer = (TrainerPlus if runner == "TrainerPlus" else Trainer)(
        model=tiny_llama(), args=training_args(tmp_path, per_device_train_batch_size=BATCH,
                                               per_device_eval_batch_size=BATCH, learning_rate=0.01,
                                               remove_unused_columns=False, **flow(schedule)),
        train_dataset=lm_rows(ROWS, seed=1), eval_dataset=lm_rows(EVAL_ROWS, seed=2, split="eval"),
        data_collator=collator, callbacks=callbacks)
    if runner == "Trainer+run_before_integrations":
        run_before_integrations(trainer)
    clock.follow(trainer)
    drive_clock(clock, trainer.model)
    trainer.train()
    if runner != "Trainer":
        assert trainer.callback_handler.callbacks[-1] is monitor
    return trainer.state.log_history, collator.batches


def run_lightweight(tmp_path, schedule: dict, monitor, clock) -> tuple[list[dict], list[dict]]:
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    collator = RecordingCollator(clock=clock)
    train = torch.utils.data.DataLoader(lm_rows(ROWS, seed=1), batch_size=BATCH, collate_fn=collator)
    evaluation = torch.utils.data.DataLoader(lm_rows(EVAL_ROWS, seed=2, split="eval"), batch_size=BATCH,
                                             collate_fn=collator)

    def train_step(batch):
        loss = model(**batch).loss
        loss.backward()
        return loss.detach()

    def eval_step(batch):
        with torch.no_grad():
            return model(**batch).loss

    model.train()
    trainer = LightweightTrainer(
        LoopArguments(output_dir=str(tmp_path), disable_tqdm=True, **flow(schedule)),
        train_step=train_step, train_data=train, eval_data=evaluation, eval_step=eval_step, model=model,
        optimizer=optimizer, callbacks=[monitor, clock_callback(clock)])
    clock.follow(trainer)
    drive_clock(clock, model)
    trainer.train()
    assert trainer.callback_handler.callbacks[-1] is monitor
    return trainer.state.log_history, collator.batches


def check(runner: str, name: str, tmp_path, monkeypatch) -> None:
    schedule = SCHEDULES[name]
    clock = SimulatedClock()
    monkeypatch.setattr(throughput, "time", clock)
    warmup = schedule.get("warmup_steps", 1)
    monitor = ThroughputMonitor(warmup_steps=warmup)
    if runner == "LightweightTrainer":
        history, batches = run_lightweight(tmp_path, schedule, monitor, clock)
    else:
        history, batches = run_transformers(tmp_path, runner, schedule, monitor, clock)
    steps = step_of_batches(math.ceil(ROWS / BATCH), schedule["accumulation"], EPOCHS)
    assert len(batches) == len(steps)
    records = throughput_records(history)
    logged = [r["step"] for r in history if "loss" in r]
    assert [r["step"] for r in records] == [s for s in logged if s > warmup]
    kinds = {"training"}
    start = warmup
    for record in records:
        assert record["throughput/window_steps"] == record["step"] - start
        assert_window_seconds(record, clock.trace, start)
        assert_counts(record, window_counts(batches, steps, start, record["step"], shifts=True))
        kinds |= {kind for kind in ("logging", "evaluation", "save") if record[f"throughput/{kind}_seconds"]}
        start = record["step"]
    wanted = {"training", "logging"} | ({"evaluation"} if "eval_steps" in schedule else set()) | (
        {"save"} if "save_steps" in schedule else set())
    assert kinds >= wanted  # each kind of work of the schedule was left out of some window


@pytest.mark.parametrize(("runner", "schedule"), sorted(FIRST_TIER))
def test_windows_count_loading_and_leave_out_the_points(runner, schedule, tmp_path, monkeypatch):
    check(runner, schedule, tmp_path, monkeypatch)


#: Every runner x schedule but those of the first tier.
MATRIX = [(runner, schedule) for runner in RUNNERS for schedule in SCHEDULES
          if (runner, schedule) not in FIRST_TIER]


@pytest.mark.second_tier
@pytest.mark.parametrize(("runner", "schedule"), MATRIX)
def test_windows_matrix(runner, schedule, tmp_path, monkeypatch):
    check(runner, schedule, tmp_path, monkeypatch)
