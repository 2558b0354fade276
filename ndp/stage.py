"""Stage, on the host: a chunk's packets put where the CPU kernels read them (the second stage of
the Loader's pipeline: plan, stage, decode, serve). The GPU's stage is ``ndp.device_shards``.

* packets all from one shard: the shard's memory map itself, nothing is copied;
* packets from several shards: gathered into one host buffer (``ndp.kernels.stage``: a copy of
  their bytes, no decoding), with each packet's ``limit`` (where its shard ended), so its
  verdict is the one it gets in its own shard;
* ``resident=True``: every shard copied once into one buffer; each packet's limit is its
  shard's end there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ndp.corpus import Corpus
from ndp.engine import Slot, Staged
from ndp.kernels.stage import gather_packets, staged_size

_NO_LIMITS = np.zeros(0, np.int64)


class HostStager:
    """Staging for the CPU backend (see the module docstring)."""

    prefetches = False  # the page cache holds the shards

    def __init__(self, corpus: Corpus, *, resident: bool = False) -> None:
        self.corpus = corpus
        self._buffer = np.empty(0, np.uint8)
        self._whole: np.ndarray | None = None
        if resident:
            sizes = np.array([s.data.shape[0] for s in corpus.shards], np.int64)
            self._base = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
            self._whole = np.empty(int(self._base[-1]), np.uint8)
            for s, shard in enumerate(corpus.shards):
                self._whole[self._base[s]: self._base[s + 1]] = shard.data

    def stage(self, packets: np.ndarray, slot: Slot) -> Staged:
        corpus = self.corpus
        n = packets.shape[0]
        shard_ids = corpus.shard_of(packets)
        offsets = corpus.offsets[packets]
        if self._whole is not None:
            base = self._base[shard_ids]
            return Staged(self._whole, offsets + base, self._base[shard_ids + 1], n)
        if n == 0 or (shard_ids == shard_ids[0]).all():  # one shard: read it where it is
            return Staged(corpus.shards[int(shard_ids[0]) if n else 0].data,
                          np.ascontiguousarray(offsets), _NO_LIMITS, n)
        return self._gather(shard_ids, offsets)

    def _gather(self, shard_ids: np.ndarray, offsets: np.ndarray) -> Staged:
        corpus = self.corpus
        n = offsets.shape[0]
        sizes = np.empty(n, np.int64)
        bounds = np.flatnonzero(np.diff(shard_ids)) + 1
        starts = np.concatenate([[0], bounds])
        stops = np.concatenate([bounds, [n]])
        total = 0
        for a, b in zip(starts, stops):
            total += staged_size(corpus.shards[shard_ids[a]].data, offsets[a:b], sizes[a:b])
        if self._buffer.shape[0] < total:
            self._buffer = np.empty(max(total, 2 * self._buffer.shape[0]), np.uint8)
        new_offsets = np.empty_like(offsets)
        limits = np.empty_like(offsets)
        at = 0
        for a, b in zip(starts, stops):
            part = int(sizes[a:b].sum())
            gather_packets(corpus.shards[shard_ids[a]].data, offsets[a:b], sizes[a:b],
                           self._buffer[at: at + part], new_offsets[a:b], limits[a:b])
            moved = new_offsets[a:b] >= 0
            new_offsets[a:b][moved] += at
            limits[a:b] += at
            at += part
        return Staged(self._buffer[:max(total, 1)], new_offsets, limits, n)

    def after(self, staged: Staged, engine: Any) -> None:
        """Nothing to record: CPU work is done when it returns."""
