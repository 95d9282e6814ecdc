"""EarlyStopping decision rules, end to end in ``LightweightTrainer`` (plain Python, no
transformers); the patience rule also in a real ``transformers.Trainer`` and ``TrainerPlus``.
The rule itself is table-tested in test_early_stopping_policy.py.

Metrics are scripted by step (evaluation every 2 steps), so each stop is known in advance.
"""

from __future__ import annotations

import math

import pytest

from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping, StopReason
from tests.callbacks.early_stopping_helpers import scripted_loop, scripted_trainer


def scripted_trainer_plus(output_dir, script, **kwargs):
    from hf_callbacks_plus.integrations.transformers import TrainerPlus

    return scripted_trainer(output_dir, script, trainer_class=TrainerPlus, **kwargs)


LOOPS = {"transformers": scripted_trainer, "lightweight": scripted_loop, "trainerplus": scripted_trainer_plus}
#: every loop: the lightweight loop always, the real Trainer and TrainerPlus when transformers is there
ALL_LOOPS = ["lightweight", pytest.param("transformers", marks=pytest.mark.transformers),
             pytest.param("trainerplus", marks=pytest.mark.transformers)]


def by_eval(*values: float):
    """Script: the k-th evaluation (step 2k) gets values[k-1]; the last value repeats."""
    return lambda step: values[min(max(step // 2 - 1, 0), len(values) - 1)]


def run(tmp_path, loop: str, script, stopper: EarlyStopping, **args):
    trainer = LOOPS[loop](tmp_path / loop, script, callbacks=[stopper], **args)
    trainer.train()
    return trainer


@pytest.mark.parametrize("loop", ALL_LOOPS)
def test_patience_counts_evaluations_and_reports(tmp_path, loop):
    stopper = EarlyStopping("eval_score", mode="min", patience=2)
    trainer = run(tmp_path, loop, by_eval(5, 4, 3, 3.5, 3.2, 1.0), stopper)
    assert trainer.state.global_step == 10  # evaluations at 2,4,6 improve; 8 and 10 do not
    assert (stopper.best_value, stopper.best_step, stopper.stopped_step) == (3.0, 6, 10)
    assert stopper.reason is StopReason.PATIENCE and stopper.stopped
    assert "step 10" in stopper.message and "patience=2" in stopper.message
    record = next(r for r in trainer.state.log_history if "eval_score" in r and r["step"] == 10)
    if loop != "transformers":  # on_pre_log: the report reaches log_history and every tracker
        assert record["early_stopping/reason"] == "patience"
        assert record["early_stopping/best_step"] == 6 and record["early_stopping/stopped_step"] == 10


def test_relative_min_delta(tmp_path):
    # 100 -> 95 is a 5% gain: not enough with min_delta=0.1 relative; 85 is.
    stopper = EarlyStopping("eval_score", mode="min", patience=2, min_delta=0.1, min_delta_mode="relative")
    run(tmp_path, "lightweight", by_eval(100, 95, 85, 80, 79), stopper)
    assert (stopper.best_value, stopper.best_step, stopper.stopped_step) == (85.0, 6, 10)


def test_max_mode_from_name_and_baseline_not_reached(tmp_path):
    stopper = EarlyStopping("eval_accuracy", patience=3, baseline=0.5)
    run(tmp_path, "lightweight", by_eval(0.3, 0.4, 0.45, 0.9), stopper, name="accuracy")
    assert stopper.resolved_mode == "max"
    assert stopper.reason is StopReason.BASELINE_NOT_REACHED and stopper.stopped_step == 6
    assert stopper.best_value is None and stopper.best_step is None


@pytest.mark.parametrize(
    ("kwargs", "values", "reason", "step"),
    [
        ({"stopping_threshold": 2.0}, (5, 4, 2.0, 1), StopReason.STOPPING_THRESHOLD, 6),
        ({"divergence_threshold": 10.0}, (5, 4, 11, 1), StopReason.DIVERGENCE_THRESHOLD, 6),
        ({}, (5, 4, math.nan, 1), StopReason.NON_FINITE, 6),
        ({}, (5, math.inf, 1), StopReason.NON_FINITE, 4),
    ],
)
def test_thresholds_and_non_finite(tmp_path, kwargs, values, reason, step):
    stopper = EarlyStopping("eval_score", mode="min", patience=5, **kwargs)
    trainer = run(tmp_path, "lightweight", by_eval(*values), stopper)
    assert stopper.reason is reason and stopper.stopped_step == step == trainer.state.global_step
    assert math.isfinite(stopper.best_value)


def test_non_finite_is_never_best_when_not_stopping(tmp_path):
    stopper = EarlyStopping("eval_score", mode="min", patience=2, check_finite=False)
    run(tmp_path, "lightweight", by_eval(5, math.nan, -math.inf, 6), stopper)
    assert (stopper.best_value, stopper.best_step) == (5.0, 2)
    assert stopper.reason is StopReason.PATIENCE and stopper.stopped_step == 6


def test_warm_up_ignores_early_evaluations(tmp_path):
    # without warm-up the flat start would stop at step 6; with it, counting starts after step 6
    stopper = EarlyStopping("eval_score", mode="min", patience=2, start_from_step=6)
    run(tmp_path, "lightweight", by_eval(5, 5, 5, 4, 4, 4, 4), stopper)
    assert (stopper.best_value, stopper.best_step, stopper.stopped_step) == (4.0, 8, 12)
    epochs = EarlyStopping("eval_score", mode="min", patience=1, start_from_epoch=1)  # 8 steps per epoch
    run(tmp_path / "epochs", "lightweight", by_eval(5, 5, 5, 5, 5, 5), epochs)
    assert (epochs.best_step, epochs.stopped_step) == (10, 12)


@pytest.mark.transformers
def test_best_moves_only_on_qualifying_improvement_unlike_transformers(tmp_path):
    """transformers compares to state.best_metric, which follows every small gain.

    The metric falls by 0.07 per evaluation (min_delta 0.1): progress is steady (0.14 every two
    evaluations), yet transformers' callback sees "< 0.1 better than the previous value" each time
    and stops after `patience` evaluations. Ours measures against its own best, which only moves on
    a gain > 0.1, so it keeps training.
    """
    from transformers import EarlyStoppingCallback

    values = [1.0 - 0.07 * k for k in range(12)]
    script = by_eval(*values)
    theirs = EarlyStoppingCallback(early_stopping_patience=2, early_stopping_threshold=0.1)
    hf = scripted_trainer(tmp_path / "hf", script, callbacks=[theirs], metric_for_best_model="score",
                          greater_is_better=False)
    hf.train()
    assert hf.state.global_step == 6  # stopped although the metric improved at every evaluation
    ours = EarlyStopping("eval_score", mode="min", patience=2, min_delta=0.1)
    trainer = run(tmp_path, "transformers", script, ours)
    assert trainer.state.global_step == 24 and not ours.stopped
    assert ours.best_step == 22 and math.isclose(ours.best_value, values[10])


def test_default_monitor_is_metric_for_best_model(tmp_path):
    stopper = EarlyStopping(patience=1)
    run(tmp_path, "lightweight", by_eval(0.5, 0.7, 0.6), stopper, metric_for_best_model="score",
        greater_is_better=True)
    # "score" is eval_score, as transformers reads metric_for_best_model ("loss" is eval_loss, not the
    # training loss)
    assert stopper.monitor_name == "eval_score" and stopper.resolved_mode == "max"
    assert stopper.state_key == "EarlyStopping[eval_score,max]"
    assert (stopper.best_step, stopper.stopped_step) == (4, 6)


def test_two_instances_keep_separate_state(tmp_path):
    on_score = EarlyStopping("eval_score", mode="min", patience=2, log_name="score")
    on_loss = EarlyStopping("loss", patience=50, log_name="loss")  # training loss, counted per log
    trainer = scripted_loop(tmp_path, by_eval(5, 4, 4, 4), callbacks=[on_score, on_loss],
                            save_strategy="steps", save_steps=4, logging_steps=1)
    trainer.train()
    assert on_score.stopped_step == 8 and not on_loss.stopped
    assert on_loss.best_step is not None and on_loss.resolved_mode == "min"
    assert on_score.state_key != on_loss.state_key
    from tests.callbacks.early_stopping_helpers import saved_state

    saved = saved_state(tmp_path / "checkpoint-8", on_score.state_key)
    assert saved["stopped"] is True and saved["best_step"] == 4, saved
    assert saved_state(tmp_path / "checkpoint-8", on_loss.state_key)["stopped"] is False


def test_training_loss_monitor_counts_logging_steps(tmp_path):
    stopper = EarlyStopping("train/loss", patience=1, min_delta=1e9)  # nothing beats the first log by 1e9
    trainer = scripted_loop(tmp_path, by_eval(1), callbacks=[stopper], logging_steps=3, eval_steps=100)
    trainer.train()
    assert (stopper.best_step, stopper.stopped_step, trainer.state.global_step) == (3, 6, 6)


def test_several_eval_datasets_and_an_evaluation_under_another_prefix(tmp_path):
    stopper = EarlyStopping("eval_b_score", mode="max", patience=1)
    trainer = scripted_loop(tmp_path, lambda step: float(step <= 4), callbacks=[stopper],
                            eval_data={"a": [0], "b": [1]})
    trainer.train()
    assert (stopper.best_step, stopper.stopped_step) == (2, 4)

    from hf_callbacks_plus import TrainerCallback

    class EvaluateOnTrainingData(TrainerCallback):
        """Evaluates every 3 steps under the "train" prefix (the stock workaround)."""

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % 3 == 0:
                loop.evaluate([0], metric_key_prefix="train")

    on_train = EarlyStopping("train_score", mode="min", patience=2)
    loop = scripted_loop(tmp_path / "subset", lambda step: 10 - min(step, 6),
                         callbacks=[on_train, EvaluateOnTrainingData()], eval_strategy="no")
    loop.train()
    assert (on_train.best_step, on_train.stopped_step) == (6, 12)


@pytest.mark.transformers
def test_several_eval_datasets_in_a_real_trainer(tmp_path):
    from tests.tiny_models import RegressionDataset

    stopper = EarlyStopping("eval_b_score", mode="max", patience=1)
    trainer = scripted_trainer(tmp_path, lambda step: float(step <= 4), callbacks=[stopper])
    trainer.eval_dataset = {"a": RegressionDataset(8, seed=3), "b": RegressionDataset(8, seed=4)}
    trainer.train()
    assert (stopper.best_step, stopper.stopped_step) == (2, 4)


def test_the_0_1_train_subset_name_is_missing_and_the_error_names_the_current_one(tmp_path):
    """``train_score`` was the train-subset name of 0.1.0 (never on an index); the subset logs
    ``train_subset_score``: the old name is a missing metric, and the error suggests the new one."""
    from hf_callbacks_plus import TrainerCallback

    class EvaluateTheSubset(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % 3 == 0:
                loop.evaluate([0], metric_key_prefix="train_subset")

    old_name = EarlyStopping("train_score", mode="min", patience=2)
    loop = scripted_loop(tmp_path, lambda step: 10 - min(step, 6), callbacks=[old_name, EvaluateTheSubset()],
                         eval_strategy="no")
    with pytest.raises(Exception, match="train_subset_score"):
        loop.train()


@pytest.mark.transformers
@pytest.mark.parametrize(("kind", "monitor", "mode"), [
    ("dpo", "eval_rewards/accuracies", "max"), ("dpo", "eval/rewards/margins", "max"),
    ("sft", "eval_mean_token_accuracy", "max"), ("reward", "eval_accuracy", "max")])
def test_mode_auto_on_the_metrics_trl_logs(tmp_path, kind, monitor, mode):
    """docs/early_stopping.md's trl example: mode="auto" knows the direction, and the metric is
    observed in a real trl trainer (it reaches EarlyStopping through on_log, not on_evaluate)."""
    pytest.importorskip("trl")
    from hf_callbacks_plus.integrations.ordering import run_before_integrations
    from tests.trl_peft import runs

    stopper = EarlyStopping(monitor, patience=50)
    assert stopper.resolved_mode == mode
    trainer = runs.trainer(kind, tmp_path, with_subset_eval=False)
    run_before_integrations(trainer, stopper)
    trainer.train()
    assert stopper.best_value is not None and stopper.best_step in (2, 4) and not stopper.stopped


@pytest.mark.parametrize(("metric", "monitor"), [("loss", "eval_loss"), ("accuracy", "eval_accuracy"),
                                                 ("eval_f1", "eval_f1"), ("eval/f1", "eval/f1")])
def test_monitor_none_reads_metric_for_best_model_as_transformers_does(metric, monitor):
    """transformers prefixes eval_ ("loss" is eval_loss, the default with load_best_model_at_end); before,
    EarlyStopping() with metric_for_best_model="loss" watched the training loss."""
    from types import SimpleNamespace

    stopper = EarlyStopping(patience=1)
    stopper._check_settings(SimpleNamespace(metric_for_best_model=metric, greater_is_better=False))
    assert stopper.monitor_name == monitor
