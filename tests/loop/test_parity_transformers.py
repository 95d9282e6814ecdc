"""Parity: the same configuration in transformers.Trainer and LightweightTrainer fires the same events.

Each test runs a real ``transformers.Trainer`` on the tiny regression model and
``LightweightTrainer`` on batches of the same count, both with an ``EventRecorder``, and
asserts identical traces: every event, its ``global_step``/``epoch``, the control flags after
it and the keys of its logs/metrics (timing *values* are never compared; no key needs
normalizing). It also compares the checkpoint folders left on disk and the final state.
The evaluation metric is scripted (same sequence in both), so best-model decisions match.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from hypothesis import given, settings
from hypothesis import strategies as st

from hf_callbacks_plus.loop import ExportableState, TrainerCallback
from hf_callbacks_plus.testing import EventRecorder, diff_traces
from tests.loop.parity import (
    assert_same_run,
    checkpoints,
    date_checkpoints,
    run_lightweight,
    run_transformers,
)

pytestmark = pytest.mark.transformers


class StopTrainingAt(TrainerCallback):
    """Sets ``should_training_stop`` at the end of optimizer step ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


class StopEpochAt(TrainerCallback):
    """Sets ``should_epoch_stop`` at the end of optimizer step ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_epoch_stop = True


class ForceEvaluateAndSaveAt(TrainerCallback):
    """Asks for an evaluation and a checkpoint at step ``step`` whatever the strategies say."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_evaluate = True
            control.should_save = True


