"""Time spent on the training thread per ``on_log``: our loggers vs transformers' callbacks.

Same log records for both (a training record every call, an evaluation record every 10th),
measured in one run:

* ``MLflowLogger`` vs ``transformers.integrations.MLflowCallback`` on a sqlite store;
* the same against a real ``mlflow server`` on 127.0.0.1 (started by this script);
* ``WandbLogger`` vs ``transformers.integrations.WandbCallback`` on a W&B offline run.

Run: ``.venv/bin/python benchmarks/bench_loggers.py [--calls 300] [--no-server] [--no-wandb] [--no-mlflow]``.
Not a test: it prints a table (median and p95 per call, ratio transformers / ours).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable

os.environ.pop("DISABLE_MLFLOW_INTEGRATION", None)
os.environ.setdefault("WANDB_SILENT", "true")

Row = tuple[str, str, list[float]]  # (backend/store, implementation, per-call seconds)


def make_logs(calls: int) -> list[dict[str, Any]]:
    """Log records like a Trainer's: train metrics every call, eval metrics every 10th."""
    logs = []
    for step in range(1, calls + 1):
        if step % 10 == 0:
            logs.append({"eval_loss": 1.0 / step, "eval_accuracy": 0.5 + step / (4 * calls),
                         "eval_runtime": 0.5, "eval_samples_per_second": 100.0,
                         "eval_steps_per_second": 10.0, "epoch": step / 100})
        else:
            logs.append({"loss": 1.0 / step, "grad_norm": 0.5, "learning_rate": 1e-4, "epoch": step / 100})
    return logs


def time_on_log(callback: Any, logs: list[dict[str, Any]], begin: Callable[[Any, Any, Any], None],
                end: Callable[[Any, Any, Any], None]) -> list[float]:
    """Call ``on_log`` once per record, timing only the call; begin/end are not timed."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="bench_loggers_"), report_to="none",
                             use_cpu=True)
    state, control = TrainerState(), TrainerControl()
    state.is_world_process_zero = True
    begin(args, state, control)
    timings = []
    for step, entry in enumerate(logs, start=1):
        state.global_step = step
        record = dict(entry)  # the Trainer passes a fresh dict per call
        start = time.perf_counter()
        callback.on_log(args, state, control, logs=record)
        timings.append(time.perf_counter() - start)
    end(args, state, control)
    return timings


def bench_mlflow(store_uri: str, label: str, logs: list[dict[str, Any]]) -> list[Row]:
    """MLflowLogger vs transformers' MLflowCallback on ``store_uri``."""
    import mlflow
    from transformers.integrations import MLflowCallback

    from hf_callbacks_plus.loggers.mlflow import MLflowLogger

    rows = []
    ours = MLflowLogger(tracking_uri=store_uri, experiment_name="bench", log_params=False)
    rows.append((label, "hf_callbacks_plus MLflowLogger", time_on_log(
        ours, logs,
        begin=lambda a, s, c: (ours.on_train_begin(a, s, c), ours.flush(120)),
        end=lambda a, s, c: ours.on_train_end(a, s, c),
    )))
    os.environ["MLFLOW_TRACKING_URI"] = store_uri
    os.environ["MLFLOW_EXPERIMENT_NAME"] = "bench"
    os.environ["MLFLOW_MAX_LOG_PARAMS"] = "0"
    try:
        stock = MLflowCallback()
        rows.append((label, "transformers MLflowCallback", time_on_log(
            stock, logs,
            begin=lambda a, s, c: stock.on_train_begin(a, s, c, model=None),
            end=lambda a, s, c: (stock.on_train_end(a, s, c), mlflow.end_run()),
        )))
    finally:
        for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_MAX_LOG_PARAMS"):
            os.environ.pop(name, None)
        mlflow.set_tracking_uri(None)
    return rows


