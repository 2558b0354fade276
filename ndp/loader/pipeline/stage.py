"""Stage, on the host: a chunk's packets read into a buffer the CPU kernels decode from (the
second stage of the Loader's pipeline: plan, stage, decode, serve). The GPU's stage is
``ndp.loader.pipeline.device_shards``.

* the packets' bytes are read from the shard files with pread(2) (``ndp.store.files``), each
packet's
  frame as its index entry gives it (6 + LEN + 2 bytes), packets that lie back to back in a file
  (a pretraining stream) in one read; no memory map, so a shard cut under the loader is a
  ``ShardChangedError`` naming it, not a SIGBUS, and only a bounded number of files is open;
* each packet's ``limit`` is the end of its own frame in the buffer, so its verdict is the one
  it gets in its shard (a header that disagrees with its entry is refused by
  ``Corpus.check_headers`` anyway);
* ``resident=True``: every shard read once into one buffer; each packet's limit is its shard's
  end there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ndp.store.corpus import Corpus
from ndp.engine.cpu import Slot, Staged
from ndp.wire.format import FRAME_BYTES


class HostStager:
    """Staging for the CPU backend (see the module docstring)."""

    prefetches = False  # the page cache holds the shards
    #: packets' headers are checked from the staged bytes, chunk by chunk (``ChunkDecoder``)
    checks_headers = False

    def __init__(self, corpus: Corpus, *, resident: bool = False) -> None:
        self.corpus = corpus
        self._buffer = np.empty(0, np.uint8)
        self._buffers: dict[int, np.ndarray] = {}  # by slot (``per_slot``), else one, key 0
        #: a buffer per ring slot, so that staging a chunk ahead leaves the one in flight
        self.per_slot = False
        self._whole: np.ndarray | None = None
        if resident:
            sizes = np.array([s.size for s in corpus.shards], np.int64)
            self._base = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            self._whole = np.empty(int(self._base[-1]), np.uint8)
            for s, shard in enumerate(corpus.shards):
                shard.read_ranges(np.zeros(1, np.int64), sizes[s:s + 1], self._whole,
                                  self._base[s:s + 1])

    def stage(self, packets: np.ndarray, slot: Slot, entries: np.ndarray | None = None,
              shard_ids: np.ndarray | None = None, keep: tuple[int, ...] = ()) -> Staged:
        """The chunk's packets read into the host buffer (``entries``: their index entries,
        if the caller holds them; else gathered from the indexes; ``shard_ids``: their shard
        numbers, if the caller knows them). The buffer is the slot's own once ``per_slot``
        is set (two chunks in flight, ``ndp.loader.pipeline.ahead``), else one for all; ``keep``
        (shards a chunk in flight reads) changes nothing on the host."""
        corpus = self.corpus
        n = packets.shape[0]
        if shard_ids is None:
            shard_ids = corpus.shard_of(packets)
        if entries is None:
            entries = corpus.entries_at(packets, shard_ids)  # one gather for both fields
        offsets = entries["offset"].astype(np.int64)
        if self._whole is not None:
            base = self._base[shard_ids]
            return Staged(self._whole, offsets + base, self._base[shard_ids + 1], n)
        sizes = entries["length"].astype(np.int64) + FRAME_BYTES
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        total = int(starts[-1])
        key = slot.index if self.per_slot else 0
        buffer = self._buffers.get(key, self._buffer)
        if buffer.shape[0] < total:
            buffer = self._buffers[key] = np.empty(max(total, 2 * buffer.shape[0]), np.uint8)
        # runs of packets back to back in one file are one read each
        follows = (shard_ids[1:] == shard_ids[:-1]) & (offsets[1:] == offsets[:-1] + sizes[:-1])
        first = np.flatnonzero(np.concatenate([[True], ~follows]))
        last = np.append(first[1:], n)
        run_shard = shard_ids[first]
        for s in np.unique(run_shard).tolist():
            mine = run_shard == s
            a, b = first[mine], last[mine]
            corpus.shards[s].read_ranges(offsets[a], starts[b] - starts[a], buffer, starts[a])
        return Staged(buffer[:max(total, 1)], starts[:-1], starts[1:], n)

    def after(self, staged: Staged, engine: Any) -> None:
        """Nothing to record: CPU work is done when it returns."""