# (id, config, callback factory or None)
CONFIGS = [
    ("log-steps-2", {"logging_steps": 2}, None),
    ("ga3-log-every-step", {"gradient_accumulation_steps": 3, "logging_steps": 1}, None),
    (
        "ga3-eval-save-steps",
        {
            "gradient_accumulation_steps": 3,
            "logging_steps": 2,
            "eval_strategy": "steps",
            "eval_steps": 2,
            "save_strategy": "steps",
            "save_steps": 2,
        },
        None,
    ),
    ("ga2-uneven-epoch", {"gradient_accumulation_steps": 2, "logging_steps": 1, "n_train": 40}, None),
    ("ga3-short-last-batch", {"gradient_accumulation_steps": 3, "logging_steps": 1, "n_train": 60}, None),
    ("max-steps-multiple-of-epoch", {"max_steps": 16, "logging_steps": 4, "eval_strategy": "epoch"}, None),
    (
        "max-steps-not-multiple",
        {
            "max_steps": 11,
            "logging_steps": 3,
            "eval_strategy": "steps",
            "eval_steps": 4,
            "save_strategy": "steps",
            "save_steps": 4,
        },
        None,
    ),
    (
        "max-steps-ga3",
        {
            "max_steps": 5,
            "gradient_accumulation_steps": 3,
            "logging_strategy": "epoch",
            "eval_strategy": "epoch",
        },
        None,
    ),
    (
        "fractional-epochs-1.5",
        {"num_train_epochs": 1.5, "logging_steps": 5, "eval_strategy": "epoch", "save_strategy": "epoch"},
        None,
    ),
    (
        "fractional-epochs-0.5-ga3",
        {"num_train_epochs": 0.5, "gradient_accumulation_steps": 3, "logging_steps": 1},
        None,
    ),
    (
        "fractional-epochs-2.3-eval-steps",
        {"num_train_epochs": 2.3, "eval_strategy": "steps", "eval_steps": 3, "logging_steps": 3},
        None,
    ),
    ("logging-no", {"logging_strategy": "no", "eval_strategy": "epoch"}, None),
    ("logging-epoch", {"logging_strategy": "epoch", "num_train_epochs": 3}, None),
    ("eval-steps-3", {"eval_strategy": "steps", "eval_steps": 3, "logging_steps": 3}, None),
    ("eval-steps-default-to-logging", {"eval_strategy": "steps", "logging_steps": 5}, None),
    ("eval-epoch", {"eval_strategy": "epoch", "logging_steps": 4, "num_train_epochs": 3}, None),
    ("save-steps-3", {"save_strategy": "steps", "save_steps": 3, "logging_steps": 3}, None),
    ("save-epoch", {"save_strategy": "epoch", "logging_strategy": "epoch"}, None),
    (
        "save-best-eval-steps",
        {
            "save_strategy": "best",
            "metric_for_best_model": "mse",
            "eval_strategy": "steps",
            "eval_steps": 2,
            "logging_steps": 2,
        },
        None,
    ),
    (
        "save-best-eval-epoch",
        {
            "save_strategy": "best",
            "metric_for_best_model": "mae",
            "eval_strategy": "epoch",
            "num_train_epochs": 5,
            "logging_strategy": "epoch",
        },
        None,
    ),
    ("logging-first-step", {"logging_first_step": True, "logging_steps": 5}, None),
    (
        "logging-first-step-ga3",
        {"logging_first_step": True, "logging_strategy": "epoch", "gradient_accumulation_steps": 3},
        None,
    ),
    ("eval-on-start-epoch", {"eval_on_start": True, "eval_strategy": "epoch", "logging_steps": 8}, None),
    ("eval-on-start-no-strategy", {"eval_on_start": True, "logging_steps": 8}, None),
    (
        "eval-delay-steps",
        {"eval_strategy": "steps", "eval_steps": 2, "eval_delay": 5, "logging_steps": 2},
        None,
    ),
    ("eval-delay-epoch", {"eval_strategy": "epoch", "eval_delay": 2, "num_train_epochs": 3}, None),
    ("fraction-logging-steps", {"logging_steps": 0.25, "max_steps": 10}, None),
    (
        "fraction-eval-save-steps",
        {
            "eval_strategy": "steps",
            "eval_steps": 0.1,
            "save_strategy": "steps",
            "save_steps": 0.2,
            "logging_steps": 0.3,
        },
        None,
    ),
    (
        "stop-training-mid-epoch",
        {"eval_strategy": "epoch", "save_strategy": "epoch", "logging_steps": 2},
        lambda: [StopTrainingAt(5)],
    ),
    (
        "stop-training-mid-epoch-ga3",
        {"gradient_accumulation_steps": 3, "logging_steps": 1, "eval_strategy": "steps", "eval_steps": 2},
        lambda: [StopTrainingAt(4)],
    ),
    (
        "should-epoch-stop",
        {"logging_strategy": "epoch", "eval_strategy": "epoch", "num_train_epochs": 3},
        lambda: [StopEpochAt(3)],
    ),
    ("callback-forces-eval-and-save", {"logging_steps": 4}, lambda: [ForceEvaluateAndSaveAt(6)]),
    ("save-total-limit-2", {"save_strategy": "steps", "save_steps": 2, "save_total_limit": 2}, None),
    (
        "save-total-limit-1-best",
        {
            "save_strategy": "steps",
            "save_steps": 2,
            "save_total_limit": 1,
            "eval_strategy": "steps",
            "eval_steps": 2,
            "load_best_model_at_end": True,
            "metric_for_best_model": "mse",
        },
        None,
    ),
    (
        "save-total-limit-2-keeps-best",
        {
            "save_strategy": "steps",
            "save_steps": 1,
            "save_total_limit": 2,
            "eval_strategy": "steps",
            "eval_steps": 1,
            "metric_for_best_model": "mse",
            "load_best_model_at_end": True,
        },
        None,
    ),
    (
        "load-best-epoch",
        {
            "eval_strategy": "epoch",
            "save_strategy": "epoch",
            "load_best_model_at_end": True,
            "metric_for_best_model": "mse",
            "num_train_epochs": 4,
        },
        None,
    ),
    (
        "load-best-greater-is-better",
        {
            "eval_strategy": "steps",
            "eval_steps": 3,
            "save_strategy": "steps",
            "save_steps": 3,
            "load_best_model_at_end": True,
            "metric_for_best_model": "mse",
            "greater_is_better": True,
        },
        None,
    ),
    (
        "best-metric-without-saving",
        {"eval_strategy": "steps", "eval_steps": 2, "metric_for_best_model": "mse", "logging_steps": 2},
        None,
    ),
]


