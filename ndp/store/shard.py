"""Shards on disk: the header and the one reader of their bytes (the writer: ``ndp.store.writer``).

Layouts (header, index) are specified in ``ndp.wire.format``; this module only reads and writes
them. Every read of a shard, by the Loader and by every tool, is a pread(2) through
``ndp.store.files`` (a bounded set of open files; a file cut or replaced under the reader a
``ShardChangedError`` naming it) into memory ndp owns. No shard is memory-mapped: a mapped page
past the end of a file cut meanwhile kills the process with SIGBUS, which no Python code can
catch (``ndp verify``, ``index`` and ``export`` died so, exit -7, when they mapped shards).

Whole-shard passes (the framing scan ``ndp.store.framing``, crc32, ``ndp verify``, ``ndp
export``) read ``BLOCK_BYTES`` at a time (``blocks``, ``packet_blocks``): memory stays one block
however large the shard, and a pread from the page cache runs at memory-copy speed, so a block
costs about what the mapping's page faults did. ``Shard.data`` reads the whole file into memory
for callers that index a shard at random (``ndp.decode_padded`` on a shard, ``ndp demo``).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
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

#: bytes a whole-shard pass reads at once: 8 MiB is ~2-20 ms of scanning, so a pread's fixed
#: cost (microseconds) vanishes, and a pass holds 8 MiB whatever the shard's size (256 MiB by
#: default, GBs in some datasets). Larger is slower: reading a 256 MiB shard from the page cache
#: took ~45 ms in 4-16 MiB blocks and ~155 ms in 32 MiB ones (the copy's destination no longer
#: stays in the CPU's cache; measured on a 2-core VM)
BLOCK_BYTES = 8 << 20
#: one block is read as pieces of this size in parallel on ndp's threads (a pread from the page
#: cache is a memory copy of ~1-8 GB/s per core)
READ_PIECE_BYTES = 1 << 20


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
    """A shard file: its size and header, and its bytes read with pread(2): ranges (``read``,
    ``read_ranges``, ``read_into``), whole-shard passes a block at a time (``blocks``,
    ``packet_blocks``), or the whole file in memory (``.data``, read on first use, released by
    ``close``).

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
        self.read_into(0, head)
        self.header = parse_shard_header(head, self.path, size=self.size)

    @property
    def size(self) -> int:
        return int(self.identity[2])

    @property
    def data(self) -> np.ndarray:
        """The whole file as a uint8 array in memory (read once, kept until ``close``): it
        costs the shard's size in RAM, so whole-shard passes read ``blocks`` instead, and a
        Loader reads only its batches' packets (``read_ranges``). Not a mapping: a file cut
        while read is a ``ShardChangedError``, never a SIGBUS (module docstring)."""
        if self._data is None:
            data = np.empty(self.size, np.uint8)
            self.read_into(0, data)
            data.flags.writeable = False  # the shard's bytes, as the mapping was: read-only
            self._data = data
        return self._data

    def read_ranges(self, offsets: np.ndarray, sizes: np.ndarray, dst: np.ndarray,
                    starts: np.ndarray) -> None:
        """Bytes ``[offsets[k], offsets[k] + sizes[k])`` into ``dst[starts[k]:]`` (int64
        arrays); ``ShardChangedError`` if the file was cut or replaced."""
        from ndp.store.files import FILES

        FILES.read_ranges(self.path, self.identity, offsets, sizes, dst, starts)

    def read_into(self, offset: int, out: np.ndarray) -> None:
        """``out.shape[0]`` bytes from ``offset`` into ``out`` (uint8, contiguous), in pieces
        of ``READ_PIECE_BYTES`` read in parallel; ``ShardChangedError`` if the file ends
        before them (it was cut)."""
        n = out.shape[0]
        at = np.arange(0, n, READ_PIECE_BYTES, dtype=np.int64)
        sizes = np.minimum(READ_PIECE_BYTES, n - at)
        self.read_ranges(at + offset, sizes, out, at)

    def read(self, offset: int, size: int) -> np.ndarray:
        """``size`` bytes from ``offset`` (uint8)."""
        out = np.empty(size, np.uint8)
        self.read_into(offset, out)
        return out

    def blocks(self, start: int = 0, stop: int | None = None, *,
               block: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
        """``(offset, bytes)`` covering ``[start, stop)`` (default: to the end), ``block``
        bytes at a time, read into one buffer: each array is overwritten by the next, so copy
        what must outlive the step. After the last block the file must still be the one opened
        (``check_unchanged``): a pass never describes a file that changed under it."""
        stop = self.size if stop is None else stop
        buf = np.empty(max(0, min(block, stop - start)), np.uint8)
        for at in range(start, stop, block):
            out = buf[: min(block, stop - at)]
            self.read_into(at, out)
            yield at, out
        self.check_unchanged()

    def packet_blocks(self, offsets: np.ndarray, ends: np.ndarray, *, block: int = BLOCK_BYTES
                      ) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
        """The packets ``[offsets[k], ends[k])`` (int64, in file order, each inside the file)
        read a run at a time: ``(i, j, data, at)`` for packets ``i..j-1``, ``at`` their offsets
        in ``data`` (its bytes from ``offsets[i]`` to ``ends[j - 1]``). A run spans at most
        ``block`` bytes, or one packet (at most ``MAX_PACKET_BYTES``); ``data`` is overwritten
        by the next run. The file must still be the one opened after the last run."""
        n = offsets.shape[0]
        buf = np.empty(0, np.uint8)
        i = 0
        while i < n:
            lo = int(offsets[i])
            j = max(i + 1, int(np.searchsorted(ends, lo + block, side="right")))
            span = int(ends[j - 1]) - lo
            if buf.shape[0] < span:
                buf = np.empty(max(span, min(block, int(ends[-1]) - lo)), np.uint8)
            data = buf[:span]
            self.read_into(lo, data)
            yield i, j, data, offsets[i:j] - lo
            i = j
        self.check_unchanged()

    def check_unchanged(self) -> None:
        """``ShardChangedError`` unless the file at ``path`` is still the one opened (device,
        inode, size, modification time): checked after a whole-shard pass, whose result would
        otherwise describe bytes that are no longer there."""
        from ndp.store.files import check_same

        check_same(self.path, self.identity)

    @property
    def index_path(self) -> Path:
        return index_path_for(self.path)

    def crc32(self) -> int:
        """zlib.crc32 of the whole file, read a block at a time: the index's staleness check."""
        crc = 0
        for _, block in self.blocks():
            crc = zlib.crc32(block, crc)
        return crc

    def close(self) -> None:
        """Close the file and drop the bytes ``.data`` read (a view of them still held
        elsewhere keeps them alive until it goes)."""
        from ndp.store.files import FILES

        self._data = None
        FILES.close(self.path)

    def __repr__(self) -> str:
        return f"Shard({str(self.path)!r}, size={self.size}, version={self.header.version})"


def index_path_for(shard_path: str | os.PathLike) -> Path:
    """Sidecar index path of a shard: ``<shard>.idx``."""
    return Path(str(shard_path) + INDEX_SUFFIX)
