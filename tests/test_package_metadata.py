"""What a pip user sees on the package index: the README works there and the project links.

The index renders README.md on its own, so every link and image must be absolute, and
``[project.urls]`` must say where the docs, source, changelog and examples are.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_readme_links_and_images_are_absolute():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert targets
    relative = [target for target in targets if not re.match(r"https?://", target)]
    assert relative == [], relative


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib")
def test_project_urls_and_version():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert {"Homepage", "Documentation", "Source", "Changelog", "Examples"} <= set(project["urls"])
    assert all(url.startswith("https://") for url in project["urls"].values())
    import hf_callbacks_plus

    assert hf_callbacks_plus.__version__ == project["version"]
    assert f"## [{project['version']}]" in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