@pytest.mark.parametrize(
    ("config", "factory"), [(c, f) for _, c, f in CONFIGS], ids=[i for i, _, _ in CONFIGS]
)
def test_same_events_as_transformers(tmp_path, config, factory):
    trace = assert_same_run(tmp_path, callbacks_factory=factory, **config)
    assert trace.count("on_train_end") == 1


def test_configurations_exercise_what_they_claim(tmp_path):
    """Guard against vacuous parity: the traces really contain substeps, evaluations and saves."""
    trace = assert_same_run(
        tmp_path,
        gradient_accumulation_steps=3,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        save_total_limit=1,
    )
    assert trace.count("on_substep_end") > 0
    assert trace.steps("on_evaluate") == [2, 4, 6]
    assert trace.steps("on_save") == [2, 4, 6]
    assert checkpoints(tmp_path / "lw") == ["checkpoint-6"]


class LateJoiner(TrainerCallback):
    """Added during training: asks for a log before each optimizer step and a save after a substep."""

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        control.should_log = True

    def on_substep_end(self, args, state, control, **kwargs):
        control.should_save = True


class AddsAndRemovesLateJoiner(TrainerCallback):
    """Adds a LateJoiner from inside ``on_step_begin`` of step 3 (so it must fire in that very
    step) and removes it in ``on_step_end`` of step 5: the loop must notice both list changes."""

    def __init__(self) -> None:
        self.trainer = None
        self.joiner = LateJoiner()

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 2:
            self.trainer.add_callback(self.joiner)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 5:
            self.trainer.remove_callback(self.joiner)


@pytest.mark.parametrize("accumulation", [1, 3])
def test_callbacks_added_and_removed_during_training(tmp_path, accumulation):
    """The loop skips events no callback implements; it must notice callbacks added mid-step.

    The EventRecorder implements every event (so nothing would be skipped): it is removed
    here, and the runs are compared by their log history and checkpoints instead.
    """

    def setup(trainer):
        trainer.remove_callback(EventRecorder)
        trainer.callback_handler.callbacks[1].trainer = trainer  # after DefaultFlowCallback

    config = {"gradient_accumulation_steps": accumulation, "logging_strategy": "no", "max_steps": 8}
    runs = []
    for name, run in (("hf", run_transformers), ("lw", run_lightweight)):
        _, trainer = run(tmp_path / name, callbacks=[AddsAndRemovesLateJoiner()], setup=setup, **config)
        runs.append(([entry["step"] for entry in trainer.state.log_history], checkpoints(tmp_path / name)))
    assert runs[0] == runs[1]
    log_steps, saved = runs[1]
    assert log_steps == [3, 4, 5, 8]  # 3-5 from the LateJoiner, then the final train record
    assert saved == (["checkpoint-3", "checkpoint-4", "checkpoint-5"] if accumulation > 1 else [])


def test_evaluate_and_predict_after_training(tmp_path):
    from tests.tiny_models import RegressionDataset

    # The transformers trainer is used before any other TrainingArguments is built (building one
    # resets accelerate's global state under a live Trainer).
    hf_recorder, hf_trainer = run_transformers(tmp_path / "hf", logging_steps=4)
    hf_metrics = hf_trainer.evaluate(metric_key_prefix="val")
    hf_trainer.predict(RegressionDataset(24, seed=3))
    lw_recorder, lw_trainer = run_lightweight(tmp_path / "lw", logging_steps=4)
    lw_metrics = lw_trainer.evaluate(metric_key_prefix="val")
    lw_trainer.predict([[1.0] * 8] * 3)
    assert sorted(hf_metrics) == sorted(lw_metrics)
    report = diff_traces(hf_recorder, lw_recorder)
    assert report is None, report
    assert hf_recorder.names()[-1] == "on_predict"
    assert hf_recorder.of("on_predict")[-1].keys == lw_recorder.of("on_predict")[-1].keys


