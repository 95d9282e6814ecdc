"""ThroughputMonitor in a real transformers.Trainer / TrainerPlus on tiny models.

The counts are checked exactly against the batches the collator built (counted by hand in
``throughput_helpers.Counts``) and against transformers' own ``num_input_tokens_seen``; the
window times (data loading in, evaluation, saving, logging and warm-up out) and the MFU formula
are checked exactly on a simulated clock (the one thing faked; see throughput_helpers); the
matrix of trainers and schedules is in test_throughput_windows.py, the wall-clock ground truth
in test_throughput_wall_clock.py.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

from hf_callbacks_plus import TrainerPlus, run_before_integrations
from hf_callbacks_plus.callbacks import throughput
from hf_callbacks_plus.callbacks.throughput import ThroughputMonitor
from hf_callbacks_plus.callbacks.throughput.flops import measure_training_flops, training_flops
from tests.callbacks.throughput_helpers import (
    EVAL_FORWARD,
    LOAD,
    TRAIN_FORWARD,
    RecordingCollator,
    SimulatedClock,
    assert_counts,
    assert_window_seconds,
    classifier_rows,
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

PEAK = 3e9  # FLOP/s of "one device", for the MFU


def build(tmp_path, *, kind="lm", mask=True, accumulation=1, rows=35, epochs=2, callbacks=(),
          trainer_class=None, model=None, compute_metrics=None, clock=None, **overrides):
    from transformers import Trainer

    collator = RecordingCollator(mask=mask, clock=clock)
    make_rows = lm_rows if kind == "lm" else classifier_rows
    values = {"per_device_train_batch_size": 4, "per_device_eval_batch_size": 4,
              "gradient_accumulation_steps": accumulation, "num_train_epochs": epochs, "logging_steps": 2,
              "learning_rate": 0.01, "remove_unused_columns": False}
    values.update(overrides)
    trainer = (trainer_class or Trainer)(
        model=model if model is not None else tiny_llama(kind),
        args=training_args(tmp_path, **values),
        train_dataset=make_rows(rows, seed=1),
        eval_dataset=make_rows(6, seed=2, split="eval"),
        data_collator=collator,
        callbacks=list(callbacks),
        compute_metrics=compute_metrics,
    )
    if clock is not None:
        clock.follow(trainer)
    return trainer, collator


CASES = {
    # causal LM, padded batches of random lengths, 9 batches an epoch (the last of 3 rows) in steps
    # of 2 micro-batches (the last step of an epoch has 1), evaluation and saving on steps that
    # log and on steps that do not
    "lm-padded-accumulation": {"kind": "lm", "mask": True, "accumulation": 2},
    # causal LM, no attention mask, no padding
    "lm-unpadded": {"kind": "lm", "mask": False, "accumulation": 1},
    # a sequence classifier (one label per row), padded, steps of 3 micro-batches
    "classifier-padded": {"kind": "classifier", "mask": True, "accumulation": 3},
}


@pytest.mark.parametrize("case", list(CASES))
def test_counts_seconds_and_mfu_by_hand(case, tmp_path, monkeypatch):
    """Every batch takes LOAD seconds to build (a slow data loader): the windows count it, and
    leave out only the logging, evaluation and save work."""
    setup = CASES[case]
    clock = SimulatedClock()
    monkeypatch.setattr(throughput, "time", clock)
    monitor = ThroughputMonitor(peak_flops=PEAK)
    trainer, collator = build(tmp_path, **setup, callbacks=[monitor, clock_callback(clock)], clock=clock,
                              eval_strategy="steps", eval_steps=3, save_strategy="steps", save_steps=5)
    run_before_integrations(trainer)  # our on_pre_log: the figures are fixed before any on_log
    drive_clock(clock, trainer.model)
    trainer.train()

    accumulation, shifts = setup["accumulation"], setup["kind"] == "lm"
    batches_per_epoch = math.ceil(35 / 4)
    steps = step_of_batches(batches_per_epoch, accumulation, epochs=2)
    assert len(collator.batches) == len(steps)  # every batch built was trained on, once
    flops = training_flops(trainer.model)
    assert sum(seconds for what, seconds, _ in clock.trace if what == "load") == LOAD * len(steps)

    records = throughput_records(trainer.state.log_history)
    logged = [r["step"] for r in trainer.state.log_history if "loss" in r]
    assert [r["step"] for r in records] == [s for s in logged if s >= 2]  # step 1 is the warm-up
    start = 1
    for record in records:
        end = record["step"]
        expected = window_counts(collator.batches, steps, start, end, shifts)
        assert record["throughput/window_steps"] == end - start
        assert_counts(record, expected, tokens=True, loss=True)
        # the window is the training work and the data loading; left out: the logging of the
        # previous window's record and the evaluations and saves from the start of the window
        # up to (not including) its last step, each under its own key
        assert_window_seconds(record, clock.trace, start)
        loads = record["throughput/window_seconds"] - expected.micro_batches * TRAIN_FORWARD
        assert loads > 0 and loads % LOAD == 0  # batches built (the loader works one batch ahead)
        seconds = record["throughput/window_seconds"]
        model_flops = (flops.per_token * expected.non_padding_tokens
                       + flops.per_squared_length * expected.squared_lengths)
        assert record["throughput/tflops_per_second"] * 1e12 * seconds == pytest.approx(model_flops, 1e-12)
        assert record["throughput/mfu"] == pytest.approx(model_flops / seconds / PEAK, rel=1e-12)
        assert record["throughput/device/tokens_per_second"] == record["throughput/tokens_per_second"]
        start = end
    assert trainer.callback_handler.callbacks[-1] is monitor  # it runs last from train begin on
    assert not trainer.model._forward_pre_hooks or all(
        getattr(h, "__self__", None) is not monitor for h in trainer.model._forward_pre_hooks.values()
    )


def test_warmup_zero_leaves_an_evaluation_on_start_out(tmp_path, monkeypatch):
    clock = SimulatedClock()
    monkeypatch.setattr(throughput, "time", clock)
    trainer, collator = build(tmp_path, rows=16, epochs=1, callbacks=[ThroughputMonitor(warmup_steps=0)],
                              clock=clock, eval_strategy="steps", eval_steps=100, eval_on_start=True)
    run_before_integrations(trainer)
    drive_clock(clock, trainer.model)
    trainer.train()
    first = throughput_records(trainer.state.log_history)[0]
    assert first["step"] == 2 and first["throughput/window_steps"] == 2
    # steps 1-2 and their batches (the loader builds one ahead: batches 0, 1 and 2)
    assert first["throughput/window_seconds"] == 2 * TRAIN_FORWARD + 3 * LOAD
    assert_window_seconds(first, clock.trace, 0)
    evaluation = math.ceil(6 / 4) * (EVAL_FORWARD + LOAD)  # the evaluation on start, its batches built
    assert first["throughput/evaluation_seconds"] == first["throughput/left_out_seconds"] == evaluation
    steps = step_of_batches(4, 1, 1)
    assert_counts(first, window_counts(collator.batches, steps, 0, 2, shifts=True))


@pytest.mark.parametrize("warmup", [1, 3])
def test_warmup_steps_are_in_no_window(warmup, tmp_path):
    trainer, collator = build(tmp_path, rows=32, epochs=1, callbacks=[ThroughputMonitor(warmup_steps=warmup)],
                              logging_steps=1)
    run_before_integrations(trainer)
    trainer.train()
    records = throughput_records(trainer.state.log_history)
    assert [r["step"] for r in records] == list(range(warmup + 1, 9))
    assert all(r["throughput/window_steps"] == 1 for r in records)
    steps = step_of_batches(8, 1, 1)
    for record in records:
        step = record["step"]
        assert_counts(record, window_counts(collator.batches, steps, step - 1, step, shifts=True))


def test_stock_trainer_without_pre_log_matches_transformers_token_counter(tmp_path, caplog):
    """In a stock Trainer (no run_before_integrations) the figures are added in on_log, to the
    record and the history; the non-padding tokens of each window equal the difference of
    transformers' own ``num_input_tokens_seen`` (include_num_input_tokens_seen="non_padding")."""
    monitor = ThroughputMonitor()
    trainer, collator = build(tmp_path, accumulation=2, callbacks=[monitor], report_to=["tensorboard"],
                              include_num_input_tokens_seen="non_padding")
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer.train()
    said = [r.getMessage() for r in caplog.records if "on_pre_log" in r.getMessage()]
    assert len(said) == 1 and "run_before_integrations" in said[0]
    training = [r for r in trainer.state.log_history if "loss" in r]
    records = throughput_records(trainer.state.log_history)
    assert records == training and len(records) == 5  # steps 2..10; step 1 is the warm-up
    steps = step_of_batches(9, 2, 2)
    for previous, record in zip(training, training[1:]):
        seconds = record["throughput/window_seconds"]
        seen = record["num_input_tokens_seen"] - previous["num_input_tokens_seen"]
        assert record["throughput/non_padding_tokens_per_second"] * seconds == pytest.approx(seen, rel=1e-9)
        assert_counts(record, window_counts(collator.batches, steps, previous["step"], record["step"], True))


