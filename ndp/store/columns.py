"""Per-packet fields of a corpus by global packet number, read from the shards' indexes when
asked: ``corpus.tokens[packets]``, ``corpus.offsets[packets]``, ...

A corpus of 1e8 packets would hold ~4 GB of per-packet arrays if it concatenated its indexes at
open; a ``Column`` holds nothing. Indexing it with global packet numbers (an int array, a slice
or an int) splits them by shard (``base``: the shards' first packet numbers), reads those
entries from each shard's index (``ndp.store.lazy``: read and checked when not held) and
returns a new array: O(the packets asked for), plus a sort of their shard numbers when they are
not in shard order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ndp.kernels._jit import cpu_kernel
from ndp.wire.format import (
    FRAME_BYTES,
    INDEX_ENTRY_DTYPE,
    MASK_COUNT_BYTES,
    TYP_MASKED_TABLE,
    TYP_WIDTH_TABLE,
)

#: the fields a ``Column`` reads, and their dtypes
FIELDS = {"offset": np.int64, "frame_bytes": np.int64, "tokens": np.int64, "src": np.uint8,
          "group": np.int64}


def tokens_of(length: np.ndarray, typ: np.ndarray, out: np.ndarray | None = None
              ) -> np.ndarray:
    """Token count of each packet with payload ``length`` and TYP ``typ``, as a valid packet of
    that layout holds (0 for TYPs that carry no tokens): ``length // width``, or for a masked
    layout (``LEN = 2 + N*w + ceil(N/8)``) the N that fits. One compiled pass, into ``out``
    (int64 by default; a packet holds at most 65,535 tokens, so int32 holds them too)."""
    out = np.empty(length.shape[0], np.int64) if out is None else out
    if out.shape[0]:
        _tokens(length, typ, _WIDTH, _MASKED, np.int64(MASK_COUNT_BYTES), out)
    return out


_WIDTH = np.ascontiguousarray(TYP_WIDTH_TABLE, np.int64)
_MASKED = np.ascontiguousarray(TYP_MASKED_TABLE != 0)


@cpu_kernel
def _tokens(length, typ, width, masked, head, out):  # pragma: no cover - compiled
    for i in range(length.shape[0]):
        n = np.int64(length[i])
        t = typ[i]
        w = width[t]
        if masked[t]:  # N is the floor below or the one after it
            body = max(n - head, 0)
            n0 = (8 * body) // (8 * w + 1)
            out[i] = n0 + (1 if head + (n0 + 1) * w + (n0 + 8) // 8 <= n else 0)
        else:
            out[i] = n // w if w > 0 else 0
    return 0


class Column:
    """One field (``FIELDS``) of every packet of ``corpus``, by global packet number."""

    def __init__(self, corpus: Any, field: str) -> None:
        self._corpus, self.field = corpus, field
        self.dtype = np.dtype(FIELDS[field])

    def __len__(self) -> int:
        return self._corpus.n_packets

    @property
    def shape(self) -> tuple[int]:
        return (self._corpus.n_packets,)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """Every packet's value: O(packets), for tools and tests, never on a reader's path."""
        out = self[0:len(self)]
        return out if dtype is None else out.astype(dtype)

    def __getitem__(self, which: Any) -> Any:
        n = len(self)
        if isinstance(which, slice):
            start, stop, step = which.indices(n)
            if step == 1:
                return self._range(start, max(start, stop))
            which = np.arange(start, stop, step)
        if isinstance(which, (int, np.integer)):
            g = int(which) + (n if which < 0 else 0)
            if not 0 <= g < n:
                raise IndexError(f"packet {which} of a corpus of {n}")
            return self[np.array([g])][0]
        want = np.asarray(which)
        if want.dtype == np.bool_:
            want = np.flatnonzero(want)
        flat = want.astype(np.int64, copy=False).ravel()
        out = np.empty(flat.shape[0], self.dtype)
        if flat.shape[0]:
            if int(flat.min()) < 0:
                flat = np.where(flat < 0, flat + n, flat)
            if int(flat.min()) < 0 or int(flat.max()) >= n:
                raise IndexError(f"packet numbers out of range for a corpus of {n}")
            self._gather(flat, out)
        return out.reshape(want.shape)

    def _gather(self, flat: np.ndarray, out: np.ndarray) -> None:
        if self.field == "group":
            out[:] = self._corpus.shard_group[self._corpus.shard_of(flat)]
        else:
            out[:] = self._of(entries_at(self._corpus, flat))

    def _of(self, entries: np.ndarray) -> np.ndarray:
        """This column's field of ``entries`` (``INDEX_ENTRY_DTYPE``)."""
        if self.field == "tokens":
            return tokens_of(entries["length"], entries["typ"])
        if self.field == "frame_bytes":
            return entries["length"].astype(np.int64) + FRAME_BYTES
        return entries[self.field]

    def _range(self, start: int, stop: int, passing: bool = False,
               out: np.ndarray | None = None) -> np.ndarray:
        """Packets ``start`` to ``stop``: each shard's part as a slice of its index (into
        ``out`` if given)."""
        base = self._corpus.base
        out = np.empty(stop - start, self.dtype) if out is None else out
        s = int(np.searchsorted(base, start, side="right")) - 1
        at = start
        while at < stop:
            end = min(stop, int(base[s + 1]))
            self._values(s, slice(at - base[s], end - base[s]), passing,
                         out[at - start: end - start])
            at, s = end, s + 1
        return out

    def passing(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """``self[start:stop]`` for a reader passing through every shard once (the plan's
        pass over an epoch): shards' entries not held are read without being held
        (``ndp.store.lazy.LazyIndex.passing``); into ``out`` if given (``tokens``: an int32
        ``out`` is written by the pass itself, with no int64 copy between)."""
        if out is not None and out.shape[0] != max(stop - start, 0):
            raise ValueError(f"out holds {out.shape[0]} values for packets {start}..{stop}")
        return self._range(start, max(start, stop), passing=True, out=out)

    def _values(self, s: int, local: Any, passing: bool, out: np.ndarray) -> None:
        """This column's values of shard ``s``'s entries ``local``, into ``out``."""
        field = self.field
        if field == "group":
            out[:] = self._corpus.shard_group[s]
            return
        index = self._corpus.indexes[s]
        if passing and hasattr(index, "passing") and isinstance(local, slice):
            entries = index.passing(local)  # only the range read, if not held
        else:
            entries = index.entries[local]
        if field == "tokens" and out.dtype in (np.int32, np.int64):
            tokens_of(entries["length"], entries["typ"], out)
        else:
            out[:] = self._of(entries)

    def __repr__(self) -> str:
        return f"Column({self.field!r}, {len(self)} packets)"


def entries_at(corpus: Any, packets: np.ndarray, shard_ids: np.ndarray | None = None
               ) -> np.ndarray:
    """The index entries (``INDEX_ENTRY_DTYPE``) of the global packet numbers ``packets``
    (int64, in range), gathered shard by shard: one pass for every field a reader needs
    (``shard_ids``: ``corpus.shard_of(packets)`` if the caller has it)."""
    base = corpus.base
    ids = corpus.shard_of(packets) if shard_ids is None else shard_ids
    out = np.empty(packets.shape[0], INDEX_ENTRY_DTYPE)
    if ids.shape[0] > 1 and (ids[1:] < ids[:-1]).any():  # not in shard order: sort
        order = np.argsort(ids.astype(np.uint16) if base.shape[0] <= 1 << 16 else ids,
                           kind="stable")  # a radix sort for 16-bit keys: O(n)
        ids = ids[order]
    else:
        order = None
    cuts = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), ids.shape[0]]):
        s = int(ids[a])
        at = slice(a, b) if order is None else order[a:b]
        out[at] = corpus.indexes[s].entries[packets[at] - base[s]]
    return out


