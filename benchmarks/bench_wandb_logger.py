"""Time spent on the training thread per ``on_log``: ``WandbLogger`` vs transformers' ``WandbCallback``.

Both log the same records (a training log every call, an evaluation log every 10th) to a W&B
offline run in a temp dir, with real ``TrainingArguments`` and ``TrainerState``. Only the
``on_log`` call is timed: the run is opened before (``on_train_begin``) and closed after.
``WandbLogger`` hands the record to its background worker; the time the worker then needs to
deliver everything is printed separately (it does not block training).

Run:
    .venv/bin/python benchmarks/bench_wandb_logger.py [--calls 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _records(calls: int) -> list[dict[str, float]]:
    records = []
    for index in range(calls):
        step = index + 1
        if step % 10 == 0:
            records.append({"eval_loss": 1.0 / step, "eval_accuracy": 0.5 + step / (4 * calls),
                            "eval_runtime": 0.1, "eval_samples_per_second": 100.0,
                            "eval_steps_per_second": 10.0, "epoch": step / 100})
        else:
            records.append({"loss": 2.0 / step, "grad_norm": 0.5, "learning_rate": 1e-4, "epoch": step / 100})
    return records


def _time_calls(callback: Any, args: Any, state: Any, control: Any, records: list[dict[str, float]],
                on_log: Callable[..., Any]) -> list[float]:
    times = []
    for step, logs in enumerate(records, start=1):
        state.global_step = step
        logs = dict(logs)  # transformers' callbacks may mutate the dict; give each a fresh one
        start = time.perf_counter()
        on_log(args, state, control, logs=logs)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=2000, help="on_log calls per logger (default 2000)")
    options = parser.parse_args()

    root = tempfile.mkdtemp(prefix="bench_wandb_")
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=root)
    import wandb
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from transformers.integrations import WandbCallback

    from hf_callbacks_plus.loggers.wandb import WandbLogger

    settings = wandb.Settings(console="off", x_disable_stats=True, x_disable_machine_info=True,
                              x_save_requirements=False, disable_git=True)
    args = TrainingArguments(output_dir=os.path.join(root, "out"), report_to="none", use_cpu=True)
    records = _records(options.calls)

    # transformers' WandbCallback
    state, control = TrainerState(), TrainerControl()
    theirs = WandbCallback()
    wandb.setup(settings=settings)
    theirs.on_train_begin(args, state, control, model=None)
    their_times = _time_calls(theirs, args, state, control, records, theirs.on_log)
    wandb.finish()

    # ours
    state, control = TrainerState(), TrainerControl()
    ours = WandbLogger(project="bench", settings=settings, log_config=True)
    ours.on_train_begin(args, state, control, model=None)
    ours.flush(timeout=120)  # the run is open: time the steady state, like theirs
    our_times = _time_calls(ours, args, state, control, records, ours.on_log)
    start = time.perf_counter()
    delivered = ours.flush(timeout=300)
    drain = time.perf_counter() - start
    ours.on_train_end(args, state, control)

    def describe(times: list[float]) -> str:
        ordered = sorted(times)
        median = statistics.median(ordered) * 1e3
        p95 = ordered[int(0.95 * (len(ordered) - 1))] * 1e3
        return f"median {median:.4f} ms, p95 {p95:.4f} ms, total {sum(times):.3f} s"

    their_median = statistics.median(their_times)
    our_median = statistics.median(our_times)
    print(f"on_log calls: {options.calls} per logger, W&B offline ({wandb.__version__})")
    print(f"  transformers WandbCallback: {describe(their_times)}")
    print(f"  hf_callbacks_plus WandbLogger: {describe(our_times)}")
    print(f"  ratio (ours / transformers, median): {our_median / their_median:.4f} "
          f"(1/{their_median / our_median:.0f}); target <= 1/20")
    print(f"  WandbLogger background delivery after the last call: {drain:.3f} s "
          f"({'complete' if delivered else 'NOT complete'})")


if __name__ == "__main__":
    main()