def test_trainer_plus_figures_reach_the_report_to_integrations(tmp_path):
    from tests.integrations.tensorboard_events import read_scalars

    trainer, _ = build(tmp_path, trainer_class=TrainerPlus, callbacks=[ThroughputMonitor()],
                       report_to=["tensorboard"])
    trainer.train()
    records = throughput_records(trainer.state.log_history)
    scalars = read_scalars(tmp_path)
    for name in ("tokens_per_second", "loss_tokens_per_second", "tflops_per_second", "window_seconds"):
        logged = scalars[f"train/throughput/{name}"]
        assert logged == {r["step"]: pytest.approx(r[f"throughput/{name}"], rel=1e-6) for r in records}
    assert "train/throughput/mfu" not in scalars  # a CPU has no known peak, and none was given


def test_resume_counts_only_the_steps_of_this_run(tmp_path):
    first, _ = build(tmp_path, rows=32, epochs=1, callbacks=[ThroughputMonitor()], save_strategy="steps",
                     save_steps=3, logging_steps=2)
    first.train()
    resumed, collator = build(tmp_path, rows=32, epochs=1, callbacks=[ThroughputMonitor()], logging_steps=2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    new = [r for r in throughput_records(resumed.state.log_history) if r["step"] > 3]
    # step 4 is the resumed call's warm-up: its windows are steps 5-6 and 7-8, from the batches
    # this call built (the trainer skips the first 3 batches without building them)
    assert [(r["step"], r["throughput/window_steps"]) for r in new] == [(6, 2), (8, 2)]
    assert len(collator.batches) == 5
    steps = [4, 5, 6, 7, 8]
    for record in new:
        assert record["throughput/window_seconds"] > 0
        step = record["step"]
        assert_counts(record, window_counts(collator.batches, steps, step - 2, step, shifts=True))


def test_measured_flops_leave_training_unchanged(tmp_path):
    """flops_per_token="measure" runs one extra forward and backward on the first micro-batch: the
    training (with dropout, so the random state matters) is the same as without the monitor."""
    plain, _ = build(tmp_path / "plain", model=tiny_llama(attention_dropout=0.3), rows=16, epochs=1)
    plain.train()
    monitor = ThroughputMonitor(flops_per_token="measure")
    measured, collator = build(tmp_path / "measured", model=tiny_llama(attention_dropout=0.3), rows=16,
                               epochs=1, callbacks=[monitor])
    run_before_integrations(measured)
    measured.train()
    losses = [r.get("loss") for r in measured.state.log_history[:-1]]
    assert losses == [r.get("loss") for r in plain.state.log_history[:-1]]
    assert monitor.flops.source == "measured"
    probe = tiny_llama(attention_dropout=0.3)
    probe.train()
    first = collator.batches[0]
    assert monitor.flops.per_token == measure_training_flops(probe, first) / first["input_ids"].numel()


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"flops_per_token": "estimate"}, ["flops_per_token", "'estimate'", "'auto'", "'measure'"]),
        ({"flops_per_token": -5}, ["flops_per_token", "-5"]),
        ({"flops_per_token": True}, ["flops_per_token", "True"]),
        ({"peak_flops": 0}, ["peak_flops", "0"]),
        ({"peak_flops": float("inf")}, ["peak_flops", "inf"]),
        ({"precision": "int8"}, ["precision", "'int8'", "'bf16'"]),
        ({"warmup_steps": -1}, ["warmup_steps", "-1"]),
        ({"warmup_steps": 1.5}, ["warmup_steps", "1.5"]),
    ],
)
def test_bad_arguments_are_refused_at_construction(kwargs, words):
    wrong_type = kwargs == {"warmup_steps": 1.5}  # a TypeError, as core/checks.py says it for every callback
    with pytest.raises(TypeError if wrong_type else ValueError) as error:
        ThroughputMonitor(**kwargs)
    assert all(word in str(error.value) for word in words), str(error.value)


