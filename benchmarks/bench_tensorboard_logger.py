"""``TensorBoardBackend.log``: one event per record vs the former ``add_scalar`` per metric (issue 16).

Writes ``--records`` log records of ``--metrics`` metrics each (one record per ``log`` call, as
the worker sends them during training) into a fresh directory, then closes the writer, so every
byte is on disk in both cases. The reference ("old") is the former ``TensorBoardBackend.log``,
kept inline below: ``add_scalar`` per metric (one event each) and ``writer.flush()`` per call.
The two are measured alternately, ``--rounds`` times, best of each kept (a load change between
two measurements moves them both).

Run:
    .venv/bin/python benchmarks/bench_tensorboard_logger.py [--records 300] [--metrics 500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from hf_callbacks_plus.loggers.base import LogRecord
from hf_callbacks_plus.loggers.tensorboard import TensorBoardBackend, summary_writer_class


def old_log(writer: Any, records: list[LogRecord]) -> None:
    """The former ``TensorBoardBackend.log``: ``add_scalar`` per value, a flush per call."""
    for record in records:
        walltime = record.time / 1000.0
        for key, value in record.metrics.items():
            writer.add_scalar(key, value, record.step, walltime=walltime)
        for key, value in record.summary.items():
            if isinstance(value, str):
                writer.add_text(key, value, record.step, walltime=walltime)
            else:
                writer.add_scalar(key, value, record.step, walltime=walltime)
    writer.flush()


def make_records(count: int, metrics: int) -> list[LogRecord]:
    """``count`` records at steps 1..count, ``metrics`` values each (as the renderer makes them)."""
    start = int(time.time() * 1000)
    return [LogRecord(step, start + step, {f"train/metric_{index}": step + index / metrics
                                           for index in range(metrics)}, {})
            for step in range(1, count + 1)]


def time_old(directory: Path, records: list[LogRecord]) -> tuple[float, float]:
    """Seconds in the ``log`` calls, and with the close (all on disk)."""
    writer = summary_writer_class()(log_dir=str(directory))
    begin = time.perf_counter()
    for record in records:
        old_log(writer, [record])
    logged = time.perf_counter() - begin
    writer.close()
    return logged, time.perf_counter() - begin


def time_new(directory: Path, records: list[LogRecord]) -> tuple[float, float]:
    """Seconds in the ``log`` calls, and with the close (all on disk)."""
    backend = TensorBoardBackend(summary_writer_class(), lambda run_id: str(directory))
    run_id = backend.start(None, "key", resume=False)
    begin = time.perf_counter()
    for record in records:
        backend.log([record], run_id)
    logged = time.perf_counter() - begin
    backend._writer.close()  # what finish() does, without its status text
    return logged, time.perf_counter() - begin


def best(function: Callable[[Path, list[LogRecord]], tuple[float, float]], root: Path, name: str,
         records: list[LogRecord], results: dict[str, list[tuple[float, float]]]) -> None:
    results.setdefault(name, []).append(function(Path(tempfile.mkdtemp(prefix=name, dir=root)), records))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--metrics", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    records = make_records(options.records, options.metrics)
    results: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as root:
        for _ in range(options.rounds):
            best(time_old, Path(root), "old", records, results)
            best(time_new, Path(root), "new", records, results)
    old = min(results["old"], key=lambda pair: pair[1])
    new = min(results["new"], key=lambda pair: pair[1])
    print(f"TensorBoardBackend.log, {options.records} records x {options.metrics} metrics, "
          f"{summary_writer_class().__module__}, best of {options.rounds}")
    print(f"{'':38} {'log calls':>10} {'+ close':>10}")
    print(f"{'old: add_scalar per metric + flush':38} {old[0]:9.3f}s {old[1]:9.3f}s")
    print(f"{'new: one event per record':38} {new[0]:9.3f}s {new[1]:9.3f}s")
    print(f"{'ratio old / new':38} {old[0] / new[0]:9.1f}x {old[1] / new[1]:9.1f}x")


if __name__ == "__main__":
    main()
