"""A tiny causal LM, a word-level tokenizer trained locally and tiny trl datasets (no hub).

Everything is real: a ``LlamaForCausalLM`` built from a config (2 layers, hidden 32), a
``tokenizers`` WordLevel tokenizer trained on the demo corpus, ``datasets.Dataset`` rows.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parents[2] / "examples" / "demo_data" / "reviews.jsonl"


@functools.lru_cache(maxsize=1)
def texts() -> tuple[str, ...]:
    with open(CORPUS, encoding="utf-8") as handle:
        return tuple(json.loads(line)["text"] for line in handle)


@functools.lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "<bos>", "<eos>"])
    tokenizer.train_from_iterator(texts()[:1000], trainer=trainer)
    return tokenizer.to_str()


def tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast`` (word level, ~400 words) with pad/bos/eos tokens."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
        pad_token="<pad>", unk_token="<unk>", bos_token="<bos>", eos_token="<eos>",
    )


def llama_config(vocab_size: int, **overrides: Any) -> Any:
    from transformers import LlamaConfig

    values: dict[str, Any] = {
        "vocab_size": vocab_size, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
        "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3,
    }
    values.update(overrides)
    return LlamaConfig(**values)


def causal_lm(seed: int = 0, vocab_size: int | None = None) -> Any:
    """A seeded 2-layer Llama (hidden 32) for the local tokenizer's vocabulary."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(vocab_size or len(tokenizer())))


def reward_model(seed: int = 0) -> Any:
    """A seeded 2-layer Llama with a 1-output sequence-classification head."""
    import torch
    from transformers import LlamaForSequenceClassification

    torch.manual_seed(seed)
    return LlamaForSequenceClassification(llama_config(len(tokenizer()), num_labels=1))


def lora_config(**overrides: Any) -> Any:
    from peft import LoraConfig

    values: dict[str, Any] = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"],
                              "lora_dropout": 0.0, "task_type": "CAUSAL_LM"}
    values.update(overrides)
    return LoraConfig(**values)


def sft_dataset(start: int, n: int) -> Any:
    from datasets import Dataset

    return Dataset.from_list([{"text": text} for text in texts()[start:start + n]])


def preference_dataset(start: int, n: int, *, with_prompt: bool = True) -> Any:
    """Rows ``{prompt, chosen, rejected}``: the real continuation vs the same words reversed."""
    from datasets import Dataset

    rows = []
    for text in texts()[start:start + n]:
        words = text.split()
        prompt, rest = " ".join(words[:3]), words[3:] or ["ok"]
        chosen, rejected = " ".join(rest), " ".join(reversed(rest)) + " bad"
        if with_prompt:
            rows.append({"prompt": prompt, "chosen": " " + chosen, "rejected": " " + rejected})
        else:
            rows.append({"chosen": f"{prompt} {chosen}", "rejected": f"{prompt} {rejected}"})
    return Dataset.from_list(rows)
