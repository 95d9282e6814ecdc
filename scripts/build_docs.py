"""Build the documentation site once: ``mkdocs build --strict`` into ``site/``, stamped.

The stamp (``site/.inputs-sha256``) is the digest of everything the build reads (``mkdocs.yml``,
``docs/``, the package sources that mkdocstrings renders). ``tests/test_docs_site.py`` checks the
built site when its stamp matches the sources and builds into a temporary folder otherwise, so
``make test`` (``make docs``, then pytest) builds the site once. :func:`files_digest` also keys
the cached venv of ``tests/loop/test_standalone_venv.py``.

Run: ``.venv/bin/python scripts/build_docs.py [site_dir]`` (what ``make docs`` does).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterable

ROOT = Path(__file__).resolve().parents[1]
STAMP = ".inputs-sha256"


#: What the docs build reads.
INPUTS = ("mkdocs.yml", "docs", "hf_callbacks_plus")


def files_digest(root: Path, names: Iterable[str], salt: str = "") -> str:
    """SHA-256 over ``salt`` and the path and bytes of each file named (a folder: every file in it,
    ``__pycache__`` left out), relative to ``root``."""
    digest = hashlib.sha256(salt.encode() + b"\0")
    for name in names:
        top = root / name
        files = [top] if top.is_file() else sorted(path for path in top.rglob("*")
                                                   if path.is_file() and "__pycache__" not in path.parts)
        for path in files:
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def inputs_digest(root: Path = ROOT) -> str:
    """The digest of everything the docs build reads."""
    return files_digest(root, INPUTS)


def build(site_dir: Path) -> None:
    """``mkdocs build --strict`` into ``site_dir``, then write the stamp there.

    Raises:
        subprocess.CalledProcessError: The build failed (its output is in the exception).
    """
    digest = inputs_digest()  # before the build: an edit during it leaves a stale stamp, never a fresh one
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(site_dir)],
                   cwd=ROOT, env=env, check=True, capture_output=True, text=True, timeout=300)
    (site_dir / STAMP).write_text(digest + "\n", encoding="utf-8")


def is_fresh(site_dir: Path) -> bool:
    """True when ``site_dir`` was built by :func:`build` from the sources as they are now."""
    stamp = site_dir / STAMP
    return stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == inputs_digest()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    site_dir = Path(args[0]) if args else ROOT / "site"
    try:
        build(site_dir.resolve())
    except subprocess.CalledProcessError as error:
        sys.stderr.write(error.stdout + error.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
