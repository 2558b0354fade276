"""Prefetch of a remote dataset's shards: the ones a Loader reads next, downloaded into the
cache (``ndp.store.cache``) on one thread while the current ones are decoded.

The Loader's producer says, at each epoch's start (or resume), which shards its share reads
and where in the share each is first and last needed (``plan``), and before each chunk where
it is (``advance``). From that the prefetcher keeps:

* **pinned**: the shards needed now (first needed at or before the position, last needed at or
  after it) and the next ones in order of first need, up to ``ahead`` bytes past those needed
  now, and never more than this rank's share of the cache's limit (the limit divided among
  the node's ranks, ``RemoteDataset.ranks``: were each rank to pin up to the whole limit, the
  shards one fetched ahead could hold the room another needs now, each waiting on the other;
  the shards needed now are pinned all the same); no process evicts a pinned shard;
* **fetched**: the pinned shards not yet in the cache, downloaded one after another, in order
  of need, on one thread that sleeps when there is nothing to fetch.

A download that fails here is left to the decoder's own fetch, which retries it and raises its
error in the consumer: the prefetcher never hides an error, it only moves downloads earlier.
It never waits behind another fetch of the same shard (``ShardBusy``: that fetch will have it),
and a shard the decoder's own fetch gave up on (``gave_up``) is not asked for again this epoch:
once the error is raised, nothing downloads that shard behind the consumer's back.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ndp.errors import CacheFullError
from ndp.store.readers import ShardBusy

#: bytes fetched ahead of those needed now, by default: two shuffle windows
AHEAD_BYTES = 2 << 30


class Prefetcher:
    """Downloads ``dataset``'s shards ahead of need (see the module docstring)."""

    def __init__(self, dataset: Any, *, ahead: int = AHEAD_BYTES) -> None:
        self.dataset = dataset
        self.sizes = np.array([e["bytes"] for e in dataset.entries], np.int64)
        limit = dataset.cache.limit
        #: what this rank's pins may hold: its share of the node's cache (None: no limit)
        self.share = None if limit is None else max(1, limit // getattr(dataset, "ranks", 1))
        self.ahead = ahead if self.share is None else min(ahead, self.share)
        self._cond = threading.Condition()
        self._order = np.zeros(0, np.int64)  # shard numbers in order of first need
        self._first = self._last = np.zeros(0, np.int64)
        self._targets: list[int] = []
        self._failed: set[int] = set()
        self._closed = False
        self._thread: threading.Thread | None = None
        #: shards this prefetcher downloaded (the rest were there, or fetched on demand)
        self.fetched = 0

    def plan(self, first: np.ndarray, last: np.ndarray, pos: int) -> None:
        """This epoch's need: shard ``s`` is read first at share position ``first[s]`` and last
        at ``last[s]`` (-1: not at all); the reader is at ``pos``."""
        needed = np.flatnonzero(first >= 0)
        order = needed[np.argsort(first[needed], kind="stable")]
        with self._cond:
            self._order, self._first, self._last = order, first[order], last[order]
            self._failed.clear()
        self.advance(pos)

    def advance(self, pos: int) -> None:
        """The reader is at share position ``pos``: pin and fetch from there."""
        with self._cond:
            alive = self._last >= pos
            order = self._order[alive]
            sizes = self.sizes[order]
            now = int((self._first[alive] <= pos).sum())  # a prefix: sorted by first need
            budget = int(sizes[:now].sum()) + self.ahead
            if self.share is not None:  # pins must leave room to evict, for other ranks too
                budget = min(budget, self.share)
            k = max(now, int(np.searchsorted(np.cumsum(sizes), budget, side="right")))
            targets = order[:k].tolist()
            self.dataset.cache.pin({self.dataset.entries[s]["name"] for s in targets})
            self._targets = [s for s in targets if s not in self._failed]
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="ndp-prefetch",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def _next(self) -> int | None:
        cache, entries = self.dataset.cache, self.dataset.entries
        for s in self._targets:
            if not cache.present(entries[s]["name"], entries[s]["bytes"]):
                return s
        return None

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (shard := self._next()) is None:
                    self._cond.wait()
                if self._closed:
                    return
            try:
                self.dataset.fetch(self.dataset.entries[shard], wait=False)
                self.fetched += 1
            except CacheFullError:  # no room before the reader moves on: until it does
                with self._cond:
                    self._targets = []
            except ShardBusy:  # another fetch is downloading it: nothing to move earlier
                with self._cond:
                    self._targets = [s for s in self._targets if s != shard]
            except Exception:  # noqa: BLE001 - the decoder's own fetch raises it
                with self._cond:
                    self._failed.add(shard)
                    self._targets = [s for s in self._targets if s != shard]

    def gave_up(self, name: str) -> None:
        """The decoder's own fetch of shard ``name`` failed (its error goes to the consumer):
        not fetched again here until the next ``plan``."""
        shard = next((s for s, e in enumerate(self.dataset.entries) if e["name"] == name), None)
        if shard is not None:
            with self._cond:
                self._failed.add(shard)
                self._targets = [s for s in self._targets if s != shard]

    def close(self) -> None:
        """Stop the thread (after the download it is in, if any)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=60)
