"""What each logger adds to ``Trainer.train()``, end to end: ours vs transformers' callbacks.

Issue 16, finding 6 / point 6. ``bench_loggers.py`` times one ``on_log`` call; this script times
what a user waits for: ``trainer.train()`` from its first to its last line, with the run opened,
every log record sent and the run closed inside it (our loggers close in ``on_train_end``).

Variants (each ``train()`` in its own fresh interpreter: W&B's service and MLflow's state are
process-wide):

* ``none``: ``report_to="none"``, no logger;
* ours: ``JsonlLogger``, ``MLflowLogger``, ``WandbLogger``, ``TensorBoardLogger``, ``TrackioLogger``
  (defaults);
* stock: transformers' ``MLflowCallback``, ``WandbCallback``, ``TensorBoardCallback``,
  ``TrackioCallback`` through
  ``report_to=[...]``.

Same environment for all: ``MLFLOW_TRACKING_URI`` a sqlite store (a copy of one store created
beforehand, so no variant pays the schema migration), ``WANDB_MODE=offline`` with ``WANDB_DIR`` in
a temporary directory, the same seed, data and model. An ``ExtraMetrics`` callback adds ``M``
float metrics to every training log record (``logging_steps=1``) from ``on_pre_log``, so every
tracker sees them (``run_before_integrations`` gives every variant, ``none`` included, the same
handler). transformers' ``PrinterCallback`` is removed (it would print 500 metrics a step to
stdout in every variant). Both W&B loggers leave their run open after ``train()`` (W&B closes it
at interpreter exit), the MLflow and trackio ones end theirs in ``on_train_end``; the time of the
``wandb.finish()`` / ``logger.close()`` / ``mlflow.end_run()`` a script would call after ``train()``
is printed under the table and added to ``train()`` in the table (issue 40: ``WandbLogger`` hands its
records to W&B from a thread of its own, so what it still hands after ``train()`` returns counts).
trackio writes to ``TRACKIO_DIR`` in the
temporary directory, project ``TrainingArguments.project`` (``"huggingface"``) for both.

Besides the wall clock, the CPU time (user + system) of the process and of its child processes
(W&B's service) during ``train()`` and the close is recorded, and the CPU time of the training thread alone
(``time.thread_time``: what the training waits for, apart from the GIL): on a shared machine they
move less with the load of other jobs than the wall clock does.

After each run the points are read back with each tracker's own reader and compared with the
points produced (``M`` per training record): MLflow ``MlflowClient().get_metric_history`` of the
extra metrics, TensorBoard ``EventAccumulator`` scalars, W&B offline history rows
(``hf_callbacks_plus.testing.wandb_reader``), JSONL lines; points MLflowLogger kept in its
write-ahead log (not acknowledged within ``flush_timeout``) are counted from the log.

Models: ``tiny`` (a 2-layer BERT classifier, hidden 64, 8 x 16 tokens a step, a few ms a step)
and ``100ms`` (a 2-layer BERT, hidden 256, 8 x 64 tokens a step: 70-130 ms a step with torch on
one thread on the 2-core machine, depending on its load; the table prints the measured ms/step
of ``none``). Default steps: 300 (tiny), 150 (100ms).

Run::

    .venv/bin/python benchmarks/bench_loggers_train.py --model both --metrics 20,500 --repeats 3 \\
        --commit HEAD   # a fixed version of the package (git archive), not the working tree
    .venv/bin/python benchmarks/bench_loggers_train.py --model tiny --metrics 500 --steps 50 \\
        --repeats 1 --variants none,MLflowLogger,MLflowCallback

The parent alternates the variants in each round (rotating the order from round to round) and
prints every run as a JSON line (``--jsonl FILE`` appends them to a file; ``--summarize FILE``
prints the tables of every run in it, e.g. after several invocations), then per (model, metrics) a
markdown table: the median and min-max of ``train()``, the cost added to the median of ``none``
in %, ours-added / stock-added per backend, the same for CPU time, and delivered / produced
points. Targets (issue 16): at 20 metrics per step every logger adds at most 2 %
to ``train()``; at 500, ours adds at most half of what the stock callback adds, per backend.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OURS = {"JsonlLogger": "jsonl", "MLflowLogger": "mlflow", "WandbLogger": "wandb",
        "TensorBoardLogger": "tensorboard", "TrackioLogger": "trackio"}
STOCK = {"MLflowCallback": "mlflow", "WandbCallback": "wandb", "TensorBoardCallback": "tensorboard",
         "TrackioCallback": "trackio"}
VARIANTS = ["none", *OURS, *STOCK]
MODELS = {
    # name: (hidden, layers, tokens per row, rows per step, default steps)
    "tiny": (64, 2, 16, 8, 300),
    "100ms": (256, 2, 64, 8, 150),
}
VOCAB = 2000


# -- one run, in a fresh interpreter ------------------------------------------------------
def _environment(root: Path, store: Path) -> None:
    """The same tracker environment for every variant (set before any tracker is imported)."""
    os.environ.pop("DISABLE_MLFLOW_INTEGRATION", None)
    os.environ.update(
        MLFLOW_TRACKING_URI=f"sqlite:///{store}", MLFLOW_EXPERIMENT_NAME="bench",
        WANDB_MODE="offline", WANDB_DIR=str(root / "wandb"), WANDB_PROJECT="bench", WANDB_SILENT="true",
        TENSORBOARD_LOGGING_DIR=str(root / "tensorboard"), TRACKIO_DIR=str(root / "trackio"),
    )
    (root / "wandb").mkdir(parents=True, exist_ok=True)


def _model(kind: str) -> Any:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    hidden, layers, tokens, _, _ = MODELS[kind]
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=max(2, hidden // 64), intermediate_size=4 * hidden,
        max_position_embeddings=tokens + 2, num_labels=2, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    ))


def _rows(kind: str, n: int) -> list[dict[str, Any]]:
    import torch

    _, _, tokens, _, _ = MODELS[kind]
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (n, tokens), generator=generator)
    labels = torch.randint(0, 2, (n,), generator=generator)
    return [{"input_ids": ids[i], "attention_mask": torch.ones(tokens, dtype=torch.long),
             "labels": labels[i]} for i in range(n)]


def _extra_metrics_callback(metrics: int) -> Any:
    from transformers import TrainerCallback

    class ExtraMetrics(TrainerCallback):
        """Adds ``metrics`` floats to every training log record, before any tracker sees it."""

        def __init__(self) -> None:
            self.names = [f"extra_{k:03d}" for k in range(metrics)]
            self.produced = 0

        def on_pre_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if not isinstance(logs, dict) or "loss" not in logs:
                return
            step = state.global_step
            logs.update({name: 1.0 / (k + 1) + step * 1e-4 for k, name in enumerate(self.names)})
            self.produced += len(self.names)

    return ExtraMetrics()


def _logger(variant: str) -> Any:
    if variant == "JsonlLogger":
        from hf_callbacks_plus.loggers.jsonl import JsonlLogger

        return JsonlLogger()
    if variant == "MLflowLogger":
        from hf_callbacks_plus.loggers.mlflow import MLflowLogger

        return MLflowLogger()
    if variant == "WandbLogger":
        from hf_callbacks_plus.loggers.wandb import WandbLogger

        return WandbLogger()
    if variant == "TrackioLogger":
        from hf_callbacks_plus.loggers.trackio import TrackioLogger

        return TrackioLogger()
    from hf_callbacks_plus.loggers.tensorboard import TensorBoardLogger

    return TensorBoardLogger()


def _spilled_points(output_dir: Path) -> int:
    """Extra-metric points left in MLflowLogger's write-ahead logs past their acknowledged offset."""
    total = 0
    for file in (output_dir / ".mlflow_wal").rglob("*.jsonl"):
        acked = json.loads(file.with_suffix(".json").read_text()).get("acked", 0)
        with open(file, "rb") as handle:
            handle.seek(acked)
            for line in handle:
                record = json.loads(line)
                if record.get("kind") == "log":
                    total += sum(1 for key in record.get("metrics", {}) if "extra_" in key)
    return total


