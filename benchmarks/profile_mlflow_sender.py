"""Where `MLflowLogger`'s delivery CPU goes: our sender against MLflow's own store (issue 33, item 10).

A training with ``MLflowLogger`` aimed at a port where nothing listens writes every record into its
write-ahead log (M extra metrics per step, ``logging_steps=1``); ``hf-callbacks-plus replay`` then
sends that log to a fresh sqlite store on this thread, under cProfile: exactly the work the sender
thread does during a training, without the training. The table splits the sending time between
MLflow's ``MlflowClient.log_batch`` (the store: SQLAlchemy row inserts and latest-value updates,
which transformers' ``MLflowCallback`` pays the same for the same points; ``--top`` lists its
functions) and everything else (ours:
reading and parsing the log, building MLflow's entities, pacing).

Run::

    .venv/bin/python benchmarks/profile_mlflow_sender.py --steps 150 --metrics 500
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def write_log(out: Path, steps: int, metrics: int) -> Path:
    """Train the tiny regression model with the store unreachable: every record stays in the log."""
    from transformers import PrinterCallback, TrainerCallback

    from hf_callbacks_plus import MLflowLogger
    from tests.tiny_models import make_trainer

    class ExtraMetrics(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs is not None and "loss" in logs:
                logs.update({f"extra_{index}": index / metrics + state.global_step
                             for index in range(metrics)})

    logger = MLflowLogger(tracking_uri="http://127.0.0.1:9", experiment_name="profile", flush_timeout=1)
    trainer = make_trainer(out, callbacks=[ExtraMetrics(), logger], n_train=8 * steps, max_steps=steps,
                           logging_steps=1, save_strategy="no", eval_strategy="no", report_to="none")
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return out / ".mlflow_wal"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--metrics", type=int, default=500)
    parser.add_argument("--top", type=int, default=0, help="also print the N costliest functions")
    options = parser.parse_args()
    from mlflow.tracking import MlflowClient

    from hf_callbacks_plus.cli import main as cli

    with tempfile.TemporaryDirectory() as folder:
        folder_path = Path(folder)
        wal = write_log(folder_path / "out", options.steps, options.metrics)
        store = f"sqlite:///{folder_path / 'store.db'}"
        MlflowClient(store).search_experiments()  # the schema first: no migration in the profile
        profile = cProfile.Profile()
        profile.runcall(cli, ["replay", str(wal), "--tracking-uri", store])
        report = pstats.Stats(profile)
        stats = report.stats
    total = _cumulative(stats, "wal.py", "send_to_end")
    store_seconds = _cumulative(stats, "tracking/client.py", "log_batch")
    print(f"{options.steps} steps x {options.metrics} metrics, sent to a fresh sqlite store by replay\n")
    print("| part | seconds | share |\n|---|---:|---:|")
    for name, seconds in (("sending, in all (`Sender.send_to_end`)", total),
                          ("MLflow's `MlflowClient.log_batch` (the store)", store_seconds),
                          ("ours (the rest)", total - store_seconds)):
        print(f"| {name} | {seconds:.2f} | {seconds / total:.1%} |")
    if options.top:
        report.sort_stats("cumulative").print_stats(options.top)


def _cumulative(stats: dict, file_part: str, function: str) -> float:
    """The cumulative time of the outermost call of ``function`` in a file ending with ``file_part``."""
    return max((entry[3] for (path, _line, name), entry in stats.items()
                if name == function and path.endswith(file_part)), default=0.0)


if __name__ == "__main__":
    main()
