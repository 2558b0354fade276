"""One piece of an epoch's order, a shuffle window (``Window``): its packets in file order and
the keyed permutation (``ndp.loader.ordering.shuffle``) that puts them in the order's places;
any place is one call away, and a run of places' values is read from a column held in file
order in one compiled pass (``Window.take``). ``ndp.loader.ordering.order`` cuts an epoch into
them (``epoch_windows``)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ndp.engine.threads import parallel_for
from ndp.loader.ordering.shuffle import NO_KEYS, invert, permute, side, take_range

#: ``Window.take`` splits a run across ndp's threads in parts of at least this many places
#: (~1 ms of work each: a hand-off costs tens of microseconds)
TAKE_GRAIN = 1 << 16


@dataclass(frozen=True)
class Window:
    """One piece of an epoch's order: the packets of the ranges ``[starts[i], stops[i])`` of
    global packet numbers, one after the other (the window's *file order*), then permuted by
    the permutation that ``keys`` name (``ndp.loader.ordering.shuffle``; ``None``: in file order). A
    shuffle window's ranges are its shards, whose numbers ``shards`` holds (``None``: not
    known), so a place's shard comes with its packet (``at_in``) instead of a search of the
    corpus' shard starts. Nothing the window's size is held: any place of its order is one
    ``at`` away."""

    starts: np.ndarray
    stops: np.ndarray
    keys: np.ndarray | None = None
    shards: np.ndarray | None = None

    @cached_property
    def size(self) -> int:
        """Packets in the window."""
        return int((self.stops - self.starts).sum())

    def flat(self, places: np.ndarray) -> np.ndarray:
        """The file-order indices of the packets at ``places`` of the window's order."""
        places = np.asarray(places, np.int64)
        return places if self.keys is None else permute(places, self.size, self.keys)

    def places(self, flat: np.ndarray) -> np.ndarray:
        """The places in the window's order of the packets at file-order indices ``flat``."""
        flat = np.asarray(flat, np.int64)
        return flat if self.keys is None else invert(flat, self.size, self.keys)

    def take(self, column: np.ndarray, a: int, b: int) -> np.ndarray:
        """``column[flat(arange(a, b))]`` (``column``: a value per packet in file order) in one
        compiled pass, the walk of the order included (``shuffle.take_step``), split across
        ndp's threads (``parallel_for``) when long."""
        column = np.ascontiguousarray(column)
        out = np.empty(max(b - a, 0), column.dtype)
        keys = NO_KEYS if self.keys is None else np.ascontiguousarray(self.keys, np.uint64)
        parallel_for(take_range, out.shape[0], column, np.int64(a), np.uint64(self.size),
                     np.uint64(side(self.size)), keys, out, grain=TAKE_GRAIN)
        return out

    def packets_of(self, flat: np.ndarray) -> np.ndarray:
        """Global packet numbers of file-order indices ``flat`` (each mapped to its range)."""
        return self._locate(flat)[0]

    def _locate(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``packets_of(flat)``, and the range each lies in."""
        lengths = self.stops - self.starts
        ends = np.cumsum(lengths)
        r = np.searchsorted(ends, flat, side="right")
        return (self.starts[r] - (ends[r] - lengths[r]) + flat).astype(np.int64, copy=False), r

    def at(self, places: np.ndarray) -> np.ndarray:
        """The packets at ``places`` of the window's order (global packet numbers, int64)."""
        return self.packets_of(self.flat(places))

    def at_in(self, places: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``at(places)``, and the shard number of each packet (``None`` if ``shards`` is)."""
        packets, r = self._locate(self.flat(places))
        return packets, None if self.shards is None else self.shards[r]

    def order(self) -> np.ndarray:
        """The file-order index at each place of the window's order, all of them (O(size))."""
        return self.flat(np.arange(self.size, dtype=np.int64))

    def packets(self) -> np.ndarray:
        """The window's part of the epoch's order: global packet numbers (int64)."""
        return self.at(np.arange(self.size, dtype=np.int64))

    def every(self, first: int, step: int) -> np.ndarray:
        """``packets()[first::step]`` (a rank's packets of the window) without the rest."""
        return self.at(np.arange(first, self.size, step, dtype=np.int64))
