"""Every distributed scenario of the suite in ONE ``torchrun --nproc_per_node 2`` launch.

Each launch pays torch's, transformers' and the trackers' imports on every rank (several
seconds on 2 CPU cores), so the session launches once: the ranks run every selected scenario
in turn, each writing its outcome files, and each test reads its scenario's outcome.

Adding a scenario is one function and one test, in the test's own module:

    def my_scenario(out: Path) -> None:
        # runs on both ranks (RANK is 0 or 1), inside a process group that is already up
        # (gloo); writes what the test checks into `out` (one folder per scenario, shared)
        ...

    @pytest.mark.distributed(scenario=my_scenario)
    def test_my_feature(distributed_outcome):
        outcome = distributed_outcome  # a ScenarioOutcome: .dir, .output(rank), .outputs(), .json()
        ...

A scenario may take string arguments after its folder: ``@pytest.mark.distributed(
scenario=f, args=("zero3",))`` runs ``f(out, "zero3")`` (spec ``path::f:zero3``, folder
``module.f.zero3``); ``also=[(g, ("ddp",))]`` adds more scenarios to the launch for a test
that compares with them (``distributed_launch.outcome(spec_of(g, ("ddp",)))``).

**Sharded engines** (DeepSpeed ZeRO-1/2/3, FSDP2, FSDP1 with both state-dict types, DDP as the
reference, through a stock ``transformers.Trainer``, ``TrainerPlus`` or trl's ``SFTTrainer``
with LoRA): ``tests/sharded.py`` holds the parts, and ``engine_scenarios`` parametrizes a test
over the engines (one scenario per engine in this same launch; engines outside the first tier
are ``second_tier``). A scenario per engine costs about 1.5-3.5 s of the launch (two short
trainings of the tiny Llama), the first DeepSpeed one about 3 s more (its import):

    from tests.sharded import engine_scenarios, make_trainer, sharded_on_cpu, write_json

    def my_scenario(out: Path, engine: str) -> None:
        with sharded_on_cpu():
            trainer = make_trainer(engine, out / "run", callbacks=[MyCallback()])
            trainer.train()
        write_json(out, {"history": trainer.state.log_history})

    @pytest.mark.parametrize("engine", engine_scenarios(my_scenario, first_tier=("zero3", "fsdp2")))
    def test_my_callback_under_each_engine(engine, distributed_outcome):
        rank0, rank1 = distributed_outcome.json()

``tests/test_sharded_engines.py`` is the ground truth: with a do-nothing callback the
trainer's records and weights are bit-identical to a run without, and its ``LAYOUT`` and
``WEIGHTS`` list each engine's checkpoint files.

The ranks run every scenario in one process: a scenario that patches a module puts it back
(``try``/``finally``) and leaves the process group up (``sharded_on_cpu`` does so for the
engines, and resets accelerate's process-wide state on the way in and out).

What the runner does for each scenario, on every rank:

* runs it with the working directory set to its folder and its stdout and stderr (file
  descriptors 1 and 2, so the C++ and logging output too) in ``output-rank<R>.txt``; the
  environment (``os.environ``) is restored afterwards; its wall time goes to
  ``seconds-rank<R>.txt`` (``ScenarioOutcome.seconds()``);
* an exception is written to ``error-rank<R>.txt`` (the test fails with it) and the next
  scenario still runs;
* its garbage is collected and every object still alive is frozen (``freeze_the_heap``), so the
  ``gc.collect()`` of each ``Trainer.train()`` scans only the next scenario's objects;
* a barrier, then the next one: the ranks start each scenario together.

The process group is created once, before the first scenario (gloo, with a timeout that makes
a rank waiting for a failed peer fail instead of hanging), and ``TrainingArguments`` /
accelerate / DeepSpeed reuse it; a scenario never destroys it. Groups created later without a
timeout (DeepSpeed's clone of the world group, in which ZeRO gathers its parameters) get the
same timeout instead of torch's 30 minutes: a rank left alone in a ZeRO-3 gather fails after
``GROUP_TIMEOUT_SECONDS`` (checked), and the whole launch is killed after
``launch_timeout``. ``DS_ACCELERATOR=cpu`` is set for the launch (only DeepSpeed reads
it). The pytest side (the session fixture in ``tests/conftest.py``) launches only the
scenarios of the selected tests.

Run by hand: ``torchrun --standalone --nproc_per_node 2 tests/distributed.py <out> \\
tests/callbacks/test_early_stopping_distributed.py::every_rank_follows_rank0 \\
tests/test_sharded_engines.py::baseline:zero3``.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
#: How long a rank waits in a collective for a peer (a peer that failed mid-scenario).
GROUP_TIMEOUT_SECONDS = 120
#: How long the whole launch may take: a start, then a share per scenario (a scenario takes 2-10 s
#: on a quiet machine, up to 4x that on a loaded one; a hang in a collective ends at the group
#: timeout). The tests of the launch carry this bound instead of pytest-timeout's per-test one
#: (tests/conftest.py), which the session fixture's setup would otherwise count against the first.
LAUNCH_START_SECONDS, LAUNCH_SECONDS_PER_SCENARIO = 120, 45


def launch_timeout(scenarios: int) -> int:
    """Seconds the launch of ``scenarios`` scenarios may take before it is killed."""
    return LAUNCH_START_SECONDS + LAUNCH_SECONDS_PER_SCENARIO * scenarios
DONE = "done-rank{rank}"
SECONDS = "seconds-rank{rank}.txt"
ERROR = "error-rank{rank}.txt"
OUTPUT = "output-rank{rank}.txt"


def spec_of(scenario: Callable[..., None], args: Sequence[str] = ()) -> str:
    """``path/to/test_module.py::function`` (``...::function:arg1:arg2`` with string arguments):
    how the ranks find a scenario and what they pass it after its folder."""
    module = sys.modules[scenario.__module__]
    for arg in args:
        if not isinstance(arg, str) or not arg.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"scenario argument {arg!r} of {scenario.__name__}: expected a word "
                             "(letters, digits, '_', '-')")
    return ":".join((f"{Path(module.__file__).resolve().relative_to(ROOT)}::{scenario.__name__}", *args))


def spec_of_marker(marker: Any) -> str:
    """The spec of a ``@pytest.mark.distributed(scenario=f, args=(...))`` marker."""
    return spec_of(marker.kwargs["scenario"], tuple(marker.kwargs.get("args", ())))


def folder_name(spec: str) -> str:
    """The scenario's folder under the launch's root, from its spec."""
    path, _, call = spec.partition("::")
    return f"{Path(path).stem}.{call.replace(':', '.')}"


@dataclass
class ScenarioOutcome:
    """What one scenario left: its folder (shared by both ranks) and each rank's output."""

    dir: Path

    def output(self, rank: int) -> str:
        """Everything rank ``rank`` wrote to stdout and stderr during the scenario."""
        return (self.dir / OUTPUT.format(rank=rank)).read_text(encoding="utf-8", errors="replace")

    def outputs(self) -> str:
        """Both ranks' output, rank 0 first."""
        return self.output(0) + self.output(1)

    def json(self, name: str = "outcome") -> list[Any]:
        """Both ranks' ``<name>-rank<R>.json`` (as written by ``tests.sharded.write_json``), rank 0 first."""
        return [json.loads((self.dir / f"{name}-rank{rank}.json").read_text(encoding="utf-8"))
                for rank in (0, 1)]

    def seconds(self, rank: int = 0) -> float:
        """How long the scenario ran on rank ``rank`` (wall time, barrier excluded)."""
        return float((self.dir / SECONDS.format(rank=rank)).read_text())


