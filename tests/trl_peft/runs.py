"""Building and running trl trainers on the tiny LM, with or without our callbacks."""

from __future__ import annotations

import warnings
from typing import Any

from hf_callbacks_plus.callbacks.train_subset.sampling import choose_indices
from tests.trl_peft import tiny_lm

N_TRAIN, N_EVAL, SUBSET = 32, 8, 8
TIMING = ("runtime", "per_second", "preparation_time")


def subset_indices(size: int = SUBSET, seed: int = 42) -> list[int]:
    return choose_indices(N_TRAIN, size, seed)


def config(kind: str, output_dir: Any, **overrides: Any) -> Any:
    import trl

    values: dict[str, Any] = {
        "output_dir": str(output_dir), "max_steps": 4, "eval_strategy": "steps", "eval_steps": 2,
        "logging_steps": 2, "per_device_train_batch_size": 8, "per_device_eval_batch_size": 8,
        "learning_rate": 5e-3, "report_to": "none", "use_cpu": True, "disable_tqdm": True, "seed": 0,
        "save_strategy": "no", "max_length": 32,
    }
    values.update(overrides)
    return {"sft": trl.SFTConfig, "dpo": trl.DPOConfig, "reward": trl.RewardConfig}[kind](**values)


def datasets(kind: str, with_subset_eval: bool) -> tuple[Any, Any]:
    """(train, eval) where eval is ``{"main": held-out, "sub": the train subset rows}`` if asked."""
    if kind == "sft":
        make = tiny_lm.sft_dataset
    else:
        def make(start, n):
            return tiny_lm.preference_dataset(start, n, with_prompt=kind == "dpo")
    train, held_out = make(0, N_TRAIN), make(1000, N_EVAL)
    if not with_subset_eval:
        return train, held_out
    return train, {"main": held_out, "sub": train.select(subset_indices())}


def trainer(kind: str, output_dir: Any, *, base: Any = None, callbacks=(), peft: bool = False,
            with_subset_eval: bool = True, model: Any = None, compute_metrics: Any = None,
            **overrides: Any) -> Any:
    import trl

    base = base or {"sft": trl.SFTTrainer, "dpo": trl.DPOTrainer, "reward": trl.RewardTrainer}[kind]
    train, evaluation = datasets(kind, with_subset_eval)
    if model is None:
        model = tiny_lm.reward_model() if kind == "reward" else tiny_lm.causal_lm()
    kwargs: dict[str, Any] = {}
    if compute_metrics is not None:
        kwargs["compute_metrics"] = compute_metrics
    if kind == "dpo" and not peft:
        kwargs["ref_model"] = tiny_lm.causal_lm()  # same seed: the policy's initial weights
    if peft:
        kwargs["peft_config"] = tiny_lm.lora_config(task_type="SEQ_CLS" if kind == "reward" else "CAUSAL_LM")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return base(model=model, args=config(kind, output_dir, **overrides), train_dataset=train,
                    eval_dataset=evaluation, processing_class=tiny_lm.tokenizer(), callbacks=list(callbacks),
                    **kwargs)


def history(trainer: Any) -> list[dict[str, Any]]:
    """``state.log_history`` without the timing keys (they differ between any two runs)."""
    return [{k: v for k, v in record.items() if not any(t in k for t in TIMING)}
            for record in trainer.state.log_history]


def assert_same_numbers(baseline: list[dict], ours: list[dict], extra_prefixes: tuple[str, ...]) -> int:
    """Every key of every baseline record is in ours with the identical value, and ours adds
    only keys starting with ``extra_prefixes``; returns the number of values compared."""
    assert len(ours) == len(baseline), (len(ours), len(baseline))
    checked = 0
    for index, (expected, got) in enumerate(zip(baseline, ours)):
        differing = {k: (v, got.get(k, "<missing>")) for k, v in expected.items()
                     if got.get(k, "<missing>") != v}
        assert not differing, (index, differing)
        added = [k for k in got if k not in expected and not k.startswith(extra_prefixes)]
        assert not added, (index, added)
        checked += len(expected)
    return checked
