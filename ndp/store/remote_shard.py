"""The shards of a remote dataset (``ndp.store.remote.RemoteDataset``): each a ``Shard`` whose
size and header come from the manifest and the index, and whose bytes are read from the node's
cache (``ndp.store.cache``), fetched there on first use and checked against the index then."""

from __future__ import annotations

from typing import Any

import numpy as np

from ndp.errors import IndexMismatchError, ShardChangedError
from ndp.store.shard import Shard, ShardHeader, parse_shard_header
from ndp.wire.format import (INDEX_HEADER_BYTES, INDEX_HEADER_DTYPE, INDEX_SUFFIX,
                             SHARD_HEADER_BYTES, SHARD_VERSION)


class RemoteShard(Shard):
    """A shard of a ``RemoteDataset``: its size and header from the manifest and index, its
    bytes read from the cache, fetched on first use (``Shard``'s interface otherwise)."""

    def __init__(self, dataset: Any, entry: dict) -> None:  # Shard.__init__ opens a file
        self.dataset, self.entry = dataset, entry
        self.url = f"{dataset.url}/{entry['name']}"
        self.path = dataset.cache.path(entry["name"])
        self._data: np.ndarray | None = None
        self._checked: tuple | None = None  # identity of the file whose header was checked
        self._offset: int | None = None  # where packets start, as the index's header says

    @property
    def data_offset(self) -> int:
        """Where the shard's packets start, from its index's header (read once; the whole
        index is read and checked by ``load_index``)."""
        if self._offset is None:
            with open(self.index_path, "rb") as f:
                head = f.read(INDEX_HEADER_BYTES)
            if len(head) < INDEX_HEADER_BYTES:
                raise IndexMismatchError(f"{self.index_path}: not an ndp index (too short)")
            self._offset = int(np.frombuffer(head, INDEX_HEADER_DTYPE)[0]["data_offset"])
        return self._offset

    @property
    def size(self) -> int:
        return int(self.entry["bytes"])

    @property
    def header(self) -> ShardHeader:
        offset = self.data_offset
        return ShardHeader(SHARD_VERSION if offset == SHARD_HEADER_BYTES else None, offset)

    @property
    def identity(self) -> tuple[int, int, int, int]:
        """The cached file's identity, fetching it first (and checking its header against
        the index the first time)."""
        from ndp.store.files import FILES, identity_of

        path = self.dataset.fetch(self.entry)
        identity = identity_of(path)
        if identity != self._checked:
            head = np.zeros(min(self.size, SHARD_HEADER_BYTES), np.uint8)
            FILES.read_ranges(path, identity, np.zeros(1, np.int64),
                              np.array([head.shape[0]], np.int64), head, np.zeros(1, np.int64))
            if parse_shard_header(head, self.url, size=self.size).data_offset \
                    != self.data_offset:
                raise IndexMismatchError(f"{self.url}{INDEX_SUFFIX}: its packets start at "
                                         f"byte {self.data_offset}, the shard's header says "
                                         f"otherwise; rebuild the index ('ndp index')")
            self._checked = identity
        return identity

    def read_ranges(self, offsets: np.ndarray, sizes: np.ndarray, dst: np.ndarray,
                    starts: np.ndarray) -> None:
        from ndp.store.files import FILES

        for attempt in range(2):
            try:
                FILES.read_ranges(self.path, self.identity, offsets, sizes, dst, starts)
                return
            except (ShardChangedError, FileNotFoundError):
                if attempt:  # evicted by another process between the fetch and the read
                    raise
                self._checked = None

    @property
    def data(self) -> np.ndarray:
        if self._data is None:
            self.identity  # noqa: B018 - fetched and checked
        return super().data

    def crc32(self) -> int:
        """The manifest's: a shard enters the cache only with it."""
        return int(self.entry["crc32"])

    def __repr__(self) -> str:
        return f"RemoteShard({self.url!r}, size={self.size})"
