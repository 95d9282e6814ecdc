"""The kept folders of `KeepBestCheckpoints` on disk: ``<output_dir>/<dirname>/checkpoint-<step>/``
and ``manifest.json`` beside them.

transformers' rotation (``save_total_limit``) lists only ``<output_dir>/checkpoint-*``, so a
folder one level down is out of its reach. A kept folder is made of **hard links** to the
files of the checkpoint just saved: no byte is copied while the checkpoint exists, and its
data stays on disk when rotation deletes the checkpoint. Where the file system refuses links,
the files are copied (`sync_folder` says which it did).

Every change is safe against a crash at any point: a new folder is built under a hidden name
and renamed into place, a file is replaced by renaming over it, a folder is renamed away before
it is deleted, and the manifest is written to a temporary file and renamed. Leftovers of an
interrupted change carry the hidden names `leftovers` finds.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import shutil
from collections.abc import Sequence
from typing import Any, Optional

from ...core.checkpoint_folders import PREFIX_CHECKPOINT_DIR
from ...core.state import write_json_atomically

__all__ = ["MANIFEST_NAME", "RESUME_ONLY", "kept_folder", "leftovers", "read_manifest", "remove_folder",
           "sync_folder", "write_manifest"]

logger = logging.getLogger("hf_callbacks_plus")

#: The manifest's file name, in the kept folder.
MANIFEST_NAME = "manifest.json"
#: Files only a resume needs (optimizer, scheduler, AMP scaler, RNG states), and the copies of
#: other steps' weights `EarlyStopping(restore_best=True)` leaves in checkpoints: not kept
#: unless ``resumable=True``.
RESUME_ONLY = ("optimizer.pt", "optimizer.bin", "scheduler.pt", "scaler.pt", "rng_state*.pth",
               "best_weights-*.safetensors")
_BUILDING, _DELETING = ".building-", ".deleting-"


def kept_folder(directory: str, step: int) -> str:
    """``<directory>/checkpoint-<step>``."""
    return os.path.join(directory, f"{PREFIX_CHECKPOINT_DIR}-{step}")


def _skipped(name: str, skip: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in skip)


def _same_file(first: str, second: str) -> bool:
    try:
        a, b = os.stat(first), os.stat(second)
    except OSError:
        return False
    if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
        return True
    return (a.st_size, a.st_mtime_ns) == (b.st_size, b.st_mtime_ns)  # a copy made earlier


def _link_or_copy(source: str, target: str) -> bool:
    """Put ``source`` at ``target`` (replacing it); True when it is a hard link."""
    partial = f"{target}.partial"
    if os.path.lexists(partial):
        os.remove(partial)
    try:
        os.link(source, partial)
        linked = True
    except OSError:  # a file system without hard links (some network and FUSE mounts)
        shutil.copy2(source, partial)
        linked = False
    os.replace(partial, target)
    return linked


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


def _sync(source: str, target: str, skip: Sequence[str]) -> bool:
    wanted = {name for name in os.listdir(source) if not _skipped(name, skip)}
    for name in os.listdir(target):
        if name not in wanted:
            _remove(os.path.join(target, name))
    linked = True
    for name in sorted(wanted):
        origin, copy = os.path.join(source, name), os.path.join(target, name)
        if os.path.isdir(origin) and not os.path.islink(origin):
            if os.path.lexists(copy) and not os.path.isdir(copy):
                os.remove(copy)
            os.makedirs(copy, exist_ok=True)
            linked = _sync(origin, copy, ()) and linked
        elif not (os.path.isfile(copy) and _same_file(origin, copy)):
            if os.path.isdir(copy):
                shutil.rmtree(copy)
            linked = _link_or_copy(origin, copy) and linked
    return linked


def sync_folder(source: str, target: str, skip: Sequence[str] = ()) -> bool:
    """Make ``target`` hold the files of ``source`` (recursively), hard-linked where possible.

    Idempotent: files already linked are left alone, a file replaced in ``source`` since is
    linked again, a file gone from ``source`` is removed from ``target``. A new ``target`` is
    built under a hidden name and renamed into place, so it exists whole or not at all.

    Args:
        source: The checkpoint folder.
        target: The kept folder.
        skip: Top-level names (glob patterns) left out. Defaults to ().

    Returns:
        True when every file is a hard link, False when some had to be copied.

    Raises:
        OSError: The disk refused (full, permissions).
    """
    if os.path.isdir(target):
        return _sync(source, target, skip)
    parent, name = os.path.split(target)
    building = os.path.join(parent, _BUILDING + name)
    if os.path.lexists(building):
        _remove(building)
    os.makedirs(building)
    linked = _sync(source, building, skip)
    os.replace(building, target)
    return linked


def remove_folder(directory: str, step: int) -> None:
    """Delete the kept folder of ``step`` in ``directory`` (renamed away first, then deleted).

    Raises:
        ValueError: The path would leave ``directory`` (a symbolic link): nothing is deleted.
    """
    path = kept_folder(directory, step)
    if not os.path.lexists(path):
        return
    if os.path.islink(path) or os.path.dirname(os.path.realpath(path)) != os.path.realpath(directory):
        raise ValueError(f"KeepBestCheckpoints: {path} is not a folder of {directory}; it is left alone.")
    deleting = os.path.join(directory, _DELETING + os.path.basename(path))
    if os.path.lexists(deleting):
        _remove(deleting)
    os.replace(path, deleting)
    shutil.rmtree(deleting)


def leftovers(directory: str) -> list[str]:
    """Folders an interrupted `sync_folder` or `remove_folder` left in ``directory``."""
    if not os.path.isdir(directory):
        return []
    return sorted(os.path.join(directory, name) for name in os.listdir(directory)
                  if name.startswith((_BUILDING, _DELETING)))


def read_manifest(directory: str) -> Optional[dict[str, Any]]:
    """The manifest in ``directory``, or None when there is none or it does not read."""
    path = os.path.join(directory, MANIFEST_NAME)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        logger.warning("KeepBestCheckpoints: cannot read %s (%s); it is treated as absent.", path, error)
        return None
    return data if isinstance(data, dict) else None


def write_manifest(directory: str, data: dict[str, Any]) -> None:
    """Write the manifest atomically (a temporary file renamed over the old one)."""
    os.makedirs(directory, exist_ok=True)
    write_json_atomically(os.path.join(directory, MANIFEST_NAME), data)