def test_evaluate_and_predict_before_training(tmp_path):
    """transformers prepares the model at the first evaluation of an untrained trainer and then
    reports ``<prefix>_model_preparation_time`` in that call and every later evaluation."""
    from tests.tiny_models import RegressionDataset

    before = {}

    def hf_setup(trainer):
        before["hf"] = (trainer.evaluate(), trainer.predict(RegressionDataset(24, seed=3)).metrics)

    def lw_setup(trainer):
        before["lw"] = (trainer.evaluate(), trainer.predict([[1.0] * 8] * 3).metrics)

    config = {"eval_strategy": "steps", "eval_steps": 4, "logging_steps": 4, "max_steps": 8}
    expected, _ = run_transformers(tmp_path / "hf", setup=hf_setup, **config)
    actual, _ = run_lightweight(tmp_path / "lw", setup=lw_setup, **config)
    report = diff_traces(expected, actual, names=("transformers.Trainer", "LightweightTrainer"))
    assert report is None, report
    (hf_eval, hf_test), (lw_eval, lw_test) = before["hf"], before["lw"]
    assert sorted(hf_eval) == sorted(lw_eval) and sorted(hf_test) == sorted(lw_test)
    assert "eval_model_preparation_time" in lw_eval and "test_model_preparation_time" in lw_test
    assert expected.count("on_evaluate") == 3  # before training, then at steps 4 and 8
    for event in actual.of("on_evaluate"):
        assert "eval_model_preparation_time" in event.keys


def test_no_model_preparation_time_when_training_comes_first(tmp_path):
    _, trainer = run_lightweight(tmp_path, logging_steps=4)
    assert not any(key.endswith("model_preparation_time") for key in trainer.evaluate())
    assert "test_model_preparation_time" not in trainer.predict([[1.0] * 8]).metrics


def test_several_eval_datasets(tmp_path):
    from transformers import Trainer

    from hf_callbacks_plus.loop import LightweightTrainer, LoopArguments
    from hf_callbacks_plus.testing import EventRecorder
    from tests.loop.parity import ScriptedMetrics
    from tests.tiny_models import RegressionDataset, TinyRegressionModel, training_args

    overrides = {"eval_strategy": "epoch", "logging_strategy": "epoch"}
    hf_recorder, lw_recorder = EventRecorder(), EventRecorder()
    Trainer(
        model=TinyRegressionModel(),
        args=training_args(tmp_path / "hf", **overrides),
        train_dataset=RegressionDataset(32, seed=1),
        eval_dataset={"easy": RegressionDataset(8, seed=2), "hard": RegressionDataset(16, seed=3)},
        compute_metrics=ScriptedMetrics(),
        callbacks=[hf_recorder],
    ).train()
    LightweightTrainer(
        LoopArguments.from_training_arguments(training_args(tmp_path / "lw", **overrides)),
        train_step=lambda batch: {"loss": 1.0, "grad_norm": 1.0},
        train_data=[[0.0] * 8] * 4,
        eval_data={"easy": [[0.0] * 8], "hard": [[0.0] * 8] * 2},
        eval_step=lambda batch: 1.0,
        metrics_fn=ScriptedMetrics(),
        learning_rate_fn=lambda: 0.1,
        callbacks=[lw_recorder],
    ).train()
    report = diff_traces(hf_recorder, lw_recorder)
    assert report is None, report
    assert "eval_hard_mse" in hf_recorder.of("on_evaluate")[-1].keys


