"""Every EarlyStopping misconfiguration raises with argument, value and valid choices."""

from __future__ import annotations

import logging

import pytest

from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
from tests.callbacks.early_stopping_helpers import scripted_trainer


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"monitor": ""}, TypeError,
         r"monitor must be a non-empty string \(e.g. 'eval_loss'\) or None .* got ''"),
        ({"monitor": 1}, TypeError, r"monitor must be a non-empty string .* got 1"),
        ({"mode": "down"}, ValueError, r"mode must be one of \['min', 'max', 'auto'\], got 'down'"),
        ({"min_delta_mode": "pct"}, ValueError,
         r"min_delta_mode must be one of \['absolute', 'relative'\], got 'pct'"),
        ({"min_delta": -1}, ValueError, r"min_delta must be >= 0, got -1"),
        ({"min_delta": None}, TypeError, r"min_delta must be a number, got None"),
        ({"patience": -1}, ValueError, r"patience must be an int >= 0 \(evaluations without improvement"),
        ({"patience": 2.5}, TypeError, r"patience must be an int >= 0 .* got 2.5 \(float\)"),
        ({"patience": True}, TypeError, r"patience must be an int >= 0 .* got True \(bool\)"),
        ({"start_from_step": -3}, ValueError,
         r"start_from_step must be an int >= 0 \(warm-up steps\), got -3"),
        ({"start_from_epoch": -1.0}, ValueError, r"start_from_epoch must be >= 0, got -1.0"),
        ({"baseline": "0.5"}, TypeError, r"baseline must be a number or None, got '0.5' \(str\)"),
        ({"stopping_threshold": float("inf")}, ValueError, r"stopping_threshold must be finite, got inf"),
        ({"strict": "yes"}, TypeError, r"strict must be True or False, got 'yes'"),
        ({"restore_best": 1}, TypeError, r"restore_best must be True or False, got 1"),
        ({"log_name": "a/b"}, ValueError,
         r"log_name must be None or a non-empty string without '/', got 'a/b'"),
        ({"monitor": "eval_score"}, ValueError,
         r"mode='auto' cannot tell whether 'eval_score' .* mode='min'"),
        ({"monitor": "eval_loss", "baseline": 1.0, "stopping_threshold": 2.0}, ValueError,
         r"stopping_threshold=2.0 must be below or equal to baseline=1.0 in mode='min'"),
        ({"monitor": "eval_accuracy", "baseline": 0.5, "stopping_threshold": 0.4}, ValueError,
         r"stopping_threshold=0.4 must be above or equal to baseline=0.5 in mode='max'"),
        ({"monitor": "eval_loss", "baseline": 1.0, "divergence_threshold": 0.5}, ValueError,
         r"divergence_threshold=0.5 must be above baseline=1.0 in mode='min'"),
        ({"mode": "max", "stopping_threshold": 0.9, "divergence_threshold": 0.95}, ValueError,
         r"divergence_threshold=0.95 must be below stopping_threshold=0.9 in mode='max'"),
    ],
)
def test_construction_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        EarlyStopping(**kwargs)


@pytest.mark.transformers
@pytest.mark.parametrize(
    ("stopper", "args", "message"),
    [
        (lambda: EarlyStopping(), {},
         r"monitor=None takes the metric from args.metric_for_best_model, which is None. "
         r"Pass monitor='eval_loss'"),
        (lambda: EarlyStopping("eval_loss"), {"eval_strategy": "no"},
         r"monitor='eval_loss' is an evaluation metric but args.eval_strategy='no'.*\['steps', 'epoch'\]"),
        (lambda: EarlyStopping("loss"), {"logging_strategy": "no"},
         r"training-loop key 'loss', but args.logging_strategy='no'"),
        (lambda: EarlyStopping("test_accuracy"), {}, r"test_\* metrics only in predict\(\)"),
        (lambda: EarlyStopping("eval_accuracy"), {"prediction_loss_only": True},
         r"args.prediction_loss_only=True makes evaluation return only eval_loss"),
        (lambda: EarlyStopping(baseline=0.5, stopping_threshold=0.4),
         {"metric_for_best_model": "score", "greater_is_better": True},
         r"stopping_threshold=0.4 must be above or equal to baseline=0.5"),
    ],
)
def test_train_begin_errors(tmp_path, stopper, args, message):
    trainer = scripted_trainer(tmp_path, lambda step: 1.0, callbacks=[stopper()], max_steps=2, **args)
    with pytest.raises(ValueError, match=message):
        trainer.train()


