"""`make demo`: fine-tune a tiny BERT classifier with a stock ``transformers.Trainer`` and our callbacks.

Everything is local (no hub, no network): a generated review corpus with 10% label noise
(``examples/demo_data``), a WordPiece tokenizer trained on it, a 2-layer BERT built from a
config. The callbacks:

* ``TrainSubsetEvaluation``: accuracy/loss on 300 fixed training samples at every
  evaluation, in the same log record as the eval metrics. The model first learns the rule,
  then memorises the noisy training labels: the train-subset curve pulls away from the
  eval curve;
* ``EarlyStopping`` on ``eval_loss``: fires once the eval loss stops improving, and says why;
* ``KeepBestCheckpoints`` on ``eval_accuracy``: the 2 best checkpoints, safe from rotation;
* ``ThroughputMonitor``: sequences/s and tokens/s of each logging window;
* ``ConsoleSummary``: one line per evaluation (eval vs train subset, the gap, the best so far,
  throughput) instead of the record's dict;
* ``MLflowLogger`` (embedded sqlite store ``runs/mlflow.db``), ``WandbLogger`` (offline, under
  ``runs/wandb``) and ``JsonlLogger`` (``runs/demo/metrics.jsonl``): every metric in its section
  (``train/``, ``train_subset/``, ``eval/``, ``gap/``, ``early_stopping/``), one step axis.

At the end it prints a summary, reads both trackers back to show the sections, and writes
``runs/demo/learning_curves.png`` (the default plot: the loss and the monitored accuracy, with
the best step, the early stop and the kept checkpoints).

Run: ``make demo`` or ``python examples/demo.py [--help]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

# A quiet console: the WandbLogger is offline by its own argument (WANDB_MODE=offline would make
# transformers print "[INFO] Running in WANDB offline mode"), MLflow keeps its INFO lines (the new
# sqlite store's tables) to itself, and transformers draws no bar per saved checkpoint ("Writing
# model shards"): the evaluation lines are the progress (--progress adds the training bar).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_CONSOLE", "off")
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo_pipeline import build_datasets, build_model, build_tokenizer, compute_metrics, data_collator  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: Optional[list[str]] = None, default_name: str = "demo") -> argparse.Namespace:
    """Command-line options; the defaults are the full demo (see the README for its time).

    ``default_name`` is the run's sub-directory when ``--name`` is not given (each example
    has its own, so one never wipes another's run)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--runs-dir", default=str(ROOT / "runs"), help="where everything is written")
    parser.add_argument("--name", default=default_name, help="run name and sub-directory of --runs-dir")
    parser.add_argument("--n-train", type=int, default=600, help="training examples")
    parser.add_argument("--n-eval", type=int, default=400, help="evaluation examples")
    parser.add_argument("--subset-size", type=int, default=200, help="train-subset size")
    parser.add_argument("--epochs", type=float, default=40,
                        help="maximum epochs (early stopping ends sooner)")
    parser.add_argument("--eval-steps", type=int, default=20, help="evaluate (and log, save) every N steps")
    parser.add_argument("--patience", type=int, default=5, help="evaluations without improvement")
    parser.add_argument("--min-delta", type=float, default=0.0, help="improvement margin of early stopping")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=32, help="per-device train batch size")
    parser.add_argument("--eval-batch-size", type=int, default=128, help="per-device eval batch size")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--trackers", default="mlflow,wandb,jsonl",
                        help="comma-separated subset of mlflow,wandb,jsonl (or 'none')")
    parser.add_argument("--resume", default=None, help="resume from this checkpoint (keeps the run dir)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=False,
                        help="show transformers' progress bar (the evaluation lines show the progress)")
    parser.add_argument("--no-plot", action="store_true", help="skip the learning-curves PNG")
    return parser.parse_args(argv)


def is_main_process() -> bool:
    """True on rank 0 (or without a distributed launcher)."""
    return int(os.environ.get("RANK", "0")) == 0


def monitoring_callbacks(options: argparse.Namespace) -> dict[str, Any]:
    """The demo's callbacks other than the loggers, in call order: the subset's metrics first, then
    the stop rule (the tests print the docs' console lines with these)."""
    from hf_callbacks_plus import (
        ConsoleSummary,
        EarlyStopping,
        KeepBestCheckpoints,
        ThroughputMonitor,
        TrainSubsetEvaluation,
    )

    return {
        "train_subset": TrainSubsetEvaluation(size=options.subset_size, stratify_by="labels", seed=0,
                                              gap_metrics=["accuracy"]),
        "early_stopping": EarlyStopping(monitor="eval_loss", patience=options.patience,
                                        min_delta=options.min_delta),
        "best_checkpoints": KeepBestCheckpoints("eval_accuracy", k=2),
        "throughput": ThroughputMonitor(flops_per_token=None),  # sequences/s, tokens/s (no MFU on a CPU)
        "console": ConsoleSummary(metrics=["accuracy"]),
    }


