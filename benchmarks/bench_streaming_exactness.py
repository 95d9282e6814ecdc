"""Exactness of ``StreamingMetrics`` against a stock ``compute_metrics`` written with scikit-learn.

For each task (classification, token classification, causal LM) a small model is trained for a
few steps, then evaluated twice on the same evaluation set with a stock ``transformers.Trainer``:

* reference: ``compute_metrics`` over every logit at once (``batch_eval_metrics=False``), written
  as a user writes it: ``sklearn.metrics`` (``accuracy_score``, ``precision_recall_fscore_support``
  micro and macro with ``zero_division=0``, ``confusion_matrix``) over the labelled positions
  (labels ``-100`` left out), and numpy in float64 for the causal LM's token accuracy and
  perplexity (position t predicts label t + 1, as the model's loss);
* streaming: ``StreamingMetrics(task=...)`` bound with ``run_before_integrations``
  (``batch_eval_metrics=True``: every batch updates exact counts, no logits kept).

The evaluation batch (7) does not divide the evaluation set, so the last batch is uneven. The
script prints a markdown table (metric, task, streaming, reference, |difference|); the confusion
counts are one row per task (sum and trace of the matrix, the difference is the largest over its
cells). It exits with status 1 if a value differs beyond the float64 rounding of the perplexity
(1e-12 relative).

Run: ``.venv/bin/python benchmarks/bench_streaming_exactness.py`` (from the repository root).
"""

from __future__ import annotations

import argparse
import math
import tempfile
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import Trainer, TrainingArguments
from transformers.trainer_callback import PrinterCallback

from hf_callbacks_plus.callbacks.streaming_metrics import StreamingMetrics
from hf_callbacks_plus.integrations.ordering import run_before_integrations

CLASSES, FEATURES, VOCAB, TOKENS = 5, 16, 512, 24
EVAL_BATCH = 7


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))

    def forward(self, features, labels=None):
        logits = self.net(features)
        return {"logits": logits, "loss": nn.functional.cross_entropy(logits, labels)}


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(64, 16)
        self.linear = nn.Linear(16, CLASSES)

    def forward(self, input_ids, labels=None):
        logits = self.linear(self.embedding(input_ids))
        loss = nn.functional.cross_entropy(logits.reshape(-1, CLASSES), labels.reshape(-1), ignore_index=-100)
        return {"logits": logits, "loss": loss}


def causal_lm():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(
        LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    )


def rows(task: str, n: int, seed: int) -> list[dict[str, Any]]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    if task == "classification":
        x = torch.randn(n, FEATURES, generator=generator)
        # learnable but noisy labels; the last class is rare (macro averages see an uneven class)
        y = ((x[:, 0] > 0).long() + (x[:, 1] > 0).long() + (x[:, 2] > 0.8).long() + (x[:, 3] > 1.5).long())
        flip = torch.rand(n, generator=generator) < 0.2
        y[flip] = torch.randint(0, CLASSES, (int(flip.sum()),), generator=generator)
        return [{"features": x[i], "labels": y[i]} for i in range(n)]
    for _ in range(n):
        ids = torch.randint(0 if task == "token_classification" else 1, 64 if task == "token_classification"
                            else VOCAB, (TOKENS,), generator=generator)
        if task == "token_classification":
            labels = ids % CLASSES
            pad = int(torch.randint(0, 6, (1,), generator=generator))  # padding: label -100
            if pad:
                labels[-pad:] = -100
            out.append({"input_ids": ids, "labels": labels})
        else:  # an arithmetic sequence (step 1-3) with 10 % noise: learnable, not trivial
            step = int(torch.randint(1, 4, (1,), generator=generator))
            ids = (ids[0] + step * torch.arange(TOKENS)) % VOCAB
            noise = torch.rand(TOKENS, generator=generator) < 0.1
            ids[noise] = torch.randint(0, VOCAB, (int(noise.sum()),), generator=generator)
            labels = ids.clone()
            labels[:4] = -100  # a prompt
            pad = int(torch.randint(0, 6, (1,), generator=generator))
            if pad:
                labels[-pad:] = -100
            out.append({"input_ids": ids, "attention_mask": torch.ones(TOKENS, dtype=torch.long),
                        "labels": labels})
    return out


def reference_compute_metrics(task: str):
    """A stock ``compute_metrics`` over every logit at once: scikit-learn, numpy in float64."""
    from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support

    def compute_metrics(eval_pred) -> dict[str, float]:
        logits = np.asarray(eval_pred.predictions, dtype=np.float64)
        labels = np.asarray(eval_pred.label_ids)
        if task == "causal_lm":
            logits, labels = logits[:, :-1], labels[:, 1:]
        logits, labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
        keep = labels != -100
        logits, labels = logits[keep], labels[keep]
        predicted = logits.argmax(-1)
        if task == "causal_lm":
            shifted = logits - logits.max(-1, keepdims=True)
            log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
            nll = -log_probs[np.arange(len(labels)), labels]
            return {"token_accuracy": float(np.mean(predicted == labels)), "perplexity": math.exp(nll.mean())}
        out = {"accuracy": float(accuracy_score(labels, predicted))}
        for average in ("micro", "macro"):
            p, r, f, _ = precision_recall_fscore_support(labels, predicted, average=average, zero_division=0)
            out.update({f"precision_{average}": float(p), f"recall_{average}": float(r),
                        f"f1_{average}": float(f)})
        counts = confusion_matrix(labels, predicted, labels=list(range(CLASSES)))
        out.update({f"confusion_{i}_{j}": float(counts[i, j])
                    for i in range(CLASSES) for j in range(CLASSES)})
        return out

    return compute_metrics


