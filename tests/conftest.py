"""Shared test configuration: environment defaults and the two test tiers.

``make test`` runs the first tier (``pytest``); ``make check`` adds the second
(``pytest --tier 2``): tests marked ``second_tier``, slow by nature and never the only test
of a feature. ``pytest --tier all`` runs both.

Hypothesis draws its examples derandomized (seeded from each test), like every other random
choice in the suite: a failure is the same on every run and every machine.

torch runs on one thread (``OMP_NUM_THREADS=1`` unless set, inherited by every subprocess and
torchrun rank): the tests' models are tiny, and a second thread costs more in synchronisation
than it computes (a 4-step trl run: about 1 s on one thread, 4-10 s on two on the shared 2-core
machine).

After each test the heap is frozen (``gc.freeze``, ``pytest_runtest_teardown`` below): the
``gc.collect()`` that accelerate runs at every ``Trainer.train()`` then scans only the objects of
the test at hand, not all of torch and transformers (0.5-0.7 s a call otherwise).
"""

import gc
import os
import sys
import tempfile

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before anything imports torch
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DISABLE_MLFLOW_INTEGRATION", "TRUE")
# trackio reads TRACKIO_DIR once, at import: one store per test process (each pytest-xdist worker
# makes its own: test folder names, and so trackio projects, repeat across workers), never the
# user's cache; a TRACKIO_DIR the user set is kept
_TRACKIO_DIR = None
if "TRACKIO_DIR" not in os.environ or os.environ.get("HF_CALLBACKS_PLUS_TESTS_TRACKIO_DIR"):
    _TRACKIO_DIR = tempfile.mkdtemp(prefix="hf_callbacks_plus_trackio_")
    os.environ["TRACKIO_DIR"] = os.environ["HF_CALLBACKS_PLUS_TESTS_TRACKIO_DIR"] = _TRACKIO_DIR

try:
    from hypothesis import settings as _hypothesis_settings
except ModuleNotFoundError:  # the compat venvs may not have it
    pass
else:
    _hypothesis_settings.register_profile("seeded", derandomize=True)
    _hypothesis_settings.load_profile("seeded")

TIERS = ("1", "2", "all")


def pytest_addoption(parser):
    parser.addoption("--tier", default="1", choices=TIERS,
                     help="1: the tests of `make test` (default); 2: only the second tier "
                          "(tests marked second_tier, run by `make check`); all: both")


#: Session fixtures that start a service once per process: under pytest-xdist (`make test` runs
#: ``-n auto --dist loadgroup``) every test using one runs on the same worker, so it starts once.
SESSION_SERVICES = {"mlflow_server": "mlflow_server", "distributed_launch": "torchrun"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        for fixture, group in SESSION_SERVICES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(group))
    tier = config.getoption("--tier")
    if tier != "all":
        wanted = tier == "2"
        keep = [item for item in items if (item.get_closest_marker("second_tier") is not None) == wanted]
        dropped = [item for item in items if (item.get_closest_marker("second_tier") is not None) != wanted]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
    # the session launch runs in the setup of its first test: that test's timeout is the launch's
    # own bound (tests/distributed.py), plus a margin for reading the outcome
    from tests.distributed import launch_timeout

    launched = [item for item in items if "distributed_launch" in getattr(item, "fixturenames", ())]
    for item in launched:
        item.add_marker(pytest.mark.timeout(launch_timeout(len(launched)) + 120))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After each test (its fixtures finalized), collect its garbage, then move every object still
    alive out of the collector's sight (``gc.freeze``). Every ``Trainer.train()`` calls
    ``gc.collect()`` (accelerate's ``free_memory``), which otherwise scans all of torch,
    transformers, trl and what earlier tests left each time: 0.5-0.7 s a call, most of a
    tiny-Trainer test's time. The torchrun ranks do the same between scenarios
    (tests/distributed.py)."""
    yield
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session):
    """Say so when pytest-xdist could not group (its ``loadgroup`` renames node ids, which
    pytest 9.2 no longer allows): the tests still pass, each worker starting its own services."""
    config = session.config
    if not hasattr(config, "workerinput") or not config.getvalue("loadgroup"):
        return
    ungrouped = [item.nodeid for item in session.items
                 if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if ungrouped and config.workerinput.get("workerid") == "gw0":
        session.warn(pytest.PytestWarning(
            f"pytest-xdist did not group {len(ungrouped)} tests by session service (pytest "
            f"{pytest.__version__}): each worker starts its own; pin the pytest of constraints.txt"))


@pytest.fixture(scope="session")
def distributed_launch(request, tmp_path_factory):
    """The session's one torchrun launch, running the scenario of every selected distributed test."""
    from tests.distributed import launch, spec_of, spec_of_marker

    specs = []
    for item in request.session.items:
        marker = item.get_closest_marker("distributed")
        if marker is not None and "scenario" in marker.kwargs:
            for spec in (spec_of_marker(marker), *(spec_of(scenario, args) for scenario, args
                                                  in marker.kwargs.get("also", ()))):
                if spec not in specs:
                    specs.append(spec)
    return launch(tmp_path_factory.mktemp("distributed"), specs)


@pytest.fixture
def distributed_outcome(request, distributed_launch):
    """This test's scenario outcome (see tests/distributed.py); fails with the ranks' errors."""
    from tests.distributed import spec_of_marker

    marker = request.node.get_closest_marker("distributed")
    if marker is None or "scenario" not in marker.kwargs:
        raise pytest.UsageError(f"{request.node.nodeid} takes distributed_outcome without "
                                "@pytest.mark.distributed(scenario=...)")
    try:
        return distributed_launch.outcome(spec_of_marker(marker))
    except RuntimeError as error:
        pytest.fail(str(error), pytrace=False)


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a real tmpfs of a given size (``tmpfs("1m")``) under the test's folder; writes beyond it
    fail with ENOSPC. Needs root (CI runs as root); the test is skipped where it cannot mount."""
    import subprocess

    mounted = []

    def mount(size: str):
        disk = tmp_path / f"disk-{len(mounted)}"
        disk.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                              capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"a tmpfs cannot be mounted here (root only): {done.stderr.strip()}")
        mounted.append(disk)
        return disk

    yield mount
    for disk in mounted:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def pytest_unconfigure(config):
    """Remove the trackio store this process made."""
    if _TRACKIO_DIR is not None:
        import shutil

        shutil.rmtree(_TRACKIO_DIR, ignore_errors=True)


@pytest.fixture(autouse=True)
def _finish_wandb_runs_kept_open():
    """After each test, finish the W&B runs a ``WandbLogger`` keeps open after ``train()`` (for
    ``evaluate()``), as the exit hook of a real process would: otherwise the next ``wandb.init()`` of
    this process (W&B's default ``reinit``) returns such a run instead of opening its own."""
    yield
    if "hf_callbacks_plus.loggers.wandb" in sys.modules:
        from tests.loggers.wandb_helpers import close_finished_loggers

        close_finished_loggers()
