"""The demo's data and model, built locally: no hub, no network.

Shared by ``examples/demo.py``, the other examples and their tests:

- :func:`load_corpus` reads ``examples/demo_data/reviews.jsonl`` (a seeded, generated corpus
  of short review sentences with 10% label noise, see ``demo_data/generate.py``);
- :func:`train_vocabulary` trains a tiny WordPiece vocabulary with ``tokenizers`` (shipped as
  ``demo_data/vocab.txt``) and :func:`build_tokenizer` builds the tokenizer on it;
- :func:`build_datasets` returns tokenized ``datasets.Dataset`` train and eval splits;
- :func:`build_model` makes a BERT-style classifier from a tiny ``BertConfig``;
- :func:`compute_metrics` and :func:`data_collator` complete a ``transformers.Trainer``;
- :func:`output_dir_argument` is the small examples' command line (``[output_dir]``).

Example:
    >>> from demo_pipeline import build_tokenizer, build_datasets, build_model
    >>> tokenizer = build_tokenizer()
    >>> train, evaluation = build_datasets(tokenizer, n_train=800, n_eval=300)
    >>> model = build_model(tokenizer)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

DATA_PATH = Path(__file__).resolve().parent / "demo_data" / "reviews.jsonl"
VOCAB_PATH = DATA_PATH.with_name("vocab.txt")
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
MAX_LENGTH = 32

__all__ = [
    "DATA_PATH",
    "build_datasets",
    "build_model",
    "build_tokenizer",
    "compute_metrics",
    "data_collator",
    "example_sizes",
    "load_corpus",
    "output_dir_argument",
    "train_vocabulary",
    "training_arguments",
]


def load_corpus(path: Path = DATA_PATH) -> list[dict[str, Any]]:
    """Read the shipped corpus: a list of ``{"text": str, "label": 0 | 1}``."""
    with Path(path).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def train_vocabulary(vocab_size: int = 1000, path: Path = DATA_PATH) -> list[str]:
    """Train a WordPiece vocabulary on the corpus with ``tokenizers``.

    The trainer breaks frequency ties in a process-dependent order, so two trainings can
    give slightly different vocabularies: that is why the vocabulary is trained once
    (``python examples/demo_data/generate.py``) and shipped as ``demo_data/vocab.txt``, like a
    saved tokenizer. Every process (every rank under torchrun) then tokenizes identically.

    Args:
        vocab_size: Maximum vocabulary size (the corpus needs about 400). Defaults to 1000.
        path: Corpus file. Defaults to the shipped ``reviews.jsonl``.

    Returns:
        The tokens: special tokens first, then sorted.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS)
    tokenizer.train_from_iterator((row["text"] for row in load_corpus(path)), trainer=trainer)
    learned = tokenizer.get_vocab()
    return SPECIAL_TOKENS + sorted(token for token in learned if token not in SPECIAL_TOKENS)


