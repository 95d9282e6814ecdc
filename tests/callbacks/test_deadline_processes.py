"""Deadline against real signals sent from outside to real processes (second tier: each process pays
the torch and transformers imports, 15-30 s here): ``kill -TERM`` to a training process, to ``torchrun``
(which forwards it), ``kill -USR1`` to ``torchrun`` with
``--signals-to-handle``, to one rank and to every rank, at seeded random moments (inside a step,
during an evaluation, during a save), each run resumed in a new launch and compared with an
uninterrupted launch. The first tier's signals come from inside the processes (``os.kill`` at a gate:
tests/callbacks/test_deadline.py, and on the ranks of the suite's torchrun launch:
test_deadline_distributed.py).

The script (``deadline_script.py``) waits at a gate until its handler recorded the test's signal, so
the signal lands where the test chose. What ``torchrun`` does with signals (torch 2.13): it handles
SIGTERM, SIGINT, SIGHUP and SIGQUIT by sending the same signal to every worker's process group and
killing them after ``--shutdown-timeout`` (30 s), then exits with 1; any other signal (SIGUSR1) kills
it outright, its workers run on unsignalled, unless ``--signals-to-handle`` names it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from hf_callbacks_plus.cli import main as cli  # noqa: E402
from tests.callbacks.deadline_helpers import comparable, complete, jsonl_points, same_weights  # noqa: E402

pytestmark = [pytest.mark.transformers]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("deadline_script.py")
TORCHRUN = Path(sys.executable).with_name("torchrun")
LAUNCH_TIMEOUT = 600


def environment() -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "DISABLE_MLFLOW_INTEGRATION": "TRUE",
    }
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def wait_for(paths: list[Path], process: subprocess.Popen, timeout: float = LAUNCH_TIMEOUT) -> None:
    end = time.monotonic() + timeout
    while not all(path.exists() for path in paths):
        if process.poll() is not None:
            raise AssertionError(
                f"the run ended (code {process.returncode}) before {paths}:\n"
                + (process.stdout.read() if process.stdout else "")
            )
        if time.monotonic() > end:
            process.kill()
            raise AssertionError(f"timeout waiting for {paths}")
        time.sleep(0.05)


def rank_pid(out: Path, rank: int) -> int:
    """The pid a gated rank wrote when it reached its gate."""
    return int((out / f"ready-rank{rank}").read_text())


@pytest.mark.second_tier
def test_kill_term_from_outside_stops_with_exit_code_75_and_the_resume_ends_bit_identical(tmp_path):
    from tests.callbacks.deadline_script import build

    out = tmp_path / "job"
    out.mkdir()
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(out), "--gate", "step:5", "--exit-code"],
        cwd=REPO,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for([out / "ready-rank0"], process)
        os.kill(process.pid, signal.SIGTERM)  # `kill -TERM <pid>`, inside step 5
        output, _ = process.communicate(timeout=LAUNCH_TIMEOUT)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 75, output[-3000:]
    assert "Deadline: SIGTERM received" in output and "stopping after step 5: saving checkpoint-5" in output
    assert complete(out / "run" / "checkpoint-5")
    assert cli(["stop-status", str(out / "run" / "status.json")]) == 75  # what a job script tests
    resumed, deadline = build(out / "run")
    resumed.train(resume_from_checkpoint=True)
    assert deadline.exit_code == 0 and cli(["stop-status", str(out / "run" / "status.json")]) == 0
    reference, _ = build(tmp_path / "reference", status=False)
    reference.train()
    assert same_weights(resumed.model, reference.model)
    assert comparable(resumed.state.log_history) == comparable(reference.state.log_history)
    assert jsonl_points(out / "run" / "metrics.jsonl") == jsonl_points(
        tmp_path / "reference" / "metrics.jsonl"
    )


# -- torchrun ----------------------------------------------------------------------------------------

HANDLED = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
#: (the launcher, who gets the signal, the signal, the launcher's extra arguments, the gated ranks)
TARGETS = {
    "torchrun-term": ("torchrun", "launcher", signal.SIGTERM, [], "01"),
    "torchrun-usr1-handled": ("torchrun", "launcher", signal.SIGUSR1, ["--signals-to-handle", HANDLED], "01"),
    "rank1-usr1": ("torchrun", "rank1", signal.SIGUSR1, [], "1"),
    "all-ranks-term": ("torchrun", "all", signal.SIGTERM, [], "01"),
    # accelerate launch --multi_gpu runs torchrun's agent in-process; PET_SIGNALS_TO_HANDLE adds SIGUSR1
    "accelerate-usr1-handled": ("accelerate", "launcher", signal.SIGUSR1, [], "01"),
}


def torchrun(
    out: Path, *extra: str, launcher_args: tuple = (), launcher: str = "torchrun"
) -> subprocess.Popen:
    env = environment()
    if launcher == "accelerate":
        command = [
            str(Path(sys.executable).with_name("accelerate")),
            "launch",
            "--multi_gpu",
            "--num_processes",
            "2",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
        ]
        env["PET_SIGNALS_TO_HANDLE"] = HANDLED
    else:
        command = [str(TORCHRUN), "--standalone", "--nproc_per_node", "2"]
    return subprocess.Popen(
        [*command, *launcher_args, str(SCRIPT), str(out), *extra],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(process: subprocess.Popen) -> str:
    try:
        output, _ = process.communicate(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
    return output


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    output = finish(torchrun(out))
    assert json.loads((out / "result-rank0.json").read_text())["global_step"] == 16, output[-3000:]
    return out


def moments(seed: int = 34) -> list[tuple[str, str, int]]:
    """Each target with a moment (the three moments in turn, from a seeded start) at a seeded random step:
    inside a step, during an evaluation (after steps 4, 8 or 12) or during the save (after step 8)."""
    rng = random.Random(seed)
    steps = {"step": list(range(2, 15)), "evaluation": [4, 12], "save": [8]}
    kinds = ["step", "evaluation", "save"]
    start = rng.randrange(len(kinds))
    picked = []
    for index, target in enumerate(TARGETS):
        moment = kinds[(start + index) % len(kinds)]
        picked.append((target, moment, rng.choice(steps[moment])))
    return picked


@pytest.mark.second_tier
@pytest.mark.parametrize(("target", "moment", "step"), moments())
def test_torchrun_signals_at_random_moments_then_resume(target, moment, step, tmp_path, uninterrupted):
    launcher, who, sig, launcher_args, gated = TARGETS[target]
    out = tmp_path / "job"
    out.mkdir()
    process = torchrun(
        out, "--gate", f"{moment}:{step}:{gated}", launcher_args=tuple(launcher_args), launcher=launcher
    )
    try:
        wait_for([out / f"ready-rank{rank}" for rank in gated], process)
        if who == "launcher":
            os.kill(process.pid, sig)
        else:
            for rank in (int(r) for r in gated):
                os.kill(rank_pid(out, rank), sig)
        wait_for([out / f"got-rank{rank}" for rank in gated], process)
        (out / "go").touch()  # a gated rank that was not signalled goes on
    finally:
        output = finish(process)
    results = [json.loads((out / f"result-rank{rank}.json").read_text()) for rank in (0, 1)]
    stop = step if moment == "step" or step % 8 == 0 else step + 1
    for result in results:
        assert (result["global_step"], result["exit_code"]) == (stop, 75), (result, output[-3000:])
    # a signal to the launcher: forwarded to both workers, the launcher exits 1; the status file has the code
    assert process.returncode == (1 if who == "launcher" else 0), output[-3000:]
    assert cli(["stop-status", str(out / "run" / "status.json")]) == 75
    assert complete(
        out / "run" / f"checkpoint-{stop}",
        (
            "model.safetensors",
            "optimizer.pt",
            "scheduler.pt",
            "rng_state_0.pth",
            "rng_state_1.pth",
            "trainer_state.json",
        ),
    )
    resumed = finish(torchrun(out, "--resume"))
    assert json.loads((out / "result-rank0.json").read_text())["global_step"] == 16, resumed[-3000:]
    assert cli(["stop-status", str(out / "run" / "status.json")]) == 0
    state = json.loads((out / "run" / "checkpoint-16" / "trainer_state.json").read_text())
    reference = json.loads((uninterrupted / "run" / "checkpoint-16" / "trainer_state.json").read_text())
    assert comparable(state["log_history"]) == comparable(reference["log_history"])
    assert jsonl_points(out / "run" / "metrics.jsonl") == jsonl_points(
        uninterrupted / "run" / "metrics.jsonl"
    )
    weights = (out / "run" / "checkpoint-16" / "model.safetensors").read_bytes()
    assert weights == (uninterrupted / "run" / "checkpoint-16" / "model.safetensors").read_bytes()


@pytest.mark.second_tier
def test_torchrun_without_signals_to_handle_dies_of_usr1_and_leaves_its_workers_unsignalled(tmp_path):
    """Why the recipe passes ``--signals-to-handle``: SIGUSR1's default action ends torchrun itself."""
    out = tmp_path / "job"
    out.mkdir()
    process = torchrun(out, "--gate", "step:4:01")
    workers: list[int] = []
    try:
        wait_for([out / "ready-rank0", out / "ready-rank1"], process)
        workers = [rank_pid(out, rank) for rank in (0, 1)]
        os.kill(process.pid, signal.SIGUSR1)
        process.wait(timeout=60)
        assert process.returncode == -signal.SIGUSR1
        time.sleep(1.0)
        assert not (out / "got-rank0").exists() and not (out / "got-rank1").exists()  # never told
    finally:
        (out / "go").touch()
        finish(process)
        for pid in workers:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
