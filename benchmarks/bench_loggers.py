"""Time spent on the training thread per ``on_log``: our loggers vs transformers' callbacks.

Same log records for both (a training record every call, an evaluation record every 10th),
measured in one run:

* ``MLflowLogger`` vs ``transformers.integrations.MLflowCallback`` on a sqlite store;
* the same against a real ``mlflow server`` on 127.0.0.1 (started by this script);
* ``WandbLogger`` vs ``transformers.integrations.WandbCallback`` on a W&B offline run.

Run: ``.venv/bin/python benchmarks/bench_loggers.py [--calls 300] [--no-server] [--no-wandb] [--no-mlflow]``.
Not a test: it prints a table (median and p95 per call, ratio transformers / ours).

``--heavy`` measures load instead (issue 12): 500 metrics per record, a record every step, 2000
steps, ours vs the stock callback on each backend, each in its own subprocess (so the peak
memory is its own): training-thread µs per record, delivery throughput (points/s into the
store), peak RSS growth during the run, delivered / expected points (and what was left in
MLflowLogger's write-ahead log and reported instead), and the wait at the end of training::

    .venv/bin/python benchmarks/bench_loggers.py --heavy [--steps 2000] [--metrics 500] \
        [--only BACKEND] [--implementation ours]
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

    The run is opened before the timed calls and closed after; ``WandbLogger`` hands each record
    to ``run.log`` on the calling thread, as the stock callback does (its flush time after the
    last call is printed separately).
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
        ours.close()  # the run stays open after training (as WandbCallback leaves it): end it here
        print(f"WandbLogger flush after the last call: {drain[0]:.3f} s "
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


# -- heavy load -------------------------------------------------------------------------
def heavy_logs(steps: int, metrics: int) -> list[dict[str, Any]]:
    """One record per step: ``loss`` plus ``metrics - 1`` other training metrics."""
    return [{"loss": 1.0 / step, **{f"metric_{k:03d}": k + step / steps for k in range(metrics - 1)}}
            for step in range(1, steps + 1)]


def _count_mlflow_points(db: Path, run_id: str) -> int:
    import sqlite3

    with sqlite3.connect(str(db)) as connection:
        return connection.execute("select count(*) from metrics where run_uuid = ?", (run_id,)).fetchone()[0]


def _spilled_points(folder: Path) -> int:
    """Points left in MLflowLogger's write-ahead logs past their acknowledged offset."""
    import json

    total = 0
    for file in folder.rglob("*.jsonl"):
        with open(file, "rb") as handle:
            handle.seek(json.loads(file.with_suffix(".json").read_text()).get("acked", 0))
            for line in handle:
                record = json.loads(line)
                if record.get("kind") == "log":
                    total += len(record.get("metrics", {}))
    return total


def heavy_one(implementation: str, backend: str, uri: str, steps: int, metrics: int, root: Path) -> dict:
    """One (implementation, backend) measurement in this process; returns the figures."""
    import resource

    from transformers import TrainerControl, TrainerState, TrainingArguments

    logs = heavy_logs(steps, metrics)
    out = root / f"{implementation}-{backend}"
    args = TrainingArguments(output_dir=str(out), report_to="none", use_cpu=True)
    state, control = TrainerState(), TrainerControl()
    state.is_world_process_zero = True
    expected = steps * metrics
    if backend.startswith("mlflow"):
        os.environ.update(MLFLOW_TRACKING_URI=uri, MLFLOW_EXPERIMENT_NAME="heavy", MLFLOW_MAX_LOG_PARAMS="0")
        if implementation == "ours":
            from hf_callbacks_plus.loggers.mlflow import MLflowLogger

            callback = MLflowLogger(log_params=False)
        else:
            from transformers.integrations import MLflowCallback

            callback = MLflowCallback()
    else:
        os.environ.update(WANDB_MODE="offline", WANDB_DIR=str(out / "wandb"))
        (out / "wandb").mkdir(parents=True, exist_ok=True)
        import wandb

        settings = wandb.Settings(console="off", x_disable_stats=True, x_disable_machine_info=True,
                                  x_save_requirements=False, disable_git=True)
        wandb.setup(settings=settings)
        if implementation == "ours":
            from hf_callbacks_plus.loggers.wandb import WandbLogger

            callback = WandbLogger(project="heavy", settings=settings, log_config=False,
                                   dir=str(out / "wandb"))
        else:
            from transformers.integrations import WandbCallback

            callback = WandbCallback()
    callback.on_train_begin(args, state, control, model=None)
    if implementation == "ours":
        callback.flush(120)  # the run is open
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    on_thread = []
    start = time.perf_counter()
    for step, entry in enumerate(logs, start=1):
        state.global_step = step
        record = dict(entry)
        begin = time.perf_counter()
        callback.on_log(args, state, control, logs=record)
        on_thread.append(time.perf_counter() - begin)
    train_end = time.perf_counter()
    callback.on_train_end(args, state, control, model=None)
    if implementation == "stock" and backend.startswith("mlflow"):
        import mlflow

        run_id = mlflow.last_active_run().info.run_id if mlflow.active_run() is None else None
        if mlflow.active_run() is not None:
            run_id = mlflow.active_run().info.run_id
            mlflow.end_run()
    elif implementation == "ours" and backend.startswith("mlflow"):
        run_id = callback.run_id
    end = time.perf_counter()
    peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - baseline) / 1024
    if backend.startswith("mlflow"):
        db = Path(uri.replace("sqlite:///", "")) if uri.startswith("sqlite") else root / "server.db"
        delivered = _count_mlflow_points(db, run_id)
    else:
        from hf_callbacks_plus.testing.wandb_reader import find_wandb_runs, read_wandb_run

        run = read_wandb_run(find_wandb_runs(out / "wandb")[-1], wait=60)
        delivered = sum(1 for row in run.history for key in row
                        if key.startswith(("train/loss", "train/metric_")))
    spilled = _spilled_points(out / ".mlflow_wal") if (out / ".mlflow_wal").exists() else 0
    return {"implementation": implementation, "backend": backend,
            "us_per_record": statistics.median(on_thread) * 1e6, "points_per_s": delivered / (end - start),
            "peak_mb": peak_mb,
            "delivered": delivered, "spilled": spilled, "expected": expected, "end_wait_s": end - train_end}