def test_lightweight_trainer_counts_the_forward_passes_of_its_train_step(tmp_path):
    from hf_callbacks_plus import LightweightTrainer, LoopArguments

    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    collator = RecordingCollator()
    data = lm_rows(32, seed=1)
    batches = [collator(data[i:i + 4]) for i in range(0, 32, 4)]

    def train_step(batch):
        loss = model(**batch).loss
        loss.backward()
        return loss.item()

    def optimizer_step():
        optimizer.step()
        optimizer.zero_grad()

    model.train()
    trainer = LightweightTrainer(
        LoopArguments(output_dir=str(tmp_path), max_steps=8, logging_steps=2, gradient_accumulation_steps=2,
                      save_strategy="no", disable_tqdm=True),
        train_step=train_step, train_data=batches, model=model, optimizer_step_fn=optimizer_step,
        callbacks=[ThroughputMonitor(peak_flops=PEAK)])
    trainer.train()
    records = throughput_records(trainer.state.log_history)
    assert [(r["step"], r["throughput/window_steps"]) for r in records] == [(2, 1), (4, 2), (6, 2), (8, 2)]
    steps = step_of_batches(8, 2, epochs=2)  # the loop goes through the 8 batches twice
    for record in records:
        first = record["step"] - int(record["throughput/window_steps"])
        assert_counts(record, window_counts(collator.batches * 2, steps, first, record["step"], shifts=True))


