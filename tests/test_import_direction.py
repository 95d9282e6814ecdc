"""The package imports one way only, has no import cycle, and a feature loads no trainer.

The rules and the checker are in ``tests/import_graph.py``; the checker is tested here on
small synthetic packages so that it demonstrably fails on each kind of violation.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hf_callbacks_plus
from tests.import_graph import LAYERS, Import, import_cycles, layer_violations, package_imports

PACKAGE = Path(hf_callbacks_plus.__file__).parent


def test_every_part_of_the_package_has_a_layer():
    parts = {path.stem if path.is_file() else path.name for path in PACKAGE.iterdir()}
    parts = {part for part in parts if not part.startswith(("__", "."))} - {"py"}
    assert parts == set(LAYERS), "add the new part to LAYERS in tests/import_graph.py"


def test_imports_point_down_the_layers_and_never_reach_the_test_kit():
    imports = package_imports(PACKAGE)
    assert len(imports) > 60  # the checker really read the package
    assert layer_violations(imports) == []


def test_no_import_cycle_between_modules():
    assert import_cycles(package_imports(PACKAGE)) == []


#: Features a user imports on their own; each must load neither a runner nor the test kit.
FEATURES = (
    "hf_callbacks_plus.callbacks.early_stopping",
    "hf_callbacks_plus.callbacks.train_subset",
    "hf_callbacks_plus.callbacks.throughput",
    "hf_callbacks_plus.loggers.jsonl",
)
#: Run in one fresh interpreter: what importing the features loads, then (after that) the module
#: each top-level name resolves to.
_FRESH = (
    "import json, sys\n"
    "for module in sys.argv[1:]:\n"
    "    __import__(module)\n"
    "loaded = sorted(name for name in sys.modules if name.startswith('hf_callbacks_plus'))\n"
    "import hf_callbacks_plus as package\n"
    "names = [name for name in package.__all__ if name != '__version__']\n"
    "exports = {name: getattr(package, name).__module__ for name in names}\n"
    "print(json.dumps({'loaded': loaded, 'exports': exports}))"
)


#: One worker runs this module under pytest-xdist: the fresh interpreter starts once.
pytestmark = pytest.mark.xdist_group("fresh_interpreter")


@pytest.fixture(scope="module")
def fresh_interpreter() -> dict:
    """What a fresh interpreter reports (one for every check here: each would pay the transformers import)."""
    output = subprocess.run([sys.executable, "-c", _FRESH, *FEATURES], check=True, capture_output=True,
                            text=True).stdout
    return json.loads(output)


def test_importing_features_loads_no_runner_and_no_test_kit(fresh_interpreter):
    loaded = fresh_interpreter["loaded"]
    assert set(FEATURES) <= set(loaded) and "hf_callbacks_plus.core" in loaded
    assert "hf_callbacks_plus.loop.trainer" not in loaded
    forbidden = ("hf_callbacks_plus.loop", "hf_callbacks_plus.integrations", "hf_callbacks_plus.testing")
    assert [name for name in loaded if name.startswith(forbidden)] == []


# -- the checker itself, on synthetic packages ----------------------------------------------


def make_package(root: Path, files: dict[str, str]) -> Path:
    """Write a fake ``hf_callbacks_plus`` tree; every folder gets an ``__init__.py``."""
    package = root / "hf_callbacks_plus"
    for name, text in {"__init__.py": "", **files}.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for folder in [path.parent, *path.parent.parents]:
            if folder == package.parent:
                break
            (folder / "__init__.py").touch()
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return package


def test_checker_reports_an_upward_import_even_inside_a_function(tmp_path):
    package = make_package(tmp_path, {
        "core/state.py": "def later():\n    from ..loop.trainer import Trainer\n",
        "loop/trainer.py": "from ..core.state import later\nclass Trainer: ...\n",
    })
    problems = layer_violations(package_imports(package))
    assert len(problems) == 1
    assert "hf_callbacks_plus.core.state:2 imports hf_callbacks_plus.loop.trainer" in problems[0]
    assert "core (layer 1) must not import loop (layer 5)" in problems[0]


def test_checker_reports_sideways_imports_and_the_test_kit(tmp_path):
    package = make_package(tmp_path, {
        "callbacks/a.py": "import hf_callbacks_plus.loggers.b\n",
        "loggers/b.py": "from hf_callbacks_plus.testing import recorder\n",
        "testing/recorder.py": "",
        "cli.py": "from . import plotting\n",
        "plotting.py": "import importlib\nimportlib.import_module('hf_callbacks_plus.loop.trainer')\n",
        "loop/trainer.py": "",
    })
    problems = layer_violations(package_imports(package))
    assert any("callbacks and loggers share layer 4" in problem for problem in problems)
    assert any("imports the test kit hf_callbacks_plus.testing.recorder" in problem for problem in problems)
    assert len(problems) == 2  # cli -> plotting is allowed; plotting -> loop points down


def test_checker_finds_cycles_through_relative_and_type_checking_imports(tmp_path):
    package = make_package(tmp_path, {
        "core/handler.py": "from .callback import X\n",
        "core/callback.py": "import typing\nif typing.TYPE_CHECKING:\n    from . import handler\nX = 1\n",
        "core/state.py": "from .callback import X\n",
    })
    assert import_cycles(package_imports(package)) == [
        ["hf_callbacks_plus.core.callback", "hf_callbacks_plus.core.handler"]
    ]


def test_checker_reports_a_part_without_a_layer():
    imports = [Import("hf_callbacks_plus.extras.x", "hf_callbacks_plus.core.state", 3)]
    assert layer_violations(imports) == [
        "hf_callbacks_plus.extras.x:3 -> hf_callbacks_plus.core.state: part not in LAYERS"
    ]


def test_every_top_level_name_resolves_to_its_own_module(fresh_interpreter):
    modules = fresh_interpreter["exports"]
    exports = hf_callbacks_plus._EXPORTS
    assert set(modules) == set(exports) and "SelfRestoringState" in modules
    for name, module in modules.items():
        assert module == exports[name], name  # defined where the lazy table says, not re-exported