def heavy(steps: int, metrics: int, backends: list[str],
          implementations: tuple[str, ...] = ("stock", "ours")) -> None:
    """Every (backend, implementation) pair in its own subprocess; prints one table."""
    import json

    root = Path(tempfile.mkdtemp(prefix="bench_loggers_heavy_"))
    server = None
    results = []
    try:
        for backend in backends:
            uri = ""
            if backend == "mlflow sqlite":
                uri = f"sqlite:///{root / 'store.db'}"
            elif backend == "mlflow server":
                server = Server(root)
                uri = server.uri
            for implementation in implementations:
                done = subprocess.run(
                    [sys.executable, __file__, "--heavy-one", implementation, backend, uri, str(steps),
                     str(metrics), str(root)], capture_output=True, text=True, timeout=3600)
                lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
                if done.returncode != 0 or not lines:
                    print(f"{backend} {implementation} failed:\n{done.stderr[-3000:]}")
                    continue
                results.append(json.loads(lines[-1]))
                print(json.dumps(results[-1]), flush=True)
            if server is not None:
                server.stop()
                server = None
    finally:
        if server is not None:
            server.stop()
    print(f"\n{steps} steps x {metrics} metrics per record, one record per step")
    print(f"{'backend':<15} {'impl':<6} {'us/record':>10} {'points/s':>9} {'peak MB':>8} {'delivered':>16} "
          f"{'kept':>8} {'end wait s':>10}")
    for row in results:
        share = f"{row['delivered']}/{row['expected']}"
        print(f"{row['backend']:<15} {row['implementation']:<6} {row['us_per_record']:>10.1f} "
              f"{row['points_per_s']:>9.0f} {row['peak_mb']:>8.1f} {share:>16} {row['spilled']:>8} "
              f"{row['end_wait_s']:>10.1f}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--heavy-one":
        import json

        implementation, backend, uri, steps, metrics, root = sys.argv[2:8]
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        print(json.dumps(heavy_one(implementation, backend, uri, int(steps), int(metrics), Path(root))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="on_log calls per row (default 300)")
    parser.add_argument("--no-server", action="store_true", help="skip the mlflow server rows")
    parser.add_argument("--no-wandb", action="store_true", help="skip the W&B offline rows")
    parser.add_argument("--no-mlflow", action="store_true", help="skip the MLflow rows (sqlite and server)")
    parser.add_argument("--heavy", action="store_true", help="the load benchmark (see the module docstring)")
    parser.add_argument("--steps", type=int, default=2000, help="--heavy: records (steps), default 2000")
    parser.add_argument("--metrics", type=int, default=500, help="--heavy: metrics per record, default 500")
    parser.add_argument("--only", choices=["mlflow sqlite", "mlflow server", "wandb offline"], default=None,
                        help="--heavy: measure this backend only")
    parser.add_argument("--implementation", choices=["stock", "ours"], default=None,
                        help="--heavy: measure this implementation only (default: both)")
    options = parser.parse_args()
    if options.heavy:
        backends = [] if options.no_mlflow else (
            ["mlflow sqlite"] + ([] if options.no_server else ["mlflow server"]))
        backends += [] if options.no_wandb else ["wandb offline"]
        implementations = (options.implementation,) if options.implementation else ("stock", "ours")
        heavy(options.steps, options.metrics, [options.only] if options.only else backends, implementations)
        return
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