RESUME_CASES = [
    # (id, config of both runs, overrides of the first run only, checkpoint to resume from)
    (
        "mid-epoch",
        {"save_strategy": "steps", "save_steps": 5, "logging_steps": 2, "eval_strategy": "epoch"},
        {},
        "checkpoint-5",
    ),
    (
        "mid-epoch-ga3",
        {
            "gradient_accumulation_steps": 3,
            "save_strategy": "steps",
            "save_steps": 4,
            "logging_steps": 1,
            "num_train_epochs": 3,
        },
        {},
        "checkpoint-4",
    ),
    (
        "epoch-boundary",
        {"save_strategy": "epoch", "logging_strategy": "epoch", "num_train_epochs": 3},
        {},
        "checkpoint-8",
    ),
    (
        "newest-with-true",
        {"save_strategy": "steps", "save_steps": 3, "max_steps": 10, "logging_steps": 2},
        {"max_steps": 7},
        True,
    ),
    (
        "ignore-data-skip",
        {"save_strategy": "steps", "save_steps": 5, "logging_steps": 2, "ignore_data_skip": True},
        {},
        "checkpoint-5",
    ),
    (
        "best-model-tracking",
        {
            "save_strategy": "steps",
            "save_steps": 2,
            "eval_strategy": "steps",
            "eval_steps": 2,
            "metric_for_best_model": "mse",
            "load_best_model_at_end": True,
            "save_total_limit": 2,
        },
        {"max_steps": 6},
        "checkpoint-6",
    ),
]


@pytest.mark.parametrize(
    ("config", "first_run", "checkpoint"),
    [case[1:] for case in RESUME_CASES],
    ids=[case[0] for case in RESUME_CASES],
)
def test_resume_same_events_as_transformers(tmp_path, config, first_run, checkpoint):
    hf_dir, lw_dir = tmp_path / "hf", tmp_path / "lw"
    run_transformers(hf_dir, **{**config, **first_run})
    run_lightweight(lw_dir, **{**config, **first_run})
    assert checkpoints(hf_dir) == checkpoints(lw_dir)
    hf_resume = True if checkpoint is True else str(hf_dir / checkpoint)
    lw_resume = True if checkpoint is True else str(lw_dir / checkpoint)
    expected, hf_trainer = run_transformers(hf_dir, resume=hf_resume, **config)
    actual, lw_trainer = run_lightweight(lw_dir, resume=lw_resume, **config)
    report = diff_traces(expected, actual, names=("transformers.Trainer", "LightweightTrainer"))
    assert report is None, report
    assert checkpoints(hf_dir) == checkpoints(lw_dir)
    for name in ("global_step", "best_global_step", "best_metric"):
        assert getattr(hf_trainer.state, name) == getattr(lw_trainer.state, name), name
    # the resumed run really starts mid-way
    assert expected.of("on_train_begin")[0].global_step > 0


def test_resume_among_newer_checkpoints_keeps_the_checkpoint_just_saved(tmp_path):
    """A run left checkpoint-2..16; resuming from checkpoint-6 re-saves checkpoint-8 with
    ``save_total_limit=2``. Rotation orders by mtime, so the re-saved folder is the newest and
    survives, as in transformers: ``[checkpoint-8, checkpoint-16]``."""
    config = {"save_strategy": "steps", "save_steps": 2, "logging_steps": 2}
    hf_dir, lw_dir = tmp_path / "hf", tmp_path / "lw"
    run_transformers(hf_dir, max_steps=16, **config)
    run_lightweight(lw_dir, max_steps=16, **config)
    for folder in (hf_dir, lw_dir):
        date_checkpoints(folder)
    resumed = {**config, "max_steps": 8, "save_total_limit": 2}
    expected, _ = run_transformers(hf_dir, resume=str(hf_dir / "checkpoint-6"), **resumed)
    actual, _ = run_lightweight(lw_dir, resume=str(lw_dir / "checkpoint-6"), **resumed)
    report = diff_traces(expected, actual, names=("transformers.Trainer", "LightweightTrainer"))
    assert report is None, report
    assert checkpoints(hf_dir) == ["checkpoint-8", "checkpoint-16"]
    assert checkpoints(lw_dir) == checkpoints(hf_dir)