def evaluate_both(task: str, n_train: int, n_eval: int, output_dir: str) -> tuple[dict, dict]:
    torch.manual_seed(0)
    model = {"classification": Classifier, "token_classification": Tagger, "causal_lm": causal_lm}[task]()
    def args() -> TrainingArguments:  # one per trainer: binding StreamingMetrics sets batch_eval_metrics
        return TrainingArguments(output_dir=output_dir, per_device_train_batch_size=8,
                                 per_device_eval_batch_size=EVAL_BATCH, num_train_epochs=1,
                                 learning_rate=1e-2 if task == "causal_lm" else 0.02, report_to="none",
                                 use_cpu=True, disable_tqdm=True, save_strategy="no", seed=0)

    train, val = rows(task, n_train, seed=1), rows(task, n_eval, seed=2)
    trainer = Trainer(model=model, args=args(), train_dataset=train)
    trainer.remove_callback(PrinterCallback)
    trainer.train()  # a few steps, so the predictions are not those of a random model
    model.eval()

    stock = Trainer(model=model, args=args(), eval_dataset=val,
                    compute_metrics=reference_compute_metrics(task))
    stock.remove_callback(PrinterCallback)
    reference = stock.evaluate()

    streaming = Trainer(model=model, args=args(), eval_dataset=val,
                        callbacks=[StreamingMetrics(task=task, num_classes=None if task == "causal_lm"
                                                    else CLASSES, train_metrics=None)])
    streaming.remove_callback(PrinterCallback)
    run_before_integrations(streaming)
    assert streaming.args.batch_eval_metrics and not stock.args.batch_eval_metrics
    ours = streaming.evaluate()
    strip = len("eval_")
    return ({k[strip:]: v for k, v in ours.items()}, {k[strip:]: v for k, v in reference.items()})


def summary(values: dict) -> str:
    """A confusion matrix's sum and trace."""
    total = sum(values[f"confusion_{i}_{j}"] for i in range(CLASSES) for j in range(CLASSES))
    trace = sum(values[f"confusion_{i}_{i}"] for i in range(CLASSES))
    return f"sum {number(total)}, trace {number(trace)}"


def number(value: float) -> str:
    if value == 0:
        return "0"
    return str(int(value)) if float(value).is_integer() and abs(value) > 1 else repr(float(value))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=400, help="training rows (one epoch, batch 8)")
    parser.add_argument("--eval", type=int, default=303, help="evaluation rows (batches of 7)")
    options = parser.parse_args()
    torch.set_num_threads(1)
    names = ["accuracy", "precision_micro", "precision_macro", "recall_micro", "recall_macro",
             "f1_micro", "f1_macro"]
    lines, worst = [], 0.0
    for task in ("classification", "token_classification", "causal_lm"):
        with tempfile.TemporaryDirectory() as output_dir:
            ours, reference = evaluate_both(task, options.train, options.eval, output_dir)
        if task == "causal_lm":
            for name in ("token_accuracy", "perplexity"):
                difference = abs(ours[name] - reference[name])
                relative = difference / abs(reference[name])
                worst = max(worst, relative if name == "perplexity" else difference)
                lines.append(f"| {name} | {task} | {ours[name]!r} | {reference[name]!r} | {difference:.3g} |")
            continue
        for name in names:
            difference = abs(ours[name] - reference[name])
            worst = max(worst, difference)
            tagging_accuracy = task == "token_classification" and name == "accuracy"
            shown = "token accuracy (ignoring -100)" if tagging_accuracy else name
            lines.append(f"| {shown} | {task} | {ours[name]!r} | {reference[name]!r} | {difference:.3g} |")
        cells = [f"confusion_{i}_{j}" for i in range(CLASSES) for j in range(CLASSES)]
        diff = max(abs(ours[c] - reference[c]) for c in cells)
        worst = max(worst, diff)

        lines.append(f"| confusion counts ({CLASSES} x {CLASSES} cells) | {task} | {summary(ours)} | "
                     f"{summary(reference)} | {number(diff)} (largest over the cells) |")
    print(f"evaluation: {options.eval} rows in batches of {EVAL_BATCH} (last batch uneven); "
          f"{CLASSES} classes; causal LM: vocabulary {VOCAB}, {TOKENS} tokens, labels -100 on the first 4 "
          "and the last 0-5")
    print()
    print("| metric | task | streaming (`StreamingMetrics`) | reference (stock `compute_metrics`, "
          "scikit-learn / numpy) | \\|difference\\| |")
    print("|---|---|---:|---:|---:|")
    for line in lines:
        print(line)
    print()
    exact = worst <= 1e-12
    print(f"largest difference (perplexity: relative): {worst:.3g}: {'exact' if exact else 'NOT EXACT'}")
    if not exact:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
