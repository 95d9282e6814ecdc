"""The kept folders of `KeepBestCheckpoints` on disk: ``<output_dir>/<dirname>/checkpoint-<step>/``
and ``manifest.json`` beside them.

transformers' rotation (``save_total_limit``) lists only ``<output_dir>/checkpoint-*``, so a
folder one level down is out of its reach.

**A kept file is a copy, never a hard link.** transformers (5.23) writes ``trainer_state.json``,
``training_args.bin``, ``optimizer.pt``, ``scheduler.pt``, ``rng_state*.pth``, ``config.json``,
``generation_config.json``, the tokenizer files and ``adapter_config.json`` *in place* (the same
inode) whenever it saves a ``checkpoint-N`` that exists (a second run, a resume from an earlier
step, ``save_model`` into it); ``torch.save``-written weights (``pytorch_model.bin``, engine
shards) too; only safetensors >= 0.5 replaces its file by a rename, and a user may write any file
in place. A hard link would change with every one of them. Where the file system shares blocks
copy-on-write (``FICLONE``: btrfs, XFS with reflinks, bcachefs; ``copy_file_range``: ZFS 2.2,
NFS 4.2 server-side), the copy costs no space and no time; elsewhere it is a byte copy, done in
the kernel where it can be.

Which files of a checkpoint a kept folder holds, under each engine, and which rank copies each
(the one that wrote it) is `hf_callbacks_plus.core.checkpoint_files.kept_entries`'s answer; here
the main process begins a folder (`begin_folder`), each rank copies its entries
(`copy_entries`), and the main process publishes it (`finish_folder`) or deletes it
(`abandon_folder`).

Every change is complete on disk before anything depends on it: a new folder is built under a
hidden name, every file ``fsync``'d, renamed into place, and its parent ``fsync``'d; a file is
replaced by renaming a complete copy over it; a folder is renamed away before it is deleted; the
manifest is written to a temporary file, ``fsync``'d and renamed. A copy that fails (a full disk,
a quota) removes what it made and raises. Leftovers of an interrupted change carry the hidden
names `leftovers` finds.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from collections.abc import Sequence
from typing import Any, Optional

from ...core.checkpoint_files import Entry, list_files
from ...core.checkpoint_folders import checkpoint_folder
from ...core.state import TRAINER_STATE_NAME
from ...runtime.file_copies import Copied, copy_file

__all__ = ["MANIFEST_NAME", "Copied", "abandon_folder", "begin_folder", "building_folder", "copy_entries",
           "copy_folder", "finish_folder", "history_matches", "leftovers", "move_folder",
           "read_manifest", "remove_folder", "update_folder", "write_manifest"]

logger = logging.getLogger("hf_callbacks_plus")

#: The manifest's file name, in the kept folder.
MANIFEST_NAME = "manifest.json"
_BUILDING, _DELETING, _PARTIAL = ".building-", ".deleting-", ".partial-"
def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


def _fsync_dir(path: str) -> None:
    """Make a folder's entries (files created, renamed in) durable. POSIX only."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:  # Windows cannot open a folder; its renames are durable on NTFS
        return
    try:
        os.fsync(descriptor)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.EBADF):  # a file system that cannot sync folders
            raise
    finally:
        os.close(descriptor)


def _make_dir(path: str) -> None:
    os.mkdir(path)


def _weights_only(source: str, target: str) -> Copied:
    """Copy a DeepSpeed optimizer partition without the optimizer's moments: its fp32 master
    weights, as DeepSpeed's ``zero_to_fp32.py`` reads them (it drops the moments itself)."""
    import torch

    state = torch.load(source, map_location="cpu", mmap=True, weights_only=False)  # this run's own file
    inner = state.get("optimizer_state_dict") if isinstance(state, dict) else None
    if isinstance(inner, dict):
        inner.pop("optimizer_state_dict", None)  # ZeRO-3: the base optimizer's state
        inner.pop("base_optimizer_state", None)  # ZeRO-1/2
    with open(target, "xb") as writer:
        torch.save(state, writer)
        writer.flush()
        os.fsync(writer.fileno())
    return Copied(1, os.path.getsize(target), 0)


def building_folder(target: str) -> str:
    """The hidden name a kept folder is built under."""
    return os.path.join(os.path.dirname(target), _BUILDING + os.path.basename(target))


def begin_folder(target: str) -> str:
    """Make the (empty) hidden folder ``target`` is built in (a stale one is removed first).

    Raises:
        OSError: The disk refused.
    """
    building = building_folder(target)
    if os.path.lexists(building):
        _remove(building)
    _make_dir(building)
    return building


def copy_entries(source: str, building: str, entries: Sequence[Entry]) -> Copied:
    """Copy ``entries`` of ``source`` into ``building`` (each file ``fsync``'d); several ranks may
    do so at once, each its own entries.

    Raises:
        OSError: The disk refused, or a file is gone.
    """
    copied = Copied()
    for entry in entries:
        origin, copy = os.path.join(source, entry.path), os.path.join(building, entry.path)
        parent = os.path.dirname(copy)
        if parent != building and not os.path.isdir(parent):
            os.makedirs(parent, exist_ok=True)
        copied.add(_weights_only(origin, copy) if entry.weights_only else copy_file(origin, copy))
    return copied


def finish_folder(building: str, target: str) -> None:
    """Sync every folder of the complete ``building`` (deepest first) and rename it to ``target``.

    Raises:
        OSError: The disk refused; ``building`` is left for `abandon_folder`.
    """
    for root, _, _ in sorted(os.walk(building), key=lambda item: -item[0].count(os.sep)):
        _fsync_dir(root)
    _publish(building, target)


def abandon_folder(building: str) -> None:
    """Delete what was built of a kept folder."""
    shutil.rmtree(building, ignore_errors=True)