class CountingStopper(TrainerCallback, ExportableState):
    """Counts optimizer steps across resumes and stops training after ``limit`` of them."""

    def __init__(self, limit: int = 10, seen: int = 0) -> None:
        self.limit = limit
        self.seen = seen

    def on_step_end(self, args, state, control, **kwargs):
        self.seen += 1
        if self.seen >= self.limit:
            control.should_training_stop = True

    def state(self):
        return {"args": {"limit": self.limit}, "attributes": {"seen": self.seen}}


@pytest.mark.parametrize("restore", [True, False], ids=["restore-callback-states", "no-restore"])
def test_stateful_callback_restored_like_transformers(tmp_path, restore):
    hf_dir, lw_dir = tmp_path / "hf", tmp_path / "lw"
    config = {
        "save_strategy": "steps",
        "save_steps": 4,
        "logging_steps": 2,
        "max_steps": 6,
        "restore_callback_states_from_checkpoint": restore,
    }
    run_transformers(hf_dir, callbacks=[CountingStopper(10)], **config)
    run_lightweight(lw_dir, callbacks=[CountingStopper(10)], **config)
    config["max_steps"] = 16
    expected, hf_trainer = run_transformers(
        hf_dir, callbacks=[CountingStopper(10)], resume=str(hf_dir / "checkpoint-4"), **config
    )
    actual, lw_trainer = run_lightweight(
        lw_dir, callbacks=[CountingStopper(10)], resume=str(lw_dir / "checkpoint-4"), **config
    )
    report = diff_traces(expected, actual)
    assert report is None, report
    # restored: 4 steps counted before the checkpoint, so it stops after 6 more (step 10)
    assert hf_trainer.state.global_step == lw_trainer.state.global_step == (10 if restore else 14)


def _random_config(draw):
    config = {
        "gradient_accumulation_steps": draw(st.sampled_from([1, 2, 3])),
        "n_train": draw(st.sampled_from([24, 40, 56, 64])),
        "logging_strategy": draw(st.sampled_from(["no", "steps", "epoch"])),
        "logging_steps": draw(st.sampled_from([1, 2, 3, 0.25])),
        "logging_first_step": draw(st.booleans()),
        "eval_strategy": draw(st.sampled_from(["no", "steps", "epoch"])),
        "eval_steps": draw(st.sampled_from([1, 2, 5, 0.3])),
        "eval_delay": draw(st.sampled_from([0, 0, 1, 3])),
        "eval_on_start": draw(st.booleans()),
        "save_strategy": draw(st.sampled_from(["no", "steps", "epoch", "best"])),
        "save_steps": draw(st.sampled_from([2, 3, 0.5])),
        "save_total_limit": draw(st.sampled_from([None, 1, 2])),
        "metric_for_best_model": draw(st.sampled_from([None, "mse"])),
    }
    if draw(st.booleans()):
        config["max_steps"] = draw(st.integers(1, 12))
    else:
        config["num_train_epochs"] = draw(st.sampled_from([0.5, 1, 1.7, 2]))
    if config["save_strategy"] == "best":
        config["metric_for_best_model"] = "mse"
        if config["eval_strategy"] == "no":
            config["eval_strategy"] = "epoch"
    return config


@settings(max_examples=15, deadline=None)
@given(st.data(), st.sampled_from([None, 2, 4]), st.sampled_from([None, 3]))
def test_random_configurations(data, stop_at, epoch_stop_at):
    config = _random_config(data.draw)

    def factory():
        callbacks = []
        if stop_at is not None:
            callbacks.append(StopTrainingAt(stop_at))
        if epoch_stop_at is not None:
            callbacks.append(StopEpochAt(epoch_stop_at))
        return callbacks

    with tempfile.TemporaryDirectory() as directory:
        assert_same_run(Path(directory), callbacks_factory=factory, **config)
