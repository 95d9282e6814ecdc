"""trl trainers keep their own numbers with our callbacks attached, through every wiring,
and the train-subset metrics are the trainer's own metrics on the subset.

Each run evaluates ``eval_dataset={"main": held-out, "sub": the train-subset rows}``: the
baseline (plain trl trainer, no callback of ours) thereby reports the trainer's own metrics
on exactly the rows ``TrainSubsetEvaluation`` picks, at the same steps and weights.
"""

from __future__ import annotations

from typing import Any

import pytest

from hf_callbacks_plus.callbacks.early_stopping import EarlyStopping
from hf_callbacks_plus.callbacks.terminate_on_nonfinite import TerminateOnNonFinite
from hf_callbacks_plus.callbacks.train_subset import TrainSubsetEvaluation
from hf_callbacks_plus.integrations.transformers import TrainerPlusMixin, run_before_integrations
from hf_callbacks_plus.loggers.jsonl import JsonlLogger
from tests.trl_peft import runs

pytestmark = [pytest.mark.transformers, pytest.mark.slow]

_BASELINES: dict[str, list[dict]] = {}


def baseline(kind, tmp_path_factory):
    if kind not in _BASELINES:
        trainer = runs.trainer(kind, tmp_path_factory.mktemp(f"baseline-{kind}"))
        trainer.train()
        _BASELINES[kind] = runs.history(trainer)
    return _BASELINES[kind]


def our_callbacks(tmp_path):
    subset = TrainSubsetEvaluation(size=runs.SUBSET, gap_metrics=True)
    return subset, [subset, EarlyStopping("eval_main_loss", patience=50), TerminateOnNonFinite(),
                    JsonlLogger(str(tmp_path / "metrics.jsonl"))]


def run_ours(kind, tmp_path, wiring):
    subset, callbacks = our_callbacks(tmp_path)
    if wiring == "mixin":
        import trl

        base = {"sft": trl.SFTTrainer, "dpo": trl.DPOTrainer, "reward": trl.RewardTrainer}[kind]
        cls = type(f"Plus{base.__name__}", (TrainerPlusMixin, base), {})
        trainer = runs.trainer(kind, tmp_path / "out", base=cls, callbacks=callbacks)
    else:
        trainer = runs.trainer(kind, tmp_path / "out", callbacks=callbacks)
        run_before_integrations(trainer, *callbacks)
    trainer.train()
    return subset, runs.history(trainer)


#: Metrics each trainer reports at evaluation besides the loss (what the subset must show too).
OWN_EVAL_METRICS = {
    "sft": ("mean_token_accuracy", "entropy"),
    "dpo": ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
            "logps/rejected", "logits/chosen", "logits/rejected", "mean_token_accuracy", "entropy"),
    "reward": ("accuracy", "margin", "min_reward", "mean_reward", "max_reward"),
}


#: The first tier runs each trainer once and each wiring with SFT; the second tier, the whole matrix.
SECOND_TIER = {("dpo", "run_before_integrations"), ("reward", "mixin"), ("grpo", "mixin")}


def cell(kind: str, wiring: str) -> Any:
    marks = [pytest.mark.compat] if kind == "sft" else []
    marks += [pytest.mark.second_tier] if (kind, wiring) in SECOND_TIER else []
    return pytest.param(kind, wiring, marks=marks, id=f"{wiring}-{kind}")


@pytest.mark.parametrize(("kind", "wiring"), [cell(kind, wiring) for kind in ("sft", "dpo", "reward")
                                              for wiring in ("run_before_integrations", "mixin")])
def test_trainer_numbers_unchanged_and_subset_metrics_are_its_own(kind, wiring, tmp_path, tmp_path_factory):
    expected = baseline(kind, tmp_path_factory)
    subset, ours = run_ours(kind, tmp_path, wiring)
    assert subset.indices == runs.subset_indices()

    # 1. every key of every record (training logs, both eval sets, the final record) is identical
    checked = runs.assert_same_numbers(expected, ours, (f"{subset.prefix}_", "gap_", "early_stopping/"))
    assert checked > 40

    # 2. the train-subset metrics of each evaluation = the trainer's own metrics on those rows
    prefix = subset.prefix
    sub_records = [r for r in expected if "eval_sub_loss" in r]
    main_records = [r for r in ours if "eval_main_loss" in r]
    assert len(sub_records) == len(main_records) == 2
    for sub, record in zip(sub_records, main_records):
        assert record[f"{prefix}_loss"] == pytest.approx(sub["eval_sub_loss"], rel=1e-6)
        for name in OWN_EVAL_METRICS[kind]:
            # trl labels its own eval metrics "eval_<name>" whatever the dataset name
            assert record[f"{prefix}_{name}"] == pytest.approx(sub[f"eval_{name}"], rel=1e-6), name
        assert record["gap_loss"] == pytest.approx(record[f"{prefix}_loss"] - record["eval_main_loss"])


