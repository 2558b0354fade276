"""Stage, on a GPU: whole shards copied to the device in bulk, packets read where they lie.

The shards live in one device buffer (the arena), so one kernel reads the packets of several
shards; a packet's offset is its shard's place in the arena plus its offset in the shard, and
its limit is its shard's end there, so its verdict is the one it gets in its own shard.

* ``resident=True``: every shard is copied once, back to back; ``ConfigError`` if they do not fit
  ``device_budget``.
* otherwise the arena is cut into slots of the largest shard's size, as many as the budget
  holds (at least two; with ``shuffle``, at least the shards of two shuffle windows, which a chunk
  may read at once, ``ndp.loader.ordering.order``), and shards come and go least recently used: a
  shard is
  copied when a chunk first needs it (``stage``), or before, for the chunk after (``prefetch``),
  while the current one decodes. A slot is overwritten only after the kernels that read its last
  shard (the copy stream waits on an event), and kernels wait for their shards' copies the same way:
  the host never waits for either.

A copy goes through two pinned bounce buffers of ``BOUNCE_BYTES``: ndp's host threads read a
piece of the shard file into one with pread(2) (``ndp.store.files``: no memory map, so a shard cut
under the loader is a ``ShardChangedError``, not a SIGBUS) while the other is on its way to the
device; the host waits only when it wants to refill a buffer whose copy has
not finished (counted).

An index matched by size alone (``verify="size"``) is checked against the packets' headers as
the bytes pass through the bounce buffers, the first time each shard is copied
(``Corpus.check_headers`` on the host path checks each chunk's packets instead): a chunk reads
nothing from the files but what it copies, however often it is decoded.
"""

from __future__ import annotations

import numpy as np

from ndp.kernels._jit import cpu_kernel
from ndp.store.corpus import Corpus
from ndp.engine.cuda import CudaEngine
from ndp.engine.device import Buffer, device_memory_info, pinned
from ndp.engine.cpu import Slot, Staged, TooManyShards
from ndp.errors import ConfigError
from ndp.loader.ordering.order import WINDOW_BYTES, shards_at_once as slots_needed
from ndp.store.index import check_headers
from ndp.wire.format import HEADER_BYTES

#: bytes per bounce buffer (two of them)
BOUNCE_BYTES = 16 << 20
#: a bounce buffer is filled by pread(2) in pieces of this many bytes, several at once
_PIECE = 1 << 20
#: arena slots are a multiple of this many bytes
_ALIGN = 256


