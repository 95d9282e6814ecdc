"""`make demo`: for now, a small run of the lightweight loop (examples/lightweight_loop.py)."""

from __future__ import annotations

import runpy
from pathlib import Path

if __name__ == "__main__":
    runpy.run_path(str(Path(__file__).with_name("lightweight_loop.py")), run_name="__main__")
