"""The train-subset evaluation is a twin of the trainer's own evaluation, across the options
that change how evaluation runs: persistent dataloader workers, SFT packing, DPO
precomputed reference log-probs (LoRA and full model), GRPO completions logging,
``eval_on_start``, gradient accumulation and several eval sets.

For each option two things are checked against independent ground truths:

* the trainer's own numbers are identical to the same run without our callbacks;
* the subset numbers logged at the last evaluation equal what the same trainer reports
  when those rows, **as prepared for training** (packed, with their precomputed columns), are
  its eval set: after training (no step after the last evaluation, so the same weights),
  ``trainer.eval_dataset`` is set to the rows and ``trainer.evaluate()`` runs the stock path.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

import pytest

from hf_callbacks_plus.callbacks.train_subset import TrainSubsetEvaluation
from hf_callbacks_plus.callbacks.train_subset.sampling import choose_indices
from hf_callbacks_plus.integrations.ordering import run_before_integrations
from tests.trl_peft import runs, tiny_lm

pytestmark = [pytest.mark.transformers, pytest.mark.slow]

SIZE = 8


def eval_records(trainer: Any, key: str) -> list[dict]:
    return [record for record in runs.history(trainer) if key in record]


def own_numbers(trainer: Any) -> list[dict]:
    """The trainer's own records, without what our callbacks add (keys, and with ``every=N`` the
    subset's own records)."""
    added = ("train_subset_", "gap_")
    own = []
    for record in runs.history(trainer):
        if any(key.startswith(added) for key in record) and set(record) <= {
                *(k for k in record if k.startswith(added)), "epoch", "step"}:
            continue
        own.append({k: v for k, v in record.items() if not k.startswith(added)})
    return own


def ground_truth(trainer: Any, rows: Any, prefix: str = "truth") -> dict[str, float]:
    """The stock evaluation of ``rows`` as the trainer's eval set (no preparation, no cache)."""
    trainer.eval_dataset = rows
    vars(trainer).pop("_eval_dataloaders", None)
    return trainer.evaluate(metric_key_prefix=prefix)


def assert_twin(logged: dict, truth: dict, names: tuple[str, ...], eval_prefix: str = "eval") -> None:
    for name in names:
        # trl labels its own eval metrics "eval_<name>" whatever the prefix
        expected = truth.get(f"truth_{name}", truth.get(f"eval_{name}"))
        assert expected is not None, (name, sorted(truth))
        assert logged[f"train_subset_{name}"] == pytest.approx(expected, rel=1e-5, abs=1e-7), name
    assert logged["train_subset_loss"] != logged[f"{eval_prefix}_loss"]  # not the eval set's numbers


# -- a stock Trainer on the tiny regression model ---------------------------------------------------

def regression_run(tmp_path: Any, with_ours: bool, **args: Any) -> tuple[Any, Any, Any]:
    """A stock Trainer with, when ``with_ours``, two subset evaluations: one joining each
    evaluation (``every="eval"``) and one every 4 steps with a record of its own."""
    from tests.tiny_models import make_trainer

    defaults = {"max_steps": 8, "eval_strategy": "steps", "eval_steps": 4, "logging_steps": 4}
    defaults.update(args)
    with_eval = TrainSubsetEvaluation(size=SIZE)
    every_n = TrainSubsetEvaluation(size=SIZE, every=4, prefix="train_subset_n")
    trainer = make_trainer(tmp_path, callbacks=[with_eval, every_n] if with_ours else [], **defaults)
    if with_ours:
        run_before_integrations(trainer)
    trainer.train()
    return trainer, with_eval, every_n


REGRESSION_OPTIONS = {
    "persistent-workers": {"dataloader_num_workers": 1, "dataloader_persistent_workers": True},
    "eval-on-start+grad-accumulation": {"eval_on_start": True, "gradient_accumulation_steps": 2},
}


@pytest.fixture
def close_dataloader_workers():
    """Shut the persistent dataloader workers a test left down when it ends. Left to the garbage
    collector, they are collected in a later test with their queues, and each worker's join then
    times out (5 s per worker: 15 s of the next test)."""
    yield
    import torch

    for obj in gc.get_objects():
        if isinstance(obj, torch.utils.data.dataloader._MultiProcessingDataLoaderIter):
            obj._shutdown_workers()


@pytest.mark.parametrize("option", sorted(REGRESSION_OPTIONS))
def test_regression_trainer_options(tmp_path, option, close_dataloader_workers):
    """``every="eval"`` and ``every=4`` in one run: with persistent workers the first gave the
    eval metrics themselves (gap 0), the second made the trainer evaluate the subset as its eval set."""
    import torch

    args = REGRESSION_OPTIONS[option]
    baseline, _, _ = regression_run(tmp_path / "baseline", False, **args)
    trainer, _, _ = regression_run(tmp_path / "ours", True, **args)
    assert own_numbers(trainer) == runs.history(baseline)  # the trainer's own, untouched
    indices = choose_indices(len(trainer.train_dataset), SIZE, 42)
    rows = torch.utils.data.Subset(trainer.train_dataset, indices)
    truth = ground_truth(trainer, rows)
    last_eval = eval_records(trainer, "train_subset_loss")[-1]
    assert_twin(last_eval, truth, ("loss", "mse", "mae"))
    last_n = eval_records(trainer, "train_subset_n_loss")[-1]
    assert last_n["train_subset_n_loss"] == pytest.approx(truth["truth_loss"], rel=1e-6)
    assert last_n["train_subset_n_loss"] != eval_records(trainer, "eval_loss")[-1]["eval_loss"]


