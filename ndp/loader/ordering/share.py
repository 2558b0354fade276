"""A rank's share of an epoch (``Share``), and the share read place by place (``RankOrder``).

Without CRC-Drop, mixing or an elastic remainder, rank ``r`` of ``W`` takes places
``r, r + W, r + 2W, ...`` of the epoch's order, cut to ``length = packets // W`` (every rank
as many): share position ``s`` is epoch place ``s * W + r``, which lies in one shuffle window
and is one keyed permutation away from its packet (``ndp.loader.ordering.window.Window.at``). So a
``RankOrder`` gives any slice of the share in O(slice + windows) with nothing held but the
windows' ranges and keys: the producer reads its chunks from it, a resume starts anywhere in
it, and nothing the size of the share (8 bytes a packet, 1.3 GB a rank at 1.3e9 documents and
8 ranks) is built; its packets' index entries are held a window at a time
(``ndp.loader.ordering.share_entries``). Otherwise the share is an array, built in a pass
(``ndp.loader.planning.epoch``) or whole (``ndp.loader.planning.plan.Plan._share_whole``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ndp.loader.ordering.order import Window
from ndp.loader.ordering.share_entries import ShareEntries


class RankOrder:
    """Rank ``rank``'s first ``length`` places of the epoch whose windows are ``windows``, as
    a read-only sequence of global packet numbers (what the producer slices). ``repeat``:
    twice over (packed mode: a rank left short by corruption goes on from its start)."""

    def __init__(self, windows: list[Window], *, rank: int, world_size: int, length: int,
                 repeat: bool = False, corpus: Any = None) -> None:
        self.windows = windows
        sizes = np.array([w.size for w in windows], np.int64)
        self._ends = np.cumsum(sizes)  # epoch place where each window ends
        self._starts = self._ends - sizes
        self.rank, self.world_size, self.length = rank, world_size, length
        self.shape = (2 * length if repeat else length,)
        self.dtype = np.dtype(np.int64)
        #: its own packets' index entries, a window at a time, if given the ``corpus``
        #: (``ndp.loader.ordering.share_entries``)
        self.tables = None if corpus is None else ShareEntries(self, corpus)

    def __len__(self) -> int:
        return self.shape[0]

    def window_at(self, pos: int) -> int:
        """The number of the window share position ``pos`` lies in."""
        if pos >= self.length and self.shape[0] > self.length:
            pos -= self.length
        return int(np.searchsorted(self._ends, pos * self.world_size + self.rank, side="right"))

    def _places(self, s: np.ndarray, *, ascending: bool = False, shards: bool = False) -> Any:
        """Packets at share positions ``s`` (each in ``[0, len)``; ``ascending``: in increasing
        order, as a slice's are), and with ``shards`` the shard number of each (``None`` if a
        window does not know its ranges' shards)."""
        if self.shape[0] > self.length:
            ascending = ascending and bool(s.shape[0]) and (
                int(s[0]) >= self.length or int(s[-1]) < self.length)  # not across the repeat
            s = np.where(s >= self.length, s - self.length, s)
        p = s * self.world_size + self.rank  # epoch places
        groups = None
        if p.shape[0] and ascending:  # one window if its first and last place are in it
            first, last = np.searchsorted(self._ends, p[[0, -1]], side="right").tolist()
            groups = [(first, slice(None))] if first == last else None
        if groups is None:
            k = np.searchsorted(self._ends, p, side="right")
            if p.shape[0] and k[0] == k[-1] and (np.diff(k) >= 0).all():  # one window (usual)
                groups = [(int(k[0]), slice(None))]
            else:
                groups = [(int(w), k == w) for w in np.unique(k).tolist()]
        out = np.empty(p.shape[0], np.int64)
        shard = np.empty(p.shape[0], np.int64) if shards else None
        for w, where in groups:
            local = p[where] - self._starts[w]
            if shard is None:
                out[where] = self.windows[w].at(local)
                continue
            out[where], of = self.windows[w].at_in(local)
            if of is None:  # a window that does not know its shards: the caller searches
                shard = None
            else:
                shard[where] = of
        return (out, shard) if shards else out

    def beyond(self, a: int, b: int) -> np.ndarray:
        """The packets at this rank's places ``a`` to ``b`` of the epoch, past the share's
        ``length`` too (what the cut that gives every rank as many leaves out)."""
        p = np.arange(a, b, dtype=np.int64) * self.world_size + self.rank
        k = np.searchsorted(self._ends, p, side="right")
        out = np.empty(p.shape[0], np.int64)
        for w in np.unique(k).tolist():
            out[k == w] = self.windows[w].at(p[k == w] - self._starts[w])
        return out

    def with_shards(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray | None]:
        """``self[a:b]`` and the shard number of each of its packets (``None`` where a window
        does not know them: the caller searches the corpus' shard starts then), for a chunk's
        stage."""
        a, b, _ = slice(a, b).indices(self.shape[0])
        held = None if self.tables is None else self.tables.packets(a, b)
        if held is not None:  # a held window table's: no second walk of the order
            return held
        return self._places(np.arange(a, max(a, b), dtype=np.int64), ascending=True,
                            shards=True)

    def __getitem__(self, key: Any) -> Any:
        n = self.shape[0]
        if isinstance(key, slice):
            a, b, step = key.indices(n)
            return self._places(np.arange(a, b, step, dtype=np.int64), ascending=step > 0)
        if isinstance(key, (int, np.integer)):
            i = int(key) + (n if key < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"share position {key} outside a share of {n}")
            return np.int64(self._places(np.array([i], np.int64))[0])
        positions = np.asarray(key, np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= n):
            raise IndexError(f"share positions outside a share of {n}")
        return self._places(positions.ravel()).reshape(positions.shape)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self[:]
        return whole if dtype is None else whole.astype(dtype)

    def __repr__(self) -> str:
        return (f"RankOrder(rank {self.rank} of {self.world_size}, {self.length} packets, "
                f"{len(self.windows)} windows)")


@dataclass(frozen=True)
class Share:
    """This rank's packets of one epoch (see ``ndp.loader.planning.plan``)."""

    #: share position -> global packet number (an array, or a ``RankOrder``); in packed mode
    #: the share twice over (positions from ``length`` on repeat it, for a rank left short by
    #: corruption)
    packets: Any
    length: int  #: the share's own packets
    # : the epoch's batch count (``len(loader)``), known or being counted
    # (``ndp.loader.planning.count``)
    count: Any
    dropped: int = 0  #: CRC-Drop: packets of this rank's part of the order dropped on purpose
    mix_unused: dict = field(default_factory=dict)  #: mixing: per source, packets left unused
    mix_repeated: dict = field(default_factory=dict)  #: mixing: per source, packets taken again
    balanced: int = 0  #: packets cut from the share's end so that every rank has as many
    # : an elastic resume (``ndp.loader.states.elastic``): packets earlier ranks were inside of,
    # given again
    redelivered: int = 0

    @property
    def batches(self) -> int:
        """Batches every rank delivers this epoch; waits for the count if it is being made."""
        return self.count.batches()

    @property
    def cut(self) -> Any:
        """Padded mode: what rows of ``seq_len`` cut from the share
        (``ndp.loader.layouts.truncation``),
        or ``None`` if not counted (yet)."""
        return self.count.cut