def build_trainer(options: argparse.Namespace, output_dir: Path) -> tuple[Any, dict[str, Any]]:
    """A stock ``transformers.Trainer`` with our callbacks; returns ``(trainer, callbacks)``."""
    import torch
    from transformers import Trainer, TrainingArguments

    from hf_callbacks_plus import JsonlLogger, MLflowLogger, WandbLogger, run_before_integrations

    # one thread: a 100k-parameter model's operations take microseconds, so a second thread only
    # adds its synchronisation (and waits for the other core whenever the machine is busy)
    torch.set_num_threads(1)
    tokenizer = build_tokenizer()
    train_dataset, eval_dataset = build_datasets(tokenizer, n_train=options.n_train, n_eval=options.n_eval)
    runs_dir = Path(options.runs_dir).resolve()
    trackers = {name.strip() for name in options.trackers.split(",")} - {"none", ""}
    unknown = trackers - {"mlflow", "wandb", "jsonl"}
    if unknown:
        raise ValueError(f"--trackers: unknown {sorted(unknown)}; choose from mlflow, wandb, jsonl, none")

    callbacks = monitoring_callbacks(options)
    if "mlflow" in trackers:
        callbacks["mlflow"] = MLflowLogger(tracking_uri=f"sqlite:///{runs_dir / 'mlflow.db'}",
                                           experiment_name="hf-callbacks-plus-demo", run_name=options.name)
    if "wandb" in trackers:
        callbacks["wandb"] = WandbLogger(project="hf-callbacks-plus-demo", name=options.name, mode="offline",
                                         dir=str(runs_dir))
    if "jsonl" in trackers:
        callbacks["jsonl"] = JsonlLogger(str(output_dir / "metrics.jsonl"))

    extra: dict[str, Any] = {}
    if "average_tokens_across_devices" in TrainingArguments.__dataclass_fields__:
        # transformers >= 4.46 multiplies the loss by the number of processes when the model's
        # forward takes **kwargs, expecting a sum over tokens; BERT's classification loss is a
        # mean, so under torchrun the logged losses would be doubled. Not needed on one process.
        extra["average_tokens_across_devices"] = False
    args = TrainingArguments(
        **extra,
        output_dir=str(output_dir), run_name=options.name, num_train_epochs=options.epochs,
        per_device_train_batch_size=options.batch_size, per_device_eval_batch_size=options.eval_batch_size,
        learning_rate=options.learning_rate, warmup_steps=30, weight_decay=0.0,
        eval_strategy="steps", eval_steps=options.eval_steps, logging_steps=options.eval_steps,
        save_strategy="steps", save_steps=options.eval_steps, save_total_limit=2,
        report_to="none", use_cpu=True, seed=0, dataloader_num_workers=0,
        disable_tqdm=not options.progress,
    )
    trainer = Trainer(
        model=build_model(tokenizer, hidden_size=options.hidden_size), args=args,
        train_dataset=train_dataset, eval_dataset=eval_dataset, data_collator=data_collator(tokenizer),
        compute_metrics=compute_metrics, callbacks=list(callbacks.values()),
    )
    # A stock Trainer has no on_pre_log event: this gives it the handler that fires it (so the
    # train-subset metrics and early_stopping/* keys are in the record every logger and the
    # console get), binds TrainSubsetEvaluation to the trainer and puts ours before the loggers.
    run_before_integrations(trainer)
    return trainer, callbacks


def tracker_sections(callbacks: dict[str, Any]) -> dict[str, dict[str, list[str]]]:
    """Read the trackers back: ``{tracker: {section: [metric names]}}``."""
    found: dict[str, set[str]] = {}
    mlflow_logger = callbacks.get("mlflow")
    if mlflow_logger is not None and mlflow_logger.run_id:
        from mlflow.tracking import MlflowClient

        run = MlflowClient(tracking_uri=mlflow_logger.tracking_uri).get_run(mlflow_logger.run_id)
        found["MLflow"] = set(run.data.metrics)
    wandb_logger = callbacks.get("wandb")
    if wandb_logger is not None and wandb_logger.run_id:
        from hf_callbacks_plus.testing.wandb_reader import find_wandb_runs, read_wandb_run

        wandb_logger.close()  # the run stays open after train() (for evaluate()): finish it to read it

        files = [f for f in find_wandb_runs(Path(wandb_logger.dir)) if wandb_logger.run_id in f.name]
        if files:
            run = read_wandb_run(files[-1], wait=10)
            found["W&B"] = set(run.keys()) | set(run.summary)
    sections: dict[str, dict[str, list[str]]] = {}
    for tracker, keys in found.items():
        grouped: dict[str, list[str]] = {}
        for key in sorted(k for k in keys if not k.startswith("_")):
            section, _, name = key.partition("/")
            grouped.setdefault(section if name else "(summary)", []).append(name or key)
        sections[tracker] = grouped
    return sections