def test_several_eval_sets_get_one_subset_evaluation_each_round(tmp_path):
    from tests.tiny_models import RegressionDataset, make_trainer

    subset = TrainSubsetEvaluation(size=SIZE, gap_metrics=True)
    trainer = make_trainer(tmp_path, callbacks=[subset], max_steps=8, eval_strategy="steps", eval_steps=4,
                           logging_steps=4)
    trainer.eval_dataset = {"a": RegressionDataset(16, seed=2), "b": RegressionDataset(16, seed=3)}
    run_before_integrations(trainer)
    trainer.train()
    with_subset = eval_records(trainer, "train_subset_loss")
    assert [r["step"] for r in with_subset] == [4, 8] and all("eval_a_loss" in r for r in with_subset)
    rows = [trainer.train_dataset[i] for i in choose_indices(len(trainer.train_dataset), SIZE, 42)]
    truth = ground_truth(trainer, rows)
    assert_twin(with_subset[-1], truth, ("loss", "mse"), eval_prefix="eval_a")
    assert with_subset[-1]["gap_loss"] == pytest.approx(with_subset[-1]["train_subset_loss"]
                                                        - with_subset[-1]["eval_a_loss"])


# -- trl: SFT packing, DPO precomputed reference log-probs, GRPO completions -------------------------

def trl_run(kind: str, tmp_path: Any, with_ours: bool, peft: bool = False,
            **overrides: Any) -> tuple[Any, Any]:
    subset = TrainSubsetEvaluation(size=SIZE)
    if kind == "dpo" and not peft and overrides.get("precompute_ref_log_probs"):
        import trl

        train, held_out = runs.datasets("dpo", with_subset_eval=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            config = runs.config("dpo", tmp_path, **overrides)
            trainer = trl.DPOTrainer(model=tiny_lm.causal_lm(), args=config,
                                     train_dataset=train, eval_dataset=held_out,
                                     processing_class=tiny_lm.tokenizer(),
                                     callbacks=[subset] if with_ours else [])
    else:
        trainer = runs.trainer(kind, tmp_path, callbacks=[subset] if with_ours else [], peft=peft,
                               with_subset_eval=False, **overrides)
    if with_ours:
        run_before_integrations(trainer)
    trainer.train()
    return trainer, subset


TRL_CASES = {
    "sft-packing": ("sft", False, {"packing": True}, ("loss", "mean_token_accuracy", "entropy")),
    "dpo-precompute-lora": ("dpo", True, {"precompute_ref_log_probs": True},
                            ("loss", "rewards/chosen", "rewards/margins", "logps/chosen")),
    "dpo-precompute-full": ("dpo", False, {"precompute_ref_log_probs": True},
                            ("loss", "rewards/chosen", "rewards/margins", "logps/chosen")),
}


@pytest.mark.parametrize("case", sorted(TRL_CASES))
def test_trl_trainer_options(tmp_path, case):
    kind, peft, overrides, names = TRL_CASES[case]
    baseline, _ = trl_run(kind, tmp_path / "baseline", False, peft, **overrides)
    trainer, subset = trl_run(kind, tmp_path / "ours", True, peft, **overrides)
    assert own_numbers(trainer) == runs.history(baseline)
    rows = trainer.train_dataset.select(subset.indices)  # the rows as prepared for training
    assert subset.indices == choose_indices(len(trainer.train_dataset), SIZE, 42)
    truth = ground_truth(trainer, rows)
    assert_twin(eval_records(trainer, "train_subset_loss")[-1], truth, names)


def test_grpo_completions_table_is_printed_for_the_trainer_only(tmp_path, monkeypatch):
    import trl.trainer.grpo_trainer as grpo_module

    from tests.trl_peft.test_trainer_metrics import grpo_run

    printed: list[int] = []
    monkeypatch.setattr(grpo_module, "print_prompt_completions_sample",
                        lambda *args, **kwargs: printed.append(args[4]))
    monkeypatch.setattr(grpo_module, "is_rich_available", lambda: True)
    original = grpo_module.GRPOConfig.__init__

    def with_completions(self, *args, **kwargs):
        original(self, *args, **{**kwargs, "log_completions": True})

    monkeypatch.setattr(grpo_module.GRPOConfig, "__init__", with_completions)
    grpo_run(tmp_path / "baseline")
    stock = list(printed)
    printed.clear()
    grpo_run(tmp_path / "ours", "run_before_integrations")
    assert stock and printed == stock  # same tables, same steps: none for the subset