def entries_one_by_one(corpus: Any, packets: np.ndarray,
                       shards: np.ndarray | None = None) -> np.ndarray:
    """The index entries of ``packets`` (global numbers; ``shards``: their shard numbers if
    known), each shard's read one by one (``LazyIndex.read_at``; a held index: a gather), the
    shards on ndp's threads at once (``parallel_for``): a shard's first read reads its index
    whole for its check, the cost of a run's first chunk, which touches every shard of its
    window."""
    from ndp.engine.threads import parallel_for

    shards = corpus.shard_of(packets) if shards is None else shards
    out = np.empty(packets.shape[0], INDEX_ENTRY_DTYPE)
    order = np.argsort(shards, kind="stable")
    ids = shards[order]
    cuts = np.flatnonzero(np.diff(ids)) + 1
    firsts, ends = [0, *cuts.tolist()], [*cuts.tolist(), ids.shape[0]]

    def read(lo: int, hi: int) -> None:
        for a, b in zip(firsts[lo:hi], ends[lo:hi]):
            s = int(ids[a])
            where = order[a:b]
            local = packets[where] - corpus.base[s]
            index = corpus.indexes[s]
            read_at = getattr(index, "read_at", None)
            out[where] = index.entries[local] if read_at is None else read_at(local)

    if packets.shape[0]:
        parallel_for(read, len(firsts))
    return out
