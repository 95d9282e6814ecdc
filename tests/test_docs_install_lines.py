"""The install lines of the README, the docs' index and the quickstart install what their example
needs (issue 41: the index's line lacked ``mlflow-local``, which the quickstart's ``sqlite:///``
store needs), and every extra a page names exists."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALL = re.compile(r"pip install '?hf-callbacks-plus\[(?P<extras>[^\]]+)\]")
PAGES = {  # page: the page whose first example its install lines are for
    "README.md": "README.md",
    "docs/quickstart.md": "docs/quickstart.md",
    "docs/index.md": "docs/quickstart.md",  # "Start with the quickstart"
}
#: What a class or function of an example needs installed, by the extra that installs it.
NEEDS = {"Trainer": "transformers", "TrainingArguments": "transformers", "WandbLogger": "wandb",
         "TensorBoardLogger": "tensorboard", "TrackioLogger": "trackio", "StreamingMetrics": "metrics",
         "plot_learning_curves": "plot"}
#: An extra that installs another.
INCLUDES = {"mlflow-local": {"mlflow"}, "trl": {"transformers"}}


def declared_extras() -> set[str]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return set(project["optional-dependencies"])


def needed_extras(page: Path) -> set[str]:
    """The extras the page's first python example needs: its classes (`NEEDS`), and for an
    ``MLflowLogger`` the client, or ``mlflow-local`` for a ``sqlite:///`` store."""
    code = re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)[0]
    needed = set()
    for node in ast.walk(ast.parse(code)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id == "MLflowLogger":
            needed.add("mlflow-local" if "sqlite:///" in ast.unparse(node) else "mlflow")
        elif node.func.id in NEEDS:
            needed.add(NEEDS[node.func.id])
    return needed


def installed_by(extras: set[str]) -> set[str]:
    return extras | {included for extra in extras for included in INCLUDES.get(extra, ())}


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib")
@pytest.mark.parametrize("page", sorted(PAGES))
def test_a_pages_install_line_installs_what_its_example_needs(page):
    lines = [{extra.strip() for extra in match["extras"].split(",")}
             for match in INSTALL.finditer((ROOT / page).read_text(encoding="utf-8"))]
    unknown = {extra for extras in lines for extra in extras} - declared_extras()
    assert not unknown, f"{page} names extras pyproject.toml does not declare: {sorted(unknown)}"
    needed = needed_extras(ROOT / PAGES[page])
    assert any(needed <= installed_by(extras) for extras in lines), (
        f"no install line of {page} installs {sorted(needed)} (what {PAGES[page]}'s example needs); "
        f"its lines install {[sorted(extras) for extras in lines]}")
