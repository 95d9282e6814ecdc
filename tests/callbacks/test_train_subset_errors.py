"""TrainSubsetEvaluation says what is wrong at the earliest moment it is knowable:
at construction, or at train begin before any training step, never at the first evaluation.
"""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

from hf_callbacks_plus.callbacks.train_subset import TrainSubsetEvaluation  # noqa: E402
from hf_callbacks_plus.integrations.ordering import run_before_integrations  # noqa: E402
from tests.tiny_models import make_trainer  # noqa: E402

pytestmark = pytest.mark.transformers

ARGS = {"max_steps": 4, "eval_strategy": "steps", "eval_steps": 2, "logging_steps": 2}


class StepCounter:
    def __init__(self) -> None:
        self.steps = 0


def wired(tmp_path, *callbacks, **overrides):
    trainer = make_trainer(tmp_path, callbacks=list(callbacks), **{**ARGS, **overrides})
    run_before_integrations(trainer)
    return trainer


def test_a_misspelt_stratify_column_is_refused_at_train_begin_with_did_you_mean(tmp_path):
    trainer = wired(tmp_path, TrainSubsetEvaluation(size=8, stratify_by="label"))
    with pytest.raises(ValueError, match=r"stratify_by='label'.*keys \['input_x', 'labels'\].*'labels'"):
        trainer.train()
    assert trainer.state.global_step == 0


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        for i in range(64):
            yield {"input_x": torch.tensor(float(i)), "labels": torch.tensor(float(i))}


def test_an_iterable_training_set_is_refused_at_train_begin(tmp_path):
    trainer = wired(tmp_path, TrainSubsetEvaluation(size=8))
    trainer.train_dataset = Stream()
    with pytest.raises(TypeError, match=r"sized and indexable.*Stream.*dataset="):
        trainer.train()
    assert trainer.state.global_step == 0


def test_two_instances_with_one_prefix_are_refused_at_train_begin(tmp_path):
    trainer = wired(tmp_path, TrainSubsetEvaluation(size=8), TrainSubsetEvaluation(size=16))
    with pytest.raises(ValueError, match=r"prefix='train_subset'.*overwrite"):
        trainer.train()
    assert trainer.state.global_step == 0
    # with distinct prefixes both report
    trainer = wired(tmp_path / "ok", TrainSubsetEvaluation(size=8),
                    TrainSubsetEvaluation(size=16, prefix="train_subset_large"))
    trainer.train()
    last = [r for r in trainer.state.log_history if "eval_loss" in r][-1]
    assert "train_subset_loss" in last and "train_subset_large_loss" in last


def test_a_tiny_size_warns_at_construction(caplog):
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        TrainSubsetEvaluation(size=1)
    assert "size=1" in caplog.text and "noise" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        TrainSubsetEvaluation(size=256)
        TrainSubsetEvaluation(size=0.01)
    assert caplog.text == ""


class Unlabeled(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, index):
        return {"input_x": torch.tensor(float(index))}


@pytest.mark.parametrize("with_compute_metrics", [True, False])
def test_an_unlabeled_subset_warning_tells_the_truth_about_compute_metrics(tmp_path, caplog,
                                                                           with_compute_metrics):
    from tests.tiny_models import regression_metrics

    subset = TrainSubsetEvaluation(size=8, dataset=Unlabeled())
    trainer = make_trainer(tmp_path, callbacks=[subset],
                           compute_metrics=regression_metrics if with_compute_metrics else None, **ARGS)
    run_before_integrations(trainer)
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        subset.compute()
    if with_compute_metrics:
        assert "has no compute_metrics" not in caplog.text and "returned nothing" in caplog.text
    else:
        assert "has no compute_metrics" in caplog.text