def default_budget(sizes: np.ndarray, *, resident: bool, shuffle: bool = True,
                   window: int | None = WINDOW_BYTES) -> int:
    """Resident: three quarters of the free device memory (the rest is the training job's);
    otherwise room for four of the largest shards or the shards of two shuffle windows,
    whichever is more, at least 256 MiB, at most half the free memory."""
    free, _ = device_memory_info()
    if resident:
        return (free * 3) // 4
    slot = _slot_bytes(sizes)
    need = slots_needed(sizes, shuffle=shuffle, window=window)
    return min(max(max(4, need) * slot, 256 << 20), free // 2)


def _slot_bytes(sizes: np.ndarray) -> int:
    return -(-max(int(sizes.max(initial=1)), 1) // _ALIGN) * _ALIGN


def distinct(ids: np.ndarray) -> np.ndarray:
    """The distinct values of ``ids`` (non-negative ints: a chunk's shard numbers), ascending,
    as ``np.unique`` gives them: by a count where they span little more than there are of
    them (a chunk's shards, usually), which costs a tenth of ``np.unique``'s sort."""
    if not ids.shape[0]:
        return ids.astype(np.int64)
    top = int(ids.max()) + 1
    if top > 4 * ids.shape[0] + 4096:
        return np.unique(ids)
    return np.flatnonzero(np.bincount(ids, minlength=top))


@cpu_kernel
def _stage_plan(offsets, shard_ids, slot_of, slot_base, sizes, out):  # pragma: no cover
    """A chunk's plan in one compiled pass: ``out[i]``, packet ``i``'s offset in the arena (its
    shard's slot's base plus its offset in the shard), ``out[n + i]`` the end of its shard
    there (its limit)."""
    n = shard_ids.shape[0]
    for i in range(n):
        s = shard_ids[i]
        base = slot_base[slot_of[s]]
        out[i] = np.int64(offsets[i]) + base
        out[n + i] = base + sizes[s]
    return 0


class DeviceShards:
    """The GPU's staging stage (see the module docstring)."""

    prefetches = True
    #: packets' headers are checked as their shards are copied (``ChunkDecoder`` need not)
    checks_headers = True

    def __init__(self, engine: CudaEngine, corpus: Corpus, *, budget: int | None,
                 resident: bool, shuffle: bool = True,
                 window: int | None = WINDOW_BYTES) -> None:
        self.engine, self.corpus, self.resident = engine, corpus, resident
        #: shards come and go (``prefetch`` has work to do) unless all are resident
        self.prefetches = not resident
        self.sizes = np.array([s.size for s in corpus.shards], np.int64)
        #: bytes a packet holds on average, frames included (shard headers too, a few bytes)
        self.mean_packet_bytes = float(self.sizes.sum()) / max(int(corpus.n_packets), 1)
        n_shards = self.sizes.shape[0]
        self.budget = budget if budget is not None else default_budget(
            self.sizes, resident=resident, shuffle=shuffle, window=window)
        if resident:
            total = int(self.sizes.sum())
            if total > self.budget:
                raise ConfigError(
                    f"resident=True needs {total} bytes of device memory for "
                    f"{n_shards} shards, over device_budget={self.budget}; pass a larger "
                    f"device_budget or resident=False (shards are then copied as needed)")
            self.slot_base = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
            arena = max(total, 1)
        else:
            slot_bytes = _slot_bytes(self.sizes)
            n_slots = min(self.budget // slot_bytes, n_shards)
            need = slots_needed(self.sizes, shuffle=shuffle, window=window)
            if n_slots < need:
                why = (f"a shuffled chunk reads from two shuffle windows of up to {need // 2} "
                       f"shard(s) at once (ndp.loader.ordering.order)" if shuffle and need > 2 else
                       "one decoding, one arriving")
                raise ConfigError(
                    f"device_budget={self.budget} holds {self.budget // slot_bytes} shard(s) of "
                    f"{slot_bytes} bytes; the loader needs room for at least {need} ({why}): "
                    f"pass device_budget >= {need * slot_bytes}, a smaller shuffle_window, or "
                    f"resident=True")
            self.slot_base = np.arange(n_slots, dtype=np.int64) * slot_bytes
            arena = max(n_slots * slot_bytes, 1)
        self.arena = Buffer(arena, np.uint8, counters=engine.counters)
        n_slots = self.slot_base.shape[0]
        self.holds = np.full(n_slots, -1, np.int64)  # shard in each slot
        self.slot_of = np.full(n_shards, -1, np.int64)  # slot of each shard
        self.used = np.zeros(n_slots, np.int64)  # last use (for least recently used)
        self.copied = [engine.new_event() for _ in range(n_slots)]
        self.read = [engine.new_event() for _ in range(n_slots)]
        self.read_recorded = np.zeros(n_slots, bool)
        #: the compute stream already waits for the slot's last copy
        self.copy_waited = np.zeros(n_slots, bool)
        self._tick = 0
        self._bounce = [pinned(BOUNCE_BYTES, np.uint8) for _ in range(2)]
        self._bounce_done = [engine.new_event(), engine.new_event()]
        #: shards whose packets' headers were checked against their index entries
        self._checked = np.full(n_shards, corpus.headers_checked, bool)
        self._bounce_busy = [False, False]
        self._turn = 0
        self._protect: set[int] = set()
        if resident:
            for s in range(n_shards):
                self._copy(s, s)

    # ----------------------------------------------------------------------------- staging
    def stage(self, packets: np.ndarray, slot: Slot, entries: np.ndarray | None = None,
              shard_ids: np.ndarray | None = None, keep: tuple[int, ...] = ()) -> Staged:
        """The chunk's shards on the device and its packets' offsets and limits there (one
        copy of both); ``TooManyShards`` if they cannot all be held at once. ``entries``: the
        packets' index entries, if the caller holds them; ``shard_ids``: their shard numbers,
        if the caller knows them; ``keep``: shards a chunk in flight still reads (its build is
        not queued yet), which must stay where they are (``ndp.loader.pipeline.ahead``)."""
        corpus, engine = self.corpus, self.engine
        n = packets.shape[0]
        if shard_ids is None:
            shard_ids = corpus.shard_of(packets)
        needed = distinct(shard_ids).tolist()
        protect = set(needed) | (set() if self.resident else set(keep))
        if len(protect) > self.holds.shape[0]:
            raise TooManyShards(
                f"a chunk needs {len(needed)} shards on the device at once"
                + (f" beside the {len(keep)} of the chunk in flight" if keep else "")
                + f", the arena holds {self.holds.shape[0]}: pass a larger device_budget or "
                "fewer chunk_batches")
        self._protect = protect
        for s in needed:
            self._ensure(s)
        offsets = corpus.offsets[packets] if entries is None else entries["offset"]
        plan = np.empty(2 * n, np.int64)  # each packet's offset in the arena, then its limit
        _stage_plan(offsets, shard_ids, self.slot_of, self.slot_base, self.sizes, plan)
        dev = engine.upload(slot, "plan", plan)
        for s in needed:  # the kernels read a shard only once its copy is done (once is
            k = self.slot_of[s]  # enough: the compute stream keeps its order)
            if not self.copy_waited[k]:
                self.copied[k].wait(engine.compute_stream)
                self.copy_waited[k] = True
        return Staged(self.arena.kernel, dev[:n], dev[n:2 * n], n, tuple(needed),
                      packet_bytes=int(self.mean_packet_bytes * n))

    def prefetch(self, packets: np.ndarray) -> None:
        """Start copying the shards of ``packets`` (the next chunk's) that are not on the
        device, into slots the current chunk does not use; never waits for a kernel."""
        if self.resident or packets.shape[0] == 0:
            return
        for s in distinct(self.corpus.shard_of(packets)).tolist():
            if self.slot_of[s] < 0 and self._victim() is not None:
                self._ensure(s)

    def after(self, staged: Staged, engine: CudaEngine) -> None:
        """The chunk's kernels are queued: its shards' slots may be overwritten once they ran
        (resident shards never are)."""
        if self.resident:
            return
        for s in staged.shards:
            k = self.slot_of[s]
            self.read[k].record(engine.compute_stream)
            self.read_recorded[k] = True

    # ----------------------------------------------------------------------------- the arena
    def _victim(self) -> int | None:
        free = np.flatnonzero(self.holds < 0)
        if free.shape[0]:
            return int(free[0])
        candidates = [k for k in range(self.holds.shape[0]) if int(self.holds[k]) not in
                      self._protect]
        return min(candidates, key=lambda k: self.used[k]) if candidates else None

    def _ensure(self, shard: int) -> None:
        self._tick += 1
        k = self.slot_of[shard]
        if k < 0:
            k = self._victim()
            if k is None:  # cannot happen: stage checked the count
                raise TooManyShards("no arena slot is free for the chunk's shards")
            old = self.holds[k]
            if old >= 0:
                self.slot_of[old] = -1
            self._copy(shard, k)
        self.used[k] = self._tick

    def _copy(self, shard: int, k: int) -> None:
        """Queue the copy of ``shard`` into slot ``k`` on the copy stream."""
        engine = self.engine
        stream = engine.copy_stream
        if self.read_recorded[k]:  # kernels still reading the slot's previous shard go first
            self.read[k].wait(stream)
            self.read_recorded[k] = False
        source = self.corpus.shards[shard]
        size = int(self.sizes[shard])
        dst = int(self.slot_base[k])
        entries = None if self._checked[shard] else _entries(self.corpus.indexes[shard])
        for at in range(0, size, BOUNCE_BYTES):
            m = min(BOUNCE_BYTES, size - at)
            turn = self._turn
            self._turn ^= 1
            if self._bounce_busy[turn]:  # its last piece must have left before we refill it
                engine.wait(self._bounce_done[turn])
            bounce = self._bounce[turn]
            pieces = np.arange(at, at + m, _PIECE, dtype=np.int64)
            source.read_ranges(pieces, np.minimum(_PIECE, at + m - pieces), bounce,
                               pieces - at)
            if entries is not None:
                self._check_headers(shard, entries, bounce, at, m)
            engine.h2d(self.arena.kernel[dst + at: dst + at + m], bounce[:m], stream)
            self._bounce_done[turn].record(stream)
            self._bounce_busy[turn] = True
        self._checked[shard] = True
        self.copied[k].record(stream)
        self.copy_waited[k] = False
        self.holds[k] = shard
        self.slot_of[shard] = k
        engine.counters.shard_copies += 1

    def _check_headers(self, shard: int, entries: np.ndarray, bounce: np.ndarray, at: int,
                       m: int) -> None:
        """``IndexMismatchError`` unless the entries of the packets that start in the shard's
        bytes ``[at, at + m)`` (in ``bounce``) match those packets' headers; a header cut by
        the piece's end is read from the file (at most one a piece)."""
        offsets = entries["offset"]  # in file order (``check_structure``)
        lo = int(np.searchsorted(offsets, at))
        whole = int(np.searchsorted(offsets, at + m - HEADER_BYTES, side="right"))
        cut = int(np.searchsorted(offsets, at + m))
        source = self.corpus.shards[shard]
        where = source.index_path
        check_headers(entries, np.arange(lo, whole), source, where=where, data=bounce,
                      at=offsets[lo:whole].astype(np.int64) - at)
        if cut > whole:
            check_headers(entries, np.arange(whole, cut), source, where=where)


def _entries(index: object) -> np.ndarray:
    """All of a shard's index entries, without pushing out the entries the decoder holds."""
    passing = getattr(index, "passing", None)  # a LazyIndex; an Index holds them
    return passing() if passing is not None else index.entries  # type: ignore[attr-defined]
