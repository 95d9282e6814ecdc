"""What appending one log record to a write-ahead log costs the training thread: packed vs JSON.

Every durable logger (MLflow, W&B, TensorBoard, trackio) appends each rendered record to its
write-ahead log on the training thread (``WriteAheadLog.append``). A ``log`` line packs its curve
values as base64 of their float64 bytes after the list of names (`WriteAheadLog._line`); before, the
whole entry was ``json.dumps``-ed, one float's repr at a time. This script times both encodings of the
same entries (full-precision random floats, as losses and accuracies are; a new step each time) and
one real ``append`` to a file, and reads the packed lines back to check every value's bits.

Run: ``.venv/bin/python benchmarks/bench_wal_line.py [--metrics 20,500] [--records 2000]``.
"""

from __future__ import annotations

import argparse
import json
import random
import struct
import tempfile
import time
from pathlib import Path

from hf_callbacks_plus.loggers.wal import WriteAheadLog


def _entries(metrics: int, records: int) -> list[dict]:
    names = [f"train/metric_{index}" for index in range(metrics)]
    return [{"kind": "log", "step": step, "time": 0, "position": step, "summary": {},
             "metrics": {name: random.random() for name in names}} for step in range(records)]


def _per_record_ms(encode, entries: list[dict]) -> float:
    start = time.thread_time()
    for entry in entries:
        encode(entry)
    return (time.thread_time() - start) / len(entries) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", default="20,500", help="metrics per record, comma-separated")
    parser.add_argument("--records", type=int, default=2000, help="records per measurement")
    options = parser.parse_args()
    print("| metrics | JSON line, ms | packed line, ms | JSON / packed | append (packed), ms | bits equal |")
    print("|---:|---:|---:|---:|---:|---|")
    for metrics in (int(value) for value in options.metrics.split(",")):
        entries = _entries(metrics, options.records)
        as_json = _per_record_ms(lambda entry: (json.dumps(entry, allow_nan=True) + "\n").encode(), entries)
        packed = _per_record_ms(WriteAheadLog._line, entries)
        with tempfile.TemporaryDirectory() as folder:
            wal = WriteAheadLog(Path(folder) / "run.jsonl")
            wal.open({"logger": "bench"}, wait=0)
            appended = _per_record_ms(wal.append, entries)
            read = [entry for entry, _ in wal.entries(wal.first)]
            wal.close()
        bits = all(struct.pack(f"<{metrics}d", *entry["metrics"].values())
                   == struct.pack(f"<{metrics}d", *original["metrics"].values())
                   for entry, original in zip(read, entries)) and len(read) == len(entries)
        ratio = as_json / packed
        print(f"| {metrics} | {as_json:.4f} | {packed:.4f} | {ratio:.1f}x | {appended:.4f} | {bits} |")


if __name__ == "__main__":
    main()
