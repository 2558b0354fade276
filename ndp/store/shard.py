"""Shards on disk: the header and a reader (the writer: ``ndp.store.writer``).

Layouts (header, index) are specified in ``ndp.wire.format``; this module only reads and writes
them. A ``Shard`` reads with pread(2) through ``ndp.store.files`` (a bounded set of open files, a
file cut under the reader an error); ``Shard.data`` memory-maps the whole file for the tools that
scan it whole (``ndp inspect``, ``verify``, ``index``, ``export``).
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ndp.errors import ShardFormatError, UnsupportedVersionError
from ndp.wire.format import (
    INDEX_SUFFIX,
    SHARD_HEADER_BYTES,
    SHARD_HEADER_CRC_AT,
    SHARD_MAGIC,
    SHARD_VERSION,
    SYNC,
)
from ndp.wire.packet import crc16_ccitt


def encode_shard_header(version: int = SHARD_VERSION) -> bytes:
    """The 32-byte shard header of ``ndp.wire.format``."""
    head = bytearray(SHARD_HEADER_BYTES)
    head[0:8] = SHARD_MAGIC
    head[8:10] = version.to_bytes(2, "big")
    head[10:12] = SHARD_HEADER_BYTES.to_bytes(2, "big")
    crc = crc16_ccitt(bytes(head[:SHARD_HEADER_CRC_AT]))
    head[SHARD_HEADER_CRC_AT:] = crc.to_bytes(2, "big")
    return bytes(head)


@dataclass(frozen=True)
class ShardHeader:
    """What the start of a shard says. ``version`` is None for a headerless packet stream."""

    version: int | None
    data_offset: int
    problem: str | None = None  # a damaged header, reported but not fatal


def parse_shard_header(data: np.ndarray, path: str | os.PathLike = "<shard>", *,
                       size: int | None = None) -> ShardHeader:
    """Read the header at the start of ``data`` (uint8: the file, or its first bytes with the
    file's ``size``).

    A file that starts with SYNC, is empty, or starts with neither SYNC nor the magic is a
    headerless stream (in the last case the framing scan reports the leading garbage). A header
    whose CRC fails is reported in ``problem`` and packets are looked for after its 32 bytes.
    Raises ``UnsupportedVersionError`` for a newer version with an intact header.
    """
    size = data.shape[0] if size is None else size
    magic = bytes(data[: len(SHARD_MAGIC)])
    if size == 0 or data[0] == SYNC or magic != SHARD_MAGIC:
        return ShardHeader(version=None, data_offset=0)
    if size < SHARD_HEADER_BYTES or data.shape[0] < SHARD_HEADER_BYTES:
        return ShardHeader(
            version=None,
            data_offset=size,
            problem=f"truncated header: {size} of {SHARD_HEADER_BYTES} bytes",
        )
    head = bytes(data[:SHARD_HEADER_BYTES])
    version = int.from_bytes(head[8:10], "big")
    header_len = int.from_bytes(head[10:12], "big")
    stored = int.from_bytes(head[SHARD_HEADER_CRC_AT:SHARD_HEADER_BYTES], "big")
    if crc16_ccitt(head[:SHARD_HEADER_CRC_AT]) != stored:
        return ShardHeader(
            version=None,
            data_offset=SHARD_HEADER_BYTES,
            problem="header CRC mismatch (damaged header); reading packets after byte 32",
        )
    if version > SHARD_VERSION:
        raise UnsupportedVersionError(
            f"{path}: shard format version {version}, this ndp reads up to {SHARD_VERSION}. "
            "Upgrade ndp (pip install -U neural-datagram) to read it."
        )
    if version < 1 or header_len < SHARD_HEADER_BYTES or header_len > size:
        raise ShardFormatError(
            f"{path}: header says version {version}, header length {header_len} "
            f"(file is {size} bytes); the shard is damaged. Rebuild it with 'ndp convert'."
        )
    return ShardHeader(version=version, data_offset=header_len)


class Shard:
    """A shard file: its size and header, read with pread(2) (``read``, ``read_ranges``), or
    memory-mapped whole as a uint8 array (``.data``, mapped on first use, released by
    ``close``) by the tools that scan a whole shard.

    Opening reads only the header and holds no file open; what is not a regular file (a FIFO
    named ``*.ndp``, whose open would wait for a writer) is a ``ShardFormatError`` before any
    open (``ndp.store.files.regular_file``). Reads go through ``ndp.store.files``: at
    most a bounded number of files open in the process, and ``ShardChangedError`` (naming the
    file) if it was cut or replaced after it was opened.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        from ndp.store.files import identity_of

        self.path = Path(path)
        self.identity = identity_of(self.path)
        self._data: np.ndarray | None = None
        head = np.zeros(min(self.size, SHARD_HEADER_BYTES), np.uint8)
        self.read_ranges(np.zeros(1, np.int64), np.array([head.shape[0]], np.int64), head,
                         np.zeros(1, np.int64))
        self.header = parse_shard_header(head, self.path, size=self.size)

    @property
    def size(self) -> int:
        return int(self.identity[2])

    @property
    def data(self) -> np.ndarray:
        """The whole file, memory-mapped read-only (for whole-shard scans; a Loader reads with
        ``read_ranges``)."""
        if self._data is None:
            if self.size == 0:  # np.memmap cannot map an empty file
                self._data = np.zeros(0, dtype=np.uint8)
            else:
                self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._data

    def read_ranges(self, offsets: np.ndarray, sizes: np.ndarray, dst: np.ndarray,
                    starts: np.ndarray) -> None:
        """Bytes ``[offsets[k], offsets[k] + sizes[k])`` into ``dst[starts[k]:]`` (int64
        arrays); ``ShardChangedError`` if the file was cut or replaced."""
        from ndp.store.files import FILES

        FILES.read_ranges(self.path, self.identity, offsets, sizes, dst, starts)

    def read(self, offset: int, size: int) -> np.ndarray:
        """``size`` bytes from ``offset`` (uint8)."""
        out = np.empty(size, np.uint8)
        self.read_ranges(np.array([offset], np.int64), np.array([size], np.int64), out,
                         np.zeros(1, np.int64))
        return out

    @property
    def index_path(self) -> Path:
        return index_path_for(self.path)

    def crc32(self) -> int:
        """zlib.crc32 of the whole file, read in 16 MiB pieces: the index's staleness check."""
        crc, step = 0, 16 << 20
        for at in range(0, self.size, step):
            crc = zlib.crc32(self.read(at, min(step, self.size - at)), crc)
        return crc

    def close(self) -> None:
        """Close the file and drop the whole-file mapping (a view of it still held elsewhere
        keeps that mapping alive until it goes)."""
        from ndp.store.files import FILES

        self._data = None
        FILES.close(self.path)

    def __repr__(self) -> str:
        return f"Shard({str(self.path)!r}, size={self.size}, version={self.header.version})"


def index_path_for(shard_path: str | os.PathLike) -> Path:
    """Sidecar index path of a shard: ``<shard>.idx``."""
    return Path(str(shard_path) + INDEX_SUFFIX)