def reward_words(completions, **kwargs):
    """A trivial GRPO reward: the number of words of each completion."""
    return [float(len(completion.split())) for completion in completions]


def grpo_run(output_dir, wiring=None):
    import trl

    prompts = [" ".join(text.split()[:3]) for text in runs.tiny_lm.texts()]
    from datasets import Dataset

    train = Dataset.from_list([{"prompt": p} for p in prompts[:16]])
    held_out = Dataset.from_list([{"prompt": p} for p in prompts[1000:1004]])
    args = trl.GRPOConfig(
        output_dir=str(output_dir), max_steps=4, eval_strategy="steps", eval_steps=2, logging_steps=2,
        per_device_train_batch_size=4, per_device_eval_batch_size=4, num_generations=2,
        num_generations_eval=2, max_completion_length=4, learning_rate=1e-2, report_to="none", use_cpu=True,
        disable_tqdm=True, seed=0, save_strategy="no")
    subset = TrainSubsetEvaluation(size=4, gap_metrics=True)
    callbacks = [subset, EarlyStopping("eval_reward", mode="max", patience=50)] if wiring else []
    base = trl.GRPOTrainer
    if wiring == "mixin":
        base = type("PlusGRPOTrainer", (TrainerPlusMixin, trl.GRPOTrainer), {})
    trainer = base(model=runs.tiny_lm.causal_lm(), reward_funcs=reward_words, args=args, train_dataset=train,
                   eval_dataset=held_out, processing_class=runs.tiny_lm.tokenizer(), callbacks=callbacks)
    if wiring == "run_before_integrations":
        run_before_integrations(trainer, *callbacks)
    trainer.train()
    timing = ("step_time",)
    return subset, [{k: v for k, v in r.items() if k not in timing} for r in runs.history(trainer)]


@pytest.mark.parametrize(("kind", "wiring"), [cell("grpo", "run_before_integrations"), cell("grpo", "mixin")])
def test_grpo_numbers_unchanged_and_subset_rewards_reported(kind, wiring, tmp_path, tmp_path_factory):
    """GRPO generates completions (sampling: random generators) at every evaluation."""
    if "grpo" not in _BASELINES:
        _BASELINES["grpo"] = grpo_run(tmp_path_factory.mktemp("baseline-grpo"))[1]
    subset, ours = grpo_run(tmp_path, wiring)
    runs.assert_same_numbers(_BASELINES["grpo"], ours, (f"{subset.prefix}_", "gap_", "early_stopping/"))
    evaluations = [r for r in ours if "eval_loss" in r]
    assert len(evaluations) == 2
    for record in evaluations:
        for name in ("reward", "reward_std", "rewards/reward_words/mean", "completions/mean_length"):
            assert f"{subset.prefix}_{name}" in record, name
        gap = record[f"{subset.prefix}_reward"] - record["eval_reward"]
        assert record["gap_reward"] == pytest.approx(gap)


class ArgumentsProbe:
    """Reads, at each evaluation record, the arguments the subset evaluation will use."""

    def __init__(self):
        self.trainer, self.seen = None, []

    def bind(self, trainer):
        self.trainer = trainer

    def on_pre_log(self, args, state, control, logs=None, **kwargs):
        from hf_callbacks_plus.runtime.isolated_evaluation import evaluation_arguments

        if "eval_runtime" in logs:
            self.seen.append(evaluation_arguments(self.trainer))

    def __getattr__(self, name):  # every other event: nothing to do
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)


@pytest.mark.parametrize("wiring", ["stock", "mixin"])
def test_sft_evaluate_arguments_are_recorded_where_the_call_passes(tmp_path, wiring):
    """trl's SFTTrainer overrides ``evaluate``: the arguments of the call in progress reach the
    subset evaluation through the recording (a wrapper set at bind for the stock trainer,
    ``TrainerPlusMixin.evaluate`` for the mixin), and the stack is empty after each call."""
    import trl

    from hf_callbacks_plus.runtime.isolated_evaluation import evaluation_arguments

    subset, probe = TrainSubsetEvaluation(size=runs.SUBSET), ArgumentsProbe()
    base = type("PlusSFTTrainer", (TrainerPlusMixin, trl.SFTTrainer), {}) if wiring == "mixin" else None
    trainer = runs.trainer("sft", tmp_path, base=base, callbacks=[subset, probe], with_subset_eval=False,
                           max_steps=2)
    if wiring == "stock":
        run_before_integrations(trainer)
    before = trainer.evaluate(ignore_keys=["past_key_values"])
    trainer.train(ignore_keys_for_eval=["hidden_states"])
    assert probe.seen == [{"ignore_keys": ["past_key_values"]}, {"ignore_keys": ["hidden_states"]}]
    assert evaluation_arguments(trainer) == {}
    during = [r for r in trainer.state.log_history if "train_subset_loss" in r]
    assert len(during) == 1 and all("train_subset_mean_token_accuracy" in r for r in (before, *during))