@dataclass
class Launch:
    """One torchrun launch of several scenarios."""

    root: Path
    specs: list[str]
    returncode: int
    output: str

    def outcome(self, spec: str) -> ScenarioOutcome:
        """The scenario's outcome; raises ``RuntimeError`` with the ranks' errors if it failed."""
        folder = self.root / folder_name(spec)
        errors = [f"--- rank {rank}:\n{(folder / ERROR.format(rank=rank)).read_text()}" for rank in (0, 1)
                  if (folder / ERROR.format(rank=rank)).is_file()]
        done = all((folder / DONE.format(rank=rank)).is_file() for rank in (0, 1))
        if errors or not done:
            outputs = "".join(f"--- {path.name}:\n{path.read_text(errors='replace')[-3000:]}\n"
                              for path in sorted(folder.glob("output-rank*.txt")))
            raise RuntimeError(
                f"distributed scenario {spec} {'failed' if errors else 'did not finish'} "
                f"(torchrun exit code {self.returncode})\n" + "\n".join(errors) + "\n" + outputs
                + f"--- torchrun output (last 3000 characters):\n{self.output[-3000:]}")
        return ScenarioOutcome(folder)


def launch(root: Path, specs: list[str]) -> Launch:
    """Run ``specs`` in one ``torchrun --standalone --nproc_per_node 2`` launch, outcomes under ``root``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline",
           "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "DS_ACCELERATOR": "cpu"}  # DeepSpeed's accelerator (tests/sharded.py); nothing else reads it
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MLFLOW_RUN_ID", "MLFLOW_TRACKING_URI"):
        env.pop(name, None)
    process = subprocess.Popen(
        [str(TORCHRUN), "--standalone", "--nproc_per_node", "2", str(Path(__file__).resolve()), str(root),
         *specs],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=launch_timeout(len(specs)))
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # torchrun and both ranks
        output, _ = process.communicate()
        output += f"\n(torchrun killed after {launch_timeout(len(specs))} s)"
    return Launch(root, list(specs), process.returncode, output)


# -- the rank side ------------------------------------------------------------------------------


def load_scenario(spec: str) -> Callable[[Path], None]:
    """The scenario of ``spec``, its string arguments bound: call it with its folder."""
    path, _, call = spec.partition("::")
    name, *args = call.split(":")
    module = importlib.import_module(".".join(Path(path).with_suffix("").parts))
    scenario = getattr(module, name)
    return lambda folder: scenario(folder, *args)


@contextlib.contextmanager
def scenario_context(folder: Path, rank: int) -> Iterator[None]:
    """Working directory, output files (fds 1 and 2) and environment of one scenario."""
    environ, cwd = dict(os.environ), os.getcwd()
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(folder / OUTPUT.format(rank=rank), "w", encoding="utf-8") as output:
        os.dup2(output.fileno(), 1)
        os.dup2(output.fileno(), 2)
        os.chdir(folder)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(environ)
    for fd in saved:
        os.close(fd)


def freeze_the_heap() -> None:
    """Collect this scenario's garbage, then move every object still alive (the modules imported so
    far, above all) out of the collector's sight (``gc.freeze``): every ``Trainer.train()`` calls
    ``gc.collect()`` (accelerate's ``free_memory``; DeepSpeed's ZeRO-3 once more), which otherwise
    scans all of torch, transformers and DeepSpeed each time (0.5 s a call by the last scenarios,
    about 40% of a ZeRO-3 scenario's time). Counted in the scenario's seconds."""
    gc.collect()
    gc.freeze()


def run_scenarios(root: Path, specs: list[str]) -> None:
    """Run each scenario on this rank (see the module docstring)."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    timeout = timedelta(seconds=GROUP_TIMEOUT_SECONDS)
    # groups created later without a timeout (DeepSpeed's clone of the world group, its data-parallel
    # groups) take this default, not torch's 30 minutes
    distributed_c10d.default_pg_timeout = timeout
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    sys.path.insert(0, str(ROOT))
    freeze_the_heap()  # torch's imports
    for spec in specs:
        folder = root / folder_name(spec)
        folder.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        with scenario_context(folder, rank):
            try:
                load_scenario(spec)(folder)
            except BaseException:  # noqa: B036 - a scenario's SystemExit is its failure too
                (folder / ERROR.format(rank=rank)).write_text(traceback.format_exc(), encoding="utf-8")
            finally:
                freeze_the_heap()
        (folder / SECONDS.format(rank=rank)).write_text(f"{time.perf_counter() - start:.3f}")
        (folder / DONE.format(rank=rank)).touch()
        try:
            dist.barrier()
        except RuntimeError as error:  # a peer failed inside a collective: the group may be broken
            with open(folder / ERROR.format(rank=rank), "a", encoding="utf-8") as errors:  # after its own
                errors.write(f"barrier after the scenario: {error}\n")
    dist.destroy_process_group()


def save_coverage() -> None:
    """Write this rank's coverage data when coverage measures the run (``os._exit`` skips atexit)."""
    coverage = sys.modules.get("coverage")
    current = coverage.Coverage.current() if coverage is not None else None
    if current is not None:
        current.stop()
        current.save()


def main() -> None:
    run_scenarios(Path(sys.argv[1]), sys.argv[2:])
    # gloo's threads can abort a rank in the interpreter's teardown ("terminate called without an
    # active exception"), after every outcome is written (pytorch#190489): leave without it
    save_coverage()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