def bench_wandb(logs: list[dict[str, Any]], root: Path) -> list[Row]:
    """WandbLogger vs transformers' WandbCallback, both writing a W&B offline run under ``root``.

    The run is opened before the timed calls and closed after; ``WandbLogger``'s background
    delivery time after the last call is printed separately (it does not block training).
    """
    os.environ.update(WANDB_MODE="offline", WANDB_DIR=str(root))
    import wandb
    from transformers.integrations import WandbCallback

    from hf_callbacks_plus.loggers.wandb import WandbLogger

    settings = wandb.Settings(console="off", x_disable_stats=True, x_disable_machine_info=True,
                              x_save_requirements=False, disable_git=True)
    stock = WandbCallback()
    wandb.setup(settings=settings)
    rows = [("wandb offline", "transformers WandbCallback", time_on_log(
        stock, logs,
        begin=lambda a, s, c: stock.on_train_begin(a, s, c, model=None),
        end=lambda a, s, c: wandb.finish(),
    ))]
    ours = WandbLogger(project="bench", settings=settings)
    drain: list[float] = []

    def end(args: Any, state: Any, control: Any) -> None:
        start = time.perf_counter()
        delivered = ours.flush(300)
        drain.append(time.perf_counter() - start)
        ours.on_train_end(args, state, control)
        print(f"WandbLogger background delivery after the last call: {drain[0]:.3f} s "
              f"({'complete' if delivered else 'NOT complete'})")

    rows.append(("wandb offline", "hf_callbacks_plus WandbLogger", time_on_log(
        ours, logs, begin=lambda a, s, c: (ours.on_train_begin(a, s, c), ours.flush(120)), end=end,
    )))
    return rows


class Server:
    """A real ``mlflow server`` on 127.0.0.1 with a sqlite store, in its own process group."""

    def __init__(self, root: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.process = subprocess.Popen(
            [str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri",
             f"sqlite:///{root / 'server.db'}", "--default-artifact-root", str(root / "artifacts"),
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env,
        )
        end = time.monotonic() + 180
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.25)
        self.stop()
        raise TimeoutError("mlflow server did not start in 180 s")

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)


def summarize(rows: list[Row]) -> None:
    print(f"{'backend':<22} {'implementation':<34} {'median ms':>10} {'p95 ms':>8} {'ratio':>8}")
    reference: dict[str, float] = {}
    for backend, name, timings in rows:
        if name.startswith("transformers"):
            reference[backend] = statistics.median(timings)
    for backend, name, timings in rows:
        median = statistics.median(timings)
        p95 = sorted(timings)[int(0.95 * (len(timings) - 1))]
        ratio = reference.get(backend, float("nan")) / median if not name.startswith("transformers") else 1.0
        print(f"{backend:<22} {name:<34} {median * 1e3:>10.4f} {p95 * 1e3:>8.4f} {ratio:>7.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="on_log calls per row (default 300)")
    parser.add_argument("--no-server", action="store_true", help="skip the mlflow server rows")
    parser.add_argument("--no-wandb", action="store_true", help="skip the W&B offline rows")
    parser.add_argument("--no-mlflow", action="store_true", help="skip the MLflow rows (sqlite and server)")
    options = parser.parse_args()
    logs = make_logs(options.calls)
    root = Path(tempfile.mkdtemp(prefix="bench_loggers_"))
    rows: list[Row] = []
    if not options.no_mlflow:
        rows += bench_mlflow(f"sqlite:///{root / 'store.db'}", "mlflow sqlite", logs)
    if not options.no_mlflow and not options.no_server:
        server = Server(root)
        try:
            rows += bench_mlflow(server.uri, "mlflow server", logs)
        finally:
            server.stop()
    if not options.no_wandb:
        rows += bench_wandb(logs, root)
    print(f"time on the training thread per on_log call ({options.calls} calls per row); "
          "ratio = transformers median / ours")
    summarize(rows)


if __name__ == "__main__":
    main()
