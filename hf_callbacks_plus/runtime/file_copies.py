"""A copy of a file that shares no bytes with its source: copy-on-write where the file system
can (``FICLONE``: btrfs, XFS with reflinks, bcachefs; ``copy_file_range``: ZFS 2.2, NFS 4.2
server-side), else a byte copy in the kernel or in Python; ``fsync``'d.

Never a hard link: transformers rewrites most checkpoint files in place (same inode) when it saves
over a folder, and a user may write any file in place; a file of ours must not change with them.
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass
from typing import Any

__all__ = ["Copied", "copy_file"]

_FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
#: copy_file_range errors that mean "not here" (another file system, an old kernel): copy in Python.
_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.EPERM,
                   errno.EBADF}


@dataclass
class Copied:
    """What a copy did: ``files`` and ``bytes`` copied, ``shared``: bytes shared copy-on-write."""

    files: int = 0
    bytes: int = 0
    shared: int = 0

    def add(self, other: Copied) -> None:
        self.files, self.bytes, self.shared = (self.files + other.files, self.bytes + other.bytes,
                                               self.shared + other.shared)


def _clone(source: Any, target: Any) -> bool:
    """Share ``source``'s blocks with ``target`` copy-on-write (FICLONE); False where unsupported."""
    try:
        import fcntl
    except ImportError:  # Windows
        return False
    try:
        fcntl.ioctl(target.fileno(), _FICLONE, source.fileno())
    except OSError:
        return False
    return True


def _copy_bytes(source: Any, target: Any, size: int) -> None:
    """Copy ``size`` bytes in the kernel (``copy_file_range``) where it can, else in Python."""
    done = 0
    if hasattr(os, "copy_file_range"):
        try:
            while done < size:
                count = os.copy_file_range(source.fileno(), target.fileno(), size - done)
                if count == 0:
                    break
                done += count
        except OSError as error:
            if done or error.errno not in _NO_KERNEL_COPY:
                raise
    if done == 0:
        shutil.copyfileobj(source, target, 8 << 20)
    elif done < size:  # the source shrank while being copied: copy what is left as it is now
        shutil.copyfileobj(source, target, 8 << 20)


def copy_file(source: str, target: str) -> Copied:
    """Copy one file to ``target`` (which must not exist), with its mtime, ``fsync``'d."""
    info = os.stat(source)
    with open(source, "rb") as reader, open(target, "xb") as writer:
        shared = _clone(reader, writer)
        if not shared:
            _copy_bytes(reader, writer, info.st_size)
        writer.flush()
        os.utime(writer.fileno(), ns=(info.st_atime_ns, info.st_mtime_ns))
        os.fsync(writer.fileno())
    return Copied(1, info.st_size, info.st_size if shared else 0)


