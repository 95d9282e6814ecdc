"""The package's import graph, read with ``ast``, and the layer rules it must follow.

Layers, bottom to top (a module may import its own package and the layers below it):

    _compat  <-  core  <-  metrics  <-  runtime  <-  callbacks, loggers  <-  loop, integrations
             <-  testing, plotting, cli

Packages on one layer do not import each other (``cli`` may use ``plotting``); the library
never imports ``testing``; there is no import cycle between modules. Every import counts:
module level, inside functions, under ``TYPE_CHECKING``, and ``importlib.import_module`` of
a constant name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

#: Layer of each top-level part of the package (the first name after ``hf_callbacks_plus.``).
LAYERS: Mapping[str, int] = {
    "_compat": 0,
    "core": 1,
    "metrics": 2,
    "runtime": 3,
    "callbacks": 4,
    "loggers": 4,
    "loop": 5,
    "integrations": 5,
    "testing": 6,
    "plotting": 6,
    "cli": 6,
}
#: Imports between two parts of one layer that are allowed (importer, imported).
SAME_LAYER_ALLOWED = frozenset({("cli", "plotting")})
#: The parts the library must never import (the test kit).
TEST_KIT = "testing"


@dataclass(frozen=True)
class Import:
    """One import statement: who imports what, where."""

    importer: str
    imported: str
    line: int


def module_name(root: Path, path: Path) -> str:
    """``hf_callbacks_plus/loop/trainer.py`` -> ``hf_callbacks_plus.loop.trainer``."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(importer: str, is_package: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([target] if target else [])])


def imports_of(root: Path, path: Path, known: Iterable[str]) -> list[Import]:
    """Every import of the package's own modules in one file (all of them, not only top level)."""
    package = root.name
    importer = module_name(root, path)
    is_package = path.name == "__init__.py"
    modules = set(known)
    found: list[Import] = []

    def add(name: str, line: int) -> None:
        if name == package or name.startswith(package + "."):
            while name not in modules and "." in name:  # ``from .x import y``: y may be a name
                name = name.rsplit(".", 1)[0]
            if name != importer:
                found.append(Import(importer, name, line))

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(importer, is_package, node.level, node.module)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                add(candidate if candidate in modules else base, node.lineno)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            add(node.args[0].value, node.lineno)
    return found


def package_imports(root: Path) -> list[Import]:
    """Every import between the modules of the package rooted at ``root``."""
    files = sorted(root.rglob("*.py"))
    known = {module_name(root, path) for path in files}
    found = [item for path in files for item in imports_of(root, path, known)]
    return list(dict.fromkeys(found))  # ``from .x import a, b``: one import of x


def part_of(module: str) -> str | None:
    """The top-level part of a module (``core``, ``loop``...), None for the package itself."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else None


def layer_violations(imports: Iterable[Import]) -> list[str]:
    """Imports that point up or sideways, or reach the test kit; one readable line each."""
    problems = []
    for item in imports:
        source, target = part_of(item.importer), part_of(item.imported)
        if source is None or target is None or source == target:
            continue  # the package's lazy __init__, or inside one part
        if source not in LAYERS or target not in LAYERS:
            problems.append(f"{item.importer}:{item.line} -> {item.imported}: part not in LAYERS")
            continue
        if target == TEST_KIT:
            problems.append(f"{item.importer}:{item.line} imports the test kit {item.imported}")
        elif LAYERS[target] > LAYERS[source]:
            problems.append(
                f"{item.importer}:{item.line} imports {item.imported}: {source} (layer {LAYERS[source]}) "
                f"must not import {target} (layer {LAYERS[target]})"
            )
        elif LAYERS[target] == LAYERS[source] and (source, target) not in SAME_LAYER_ALLOWED:
            problems.append(
                f"{item.importer}:{item.line} imports {item.imported}: {source} and {target} share "
                f"layer {LAYERS[source]} and must not import each other"
            )
    return problems


def import_cycles(imports: Iterable[Import]) -> list[list[str]]:
    """Strongly connected groups of modules (each one an import cycle), sorted."""
    graph: dict[str, set[str]] = {}
    for item in imports:
        graph.setdefault(item.importer, set()).add(item.imported)
        graph.setdefault(item.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)