@pytest.mark.transformers
def test_missing_metric_strict_lists_keys_and_suggests(tmp_path):
    stopper = EarlyStopping("eval_scor", mode="min")
    trainer = scripted_trainer(tmp_path, lambda step: 1.0, callbacks=[stopper], max_steps=2)
    expected = (r"the 'eval' evaluation did not return it. Metric 'eval_scor' was not found. "
                r"Available keys: \[.*'eval_score'.*\]. Did you mean 'eval_score'")
    with pytest.raises(RuntimeError, match=expected):
        trainer.train()


@pytest.mark.transformers
def test_missing_metric_not_strict_warns_once(tmp_path, caplog):
    stopper = EarlyStopping("eval_scor", mode="min", strict=False)
    trainer = scripted_trainer(tmp_path, lambda step: 1.0, callbacks=[stopper], max_steps=6)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        trainer.train()
    assert caplog.text.count("Metric 'eval_scor' was not found") == 1
    assert trainer.state.global_step == 6 and not stopper.stopped


@pytest.mark.transformers
def test_missing_training_loop_key_and_non_numeric_value(tmp_path):
    # LightweightTrainer logs no grad_norm when train_step does not return one
    from tests.callbacks.early_stopping_helpers import scripted_lightweight

    on_grad = EarlyStopping("grad_norm", mode="min")
    loop = scripted_lightweight(tmp_path, lambda step: 1.0, callbacks=[on_grad], max_steps=2)
    expected = r"Metric 'grad_norm' was not found. Available keys: \['epoch', 'loss'\]"
    with pytest.raises(RuntimeError, match=expected):
        loop.train()
    stopper = EarlyStopping("eval_label", mode="min")
    bad = scripted_trainer(tmp_path / "b", lambda step: 1.0, callbacks=[stopper], max_steps=2)
    bad.compute_metrics = lambda p: {"label": "cat"}
    with pytest.raises(TypeError, match=r"the monitored metric 'eval_label' is not a number: 'cat' \(str\)"):
        bad.train()


# -- when each error comes: construction, train begin, the first evaluation, never at the end ----------

@pytest.mark.parametrize(
    ("monitor", "meant"),
    [("eval_los", "eval_loss"), ("eval/los", "eval_loss"), ("eval_acuracy", "eval_accuracy"),
     ("train_subset_los", "train_subset_loss"), ("eval_squad_acuracy", "eval_squad_accuracy"),
     ("eval_rewards/acuracies", "eval_rewards/accuracies"), ("eval_mean_token_acuracy",
                                                              "eval_mean_token_accuracy")],
)
def test_typo_gets_did_you_mean_at_construction_not_the_mode_error(monitor, meant):
    expected = rf"looks like a misspelt metric name. Did you mean '{meant}'"
    with pytest.raises(ValueError, match=expected) as err:
        EarlyStopping(monitor)
    assert "cannot tell" not in str(err.value)
    EarlyStopping(monitor, mode="min")  # the user's own metric with that name: accepted


@pytest.mark.transformers
@pytest.mark.parametrize("runner", ["stock", "trainerplus"])
@pytest.mark.parametrize(
    ("monitor", "message"),
    [("eval_accuracy", r"no compute_metrics, so its evaluations return only 'eval_loss'.*Did you mean "
                       r"'eval_loss'"),
     ("eval/accuracy", r"no compute_metrics"), ("eval_los", r"no compute_metrics.*Did you mean 'eval_loss'")],
)
def test_metric_a_stock_trainer_cannot_produce_is_refused_at_train_begin(tmp_path, runner, monitor, message):
    """Mode given, no compute_metrics: known before any step (the trainer is bound at construction)."""
    from hf_callbacks_plus.integrations.ordering import run_before_integrations
    from hf_callbacks_plus.integrations.transformers import TrainerPlus
    from tests.tiny_models import make_trainer

    stopper = EarlyStopping(monitor, mode="max")
    if runner == "stock":
        trainer = make_trainer(tmp_path, compute_metrics=None, eval_strategy="steps", eval_steps=2,
                               max_steps=6)
        run_before_integrations(trainer, stopper)
    else:
        trainer = make_trainer(tmp_path, callbacks=[stopper], compute_metrics=None, trainer_class=TrainerPlus,
                               eval_strategy="steps", eval_steps=2, max_steps=6)
    with pytest.raises(ValueError, match=message):
        trainer.train()
    assert trainer.state.global_step == 0 and not any("eval_loss" in r for r in trainer.state.log_history)


