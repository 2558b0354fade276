"""Shards on disk: the header, an atomic rolling writer and a reader.

Layouts (header, index) are specified in ``ndp.format``; this module only reads and writes them.
A ``Shard`` reads with pread(2) through ``ndp.files`` (a bounded set of open files, a file cut
under the reader an error); ``Shard.data`` memory-maps the whole file for the tools that scan
it whole (``ndp inspect``, ``verify``, ``index``, ``export``).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ndp.atomic import AtomicFile
from ndp.errors import ConfigError, ShardFormatError, UnsupportedVersionError
from ndp.format import (
    FRAME_BYTES,
    INDEX_ENTRY_DTYPE,
    INDEX_SUFFIX,
    SHARD_HEADER_BYTES,
    SHARD_HEADER_CRC_AT,
    SHARD_MAGIC,
    SHARD_SUFFIX,
    SHARD_VERSION,
    SYNC,
)
from ndp.packet import crc16_ccitt


def encode_shard_header(version: int = SHARD_VERSION) -> bytes:
    """The 32-byte shard header of ``ndp.format``."""
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

    Opening reads only the header and holds no file open. Reads go through ``ndp.files``: at
    most a bounded number of files open in the process, and ``ShardChangedError`` (naming the
    file) if it was cut or replaced after it was opened.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        from ndp.files import identity_of

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
        from ndp.files import FILES

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
        from ndp.files import FILES

        self._data = None
        FILES.close(self.path)

    def __repr__(self) -> str:
        return f"Shard({str(self.path)!r}, size={self.size}, version={self.header.version})"


def index_path_for(shard_path: str | os.PathLike) -> Path:
    """Sidecar index path of a shard: ``<shard>.idx``."""
    return Path(str(shard_path) + INDEX_SUFFIX)


@dataclass
class ShardInfo:
    """One finished shard: its path, size, packet count and crc32."""

    path: Path
    size: int
    packets: int
    crc32: int


@dataclass
class _OpenShard:
    path: Path
    out: AtomicFile
    size: int = 0
    crc32: int = 0
    entries: list = field(default_factory=list)


class ShardWriter:
    """Writes packets into ``directory/<prefix>-00000.ndp``, ``-00001.ndp``, ... with indexes,
    and commits them with the manifest ``ndp.json`` (``ndp.manifest``).

    Each shard is written atomically (``ndp.atomic``: ``<name>.tmp``, fsynced, renamed into
    place only when it is complete), so a crash leaves a ``.tmp`` file and never a half shard
    under a final name. A new
    shard starts when the next packet would pass ``max_shard_bytes``. ``commit`` (or ``close``,
    or leaving the ``with`` block normally) finishes the last shard and then writes the
    manifest, listing these shards and those an earlier commit in the directory listed; until
    then readers refuse the directory. An exception in the block discards the open shard and
    commits nothing.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        prefix: str = "shard",
        max_shard_bytes: int = 256 << 20,
        header: bool = True,
        on_finish: Callable[[ShardInfo], None] | None = None,
    ) -> None:
        min_bytes = SHARD_HEADER_BYTES + FRAME_BYTES + 0xFFFF
        if max_shard_bytes < min_bytes:
            raise ConfigError(f"`max_shard_bytes` must be at least {min_bytes:,} bytes "
                              f"({min_bytes / (1 << 20):.3f} MB: one full packet), got "
                              f"{max_shard_bytes:,} bytes")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix
        self.max_shard_bytes = max_shard_bytes
        self.header = header
        self.on_finish = on_finish  # called with each shard once it and its index are written
        self.finished: list[ShardInfo] = []
        self.committed = False
        self._current: _OpenShard | None = None

    def _open(self) -> _OpenShard:
        path = self.directory / f"{self.prefix}-{len(self.finished):05d}{SHARD_SUFFIX}"
        cur = _OpenShard(path=path, out=AtomicFile(path))
        if self.header:
            self._append(cur, encode_shard_header())
        return cur

    @staticmethod
    def _append(cur: _OpenShard, data: bytes) -> None:
        cur.out.file.write(data)
        cur.crc32 = zlib.crc32(data, cur.crc32)
        cur.size += len(data)

    def write(self, packet: bytes) -> None:
        """Append one framed packet (from ``encode_packet``/``encode_tokens``)."""
        head = bytes(packet[:6])  # ints, also for a uint8 array (whose << 8 would wrap)
        if len(packet) < FRAME_BYTES or head[0] != SYNC:
            raise ShardFormatError("write() takes a framed packet starting with the sync byte")
        length = (head[4] << 8) | head[5]
        if len(packet) != FRAME_BYTES + length:
            raise ShardFormatError(
                f"packet is {len(packet)} bytes but its LEN says {FRAME_BYTES + length}"
            )
        cur = self._current
        if cur is not None and cur.entries and cur.size + len(packet) > self.max_shard_bytes:
            self._finish()
            cur = None
        if cur is None:
            cur = self._current = self._open()
        cur.entries.append((cur.size, length, head[1], head[2], head[3]))
        self._append(cur, packet)

    def _finish(self) -> None:
        from ndp.index import write_index  # index.py builds on this module

        cur = self._current
        self._current = None
        entries = np.zeros(len(cur.entries), dtype=INDEX_ENTRY_DTYPE)
        if cur.entries:
            cols = np.array(cur.entries, dtype=np.uint64)
            for i, name in enumerate(("offset", "length", "src", "dst", "typ")):
                entries[name] = cols[:, i]
        data_offset = SHARD_HEADER_BYTES if self.header else 0
        cur.out.commit(sync_dir=False)
        write_index(index_path_for(cur.path), entries, cur.size, cur.crc32, data_offset)
        self.finished.append(ShardInfo(cur.path, cur.size, len(cur.entries), cur.crc32))
        if self.on_finish is not None:
            self.on_finish(self.finished[-1])

    def finish(self) -> list[ShardInfo]:
        """Finish the open shard (if any) and return every finished shard (no manifest)."""
        if self._current is not None:
            self._finish()
        return self.finished

    def commit(self, extra: dict | None = None) -> Path:
        """Finish the open shard and write the manifest: ``extra`` (what wrote the dataset) and
        every shard, after those an earlier commit in this directory listed. Returns its path."""
        from ndp.manifest import read_manifest, shard_entry, write_manifest

        self.finish()
        mine = [shard_entry(s.path, s.size, s.packets, s.crc32) for s in self.finished]
        names = {e["name"] for e in mine}
        earlier = read_manifest(self.directory) or {"shards": []}
        kept = [e for e in earlier["shards"]
                if e["name"] not in names and (self.directory / e["name"]).exists()]
        manifest = {"format_version": SHARD_VERSION, **(extra or {}),
                    "shards": sorted(kept + mine, key=lambda e: e["name"])}
        path = write_manifest(self.directory, manifest)
        self.committed = True
        return path

    def close(self) -> list[ShardInfo]:
        """Finish the open shard, commit (unless ``commit`` did) and return every finished
        shard."""
        if not self.committed:
            self.commit()
        return self.finished

    def abort(self) -> None:
        """Discard the shard being written; finished shards stay."""
        if self._current is not None:
            self._current.out.abort()
            self._current = None

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

