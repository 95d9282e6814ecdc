"""GenerationSamples in trl's SFTTrainer (LoRA): the same prompts at every evaluation, greedy
completions equal to ``model.generate`` on the weights of that moment, a file per evaluation."""

from __future__ import annotations

import json

import pytest

from hf_callbacks_plus import GenerationSamples, run_before_integrations
from tests.trl_peft import runs, tiny_lm


def test_generations_at_every_evaluation(tmp_path):
    samples = GenerationSamples(num_samples=2, max_new_tokens=5)
    trainer = runs.trainer("sft", tmp_path, peft=True, with_subset_eval=False, callbacks=[samples])
    run_before_integrations(trainer)
    trainer.train()
    assert [p.name for p in samples.files] == ["step-2.jsonl", "step-4.jsonl"]
    rows = [json.loads(line) for line in samples.files[-1].read_text().splitlines()]
    words = tiny_lm.texts()[1000].split()
    assert rows[0]["prompt"] == " ".join(words[: len(words) // 2]) and rows[0]["step"] == 4
    # the final weights are those of the last evaluation: generate again, independently
    import torch

    tokenizer = tiny_lm.tokenizer()
    encoded = tokenizer(rows[0]["prompt"], return_tensors="pt")
    with torch.no_grad():
        output = trainer.model.generate(
            **encoded, max_new_tokens=5, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
    assert rows[0]["completion"] == tokenizer.decode(
        output[0, encoded["input_ids"].shape[1] :], skip_special_tokens=True
    )


def test_errors(tmp_path):
    with pytest.raises(TypeError, match="prompts must be a list of strings"):
        GenerationSamples(prompts="hello")
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1, got 0"):
        GenerationSamples(prompts=["a"], max_new_tokens=0)
    from datasets import Dataset

    trainer = runs.trainer("sft", tmp_path, with_subset_eval=False, callbacks=[GenerationSamples()])
    trainer.eval_dataset = Dataset.from_list([{"input_ids": [1, 2]}])
    run_before_integrations(trainer)
    with pytest.raises(ValueError, match="no 'prompt' or 'text' column"):
        trainer.train()


def test_generations_reach_the_mlflow_run(tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from hf_callbacks_plus import MLflowLogger

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    samples = GenerationSamples(prompts=["the movie was"], max_new_tokens=3, log_to_trackers=True)
    trainer = runs.trainer(
        "sft",
        tmp_path,
        with_subset_eval=False,
        callbacks=[samples, MLflowLogger(tracking_uri=uri, experiment_name="gen")],
    )
    run_before_integrations(trainer)
    trainer.train()
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("gen").experiment_id])
    assert sorted(item.path for item in client.list_artifacts(run.info.run_id)) == [
        "generations_step-2",
        "generations_step-4",
    ]
