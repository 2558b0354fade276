"""A rank's own packets' index entries, a shuffle window at a time (``ShareEntries``).

A chunk's packets are read at the offsets their index entries give, checked against the LEN,
SRC, DST and TYP the entries give, and laid out by the token counts they give. Gathered packet
by packet from whole shards' entries, that needs every entry of the window being read (16
bytes a packet: 430 MB for a 1 GiB window of 16-token documents), on every rank, though a rank
reads only its own 1/W of them. A ``RankOrder`` share instead keeps, for the windows being read,
a table of its own packets' entries in share order (``table``): the window's shards' entries
are read in passing (a block of ``BLOCK`` entries at a time, not held by the corpus' cache),
and only this rank's are kept, so a rank holds 16 bytes a packet of its own share of two
windows (the one being read and the next, which the producer's ``ndp.loader.ordering.warm.Warmer``
has built ahead; a few more where they are small, ``HELD_BYTES``), and 8 more (12 past 2**31
packets a shard) for each packet's shard and number in it; a chunk's entries are then a slice
of a table, with no gather and no sort, and its packets a slice too (``packets``), with no
second walk of the window's shuffled order.
A table takes a whole read of its window's indexes and a walk of its order, made by compiled
passes (``_build``; about 53 ns a packet on this project's VM, measured by hand on a window of
32,828 packets, against 90 ns for the numpy passes before): while one is being built, a
chunk of at most ``DIRECT`` packets reads its entries one by one instead
(``LazyIndex.read_at``), so that a run's first batch does not wait for it; an index not
checked yet is read whole and checked first (the first use of an index is its check, however
its entries are read: a lie that keeps every packet header, an entry repeated or two swapped,
is only seen there).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from ndp.kernels._jit import cpu_kernel
from ndp.loader.ordering.shuffle import LANES, NO_KEYS, permute_step, side
from ndp.store.columns import entries_one_by_one
from ndp.wire.format import INDEX_ENTRY_DTYPE

#: entries read from a shard's index at once, and share positions whose packets are worked
#: out at once, while a table is built
BLOCK = 1 << 18
#: windows whose tables are held: the one being read and the next, at least; more while
#: they hold at most ``HELD_BYTES`` together (``MOST_HELD`` at most): with small windows a
#: chunk, its look-ahead and the chunk staged after it reach into three or more, and two held
#: tables were built again and again (up to 11 times each, with two 16 MiB shards a window in
#: ``benchmarks/gpu/gpu_host.py``'s host source)
HELD = 2
HELD_BYTES = 1 << 26
MOST_HELD = 8
#: share positions a chunk may read one entry at a time while their window's table is being
#: built (a run's first chunks: its first batch does not wait for a whole window's entries)
DIRECT = 1 << 17


class ShareEntries:
    """The index entries of a ``RankOrder``'s own packets (module docstring)."""

    def __init__(self, order: Any, corpus: Any) -> None:
        self.order, self.corpus = order, corpus
        #: window -> (its own packets' entries, their shard numbers, their numbers in them)
        self._tables: OrderedDict[int, tuple] = OrderedDict()
        self._lock = threading.Lock()
        self._making: dict[int, threading.Lock] = {}
        self._claimed: set[int] = set()  # windows a thread is about to build (``claim``)
        #: tables built (each window's once while it is held), the most entries one held,
        #: and entries read one by one while a table was being built
        self.built = 0
        self.largest = 0
        self.direct = 0

    def span(self, k: int) -> tuple[int, int]:
        """The share positions (of the share's own packets) whose places lie in window ``k``."""
        o = self.order
        start, end = int(o._starts[k]), int(o._ends[k])
        W, r = o.world_size, o.rank
        a = max(0, -(-(start - r) // W))
        b = min(o.length, max(0, -(-(end - r) // W)))
        return a, max(a, b)

    def entries(self, a: int, b: int) -> np.ndarray:
        """The entries of share positions ``[a, b)`` (``INDEX_ENTRY_DTYPE``); positions past
        the share's own packets (packed mode's repeat) are its first ones'."""
        o = self.order
        L = o.length
        if b > L and o.shape[0] > L:
            if a >= L:
                return self.entries(a - L, b - L)
            return np.concatenate([self.entries(a, L), self.entries(0, b - L)])
        if b <= a:
            return np.zeros(0, INDEX_ENTRY_DTYPE)
        parts = []
        k = o.window_at(a)
        while a < b:
            s0, s1 = self.span(k)
            if s1 > a:
                c = min(b, s1)
                with self._lock:
                    held = self._tables.get(k)
                    building = k in self._making or k in self._claimed
                table = None if held is None else held[0]
                if table is None and building and c - a <= DIRECT:
                    parts.append(self._direct(a, c))  # not waiting for the table
                else:
                    table = self.table(k) if table is None else table
                    parts.append(table[a - s0: c - s0])
                a = c
            k += 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _direct(self, a: int, b: int) -> np.ndarray:
        """The entries of share positions ``[a, b)`` read one by one, while their window's
        table is being built (``ndp.store.columns.entries_one_by_one``)."""
        out = entries_one_by_one(self.corpus, self.order[a:b])
        self.direct += b - a
        return out

    def packets(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The packets of share positions ``[a, b)`` of the share's own packets and their
        shard numbers, from a held table (kept when it was built: no second walk of the
        window's order), if ``[a, b)`` lies in one window whose table is held; else ``None``."""
        o = self.order
        if b > o.length or b <= a:
            return None
        k = o.window_at(a)
        s0, s1 = self.span(k)
        if b > s1:
            return None
        with self._lock:
            held = self._tables.get(k)
        if held is None:
            return None
        shard = held[1][a - s0: b - s0].astype(np.int64)
        return self.corpus.base[shard] + held[2][a - s0: b - s0], shard

    def table(self, k: int, stop: np.ndarray | None = None) -> np.ndarray:
        """Window ``k``'s table (built now if it is not held: one thread builds it, another
        asking meanwhile waits for it). ``stop``: a flag (one uint8) that, set to 1 by another
        thread, abandons the build (``TableStopped``): a loop left while the warmer builds a
        window of tens of millions of packets does not wait for it."""
        with self._lock:
            got = self._tables.get(k)
            if got is not None:
                self._tables.move_to_end(k)
                return got[0]
            making = self._making.setdefault(k, threading.Lock())
        try:
            with making:
                with self._lock:
                    got = self._tables.get(k)
                if got is None:
                    got = self._build(k, NO_STOP if stop is None else stop)
                    with self._lock:
                        self._tables[k] = got
                        self.built += 1
                        self.largest = max(self.largest, got[0].shape[0])
                        while len(self._tables) > HELD and (
                                len(self._tables) > MOST_HELD
                                or self._held_bytes() > HELD_BYTES):
                            self._tables.popitem(last=False)
        finally:
            with self._lock:
                self._making.pop(k, None)
        return got[0]

    def _build(self, k: int, stop: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Window ``k``'s table: this rank's packets of it, their shards and their numbers in
        them worked out in one compiled pass (kept with the table for ``packets``: 8 or 12
        bytes a packet), put in order of shard and block by a compiled counting sort, then each
        shard's entries read in passing a block at a time and the rank's scattered into the
        table by a compiled pass (per packet: no Python, no structured-array gather)."""
        o, corpus = self.order, self.corpus
        s0, s1 = self.span(k)
        n = s1 - s0
        out = np.empty(n, INDEX_ENTRY_DTYPE)
        if n == 0:
            return out, np.zeros(0, np.int32), np.zeros(0, np.int32)
        win, base = o.windows[k], np.ascontiguousarray(corpus.base, np.int64)
        small = int(np.diff(base).max()) < 1 << 31
        local = np.empty(n, np.int32 if small else np.int64)
        shard = np.empty(n, np.int32)
        starts = np.ascontiguousarray(win.starts, np.int64)
        ends = np.cumsum(np.ascontiguousarray(win.stops, np.int64) - starts)
        keys = NO_KEYS if win.keys is None else np.ascontiguousarray(win.keys, np.uint64)
        if win.shards is not None:  # its ranges are its shards
            shards, lo, near = np.ascontiguousarray(win.shards, np.int64), 0, base
        else:  # the shards its ranges lie in, where each packet's is looked for
            lo = int(corpus.shard_of(starts).min())
            hi = int(corpus.shard_of(np.maximum(win.stops - 1, starts)).max())
            shards, near = NO_SHARDS, base[lo: hi + 2]
        size = win.size
        if _own_packets(np.int64(s0), np.int64(o.world_size), np.int64(o.rank),
                        np.int64(o._starts[k]), np.uint64(size), np.uint64(side(size)), keys,
                        starts, ends, shards, near, np.int32(lo), shard, local, stop) < 0:
            raise TableStopped(f"window {k}'s table: stopped")
        first, last = int(shard.min()), int(shard.max())
        blocks = int(np.diff(base[first: last + 2]).max()) // BLOCK + 1  # per shard, at most
        order = np.empty(n, np.int32 if n < 1 << 31 else np.int64)  # 4 bytes a packet, briefly
        cuts = np.zeros((last - first + 1) * blocks + 1, np.int64)
        _by_block(shard, local, np.int64(first), np.int64(blocks), np.int64(BLOCK), order, cuts)
        table = out.view(np.uint64).reshape(n, 2)
        for j in np.flatnonzero(np.diff(cuts)).tolist():
            if stop[0]:
                raise TableStopped(f"window {k}'s table: stopped")
            s, x = first + j // blocks, (j % blocks) * BLOCK
            index = corpus.indexes[s]
            passing = getattr(index, "passing", None)
            if passing is None:  # an index held whole (a scan's): scatter from it
                got, x = index.entries, 0
            else:
                got = passing(slice(x, min(x + BLOCK, len(index))))
            got = np.ascontiguousarray(got, INDEX_ENTRY_DTYPE).view(np.uint64).reshape(-1, 2)
            _scatter(table, got, order, np.int64(cuts[j]), np.int64(cuts[j + 1]), local,
                     np.int64(x))
        return out, shard, local

    def _held_bytes(self) -> int:
        """Bytes of the tables held (the caller holds the lock)."""
        return sum(sum(a.nbytes for a in held) for held in self._tables.values())

    def claim(self, k: int) -> bool:
        """Mark window ``k`` as about to be built by a thread (``unclaim`` when done), unless
        its table is held or claimed already (``False``)."""
        with self._lock:
            if k in self._tables or k in self._claimed or k in self._making:
                return False
            self._claimed.add(k)
            return True

    def unclaim(self, k: int) -> None:
        with self._lock:
            self._claimed.discard(k)

    def drop_before(self, k: int) -> None:
        """Let go of the tables of windows before ``k`` (read past)."""
        with self._lock:
            for w in [w for w in self._tables if w < k]:
                del self._tables[w]

    def clear(self) -> None:
        """Let go of every table (the epoch is read; one asked for again is built again)."""
        with self._lock:
            self._tables.clear()

    def prepare(self, k: int, stop: np.ndarray | None = None) -> None:
        """Build window ``k``'s table now (the warmer, ahead of the producer, which has read
        past the windows before ``k - 1``: their tables go first); ``stop`` as ``table``'s."""
        if 0 <= k < len(self.order.windows):
            self.drop_before(k - 1)
            self.table(k, stop)

    def held(self) -> list[int]:
        """The windows whose tables are held."""
        with self._lock:
            return list(self._tables)


#: no shard numbers: a window's ranges are not shards; a stop flag never set
NO_SHARDS = np.zeros(0, np.int64)
NO_STOP = np.zeros(1, np.uint8)


class TableStopped(Exception):
    """A window table's build was abandoned (its ``stop`` flag set): nothing was kept."""


@cpu_kernel
def _last_at_or_before(sorted_, v):  # pragma: no cover - compiled
    """The last ``i`` with ``sorted_[i] <= v`` (-1 if none). The positions come in random
    order, so a short array is counted through (no branch on the data: 0.2 ns a compare
    against ~15 ns a mispredicted step of a binary search); a long one is searched."""
    n = sorted_.shape[0]
    if n <= 64:
        c = 0
        for k in range(n):
            c += sorted_[k] <= v
        return c - 1
    lo = -1
    while n > 0:  # lo: the last known <= v; n: how many after it are unknown
        half = n >> 1
        if sorted_[lo + half + 1] <= v:
            lo += half + 1
            n -= half + 1
        else:
            n = half
    return lo


@cpu_kernel
def _own_packets(first, W, r, wstart, size, m, keys, starts, ends, shards, base, lo, shard,
                 local, stop):  # pragma: no cover - compiled
    """For share positions ``first, first + 1, ..``: the place in the window's order of each
    (``pos * W + r - wstart``), the file-order index there (``permute_step``, or the place
    itself without ``keys``), the window range it lies in (``ends``: the ranges' cumulative
    lengths), its global packet number, then its shard (the range's, from ``shards`` where
    given, else found in ``base``: the first packet of each shard from shard ``lo`` on) and its
    number in that shard: ``Window.at_in``, or ``Window.at`` and ``Corpus.shard_of``. -1 as
    soon as ``stop[0]`` is set (looked at every 65,536 packets), else 0."""
    n = shard.shape[0]
    flats = np.empty(min(LANES, n), np.int64)
    for o in range(0, n, LANES):  # LANES divides 65,536
        if (o & 0xFFFF) == 0 and stop[0]:
            return -1
        c = min(LANES, n - o)
        x0 = (first + o) * W + r - wstart
        if keys.shape[0]:  # the block's places through the rounds together
            permute_step(x0, W, size, m, keys, flats[:c])
        else:
            for i in range(c):
                flats[i] = x0 + i * W
        for t in range(c):
            i = o + t
            flat = flats[t]
            j = _last_at_or_before(ends, flat) + 1  # the first range whose end is past flat
            packet = starts[j] + flat - (ends[j - 1] if j else 0)
            if shards.shape[0]:
                s = shards[j]
                local[i] = packet - base[s]
            else:
                s = _last_at_or_before(base, packet)
                local[i] = packet - base[s]
                s += lo
            shard[i] = s
    return 0


@cpu_kernel
def _by_block(shard, local, first, blocks, block, order, cuts):  # pragma: no cover - compiled
    """A stable counting sort of the packets by (shard, block of ``block`` entries in it):
    ``order`` the packets' positions, bucket ``j``'s in ``order[cuts[j]:cuts[j + 1]]``."""
    for i in range(shard.shape[0]):
        cuts[(shard[i] - first) * blocks + local[i] // block + 1] += 1
    for j in range(1, cuts.shape[0]):
        cuts[j] += cuts[j - 1]
    at = cuts[:-1].copy()
    for i in range(shard.shape[0]):
        j = (shard[i] - first) * blocks + local[i] // block
        order[at[j]] = i
        at[j] += 1
    return 0


@cpu_kernel
def _scatter(table, got, order, a, b, local, x):  # pragma: no cover - compiled
    """``table[i] = got[local[i] - x]`` for the packets ``order[a:b]`` (16-byte entries as
    two uint64 words)."""
    for t in range(a, b):
        i = order[t]
        j = local[i] - x
        table[i, 0] = got[j, 0]
        table[i, 1] = got[j, 1]
    return 0
