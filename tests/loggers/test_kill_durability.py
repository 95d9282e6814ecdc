"""When a checkpoint is complete, every record up to its step is on disk, whatever the tracker's own
writer was doing: a training killed after ``checkpoint-60`` (SIGKILL of the training process, or of
its whole process group, W&B's service included) with the tracker's writer made slow from step 50,
then resumed from ``checkpoint-60``, leaves every (metric, step) of the trainer's history in the
tracker exactly once (tests/loggers/tracker_kill_script.py; real W&B offline files, TensorBoard event
files, a trackio store and a JSONL file, read back with each tracker's reader).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("transformers")

pytestmark = [pytest.mark.transformers, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(Path(__file__).with_name("tracker_kill_script.py"))
#: The trainer's keys and each tracker's names for them (the default "sections" naming).
KEYS = {"loss": "train/loss", "grad_norm": "train/grad_norm", "eval_loss": "eval/loss",
        "eval_mse": "eval/mse"}


def run_script(out: Path, tracker: str, kill_at: str, kill: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, str(out), tracker, kill_at, "50", kill], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600, start_new_session=True)


def expected_points(out: Path) -> Counter:
    """``(tracker key, step)`` of the trainer's own history: the final checkpoint's ``log_history``."""
    history = json.loads((out / "checkpoint-80" / "trainer_state.json").read_text())["log_history"]
    return Counter((KEYS[key], entry["step"]) for entry in history for key in entry if key in KEYS)


def tracker_points(out: Path, tracker: str, env: dict) -> Counter:
    if tracker == "wandb":
        from hf_callbacks_plus.testing.wandb_reader import find_wandb_runs, read_wandb_run
        from tests.loggers.wandb_helpers import points, synced_history

        # the killed run never gets its exit record: read as it is; the resumed one once W&B wrote it all
        paths = find_wandb_runs(Path(env["WANDB_DIR"]))
        resumed = max(paths, key=lambda path: path.parent.name)  # offline-run-<date>_<time>-<id>
        runs = [read_wandb_run(path, wait=20 if path == resumed else 0) for path in paths]
        return Counter(point for point in points(synced_history(runs)) if point[0] in KEYS.values())
    if tracker == "tensorboard":
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        accumulator = EventAccumulator(str(out / "tb"), size_guidance={"scalars": 0})
        accumulator.Reload()
        return Counter((tag, event.step) for tag in accumulator.Tags()["scalars"] if tag in KEYS.values()
                       for event in accumulator.Scalars(tag))
    if tracker == "trackio":
        from tests.loggers.trackio_helpers import points

        return Counter({point: count for point, count in points(env["KILL_TEST_TRACKIO_PROJECT"]).items()
                        if point[0] in KEYS.values()})
    counted: Counter = Counter()
    for line in (out / "log.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("event") == "log":
            counted.update((key, record["step"]) for key in record["curves"] if key in KEYS.values())
    return counted


TRACKERS = ("wandb", "tensorboard", "trackio", "jsonl")
#: Kill moments: right after the record of step 65 (between checkpoints), and inside the save of step 60
#: once its checkpoint is complete (before the logger hears of the save).
MOMENTS = {"65": 65, "s60": 60}
#: The first tier: W&B (whose service lost every point) killed with its service inside the save;
#: TensorBoard's writer at a save is also checked in the first tier by test_tensorboard_events.py.
FIRST_TIER = {("wandb", "s60", "group")}


@pytest.mark.parametrize("tracker,moment,kill", [
    pytest.param(*case, marks=() if case in FIRST_TIER else pytest.mark.second_tier)
    for case in itertools.product(TRACKERS, MOMENTS, ("process", "group"))])
def test_a_killed_and_resumed_training_leaves_every_point_once_in_the_tracker(tmp_path, monkeypatch,
                                                                                tracker, moment, kill):
    if tracker == "wandb":
        from tests.loggers.wandb_helpers import offline_env

        offline_env(monkeypatch, tmp_path / "wb")
    if tracker == "tensorboard":
        pytest.importorskip("tensorboard")
    if tracker == "trackio":
        pytest.importorskip("trackio")
        from tests.loggers.trackio_helpers import project_name

        monkeypatch.setenv("KILL_TEST_TRACKIO_PROJECT", project_name(tmp_path))
    # WANDB_SERVICE: the W&B service of this test process (a W&B test before this one started it); the
    # training must start its own, as a training does, so that its kill takes the service with it
    env = {**{key: value for key, value in os.environ.items() if key != "WANDB_SERVICE"},
           "PYTHONPATH": str(REPO), "WANDB_INIT_TIMEOUT": "300"}
    killed = run_script(tmp_path, tracker, moment, kill, env)
    assert killed.returncode == -signal.SIGKILL and f"KILL {MOMENTS[moment]}" in killed.stdout, \
        killed.stderr[-3000:]
    assert (tmp_path / "checkpoint-60" / "trainer_state.json").exists()
    assert not (tmp_path / "checkpoint-80").exists()
    resumed = run_script(tmp_path, tracker, "0", kill, env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    expected, found = expected_points(tmp_path), tracker_points(tmp_path, tracker, env)
    missing = sorted(set(expected) - set(found))
    repeated = sorted(point for point, count in found.items() if count > 1)
    assert not missing and not repeated, (f"{len(missing)} missing: {missing[:12]}; "
                                         f"{len(repeated)} repeated: {repeated[:12]}; killed: "
                                         f"{killed.stderr[-2000:]}; resumed: {resumed.stderr[-2000:]}")
    assert found == expected
    assert not list((tmp_path / ".tracker_journal").glob("*.jsonl"))  # closed cleanly: nothing kept
