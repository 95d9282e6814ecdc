"""StreamingMetrics in trl's SFTTrainer (full model and LoRA), side by side with the same
SFTTrainer given a stock compute_metrics over every logit."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("torchmetrics")

from hf_callbacks_plus import EarlyStopping, TrainSubsetEvaluation, run_before_integrations  # noqa: E402
from hf_callbacks_plus.callbacks.streaming_metrics import StreamingMetrics  # noqa: E402
from tests.streaming_reference import assert_same_metrics, reference_compute_metrics  # noqa: E402
from tests.trl_peft import runs  # noqa: E402


@pytest.mark.compat
@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_sft_evaluation_equals_a_stock_compute_metrics(peft, tmp_path, caplog):
    stock = runs.trainer(
        "sft",
        tmp_path / "stock",
        peft=peft,
        with_subset_eval=False,
        compute_metrics=reference_compute_metrics("causal_lm"),
    )
    stock.train()
    expected = {k: v for k, v in stock.state.log_history[-2].items()}  # the last evaluation

    callback = StreamingMetrics(task="causal_lm")
    ours = runs.trainer(
        "sft",
        tmp_path / "ours",
        peft=peft,
        with_subset_eval=False,
        callbacks=[
            callback,
            TrainSubsetEvaluation(size=8),
            EarlyStopping(monitor="eval_token_accuracy", patience=10),
        ],
    )
    run_before_integrations(ours)
    assert ours.args.batch_eval_metrics is True
    with caplog.at_level(logging.WARNING, logger="hf_callbacks_plus"):
        ours.train()
    record = ours.state.log_history[-2]
    assert_same_metrics(
        record, {"token_accuracy": expected["eval_token_accuracy"], "perplexity": expected["eval_perplexity"]}
    )
    assert record["eval_mean_token_accuracy"] == expected["eval_mean_token_accuracy"]  # trl's own, untouched
    assert "train_subset_token_accuracy" in record and "train_subset_perplexity" in record

    training = [r for r in ours.state.log_history if "loss" in r]
    if any("token_accuracy" in r for r in training):  # trl builds the training logits (trl < 1.0)
        assert all(0.0 <= r["token_accuracy"] <= 1.0 for r in training)
    else:  # trl's fused LM head: no logits in training, said once
        said = [r.getMessage() for r in caplog.records if "no logits" in r.getMessage()]
        assert len(said) == 1 and "SFTTrainer" in said[0]


def test_sft_builds_the_logits_with_a_second_forward_pass_per_evaluation_batch(tmp_path):
    """What docs/streaming_metrics.md says of trl's SFTTrainer: its fused LM head builds no logits,
    so any compute_metrics (StreamingMetrics too) costs one more forward pass per evaluation
    batch; without one, one pass per batch. A trl release that changes this fails here."""
    import warnings

    passes = {}
    streaming = [StreamingMetrics(task="causal_lm", train_metrics=None)]
    for name, callbacks in (("alone", []), ("streaming", streaming)):
        trainer = runs.trainer("sft", tmp_path / name, callbacks=callbacks, with_subset_eval=False,
                               per_device_eval_batch_size=2)
        if callbacks:
            run_before_integrations(trainer)
        calls = []
        hook = trainer.model.register_forward_pre_hook(lambda module, args: calls.append(1))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            metrics = trainer.evaluate()
        hook.remove()
        passes[name] = len(calls) / len(trainer.get_eval_dataloader())
        assert ("eval_token_accuracy" in metrics) == bool(callbacks)
    assert passes == {"alone": 1.0, "streaming": 2.0}