@pytest.mark.transformers
def test_plain_eval_metric_with_named_eval_sets(tmp_path):
    """'eval_score' with eval_dataset={"a": ...}: bound -> train begin; a stock Trainer it never bound
    -> the first evaluation (step 2), with the did-you-mean; never a finished run that raises."""
    from hf_callbacks_plus.integrations.transformers import TrainerPlus
    from tests.tiny_models import RegressionDataset

    for runner, step in (("trainerplus", 0), ("stock", 2)):
        stopper = EarlyStopping("eval_score", mode="min")
        trainer = scripted_trainer(tmp_path / runner, lambda step: 1.0, callbacks=[stopper], max_steps=8,
                                   trainer_class=TrainerPlus if runner == "trainerplus" else None)
        trainer.eval_dataset = {"a": RegressionDataset(8)}  # assigned after construction: read at train begin
        error = ValueError if step == 0 else RuntimeError
        with pytest.raises(error, match=r"Did you mean 'eval_a_score'") as err:
            trainer.train()
        assert trainer.state.global_step == step, runner
        assert "eval_a_runtime" not in str(err.value).split("Did you mean")[1]


@pytest.mark.transformers
@pytest.mark.parametrize("first_has_it", [True, False])
def test_metric_present_in_some_evaluations_only(tmp_path, first_has_it):
    """The rule: strict raises only when the FIRST evaluation that should hold the metric lacks it;
    later evaluations without it are skipped observations (patience counts the others)."""
    holder = {}
    trainer = scripted_trainer(tmp_path, lambda step: 1.0, max_steps=24, callbacks=[
        stopper := EarlyStopping("eval_f1", mode="max", patience=2)])
    holder["trainer"] = trainer
    present = 0 if first_has_it else 1

    def every_other(eval_pred):  # f1 at every other evaluation, never improving after the first
        index = trainer.state.global_step // 2 - 1
        return {"f1": 0.5} if index % 2 == present else {}

    trainer.compute_metrics = every_other
    if first_has_it:
        trainer.train()
        # f1 at steps 2, 6, 10: best at 2, misses at 6 and 10 -> stop at 10 (steps 4, 8 skipped)
        assert (stopper.best_step, stopper.stopped_step) == (2, 10)
    else:
        with pytest.raises(RuntimeError, match=r"'eval_f1' was not found") as err:
            trainer.train()
        assert trainer.state.global_step == 2
        assert "eval_runtime" not in str(err.value).split("Did you mean")[-1]


def test_typo_with_mode_given_warns_at_construction(caplog):
    from types import SimpleNamespace

    from hf_callbacks_plus.core.state import TrainerControl, TrainerState

    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        stopper = EarlyStopping("eval_los", mode="min")
        stopper.patience = 5
    stopper.on_train_begin(SimpleNamespace(eval_strategy="steps", output_dir=None), TrainerState(),
                           TrainerControl())  # a later train begin does not repeat the warning
    assert caplog.text.count("looks like a misspelt 'eval_loss'") == 1


@pytest.mark.transformers
def test_near_miss_of_metric_for_best_model_is_refused_at_train_begin_with_mode_given(tmp_path):
    """A stock Trainer, not bound: args alone tell (the trainer selects on 'score')."""
    stopper = EarlyStopping("eval_scores", mode="min")
    trainer = scripted_trainer(tmp_path, lambda step: 1.0, callbacks=[stopper], max_steps=4,
                               metric_for_best_model="score", greater_is_better=False)
    with pytest.raises(ValueError, match=r"metric_for_best_model='score'. Did you mean 'eval_score'"):
        trainer.train()
    assert trainer.state.global_step == 0
