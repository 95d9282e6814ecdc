"""Run pytest with ``torch`` and ``transformers`` unimportable.

Usage: ``python block_heavy_imports.py <pytest args>``.

Used to prove that an example needs neither (as if they were not installed). ``_compat``
then sees them as missing, exactly like in an environment without them.
"""

from __future__ import annotations

import importlib.abc
import sys

BLOCKED = ("torch", "transformers", "accelerate", "datasets")


class BlockHeavyImports(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked by the test)", name=fullname)
        return None


if __name__ == "__main__":
    sys.meta_path.insert(0, BlockHeavyImports())
    import pytest

    code = pytest.main(sys.argv[1:])
    leaked = sorted(name for name in sys.modules if name.split(".")[0] in BLOCKED)
    if leaked:
        print(f"heavy modules imported: {leaked}")
        code = code or 1
    sys.exit(code)