@pytest.mark.parametrize("bound", [False, True])
def test_an_evaluation_asked_for_by_a_callback_after_the_monitor_is_left_out(bound, tmp_path):
    """A callback listed after the monitor asks for an evaluation at a step that does not log. In
    a stock Trainer (not bound) the step's end could not announce it: it is left out from that
    step's end, unsynchronised; bound (run_before_integrations), the monitor runs last and sees
    the request. The evaluation is made slow, 0.3 s, by its compute_metrics (a fault injected to
    make it measurable)."""
    import time

    from transformers import TrainerCallback

    class EvaluateAtStep3(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                control.should_evaluate = True

    def slow_metrics(eval_pred):
        time.sleep(0.3)
        return {}

    monitor = ThroughputMonitor()
    trainer, _ = build(tmp_path, rows=24, epochs=1, callbacks=[monitor, EvaluateAtStep3()],
                       compute_metrics=slow_metrics)
    if bound:
        run_before_integrations(trainer)
    trainer.train()
    assert (trainer.callback_handler.callbacks[-1] is monitor) == bound
    evaluation = next(r for r in trainer.state.log_history if "eval_runtime" in r)
    assert evaluation["step"] == 3 and evaluation["eval_runtime"] >= 0.3
    window = next(r for r in throughput_records(trainer.state.log_history) if r["step"] == 4)
    assert window["throughput/evaluation_seconds"] >= evaluation["eval_runtime"]