def copy_folder(source: str, target: str, entries: Optional[Sequence[Entry]] = None) -> Copied:
    """Make ``target`` a complete, durable copy of ``source``'s ``entries`` (by default every file),
    in one process, or raise and leave nothing made.

    Built under a hidden name, every file and folder ``fsync``'d, then renamed into place (an
    existing ``target`` is renamed away first and deleted after).

    Args:
        source: The checkpoint folder.
        target: The kept folder.
        entries: What to copy (`kept_entries`). Defaults to None: every file as it is.

    Returns:
        What was copied (`Copied`).

    Raises:
        OSError: The disk refused (full, quota, permissions) or ``source`` vanished; nothing of
            the copy is left.
    """
    if entries is None:
        entries = [Entry(path) for path in list_files(source)]
    building = building_folder(target)
    try:
        begin_folder(target)
        copied = copy_entries(source, building, entries)
        finish_folder(building, target)
    except BaseException:
        abandon_folder(building)
        raise
    return copied


def _publish(building: str, target: str) -> None:
    """Rename the complete ``building`` to ``target`` (an existing one renamed away first, then
    deleted), durably."""
    parent, name = os.path.split(target)
    if os.path.lexists(target):
        deleting = os.path.join(parent, _DELETING + name)
        if os.path.lexists(deleting):
            _remove(deleting)
        os.replace(target, deleting)
        os.replace(building, target)
        shutil.rmtree(deleting, ignore_errors=True)
    else:
        os.replace(building, target)
    _fsync_dir(parent)


def _same_file(first: str, second: str) -> bool:
    try:
        a, b = os.stat(first), os.stat(second)
    except OSError:
        return False
    return (a.st_size, a.st_mtime_ns) == (b.st_size, b.st_mtime_ns)  # copies keep the mtime


def update_folder(source: str, target: str, entries: Sequence[Entry]) -> Copied:
    """Bring the complete kept folder ``target`` up to ``source`` for ``entries``: a file added or
    rewritten since the copy (same size and mtime: unchanged) is copied again, by a rename of a
    complete copy over the old one. Used only within the save that made ``target`` (the files
    later callbacks write into the same checkpoint).

    Raises:
        OSError: The disk refused; each file of ``target`` is still whole (old or new).
    """
    copied = Copied()
    for entry in entries:
        origin, copy = os.path.join(source, entry.path), os.path.join(target, entry.path)
        if entry.weights_only or (os.path.isfile(copy) and _same_file(origin, copy)):
            continue
        os.makedirs(os.path.dirname(copy), exist_ok=True)
        partial = os.path.join(os.path.dirname(copy), _PARTIAL + os.path.basename(copy))
        if os.path.lexists(partial):
            _remove(partial)
        try:
            copied.add(copy_file(origin, partial))
            os.replace(partial, copy)
        finally:
            if os.path.lexists(partial):
                os.remove(partial)
        _fsync_dir(os.path.dirname(copy))
    return copied


def remove_folder(directory: str, step: int) -> None:
    """Delete the kept folder of ``step`` in ``directory`` (renamed away first, then deleted).

    Raises:
        ValueError: The path would leave ``directory`` (a symbolic link): nothing is deleted.
    """
    path = checkpoint_folder(directory, step)
    if not os.path.lexists(path):
        return
    if os.path.islink(path) or os.path.dirname(os.path.realpath(path)) != os.path.realpath(directory):
        raise ValueError(f"KeepBestCheckpoints: {path} is not a folder of {directory}; it is left alone.")
    deleting = os.path.join(directory, _DELETING + os.path.basename(path))
    if os.path.lexists(deleting):
        _remove(deleting)
    os.replace(path, deleting)
    shutil.rmtree(deleting)


def move_folder(source: str, target: str) -> None:
    """Rename ``source`` to ``target`` (a folder that does not exist yet), durably.

    Raises:
        OSError: ``target`` exists, or the rename was refused (another file system: copied, then
            ``source`` deleted).
    """
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, "already exists", target)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    try:
        os.rename(source, target)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        copy_folder(source, target)
        shutil.rmtree(source)
    _fsync_dir(os.path.dirname(target))
    _fsync_dir(os.path.dirname(source))


def leftovers(directory: str) -> list[str]:
    """Folders an interrupted `copy_folder` or `remove_folder` left in ``directory``."""
    if not os.path.isdir(directory):
        return []
    return sorted(os.path.join(directory, name) for name in os.listdir(directory)
                  if name.startswith((_BUILDING, _DELETING)))


def _records(history: Any) -> list[str]:
    return [json.dumps(record, sort_keys=True) for record in history or []]


def history_matches(folder: str, step: int, history: Sequence[Any]) -> bool:
    """Whether ``folder`` holds a save of ``step`` made on the way to ``history`` (the resumed
    run's ``log_history``): its ``trainer_state.json`` is at ``step`` and its ``log_history`` is a
    non-empty prefix of ``history``. Another run's (or another line's) save of the same step
    differs at least in its logged times."""
    try:
        with open(os.path.join(folder, TRAINER_STATE_NAME), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or data.get("global_step") != step:
        return False
    saved, resumed = _records(data.get("log_history")), _records(history)
    return bool(saved) and saved == resumed[: len(saved)]


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
    """Write the manifest durably: a temporary file, ``fsync``'d, renamed over the old one.

    Raises:
        OSError: The disk refused; the old manifest is unchanged.
    """
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, MANIFEST_NAME)
    partial = os.path.join(directory, _PARTIAL + MANIFEST_NAME)
    try:
        with open(partial, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
    finally:
        if os.path.lexists(partial):
            os.remove(partial)
    _fsync_dir(directory)
