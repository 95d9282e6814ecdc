"""The isolation pieces without a trainer: accumulator registry, set-aside, relabelling."""

from __future__ import annotations

from collections import defaultdict, deque

import pytest

from hf_callbacks_plus.runtime import isolated_evaluation as iso


class TrlLikeTrainer:
    """Holds accumulators shaped like trl's (``_metrics``, GRPO's ``_logs``) and a user one."""

    def __init__(self):
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self._metrics["eval"]["mean_token_accuracy"].append(0.25)
        self._logs = {"prompt": deque(["p"], maxlen=8), "rewards": defaultdict(lambda: deque(maxlen=8))}
        self._my_counts = [1, 2]
        self._gen_kwargs = {"max_length": 5}


def test_accumulators_are_empty_inside_and_the_originals_back_after(monkeypatch):
    monkeypatch.setitem(iso.TRAINER_ACCUMULATORS, "_my_counts", "fresh")
    trainer = TrlLikeTrainer()
    originals = {name: getattr(trainer, name) for name in ("_metrics", "_logs", "_my_counts", "_gen_kwargs")}
    with iso.accumulators_set_aside(trainer):
        assert set(trainer._metrics) == {"train", "eval"} and not trainer._metrics["eval"]
        trainer._metrics["eval"]["entropy"].append(1.0)  # defaultdict(list) kept its factory
        assert trainer._logs["prompt"].maxlen == 8 and not trainer._logs["prompt"]
        assert trainer._my_counts == []
        assert trainer._gen_kwargs is originals["_gen_kwargs"]  # "restore": kept during the block
        trainer._gen_kwargs = {"max_length": 99}
    for name, original in originals.items():
        assert getattr(trainer, name) is original
    assert trainer._metrics["eval"] == {"mean_token_accuracy": [0.25]}


def test_register_validates_and_adds(monkeypatch):
    monkeypatch.setattr(iso, "TRAINER_ACCUMULATORS", dict(iso.TRAINER_ACCUMULATORS))
    iso.register_trainer_accumulator("_mine")
    assert iso.TRAINER_ACCUMULATORS["_mine"] == "fresh"
    with pytest.raises(ValueError, match=r"policy must be 'fresh' or 'restore', got 'keep'"):
        iso.register_trainer_accumulator("_x", "keep")
    with pytest.raises(ValueError, match="attribute must be a non-empty name, got ''"):
        iso.register_trainer_accumulator("")


def test_relabel_keeps_the_prefix_renames_eval_and_drops_timing_and_counters():
    raw = {"train_subset_loss": 1.0, "train_subset_runtime": 0.1, "train_subset_samples_per_second": 5.0,
           "eval_mean_token_accuracy": 0.3, "eval_num_tokens": 100.0, "epoch": 1.0,
           "num_input_tokens_seen": 7}
    assert iso.relabel_metrics(raw, "train_subset") == {
        "train_subset_loss": 1.0, "train_subset_mean_token_accuracy": 0.3}
