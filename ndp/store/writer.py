"""Writing shards: an atomic rolling writer of packets into shards with their indexes, committed
with the dataset's manifest. The layouts are specified in ``ndp.wire.format``; the reader is
``ndp.store.shard``, the index ``ndp.store.index`` (which reads shards, so the writer sits above
both).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ndp.errors import ConfigError, ShardFormatError
from ndp.store.atomic import AtomicFile
from ndp.store.index import write_index
from ndp.store.shard import encode_shard_header, index_path_for
from ndp.wire.format import (
    DST_CONTINUES,
    FRAME_BYTES,
    INDEX_ENTRY_DTYPE,
    SHARD_HEADER_BYTES,
    SHARD_SUFFIX,
    SHARD_VERSION,
    SYNC,
)


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
    """Writes packets into ``directory/<prefix>-00000.ndp``, ``-00001.ndp``, ... (from
    ``<prefix>-<first>``) with indexes, and commits them with the manifest ``ndp.json``
    (``ndp.store.manifest``).

    Each shard is written atomically (``ndp.store.atomic``: ``<name>.tmp``, fsynced, renamed into
    place only when it is complete), so a crash leaves a ``.tmp`` file and never a half shard
    under a final name. A new
    shard starts when the next packet that starts a document would pass ``max_shard_bytes``
    (a document split over packets stays in one shard). ``commit`` (or ``close``,
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
        first: int = 0,
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
        self.first = first  # the first shard's number (``ndp convert --append``: after the last)
        self.max_shard_bytes = max_shard_bytes
        self.header = header
        self.on_finish = on_finish  # called with each shard once it and its index are written
        self.finished: list[ShardInfo] = []
        self.committed = False
        self._current: _OpenShard | None = None

    def _open(self) -> _OpenShard:
        path = self.directory / f"{self.prefix}-{self.first + len(self.finished):05d}{SHARD_SUFFIX}"
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
        """Append one framed packet (from ``encode_packet``/``encode_tokens``). A packet that
        continues a document (``DST_CONTINUES``: ``encode_tokens(..., continues=True)``) is
        written into the shard of the piece before it, whatever its size; the first packet of
        a shard never continues one."""
        head = bytes(packet[:6])  # ints, also for a uint8 array (whose << 8 would wrap)
        if len(packet) < FRAME_BYTES or head[0] != SYNC:
            raise ShardFormatError("write() takes a framed packet starting with the sync byte")
        length = (head[4] << 8) | head[5]
        if len(packet) != FRAME_BYTES + length:
            raise ShardFormatError(
                f"packet is {len(packet)} bytes but its LEN says {FRAME_BYTES + length}"
            )
        cur = self._current
        # a document's later pieces stay in its shard (never a new one before them), so that
        # every piece of it is one shard's and one shuffle window's: the shard may pass
        # max_shard_bytes by the rest of a document
        if cur is not None and cur.entries and cur.size + len(packet) > self.max_shard_bytes \
                and not head[2] & DST_CONTINUES:
            self._finish()
            cur = None
        if cur is None:
            if head[2] & DST_CONTINUES:
                raise ShardFormatError(
                    "the first packet of a shard continues a document (DST bit 7 set): a "
                    "document's pieces follow its first packet, written just before them")
            cur = self._current = self._open()
        cur.entries.append((cur.size, length, head[1], head[2], head[3]))
        self._append(cur, packet)

    def _finish(self) -> None:

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
        from ndp.store.manifest import read_manifest, shard_entry, write_manifest

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