def summarize(trainer: Any, callbacks: dict[str, Any], output_dir: Path, seconds: float,
              png: Optional[Path]) -> str:
    """The text printed at the end of the demo."""
    stopper = callbacks["early_stopping"]
    history = trainer.state.log_history
    evals = [r for r in history if "eval_accuracy" in r]
    lines = ["", "=" * 78, f"Demo finished in {seconds:.0f} s ({trainer.state.global_step} steps, "
             f"{trainer.state.epoch:.1f} epochs)."]
    if stopper.stopped:
        lines.append(f"Early stopping ({stopper.reason.name}): {stopper.message}")
    else:
        lines.append(f"Early stopping did not fire (wait {stopper.wait}/{stopper.patience}); "
                     f"training ended at step {trainer.state.global_step}.")
    if stopper.best_step is not None:
        lines.append(f"Best eval_loss {stopper.best_value:.4f} at step {stopper.best_step}.")
    if evals:
        first, best, last = evals[0], evals[0], evals[-1]
        best = next((r for r in evals if r.get("step") == stopper.best_step), last)
        lines.append("Train subset vs eval accuracy (the gap is over-fitting to the noisy labels):")
        for label, record in (("first eval", first), ("best step", best), ("last eval", last)):
            train = record.get("train_subset_accuracy", float("nan"))
            gap = record.get("gap_accuracy", float("nan"))
            lines.append(f"  {label:>10} step {record['step']:>4}: train {train:.3f}  "
                         f"eval {record['eval_accuracy']:.3f}  gap {gap:+.3f}")
    for tracker, grouped in tracker_sections(callbacks).items():
        parts = "; ".join(f"{section + '/' if section != '(summary)' else 'run summary:'} {', '.join(names)}"
                          for section, names in grouped.items())
        lines.append(f"{tracker} metrics by section: {parts}")
    lines.append("Files:")
    lines.append(f"  checkpoints, trainer_state.json: {output_dir}")
    if "jsonl" in callbacks:
        lines.append(f"  JSONL log:        {callbacks['jsonl'].path}")
    if png is not None:
        lines.append(f"  learning curves:  {png}")
    if "mlflow" in callbacks:
        db_uri = callbacks["mlflow"].tracking_uri
        lines.append(f"  MLflow store:     {db_uri} (run {callbacks['mlflow'].run_id})")
        lines.append(f"  open it with:     mlflow ui --backend-store-uri {db_uri}")
    if "wandb" in callbacks and callbacks["wandb"].run_id:
        lines.append(f"  W&B offline run:  {callbacks['wandb'].dir}/wandb (id {callbacks['wandb'].run_id}); "
                     f"upload with: wandb sync {callbacks['wandb'].dir}/wandb/offline-run-*")
    lines.append("=" * 78)
    return "\n".join(lines)


def run(options: argparse.Namespace, prepare: Optional[Callable[[Any, dict[str, Any]], None]] = None,
        ) -> dict[str, Any]:
    """Train, then print the summary and write the PNG (rank 0). Returns what tests check.

    Args:
        options: From :func:`parse_args`.
        prepare: Called with ``(trainer, callbacks)`` before training (examples hook in here).
    """
    output_dir = Path(options.runs_dir).resolve() / options.name
    if options.resume is None and is_main_process() and output_dir.exists():
        shutil.rmtree(output_dir)  # a fresh demo run each time (the MLflow store keeps history)
    start = time.time()
    trainer, callbacks = build_trainer(options, output_dir)
    if prepare is not None:
        prepare(trainer, callbacks)
    trainer.train(resume_from_checkpoint=options.resume)
    seconds = time.time() - start
    trainer.save_state()
    for name in ("mlflow", "wandb", "jsonl"):
        if name in callbacks:
            callbacks[name].flush(timeout=30)
    stopper = callbacks["early_stopping"]
    result = {
        "global_step": trainer.state.global_step, "stopped_step": stopper.stopped_step,
        "best_step": stopper.best_step, "best_value": stopper.best_value, "reason": stopper.reason.name,
        "mlflow_run_id": getattr(callbacks.get("mlflow"), "run_id", None),
        "wandb_run_id": getattr(callbacks.get("wandb"), "run_id", None),
        "output_dir": str(output_dir), "seconds": seconds, "log_history": trainer.state.log_history,
    }
    if is_main_process():
        png = None
        if not options.no_plot:
            from hf_callbacks_plus import plot_learning_curves

            png = output_dir / "learning_curves.png"  # the default plot: the loss and the monitored metrics
            plot_learning_curves(output_dir, png, title=f"{options.name}: train subset vs eval")
        print(summarize(trainer, callbacks, output_dir, seconds, png), flush=True)
    return result


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    """Entry point of ``python examples/demo.py``."""
    return run(parse_args(argv))


def quiet_process() -> None:
    """Settings of the command's whole process (the tests that call `main` share theirs with
    DeepSpeed's tests, so only the command takes them):

    * an installed DeepSpeed is invisible: accelerate imports it in every ``Trainer`` (``make``
      installs it for the tests), which costs a second and prints "Setting accelerator to CPU";
      the demo trains on the CPU without it;
    * transformers' "mtime may not be reliable on this filesystem" is not printed: it says so
      whenever two checkpoints are less than a second apart (a fast machine) and then sorts them
      by step, which is right anyway.
    """
    import logging

    sys.modules.setdefault("deepspeed", None)  # importlib: not installed
    logging.getLogger("transformers.trainer_utils").setLevel(logging.ERROR)


if __name__ == "__main__":
    quiet_process()
    main()
