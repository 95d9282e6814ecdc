"""W&B run files (``run-*.wandb``, W&B's transaction log): the format, and the last history row on disk.

W&B's service writes every record of a run to ``<sync_dir>/run-<id>.wandb`` (offline runs, and the local
copy of online ones) in 32 KiB blocks it keeps in memory until they are full: what it holds when it is
killed is not in the file. `WandbLogger`'s journal keeps every row until this file holds it
(`last_history_step`); the test kit's ``read_wandb_run`` folds the whole run.

The format (nothing from ``wandb``'s private internals): a LevelDB-style log of protobuf
``wandb.proto.wandb_internal_pb2.Record`` messages:

* a 7-byte file header: ``b":W&B"``, the magic ``0xBEE1`` (little-endian uint16) and a version byte (0);
* then 32 KiB blocks (the first block starts with the file header). Each block holds chunks with a
  7-byte header: ``crc32`` (little-endian uint32, zlib's CRC-32 of the type byte followed by the data,
  not masked), ``length`` (uint16) and ``type`` (1 full, 2 first, 3 middle, 4 last). A record larger
  than what is left in a block is split into first/middle.../last chunks. When fewer than 7 bytes are
  left in a block they are zero padding. Every checksum is verified.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Optional, Union

from .._compat import require

__all__ = ["BLOCK_LEN", "WandbLogFormatError", "last_history_step", "split_records"]

FILE_HEADER_IDENT = b":W&B"
FILE_HEADER_MAGIC = 0xBEE1
FILE_HEADER_VERSION = 0
FILE_HEADER = struct.Struct("<4sHB")
CHUNK_HEADER = struct.Struct("<IHB")
HEADER_LEN = 7
BLOCK_LEN = 32 * 1024
CHUNK_FULL, CHUNK_FIRST, CHUNK_MIDDLE, CHUNK_LAST = 1, 2, 3, 4


class WandbLogFormatError(ValueError):
    """The file is not a W&B run log, or it is corrupted (bad checksum, bad chunk order)."""


def split_records(data: bytes, name: str) -> tuple[list[bytes], bool]:
    """Split the bytes of a ``.wandb`` file into record payloads, checking every chunk.

    Args:
        data: The whole file.
        name: Shown in error messages.

    Returns:
        ``(records, truncated)``: the serialized records, and whether the file ends inside
        a record (a run still being written, or a crash).

    Raises:
        WandbLogFormatError: Bad file header, checksum mismatch or chunks out of order.
    """
    if len(data) < HEADER_LEN:
        raise WandbLogFormatError(f"{name}: {len(data)} bytes, too short for a W&B run log header")
    ident, magic, version = FILE_HEADER.unpack_from(data, 0)
    if ident != FILE_HEADER_IDENT or magic != FILE_HEADER_MAGIC:
        raise WandbLogFormatError(
            f"{name}: not a W&B run log (header {data[:HEADER_LEN]!r}, expected "
            f"{FILE_HEADER_IDENT!r} and magic {FILE_HEADER_MAGIC:#06x})"
        )
    if version != FILE_HEADER_VERSION:
        raise WandbLogFormatError(
            f"{name}: W&B run log version {version} is not supported (only {FILE_HEADER_VERSION})"
        )
    records: list[bytes] = []
    pending: Optional[bytearray] = None
    pos = HEADER_LEN
    size = len(data)
    while pos < size:
        left_in_block = BLOCK_LEN - pos % BLOCK_LEN
        if left_in_block < HEADER_LEN:  # zero padding at the end of a block
            pos += left_in_block
            continue
        if size - pos < HEADER_LEN:
            return records, True
        checksum, length, kind = CHUNK_HEADER.unpack_from(data, pos)
        if checksum == 0 and length == 0 and kind == 0:  # preallocated, never written
            return records, pending is not None
        start = pos + HEADER_LEN
        end = start + length
        if length > left_in_block - HEADER_LEN:
            raise WandbLogFormatError(
                f"{name}: chunk at offset {pos} claims {length} bytes, more than its block holds"
            )
        if end > size:
            return records, True
        payload = data[start:end]
        if zlib.crc32(bytes((kind,)) + payload) & 0xFFFFFFFF != checksum:
            raise WandbLogFormatError(f"{name}: checksum mismatch in the chunk at offset {pos}")
        pos = end
        if kind == CHUNK_FULL:
            _expect_no_pending(pending, name, pos)
            records.append(payload)
        elif kind == CHUNK_FIRST:
            _expect_no_pending(pending, name, pos)
            pending = bytearray(payload)
        elif kind in (CHUNK_MIDDLE, CHUNK_LAST):
            if pending is None:
                raise WandbLogFormatError(
                    f"{name}: chunk of type {kind} at offset {pos - length - HEADER_LEN} "
                    "continues a record that never started"
                )
            pending += payload
            if kind == CHUNK_LAST:
                records.append(bytes(pending))
                pending = None
        else:
            raise WandbLogFormatError(f"{name}: unknown chunk type {kind} at offset {pos - length}")
    return records, pending is not None


def _expect_no_pending(pending: Optional[bytearray], name: str, pos: int) -> None:
    if pending is not None:
        raise WandbLogFormatError(f"{name}: a new record starts at offset {pos} inside an unfinished one")


def last_history_step(path: Union[str, Path]) -> Optional[int]:
    """The ``_step`` of the last history row the file holds whole (None: no row, or no file yet).

    Raises:
        WandbLogFormatError: The file is not a W&B run log, or it is corrupted.
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    pb = require("wandb.proto.wandb_internal_pb2", "WandbLogger")
    last = None
    for payload in split_records(data, str(path))[0]:
        record = pb.Record.FromString(payload)
        if record.WhichOneof("record_type") == "history":
            last = record.history.step.num
    return last
