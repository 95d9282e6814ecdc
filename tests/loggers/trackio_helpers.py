"""A real trackio store read back: the project's runs, their records, configs and alerts.

trackio keeps one sqlite file per project under ``TRACKIO_DIR`` (tests/conftest.py points it at a
temporary folder per test process, before trackio is imported); each test uses its own project.
Read through trackio's own API (``trackio.Api``) and storage class, which its dashboard uses.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any


def project_name(tmp_path: Path) -> str:
    """A project of this test's own (trackio's store is shared by the test process)."""
    return f"t-{tmp_path.name}"


def trackio_runs(project: str) -> list[Any]:
    """The project's runs (``trackio.Api``'s: ``name``, ``id``, ``config``, ``alerts()``), oldest first."""
    import trackio

    return list(trackio.Api().runs(project))


def records(project: str, run: Any) -> list[dict[str, Any]]:
    """The run's records in logging order: ``{"step": ..., "timestamp": ..., key: value...}``."""
    from trackio.sqlite_storage import SQLiteStorage

    return SQLiteStorage.get_logs(project, run.name, run_id=run.id)


def points(project: str) -> Counter:
    """``(key, step)`` of every value of every run of the project."""
    counted: Counter = Counter()
    for run in trackio_runs(project):
        for row in records(project, run):
            counted.update((key, row["step"]) for key in row if key not in ("step", "timestamp"))
    return counted


def series(project: str, run: Any, key: str) -> list[tuple[int, Any]]:
    """``(step, value)`` of each record of ``run`` holding ``key``."""
    return [(row["step"], row[key]) for row in records(project, run) if key in row]


def store_bytes(project: str) -> bytes:
    """Every byte of the project's store (the sqlite file and its journal files)."""
    from trackio.sqlite_storage import SQLiteStorage

    path = SQLiteStorage.get_project_db_path(project)
    return b"".join(file.read_bytes() for file in path.parent.glob(path.name + "*"))


def points_and_statuses(project: str) -> tuple[Counter, list[str]]:
    """``(key, step)`` points and one status per run: trackio has no run status, so a run with an
    ERROR alert at its last step (the crash) is FAILED, else FINISHED."""
    statuses = []
    for run in trackio_runs(project):
        last = max((row["step"] for row in records(project, run)), default=0)
        failed = any(alert["level"] == "error" and alert["step"] >= last for alert in run.alerts())
        statuses.append("FAILED" if failed else "FINISHED")
    return points(project), statuses
