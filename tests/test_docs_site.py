"""The documentation site builds with --strict and renders every docstring cross-reference.

mkdocstrings does not understand Sphinx roles (``:class:`X```): they reach the HTML as
literal text. Docstrings use Markdown (backticks or ``[Name][module.Name]``) instead.

The site is built once per ``make test``: ``make docs`` (``scripts/build_docs.py``) builds
``site/`` strictly and stamps it with the digest of its sources; the test reads that site when
the stamp matches the sources as they are, and builds its own strictly otherwise.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scripts.build_docs import INPUTS, ROOT, STAMP, build, files_digest, inputs_digest, is_fresh

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|data|exc|obj|ref):(?:`|<code>)")
SOURCE_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|mod|data|exc|obj):`")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The strictly built site: ``make docs``'s ``site/`` when fresh, else a new build."""
    if is_fresh(ROOT / "site"):
        return ROOT / "site"
    site_dir = tmp_path_factory.mktemp("site")
    build(site_dir)  # raises with mkdocs' output when the strict build fails
    return site_dir


def test_site_builds_strict_without_raw_sphinx_roles(site):
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    assert "EarlyStopping" in api and "KeyGrammar" in api  # the API page was really rendered
    raw = {str(page.relative_to(site)): ROLE.findall(page.read_text(encoding="utf-8"))
           for page in site.rglob("*.html")}
    assert {page: found for page, found in raw.items() if found} == {}


def test_a_stamp_names_the_sources_it_was_built_from(tmp_path):
    # a site built from other sources (or not by build()) is never taken for a fresh one
    assert not is_fresh(tmp_path)
    (tmp_path / STAMP).write_text("0" * 64 + "\n", encoding="utf-8")
    assert not is_fresh(tmp_path)
    (tmp_path / STAMP).write_text(inputs_digest() + "\n", encoding="utf-8")
    assert is_fresh(tmp_path)


def test_a_digest_changes_with_any_file_it_covers(tmp_path):
    # the docs stamp and the standalone venv's cache key (tests/loop/test_standalone_venv.py)
    names = ("mkdocs.yml", "docs/index.md", "docs/images/a.png", "hf_callbacks_plus/a.py")
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name, encoding="utf-8")
    digests = {inputs_digest(tmp_path)}
    (tmp_path / "hf_callbacks_plus" / "__pycache__").mkdir()
    (tmp_path / "hf_callbacks_plus" / "__pycache__" / "a.pyc").write_text("bytecode", encoding="utf-8")
    assert inputs_digest(tmp_path) in digests  # bytecode is not a source
    for name in ("mkdocs.yml", "docs/images/a.png", "hf_callbacks_plus/a.py"):
        (tmp_path / name).write_text("changed", encoding="utf-8")
        digests.add(inputs_digest(tmp_path))
    (tmp_path / "hf_callbacks_plus" / "b.py").write_text("", encoding="utf-8")
    digests.add(inputs_digest(tmp_path))
    digests.add(files_digest(tmp_path, INPUTS, salt="another python"))
    assert len(digests) == 6


def test_no_sphinx_roles_in_package_docstrings():
    # Modules not (yet) on the API page render there as soon as someone adds them.
    found = [f"{path.relative_to(ROOT)}:{number}"
             for path in sorted((ROOT / "hf_callbacks_plus").rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if SOURCE_ROLE.search(line)]
    assert found == []


#: Characters a code line of the site holds at 1366 px, the most common laptop screen (measured
#: with scripts/docs_screenshots.py in Chromium: 98 fit, 99 are cut off; at 1440 px 104 fit).
CODE_COLUMNS = 98
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")


def long_code_lines(text: str, limit: int = CODE_COLUMNS) -> list[tuple[int, int]]:
    """``(line number, length)`` of the code lines longer than ``limit`` in a Markdown page.
    Blocks without a language or marked ``text`` wrap on the site (docs/stylesheets/extra.css)."""
    found, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.groups()
        elif fence is not None and line.strip() == fence[1]:
            fence = None
        elif fence is not None and fence[2] not in ("", "text"):
            code = line[len(fence[0]):] if line.startswith(fence[0]) else line
            if len(code) > limit:
                found.append((number, len(code)))
    return found


def test_code_blocks_fit_the_content_column_of_a_1366px_screen():
    """A code line longer than the column is cut off (scrolls) on the page. The rendered check,
    tables included, is scripts/docs_screenshots.py; this one reads the sources in every run."""
    wide = {str(page.relative_to(ROOT)): lines for page in sorted((ROOT / "docs").glob("*.md"))
            if (lines := long_code_lines(page.read_text(encoding="utf-8")))}
    assert wide == {}


def test_the_check_finds_a_long_line_and_lets_wrapping_blocks_be():
    long = "x" * (CODE_COLUMNS + 1)
    page = "\n".join(["```python", "y" * CODE_COLUMNS, long, "```", "", "```text", long, "```", "",
                      "- item", "", "    ```bash", f"    {long}", "    ```", ""])
    assert long_code_lines(page) == [(3, CODE_COLUMNS + 1), (13, CODE_COLUMNS + 1)]
