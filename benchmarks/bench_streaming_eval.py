"""Benchmark the peak memory and time of one ``Trainer.evaluate()`` on a causal LM: a stock
``compute_metrics`` over every logit against ``StreamingMetrics``, and against no metrics.

The metric variants compute the same two metrics, token accuracy and perplexity, over the same
model and data:

* stock: ``Trainer(..., compute_metrics=stock_compute_metrics)`` with
  ``batch_eval_metrics=False``: the Trainer concatenates every batch's logits (samples x tokens x
  vocabulary float32) and hands them to a numpy ``compute_metrics``;
* streaming: ``StreamingMetrics(task="causal_lm", train_metrics=None)`` bound with
  ``run_before_integrations`` (``batch_eval_metrics=True``: each batch updates exact counts, no
  logits kept);
* predictions: the same, with ``save_predictions=True`` (the predictions file of each row);
* none: no ``compute_metrics`` (the loss only): what ``StreamingMetrics`` adds is its growth
  minus this one's.

Model: a 2-layer ``LlamaForCausalLM`` from a config (vocabulary 8192, hidden 64, seed 0);
data: random token ids, 128 tokens per sample, 512 and 1024 samples, eval batch 16 (the
vocabulary, tokens and batch are options: ``--vocab 32000 --tokens 256 --batch 8`` is a
realistic language model's batch).
Each (variant, samples) runs in its own process (this script with ``--child VARIANT SAMPLES``);
the memory figure is the growth of the process's peak RSS (``ru_maxrss``) across ``evaluate()``,
the time is the wall time of ``evaluate()`` (and its CPU time, ``time.process_time``, which a
shared machine disturbs less); with ``--repeat K`` the median of K processes, the variants taken
in turn inside each repeat. The parent prints a markdown table (ratios are streaming / stock)
and checks that the metrics agree: token accuracy exactly, perplexity within 1e-6 relative.
With ``none`` among the variants it also prints each metric variant's time over the evaluation
without metrics: the ratio of the medians and the range of the ratios of the same repeat.

Run: ``python benchmarks/bench_streaming_eval.py [--samples 512,1024] [--repeat 1]
[--variants stock,streaming]`` (from the repository root, e.g. with ``.venv/bin/python``).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = ("stock", "streaming", "predictions", "none")
#: Samples per chunk of the stock compute_metrics' float64 log-softmax.
CHUNK = 8


def stock_compute_metrics(eval_pred):
    """Token accuracy and perplexity from the full arrays, as a user writes it with numpy.

    Shifted as the model's loss is (position t predicts label t + 1), labels -100 left out.
    Choice: the float64 log-softmax runs over ``CHUNK`` samples at a time, and the shift is
    sliced per chunk, so neither a full-size float64 copy nor a full-size float32 copy (a
    ``reshape`` of the non-contiguous ``logits[:, :-1]`` copies) is added to the Trainer's
    concatenated logits: the stock figure is the Trainer's cost, not a careless metric's.
    """
    import numpy as np

    logits, labels = eval_pred.predictions, eval_pred.label_ids
    correct, nll, count = 0, 0.0, 0
    for start in range(0, len(labels), CHUNK):
        scores = logits[start : start + CHUNK, :-1]  # a view
        target = labels[start : start + CHUNK, 1:]
        keep = target != -100
        scores, target = scores[keep], target[keep]  # [labelled tokens of the chunk, vocabulary]
        correct += int((scores.argmax(-1) == target).sum())
        shifted = scores.astype(np.float64)
        shifted -= shifted.max(-1, keepdims=True)
        log_probs = shifted[np.arange(len(target)), target] - np.log(np.exp(shifted).sum(-1))
        nll -= float(log_probs.sum())
        count += len(target)
    return {"token_accuracy": correct / count, "perplexity": math.exp(nll / count)}


def current_rss_mb() -> float:
    """The process's resident set now (``VmRSS``), in MB; nan where /proc is missing."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def child(variant: str, samples: int, options: argparse.Namespace) -> None:
    """One evaluate() of one variant; prints one JSON line."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    from hf_callbacks_plus import run_before_integrations
    from hf_callbacks_plus.callbacks.streaming_metrics import StreamingMetrics

    vocab, tokens, hidden = options.vocab, options.tokens, options.hidden
    torch.set_num_threads(options.threads)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max(256, tokens))
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, vocab, (samples, tokens), generator=torch.Generator().manual_seed(1))
    rows = [{"input_ids": ids[i], "attention_mask": torch.ones(tokens, dtype=torch.long),
             "labels": ids[i].clone()} for i in range(samples)]
    with tempfile.TemporaryDirectory() as output_dir:
        args = TrainingArguments(output_dir=output_dir, per_device_eval_batch_size=options.batch,
                                 report_to="none", use_cpu=True, disable_tqdm=True)
        if variant == "stock":
            trainer = Trainer(model=model, args=args, eval_dataset=rows,
                              compute_metrics=stock_compute_metrics)
        elif variant == "none":
            trainer = Trainer(model=model, args=args, eval_dataset=rows)
        else:
            streaming = StreamingMetrics(task="causal_lm", train_metrics=None,
                                         save_predictions=variant == "predictions")
            trainer = Trainer(model=model, args=args, eval_dataset=rows, callbacks=[streaming])
            run_before_integrations(trainer)
        trainer.remove_callback(PrinterCallback)  # keep stdout to our one JSON line
        assert trainer.args.batch_eval_metrics is (variant in ("streaming", "predictions"))
        rss = current_rss_mb()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        start, cpu = time.perf_counter(), time.process_time()
        metrics = trainer.evaluate()
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"baseline_mb": before / 1024, "peak_mb": peak / 1024,
                      "growth_mb": (peak - before) / 1024, "rss_before_mb": rss, "seconds": seconds,
                      "cpu_seconds": cpu_seconds,
                      "token_accuracy": metrics.get("eval_token_accuracy", math.nan),
                      "perplexity": metrics.get("eval_perplexity", math.nan)}))


def measure(variant: str, samples: int, options: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--child", variant, str(samples), "--hidden", str(options.hidden),
               "--threads", str(options.threads), "--vocab", str(options.vocab), "--tokens",
               str(options.tokens), "--batch", str(options.batch)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        raise SystemExit(f"child {variant} {samples} failed with exit code {result.returncode}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def spread(values: list) -> str:
    """``median (min-max)`` of seconds."""
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", default="512,1024", help="comma-separated evaluation set sizes")
    parser.add_argument("--repeat", type=int, default=1, help="processes per (variant, samples); median")
    parser.add_argument("--hidden", type=int, default=64, help="model hidden size (intermediate = 2x)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each child")
    parser.add_argument("--vocab", type=int, default=8192, help="vocabulary size")
    parser.add_argument("--tokens", type=int, default=128, help="tokens per sample")
    parser.add_argument("--batch", type=int, default=16, help="evaluation batch size")
    parser.add_argument("--variants", default="stock,streaming",
                        help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "SAMPLES"), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        child(options.child[0], int(options.child[1]), options)
        return

    variants = [v for v in options.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    sizes = [int(n) for n in options.samples.split(",")]
    vocab, tokens, batch = options.vocab, options.tokens, options.batch
    print(f"causal LM: vocabulary {vocab}, {tokens} tokens/sample, hidden {options.hidden}, "
          f"eval batch {batch}, {options.threads} torch thread(s), median of {options.repeat} process(es)")
    print(f"logits of one batch: {batch} x {tokens} x {vocab} x 4 bytes = "
          f"{batch * tokens * vocab * 4 / 2**20:.0f} MB")
    for samples in sizes:
        print(f"expected logits size at {samples} samples: {samples} x {tokens} x {vocab} x 4 bytes = "
              f"{samples * tokens * vocab * 4 / 2**20:.0f} MB")
    results = {(variant, samples): [] for samples in sizes for variant in variants}
    for samples in sizes:
        for k in range(options.repeat):
            for variant in variants:  # in turn, so a change of the machine's load touches every variant
                run = measure(variant, samples, options)
                results[variant, samples].append(run)
                print(f"{variant:>11} {samples:>5} #{k + 1}: ru_maxrss {run['baseline_mb']:.0f} -> "
                      f"{run['peak_mb']:.0f} MB (+{run['growth_mb']:.0f}; RSS before evaluate "
                      f"{run['rss_before_mb']:.0f}), {run['seconds']:.2f} s "
                      f"(CPU {run['cpu_seconds']:.2f} s), "
                      f"token_accuracy {run['token_accuracy']!r}, perplexity {run['perplexity']!r}",
                      flush=True)

    print()
    print("| samples | " + " | ".join(f"{v} peak RSS growth (MB)" for v in variants)
          + " | " + " | ".join(f"{v} s" for v in variants) + " |")
    print("|---" * (1 + 2 * len(variants)) + "|")
    for samples in sizes:
        growth = {v: statistics.median(r["growth_mb"] for r in results[v, samples]) for v in variants}
        seconds = {v: statistics.median(r["seconds"] for r in results[v, samples]) for v in variants}
        print(f"| {samples} | " + " | ".join(f"{growth[v]:.0f}" for v in variants) + " | "
              + " | ".join(f"{seconds[v]:.2f}" for v in variants) + " |")
    if "none" in variants:
        for samples in sizes:
            none = statistics.median(r["growth_mb"] for r in results["none", samples])
            for variant in (v for v in variants if v != "none"):
                added = statistics.median(r["growth_mb"] for r in results[variant, samples]) - none
                print(f"{variant} adds {added:.0f} MB to the peak of an evaluation without metrics "
                      f"at {samples} samples")
        print()
        print("| variant | samples | s, median (range) | none s, median (range) | time / none: ratio of "
              "medians | paired ratios (range) | CPU time / none: ratio of medians | paired ratios (range) |")
        print("|---|---|---|---|---|---|---|---|")
        for samples in sizes:
            none = results["none", samples]
            for variant in (v for v in variants if v != "none"):
                ours = results[variant, samples]
                cells = [f"{spread([r['seconds'] for r in ours])}", f"{spread([r['seconds'] for r in none])}"]
                for key in ("seconds", "cpu_seconds"):
                    ours_median = statistics.median(r[key] for r in ours)
                    medians = ours_median / statistics.median(r[key] for r in none)
                    paired = [a[key] / b[key] for a, b in zip(ours, none)]
                    cells += [f"{medians:.2f}", f"{min(paired):.2f}-{max(paired):.2f}"]
                print(f"| {variant} | {samples} | " + " | ".join(cells) + " |")
    if not {"stock", "streaming"} <= set(variants):
        return
    print()
    print("| samples | stock peak RSS growth (MB) | streaming peak RSS growth (MB) | ratio | stock s "
          "| streaming s | time ratio |")
    print("|---|---|---|---|---|---|---|")
    checks = []
    for samples in sizes:
        growth = {v: statistics.median(r["growth_mb"] for r in results[v, samples]) for v in variants}
        seconds = {v: statistics.median(r["seconds"] for r in results[v, samples]) for v in variants}
        memory_ratio = growth["streaming"] / growth["stock"] if growth["stock"] else math.nan
        print(f"| {samples} | {growth['stock']:.0f} | {growth['streaming']:.0f} | {memory_ratio:.3f} | "
              f"{seconds['stock']:.2f} | {seconds['streaming']:.2f} | "
              f"{seconds['streaming'] / seconds['stock']:.2f} |")
        stock, ours = results["stock", samples][0], results["streaming", samples][0]
        same_accuracy = stock["token_accuracy"] == ours["token_accuracy"]
        relative = abs(ours["perplexity"] / stock["perplexity"] - 1)
        ok = same_accuracy and relative < 1e-6
        checks.append(f"metrics agree at {samples} samples: {'yes' if ok else 'NO'} (token_accuracy "
                      f"{stock['token_accuracy']!r} vs {ours['token_accuracy']!r}: "
                      f"{'equal' if same_accuracy else 'DIFFERENT'}; perplexity {stock['perplexity']!r} vs "
                      f"{ours['perplexity']!r}: relative difference {relative:.1e}, target < 1e-6)")
    print("ratio and time ratio = streaming / stock (below 1: streaming uses less memory / time)")
    for line in checks:
        print(line)


if __name__ == "__main__":
    main()