def _delivered(variant: str, root: Path, output_dir: Path, names: list[str]) -> int:
    """Points of the extra metrics the tracker holds, read back with its own reader."""
    backend = OURS.get(variant) or STOCK.get(variant)
    if backend == "jsonl":
        total = 0
        for line in (output_dir / "metrics.jsonl").read_text().splitlines():
            record = json.loads(line)
            if record.get("event") == "log":
                total += sum(1 for key in record.get("curves", {}) if "extra_" in key)
        return total
    if backend == "mlflow":
        from mlflow import MlflowClient

        client = MlflowClient()
        experiment = client.get_experiment_by_name("bench")
        runs = client.search_runs([experiment.experiment_id])
        total = 0
        for run in runs:
            keys = [key for key in run.data.metrics if "extra_" in key]
            total += sum(len(client.get_metric_history(run.info.run_id, key)) for key in keys)
        return total
    if backend == "trackio":  # the project is TrainingArguments.project's default, "huggingface"
        import trackio
        from trackio.sqlite_storage import SQLiteStorage

        return sum(1 for run in trackio.Api().runs("huggingface")
                   for row in SQLiteStorage.get_logs("huggingface", run.name, run_id=run.id)
                   for key in row if "extra_" in key)
    if backend == "tensorboard":
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        total = 0
        folders = {file.parent for file in root.rglob("events.out.tfevents.*")}
        for folder in folders:
            accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0})
            accumulator.Reload()
            total += sum(len(accumulator.Scalars(tag)) for tag in accumulator.Tags()["scalars"]
                         if "extra_" in tag)
        return total
    from hf_callbacks_plus.testing.wandb_reader import find_wandb_runs, read_wandb_run

    total = 0
    for folder in find_wandb_runs(root / "wandb"):
        run = read_wandb_run(folder, wait=60)
        total += sum(1 for row in run.history for key in row if "extra_" in key)
    return total


