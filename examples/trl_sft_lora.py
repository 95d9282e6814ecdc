"""trl's ``SFTTrainer`` on a LoRA model with every callback and the three loggers.

    python examples/trl_sft_lora.py [output_dir]        # needs the [trl] extra (trl, peft)

Everything is local: a word-level tokenizer trained on ``examples/demo_data/reviews.jsonl``,
a 2-layer Llama (hidden 32) built from a config, LoRA adapters on ``q_proj``/``v_proj``.

* ``class SFTTrainerPlus(TrainerPlusMixin, SFTTrainer)``: the mixin first, nothing else;
* ``TrainSubsetEvaluation`` reports SFT's own metrics on 32 training texts at every
  evaluation (``train_subset_loss``, ``train_subset_mean_token_accuracy``,
  ``train_subset_entropy``) and the gaps to the eval set, without changing SFT's own numbers;
* ``EarlyStopping(restore_best=True)`` keeps only the adapter in memory (when it needs a
  copy) and restores the best adapter at the end, also from an ``adapter_model.safetensors``
  checkpoint;
* ``TerminateOnNonFinite`` stops on a NaN loss; ``JsonlLogger``, ``MLflowLogger`` (sqlite in
  the output directory) and ``WandbLogger`` (offline) each get one run.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, Optional

DATA = Path(__file__).resolve().parent / "demo_data" / "reviews.jsonl"


def texts() -> list[str]:
    with open(DATA, encoding="utf-8") as handle:
        return [json.loads(line)["text"] for line in handle]


def build_tokenizer(corpus: list[str]) -> Any:
    """A word-level tokenizer trained here (no download), with pad/bos/eos tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(corpus, trainer=trainers.WordLevelTrainer(
        special_tokens=["<pad>", "<unk>", "<bos>", "<eos>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", unk_token="<unk>",
                                   bos_token="<bos>", eos_token="<eos>")


def build_model(vocab_size: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
        bos_token_id=2, eos_token_id=3))


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point: ``argv`` is ``[output_dir]`` (a new temporary folder when empty)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("output_dir", nargs="?",
                        help="where everything is written (default: a new temporary folder)")
    output_dir = parser.parse_args(argv).output_dir or tempfile.mkdtemp(prefix="trl-sft-lora-")
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from hf_callbacks_plus import (
        EarlyStopping,
        JsonlLogger,
        MLflowLogger,
        TerminateOnNonFinite,
        TrainerPlusMixin,
        TrainSubsetEvaluation,
        WandbLogger,
    )

    class SFTTrainerPlus(TrainerPlusMixin, SFTTrainer):
        """trl's SFTTrainer with our events: the mixin first."""

    out = Path(output_dir)
    corpus = texts()
    tiny = os.environ.get("EXAMPLES_TINY") == "1"
    n_train, n_eval, steps = (64, 16, 16) if tiny else (512, 64, 96)
    tokenizer = build_tokenizer(corpus[:2000])
    train = Dataset.from_list([{"text": text} for text in corpus[:n_train]])
    evaluation = Dataset.from_list([{"text": text} for text in corpus[2000:2000 + n_eval]])
    args = SFTConfig(
        output_dir=str(out / "run"), max_steps=steps, eval_strategy="steps", eval_steps=4, logging_steps=4,
        save_strategy="steps", save_steps=4, save_total_limit=2, per_device_train_batch_size=8,
        per_device_eval_batch_size=8, learning_rate=1e-2, max_length=32, report_to="none", use_cpu=True,
        disable_tqdm=True, seed=0,
    )
    subset = TrainSubsetEvaluation(size=32, gap_metrics=True)
    stopper = EarlyStopping("eval_loss", patience=3, restore_best=True)
    callbacks = [
        subset, stopper, TerminateOnNonFinite(),
        JsonlLogger(str(out / "metrics.jsonl")),
        MLflowLogger(tracking_uri=f"sqlite:///{out / 'mlflow.db'}", experiment_name="trl-sft-lora"),
        WandbLogger(project="trl-sft-lora", mode="offline", dir=str(out)),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # trl's notices about tiny configs
        trainer = SFTTrainerPlus(
            model=build_model(len(tokenizer)), args=args, train_dataset=train, eval_dataset=evaluation,
            processing_class=tokenizer, callbacks=callbacks,
            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                                   task_type="CAUSAL_LM"),
        )
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.model.parameters())
    trainer.train()

    evaluations = [r for r in trainer.state.log_history if "eval_loss" in r]
    last = evaluations[-1]
    print(f"LoRA: {trainable} trainable parameters of {total}")
    print(f"{len(evaluations)} evaluations; last at step {last['step']}:")
    for name in ("loss", "mean_token_accuracy", "entropy"):
        train_value, eval_value = last[f"{subset.prefix}_{name}"], last[f"eval_{name}"]
        gap = last.get(f"gap_{name}")  # none for entropy: a diagnostic, not a score
        print(f"  {name}: train subset {train_value:.4f}, eval {eval_value:.4f}, "
              + (f"gap {gap:+.4f}" if gap is not None else "no gap (a diagnostic)"))
    print(f"best eval_loss {stopper.best_value:.5f} at step {stopper.best_step}; "
          f"stopped: {stopper.stopped} ({stopper.reason.value}); best adapter restored")
    final = trainer.isolated_evaluate(evaluation, metric_key_prefix="eval")  # no log record
    print(f"eval_loss after restoring the best adapter: {final['eval_loss']:.5f}")
    print(f"logs: {out / 'metrics.jsonl'}, mlflow ui --backend-store-uri sqlite:///{out / 'mlflow.db'}, "
          f"W&B offline run in {out / 'wandb'}")


if __name__ == "__main__":
    main()
