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


@pytest.mark.transformers
def test_never_seen_metric_raises_at_train_end(tmp_path):
    """With several eval datasets, 'eval_score' (no dataset) is never produced: caught at the end."""
    from tests.tiny_models import RegressionDataset

    stopper = EarlyStopping("eval_score", mode="min")
    trainer = scripted_trainer(tmp_path, lambda step: 1.0, callbacks=[stopper], max_steps=2)
    trainer.eval_dataset = {"a": RegressionDataset(8)}
    with pytest.raises(RuntimeError, match=r"no evaluation of this run returned the monitored metric.*"
                                           r"Did you mean 'eval_a_score'"):
        trainer.train()
