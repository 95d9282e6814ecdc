"""GenerationSamples under every sharding engine (DeepSpeed ZeRO-1/2/3, FSDP2, FSDP1 with both
state-dict types, DDP), through a stock ``Trainer``, ``TrainerPlus`` and trl's ``SFTTrainer`` with
LoRA, on the 2 ranks of the suite's launch (scenario: ``tests/callbacks/sharded_callbacks.py``).

Before: ZeRO-3 crashed at the first evaluation (rank 0 generated alone; gloo's "Received data size
doesn't match"), FSDP2 hung (rank 0 alone in the all-gathers), FSDP1 raised "'weight' must be 2-D".

Ground truth, independent of the callback: at each evaluation a test-side callback gathers every
parameter whole (``tests/sharded.full_weights``); here, in one process, the unsharded tiny Llama
(with the same LoRA adapter for SFT) loads them and generates each prompt alone, greedily. The 5
prompts have different lengths and split unevenly (3 and 2) over the 2 ranks in batches of 2, so
the callback generates left-padded batches, and under sharding rank 1 makes a spare call.
"""

from __future__ import annotations

import json

import pytest

from tests.callbacks.sharded_callbacks import MAX_NEW_TOKENS, STEPS, callbacks_under_engine, prompts
from tests.sharded import TRAINERS, engine_scenarios

pytestmark = [pytest.mark.transformers, pytest.mark.slow]
pytest.importorskip("deepspeed")
pytest.importorskip("trl")

FIRST_TIER = ("zero3", "fsdp2")


def unsharded_model(weights: dict, trainer: str):
    from tests.sharded import model

    reference = model()
    if trainer == "sft_lora":
        from peft import get_peft_model

        from tests.trl_peft import tiny_lm

        reference = get_peft_model(reference, tiny_lm.lora_config())
    reference.load_state_dict(weights, strict=True)
    return reference.eval()


def expected_completions(weights: dict, trainer: str) -> list[str]:
    """Each prompt generated alone, greedily, by the unsharded model with ``weights``."""
    import torch

    from tests.sharded import tokenizer

    reference, encode = unsharded_model(weights, trainer), tokenizer()
    texts = []
    for prompt in prompts():
        encoded = encode(prompt, return_tensors="pt")
        with torch.no_grad():
            output = reference.generate(**encoded, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                        pad_token_id=encode.pad_token_id)
        texts.append(encode.decode(output[0, encoded["input_ids"].shape[1]:], skip_special_tokens=True))
    return texts


@pytest.mark.parametrize(("engine", "trainer"), engine_scenarios(callbacks_under_engine, trainers=TRAINERS,
                                                                 first_tier=FIRST_TIER))
def test_generations_equal_the_unsharded_model(engine, trainer, distributed_outcome):
    import torch

    rank0, rank1 = distributed_outcome.json()
    for got in (rank0, rank1):  # the trainer's own records (loss, grad_norm, eval_loss...) unchanged
        assert got["with"] == got["without"]
    steps = list(range(2, STEPS + 1, 2))
    assert rank0["files"] == [f"step-{step}.jsonl" for step in steps]
    assert rank1["files"] == []  # rank 0 alone writes
    folder = distributed_outcome.dir / "with" / "generations"
    assert sorted(path.name for path in folder.iterdir()) == rank0["files"]
    for step in steps:
        rows = [json.loads(line) for line in (folder / f"step-{step}.jsonl").read_text().splitlines()]
        assert [(row["step"], row["prompt"]) for row in rows] == [(step, prompt) for prompt in prompts()]
        weights = torch.load(distributed_outcome.dir / f"weights-{step}.pt", weights_only=True)
        assert [row["completion"] for row in rows] == expected_completions(weights, trainer), step
        assert all(row["completion"] for row in rows)