def _cpu_seconds() -> float:
    """CPU time (user + system) of this process, its finished children and its live children
    (W&B's service process does the writing for both W&B callbacks)."""
    try:
        import psutil
    except ImportError:
        times = os.times()
        return times.user + times.system + times.children_user + times.children_system
    me = psutil.Process()
    total = sum(me.cpu_times())  # user, system, children_user, children_system (+ iowait on Linux)
    total -= getattr(me.cpu_times(), "iowait", 0.0)
    for child in me.children(recursive=True):
        try:
            times = child.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def run_one(kind: str, metrics: int, variant: str, steps: int, root: Path, store: Path, threads: int) -> dict:
    """Build, train (timed), close, read back; returns the figures as a dict."""
    _environment(root, store)
    import torch
    from transformers import PrinterCallback, Trainer, TrainingArguments

    from hf_callbacks_plus.integrations.ordering import run_before_integrations

    if threads > 0:
        torch.set_num_threads(threads)
    output_dir = root / "out"
    batch = MODELS[kind][3]
    report_to = [STOCK[variant]] if variant in STOCK else "none"
    args = TrainingArguments(
        str(output_dir), max_steps=steps, per_device_train_batch_size=batch, logging_steps=1,
        report_to=report_to, use_cpu=True, disable_tqdm=True, save_strategy="no",
        dataloader_num_workers=0, seed=0, learning_rate=1e-4,
    )
    extra = _extra_metrics_callback(metrics)
    loggers = [] if variant == "none" or variant in STOCK else [_logger(variant)]
    trainer = Trainer(model=_model(kind), args=args, train_dataset=_rows(kind, steps * batch),
                      callbacks=loggers)
    trainer.remove_callback(PrinterCallback)
    run_before_integrations(trainer, extra)
    cpu, thread_cpu = _cpu_seconds(), time.thread_time()
    start = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    if variant == "WandbLogger":  # its run stays open after train(), as WandbCallback's does
        loggers[0].close()
    elif variant == "WandbCallback":
        import wandb

        wandb.finish()
    elif variant == "MLflowCallback":
        import mlflow

        if mlflow.active_run() is not None:
            mlflow.end_run()
    close_seconds = time.perf_counter() - start
    # CPU through the close: what a logger hands to its tracker after train() returns is counted too
    cpu, thread_cpu = _cpu_seconds() - cpu, time.thread_time() - thread_cpu
    delivered = _delivered(variant, root, output_dir, extra.names) if variant != "none" else 0
    return {"model": kind, "metrics": metrics, "variant": variant, "steps": steps,
            "train_s": train_seconds, "cpu_s": cpu, "thread_cpu_s": thread_cpu, "close_s": close_seconds,
            "produced": extra.produced, "delivered": delivered, "spilled": _spilled_points(output_dir)}


# -- the parent: alternate, summarize ------------------------------------------------------
def _make_store(path: Path) -> None:
    """A sqlite MLflow store with its schema and the experiment, copied for every run."""
    code = ("import mlflow,sys; c=mlflow.MlflowClient(sys.argv[1]); c.create_experiment('bench')")
    subprocess.run([sys.executable, "-c", code, f"sqlite:///{path}"], check=True, capture_output=True,
                   timeout=600)


