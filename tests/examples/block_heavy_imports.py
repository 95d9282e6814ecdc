"""Run a script, or pytest, with ``torch`` and ``transformers`` unimportable.

Usage: ``python block_heavy_imports.py <script.py> <args>`` or ``python block_heavy_imports.py
-m pytest <pytest args>``.

Used to prove that an example needs neither (as if they were not installed). ``_compat``
then sees them as missing, exactly like in an environment without them. Exits non-zero when
the run fails or when a blocked module was imported anyway.
"""

from __future__ import annotations

import importlib.abc
import runpy
import sys

BLOCKED = ("torch", "transformers", "accelerate", "datasets")


class BlockHeavyImports(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked by the test)", name=fullname)
        return None


def run(argv: list[str]) -> int:
    """Run ``argv`` (a script and its arguments, or ``-m pytest ...``); returns the exit code."""
    if argv[:2] == ["-m", "pytest"]:
        import pytest

        code = int(pytest.main(argv[2:]))
    else:
        sys.argv = list(argv)
        try:
            runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
    leaked = sorted(name for name in sys.modules if name.split(".")[0] in BLOCKED)
    if leaked:
        print(f"heavy modules imported: {leaked}")
        code = code or 1
    return code


if __name__ == "__main__":
    sys.meta_path.insert(0, BlockHeavyImports())
    sys.exit(run(sys.argv[1:]))