def build_tokenizer(vocab_path: Path = VOCAB_PATH) -> Any:
    """A BERT-style WordPiece tokenizer (``tokenizers``) on the shipped vocabulary.

    Args:
        vocab_path: One token per line. Defaults to ``demo_data/vocab.txt`` (written by
            :func:`train_vocabulary` through ``demo_data/generate.py``).

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` with ``[PAD]``/``[CLS]``/``[SEP]`` tokens and a
        BERT-style ``[CLS] ... [SEP]`` post-processor.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokens = Path(vocab_path).read_text(encoding="utf-8").split("\n")
    vocab = {token: index for index, token in enumerate(t for t in tokens if t)}
    tokenizer = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tokenizer.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
        sep_token="[SEP]", mask_token="[MASK]", model_max_length=MAX_LENGTH,
    )


def build_datasets(tokenizer: Any, n_train: int = 800, n_eval: int = 400,
                   path: Path = DATA_PATH) -> tuple[Any, Any]:
    """Tokenized train and eval ``datasets.Dataset`` splits (disjoint, in file order).

    Args:
        tokenizer: From :func:`build_tokenizer`.
        n_train: Number of training examples. Defaults to 800.
        n_eval: Number of evaluation examples. Defaults to 400.
        path: Corpus file. Defaults to the shipped ``reviews.jsonl``.

    Returns:
        ``(train_dataset, eval_dataset)`` with columns ``input_ids``, ``attention_mask``,
        ``token_type_ids`` and ``labels`` (unpadded; pad with :func:`data_collator`).

    Raises:
        ValueError: If ``n_train + n_eval`` exceeds the corpus size.
    """
    from datasets import Dataset

    rows = load_corpus(path)
    if n_train < 1 or n_eval < 1 or n_train + n_eval > len(rows):
        raise ValueError(
            f"n_train + n_eval must be between 2 and {len(rows)} (the corpus size); "
            f"got n_train={n_train}, n_eval={n_eval}"
        )

    splits = []
    for part in (rows[:n_train], rows[n_train:n_train + n_eval]):
        encoded = tokenizer([row["text"] for row in part], truncation=True, max_length=MAX_LENGTH)
        splits.append(Dataset.from_dict({**encoded, "labels": [row["label"] for row in part]}))
    return splits[0], splits[1]


def build_model(tokenizer: Any, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 2,
                seed: int = 0) -> Any:
    """A tiny BERT-style sequence classifier (2 labels) built from a config, seeded.

    Args:
        tokenizer: From :func:`build_tokenizer` (gives the vocabulary size and pad id).
        hidden_size: Hidden size. Defaults to 64.
        num_layers: Transformer layers. Defaults to 2.
        num_heads: Attention heads. Defaults to 2.
        seed: Seed for the weight initialization. Defaults to 0.

    Returns:
        A ``transformers.BertForSequenceClassification`` (about 100k parameters).
    """
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, intermediate_size=2 * hidden_size,
        max_position_embeddings=MAX_LENGTH + 2, pad_token_id=tokenizer.pad_token_id, num_labels=2,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1},
    )
    torch.manual_seed(seed)
    return BertForSequenceClassification(config)


def compute_metrics(eval_pred: Any) -> dict[str, float]:
    """``compute_metrics`` for the classifier: accuracy."""
    import numpy as np

    logits, labels = eval_pred
    if isinstance(logits, tuple):
        logits = logits[0]
    predictions = np.asarray(logits).argmax(axis=-1)
    return {"accuracy": float((predictions == np.asarray(labels)).mean())}


def data_collator(tokenizer: Any) -> Any:
    """Dynamic padding (``transformers.DataCollatorWithPadding``)."""
    from transformers import DataCollatorWithPadding

    return DataCollatorWithPadding(tokenizer)


def example_sizes() -> dict[str, Any]:
    """Sizes for the small examples; ``EXAMPLES_TINY=1`` (set by the tests) makes them tiny.

    Returns:
        ``{"n_train", "n_eval", "subset", "hidden_size", "epochs", "eval_steps"}``.
    """
    if os.environ.get("EXAMPLES_TINY", "") not in ("", "0"):
        return {"n_train": 96, "n_eval": 48, "subset": 32, "hidden_size": 32, "epochs": 3, "eval_steps": 3}
    return {"n_train": 600, "n_eval": 400, "subset": 200, "hidden_size": 64, "epochs": 15, "eval_steps": 20}


def training_arguments(output_dir: str, **overrides: Any) -> Any:
    """``TrainingArguments`` of the small examples (CPU, quiet, evaluate/log/save together)."""
    from transformers import TrainingArguments

    sizes = example_sizes()
    values: dict[str, Any] = {
        "output_dir": output_dir, "num_train_epochs": sizes["epochs"], "learning_rate": 1e-3,
        "warmup_steps": 30, "per_device_train_batch_size": 16 if sizes["n_train"] < 200 else 32,
        "per_device_eval_batch_size": 64, "eval_strategy": "steps", "eval_steps": sizes["eval_steps"],
        "logging_steps": sizes["eval_steps"], "save_strategy": "steps", "save_steps": sizes["eval_steps"],
        "report_to": "none", "use_cpu": True, "seed": 0, "disable_tqdm": True,
    }
    values.update(overrides)
    return TrainingArguments(**values)


def output_dir_argument(argv: Optional[list[str]], prefix: str, description: Optional[str] = None) -> str:
    """The small examples' command line: ``[output_dir]``.

    Args:
        argv: The arguments (``None``: ``sys.argv[1:]``).
        prefix: Prefix of the temporary folder made when no ``output_dir`` is given.
        description: The ``--help`` text. Defaults to none.

    Returns:
        The output folder.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("output_dir", nargs="?",
                        help="where everything is written (default: a new temporary folder)")
    return parser.parse_args(argv).output_dir or tempfile.mkdtemp(prefix=prefix)
