"""W&B run files (``run-*.wandb``, W&B's transaction log): the format, and the last history row on disk.

W&B's service writes every record of a run to ``<sync_dir>/run-<id>.wandb`` in 32 KiB blocks it keeps
in memory until they are full: what it holds when it is killed is not in the file. `WandbLogger`'s
journal keeps every row until this file holds it (`HistoryTail`); the test kit's ``read_wandb_run``
folds the whole run. The format, a LevelDB-style log of protobuf ``wandb_internal_pb2.Record`` messages
with every chunk's CRC-32 verified, is described in docs/testing_wandb.md ("The file format").
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Optional, Union

from .._compat import require

__all__ = ["BLOCK_LEN", "ChunkReader", "HistoryTail", "WandbLogFormatError", "split_records"]

#: ``:W&B``, the magic 0xBEE1 and version 0.
FILE_HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
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
    check_header(data, name)
    chunks = ChunkReader(name)
    records = chunks.feed(data)
    return records, chunks.truncated


def check_header(data: bytes, name: str) -> None:
    """Raise `WandbLogFormatError` unless ``data`` starts with a W&B run log's file header."""
    if data[:HEADER_LEN] != FILE_HEADER:
        raise WandbLogFormatError(f"{name}: not a W&B run log (header {data[:HEADER_LEN]!r}, expected "
                                  f"{FILE_HEADER!r}: ':W&B', magic 0xBEE1, version 0)")


class ChunkReader:
    """Joins the chunks of a run log into records, fed the file's bytes piece by piece (a file still
    being written is read again from `position`, the end of its last whole chunk)."""

    def __init__(self, name: str) -> None:
        self.name = name
        #: Offset in the file of the first byte not consumed yet.
        self.position = 0
        self._pending: Optional[bytearray] = None
        self._cut = False  # the bytes fed last end inside a chunk

    @property
    def truncated(self) -> bool:
        """Whether the bytes fed so far end inside a record."""
        return self._pending is not None or self._cut

    def feed(self, data: bytes) -> list[bytes]:
        """The records completed by ``data``, the file's bytes from `position` on (the file header first,
        checked once whole); the bytes of a chunk cut at the end are not consumed (feed them again)."""
        records: list[bytes] = []
        name, base, offset, size = self.name, self.position, 0, len(data)
        if base == 0:
            if size < HEADER_LEN:  # the writer has not written the header yet
                return records
            check_header(data, name)
            offset = HEADER_LEN
        unwritten = False  # zeros where a chunk starts: space the writer has not filled yet (read it again)
        while offset < size:
            pos = base + offset
            left_in_block = BLOCK_LEN - pos % BLOCK_LEN
            if left_in_block < HEADER_LEN:  # zero padding at the end of a block
                offset += min(left_in_block, size - offset)
                continue
            if size - offset < HEADER_LEN:
                break
            checksum, length, kind = CHUNK_HEADER.unpack_from(data, offset)
            if checksum == 0 and length == 0 and kind == 0:  # preallocated, not written yet
                unwritten = True
                break
            if length > left_in_block - HEADER_LEN:
                raise WandbLogFormatError(
                    f"{name}: chunk at offset {pos} claims {length} bytes, more than its block holds"
                )
            start = offset + HEADER_LEN
            if start + length > size:
                break
            payload = data[start:start + length]
            if zlib.crc32(bytes((kind,)) + payload) & 0xFFFFFFFF != checksum:
                raise WandbLogFormatError(f"{name}: checksum mismatch in the chunk at offset {pos}")
            offset = start + length
            if kind in (CHUNK_FULL, CHUNK_FIRST):
                if self._pending is not None:
                    raise WandbLogFormatError(f"{name}: a new record starts at offset {base + offset} inside "
                                              "an unfinished one")
                self._pending = bytearray()
            elif kind not in (CHUNK_MIDDLE, CHUNK_LAST):
                raise WandbLogFormatError(f"{name}: unknown chunk type {kind} at offset {pos}")
            elif self._pending is None:
                raise WandbLogFormatError(
                    f"{name}: chunk of type {kind} at offset {pos} continues a record that never started")
            self._pending += payload
            if kind in (CHUNK_FULL, CHUNK_LAST):
                records.append(bytes(self._pending))
                self._pending = None
        self.position = base + offset
        self._cut = offset < size and not unwritten
        return records


class HistoryTail:
    """The ``_step`` of the last history row a run file holds whole, read on from where it was last read
    (each call reads only what W&B wrote since: a long run's file is gigabytes)."""

    def __init__(self, path: Union[str, Path]) -> None:
        self.path = Path(path)
        self.last_step: Optional[int] = None
        self._chunks = ChunkReader(str(path))

    def read(self) -> Optional[int]:
        """The last whole history row's ``_step`` (None: no row, or no file yet).

        Raises:
            WandbLogFormatError: The file is not a W&B run log, or it is corrupted.
        """
        try:
            with self.path.open("rb") as file:
                file.seek(self._chunks.position)
                data = file.read()
        except FileNotFoundError:
            return self.last_step
        pb = require("wandb.proto.wandb_internal_pb2", "WandbLogger")
        for payload in self._chunks.feed(data):
            record = pb.Record.FromString(payload)
            if record.WhichOneof("record_type") == "history":
                self.last_step = record.history.step.num
        return self.last_step