def _export(checkout: Path, revision: str) -> str:
    """``hf_callbacks_plus`` as of ``revision``, exported to a temporary directory; returns it."""
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", revision], check=True,
                            capture_output=True, text=True).stdout.strip()
    target = Path(tempfile.mkdtemp(prefix=f"bench_loggers_train_{commit[:10]}_"))
    archive = subprocess.run(["git", "-C", str(checkout), "archive", commit, "hf_callbacks_plus"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    print(f"git {revision} = {commit}", flush=True)
    return str(target)


def _spawn(kind: str, metrics: int, variant: str, steps: int, template: Path, threads: int,
           package_dir: str) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench_loggers_train_"))
    try:
        store = root / "mlflow.db"
        shutil.copy(template, store)
        done = subprocess.run(
            [sys.executable, __file__, "--one", kind, str(metrics), variant, str(steps), str(root),
             str(store), str(threads), package_dir],
            capture_output=True, text=True, timeout=3600)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"{kind} M={metrics} {variant} failed:\n{done.stderr[-3000:]}")
        return json.loads(lines[-1])
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _fmt_points(rows: list[dict]) -> str:
    """Delivered / produced points over the runs (a range when runs differ), and what was spilled."""
    delivered = [row["delivered"] for row in rows]
    text = f"{min(delivered)}" if min(delivered) == max(delivered) else f"{min(delivered)}-{max(delivered)}"
    text += f" / {rows[0]['produced']}"
    spilled = [row["spilled"] for row in rows if row["spilled"]]
    if spilled:
        amount = f"{min(spilled)}" if min(spilled) == max(spilled) else f"{min(spilled)}-{max(spilled)}"
        text += f"; {len(spilled)} of {len(rows)} runs spilled {amount} (reported)"
    return text


def _added(medians: dict[str, float], base: float | None) -> dict[str, float]:
    return {name: (value - base) / base * 100 if base else float("nan") for name, value in medians.items()}


def _ratio(name: str, added: dict[str, float]) -> float | None:
    """Ours-added / stock-added for the backend of ``name`` (None without a stock row or cost)."""
    if name not in OURS or OURS[name] not in STOCK.values():
        return None
    stock_name = next(stock for stock, backend in STOCK.items() if backend == OURS[name])
    if stock_name not in added or not added[stock_name] > 0:
        return None
    return added[name] / added[stock_name]


def summarize(results: list[dict], kind: str, metrics: int) -> list[str]:
    """A title line and a markdown table for one (model, metrics)."""
    by_variant: dict[str, list[dict]] = {}
    for row in results:
        if row["model"] == kind and row["metrics"] == metrics:
            by_variant.setdefault(row["variant"], []).append(row)
    if not by_variant:
        return []
    wall = {name: statistics.median(r["train_s"] + r["close_s"] for r in rows)
            for name, rows in by_variant.items()}
    cpu = {name: statistics.median(r["cpu_s"] for r in rows) for name, rows in by_variant.items()}
    thread = {name: statistics.median(r.get("thread_cpu_s", float("nan")) for r in rows)
              for name, rows in by_variant.items()}
    base, cpu_base = wall.get("none"), cpu.get("none")
    added, cpu_added = _added(wall, base), _added(cpu, cpu_base)
    thread_added = _added(thread, thread.get("none"))
    steps = next(iter(by_variant.values()))[0]["steps"]
    runs = sorted({len(rows) for rows in by_variant.values()})
    per_step = f"; `none`: {1000 * base / steps:.1f} ms/step" if base else ""
    lines = [f"**{kind} BERT, {steps} steps, {metrics} extra metrics per step{per_step}; "
             f"{'/'.join(map(str, runs))} runs per variant**", "",
             "| variant | train() + close s, median (min-max) | added to train() + close | "
             "ours-added / stock-added | target | CPU s, median | added CPU | ours / stock, CPU | "
             "ours / stock, training thread CPU | delivered / produced points |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    for name in VARIANTS:
        rows = by_variant.get(name)
        if not rows:
            continue
        times = [r["train_s"] + r["close_s"] for r in rows]
        ratio, cpu_ratio, thread_ratio = (_ratio(name, values) for values in (added, cpu_added, thread_added))
        if base is None or name == "none":
            target = ""
        elif metrics <= 20:
            target = "met (<= 2 %)" if added[name] <= 2.0 else "missed (> 2 %)"
        elif ratio is not None:
            target = "met (<= 0.5)" if ratio <= 0.5 else "missed (> 0.5)"
        else:
            target = ""
        none = name == "none"
        lines.append(
            f"| {name} | {statistics.median(times):.2f} ({min(times):.2f}-{max(times):.2f}) "
            f"| {'' if none else f'{added[name]:+.1f} %'} | {'' if ratio is None else f'{ratio:.2f}'} "
            f"| {target} | {cpu[name]:.2f} | {'' if none else f'{cpu_added[name]:+.1f} %'} "
            f"| {'' if cpu_ratio is None else f'{cpu_ratio:.2f}'} "
            f"| {'' if thread_ratio is None else f'{thread_ratio:.2f}'} "
            f"| {'' if none else _fmt_points(rows)} |")
    closes = {name: statistics.median(r["close_s"] for r in rows) for name, rows in by_variant.items()
              if name in ("MLflowCallback", "WandbCallback", "WandbLogger")}
    if closes:
        lines += ["", "After train() (not in the figures above): " + ", ".join(
            f"{name} close {value:.3f} s" for name, value in closes.items()) + "."]
    return lines + [""]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        kind, metrics, variant, steps, root, store, threads, package_dir = sys.argv[2:10]
        sys.path.insert(0, package_dir)
        row = run_one(kind, int(metrics), variant, int(steps), Path(root), Path(store), int(threads))
        row["package"] = str(Path(sys.modules["hf_callbacks_plus"].__file__).parent)
        print(json.dumps(row))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "100ms", "both"], default="both")
    parser.add_argument("--metrics", default="20,500", help="extra metrics per step, comma-separated")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps (default: 300 for tiny, 150 for 100ms)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds over all variants (default 3)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated of {VARIANTS}")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (0: torch's default), default 1")
    parser.add_argument("--jsonl", default=None, help="append every run's figures to this file")
    parser.add_argument("--summarize", default=None, metavar="FILE",
                        help="only print the tables of the runs in FILE (written by --jsonl; several "
                             "invocations may append to one file)")
    parser.add_argument("--commit", default=None,
                        help="measure hf_callbacks_plus as of this git revision (exported with git archive), "
                             "not the working tree: a fixed version while others edit the checkout")
    options = parser.parse_args()
    if options.summarize:
        results = [json.loads(line) for line in Path(options.summarize).read_text().splitlines() if line]
        for kind in MODELS:
            for metrics in sorted({row["metrics"] for row in results}):
                print("\n".join(summarize(results, kind, metrics)))
        return
    checkout = Path(__file__).resolve().parents[1]
    if not (checkout / "hf_callbacks_plus").is_dir():  # a copy of this script run from elsewhere
        checkout = Path.cwd()
    package_dir = str(checkout)
    if options.commit:
        package_dir = _export(checkout, options.commit)
    variants = [v.strip() for v in options.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {VARIANTS}")
    kinds = ["tiny", "100ms"] if options.model == "both" else [options.model]
    metric_counts = [int(m) for m in options.metrics.split(",")]
    template = Path(tempfile.mkdtemp(prefix="bench_loggers_train_store_")) / "mlflow.db"
    _make_store(template)
    results: list[dict] = []
    print(f"hf_callbacks_plus from {package_dir}" + (f" (git {options.commit})" if options.commit else
          " (working tree)"), flush=True)
    print(f"torch threads: {options.threads or 'default'}; {len(variants)} variants, "
          f"{options.repeats} rounds, order rotated each round", flush=True)
    for round_index in range(options.repeats):
        for kind in kinds:
            steps = options.steps or MODELS[kind][4]
            for metrics in metric_counts:
                shift = round_index % len(variants)
                for variant in variants[shift:] + variants[:shift]:
                    try:
                        row = _spawn(kind, metrics, variant, steps, template, options.threads, package_dir)
                    except (RuntimeError, subprocess.TimeoutExpired) as error:
                        print(error, flush=True)
                        continue
                    results.append(row)
                    print(json.dumps(row), flush=True)
                    if options.jsonl:
                        with open(options.jsonl, "a") as handle:
                            handle.write(json.dumps(row) + "\n")
    print()
    for kind in kinds:
        for metrics in metric_counts:
            print("\n".join(summarize(results, kind, metrics)))
    shutil.rmtree(template.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
