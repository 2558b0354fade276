"""Documents split over packets, as a shard's index shows them (``Pieces``).

The converter splits a document longer than one packet into consecutive packets of one shard,
the pieces after the first marked with DST bit 7 (``ndp.wire.format.DST_CONTINUES``). Once a
shard's index entries pass their first-use check, ``pieces_of`` finds its runs of marked
packets (each run: the later pieces of one document, right after the document's first packet)
and keeps per run its first packet, its length and its tokens: O(split documents), nothing per
packet. The index header counts the marked packets (``continued``), so a corpus knows at open,
at the cost of its headers, whether any shard holds split documents (``ndp.loader.ordering.units``
reads
them as one in packed mode), and the first-use check holds the header to its entries.

A marked packet at a shard's start has no first piece before it (a writer never puts one there:
``ndp.store.writer``); it is read as a document's start.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ndp.store.columns import tokens_of
from ndp.store.index_walk import marked
from ndp.wire.format import DST_CONTINUES


@dataclass(frozen=True)
class Pieces:
    """A shard's runs of later pieces: run ``k`` is packets ``first[k]`` to
    ``first[k] + count[k] - 1`` (local numbers), continuing the document whose first packet is
    ``first[k] - 1``, and holds ``tokens[k]`` tokens."""

    first: np.ndarray
    count: np.ndarray
    tokens: np.ndarray

    @property
    def packets(self) -> int:
        """The later pieces in the shard (what its index header counts as ``continued``)."""
        return int(self.count.sum())


def continued_mask(entries: np.ndarray) -> np.ndarray:
    """Whether each entry's packet continues the document before it (DST bit 7; never the
    shard's first packet)."""
    marked = (entries["dst"] & DST_CONTINUES) != 0
    if marked.shape[0]:
        marked[0] = False
    return marked


def count_continued(entries: np.ndarray) -> int:
    """The packets of ``entries`` that continue a document (the index header's ``continued``),
    in one compiled pass."""
    return marked(entries, DST_CONTINUES)


def pieces_of(entries: np.ndarray) -> Pieces | None:
    """The runs of later pieces among a shard's index ``entries``, or None if it has none."""
    if not count_continued(entries):  # a shard's usual case: no mask built
        return None
    at = np.flatnonzero(continued_mask(entries))
    if not at.shape[0]:
        return None
    breaks = np.flatnonzero(np.diff(at) != 1) + 1
    starts = np.concatenate([[0], breaks]).astype(np.int64)
    ends = np.concatenate([breaks, [at.shape[0]]]).astype(np.int64)
    cum = np.concatenate([[0], np.cumsum(tokens_of(entries["length"][at], entries["typ"][at]))])
    return Pieces(at[starts].astype(np.int64), ends - starts, (cum[ends] - cum[starts]))


def runs_after(pieces: Pieces | None, local: np.ndarray) -> tuple[np.ndarray, np.ndarray,
                                                                  np.ndarray]:
    """For packets ``local`` of a shard with ``pieces``: whether each is a later piece (a
    place of nothing in packed mode), and the pieces and tokens of the run after each (0 and
    0 for a packet no run follows)."""
    n = local.shape[0]
    if pieces is None:
        zero = np.zeros(n, np.int64)
        return np.zeros(n, bool), zero, zero
    k = np.searchsorted(pieces.first, local, side="right") - 1  # the run at or before
    inside = (k >= 0) & (local < pieces.first[np.maximum(k, 0)] + pieces.count[np.maximum(k, 0)])
    j = np.searchsorted(pieces.first, local + 1)  # a run starting right after
    j = np.minimum(j, pieces.first.shape[0] - 1)
    starts = (pieces.first[j] == local + 1) & ~inside
    return inside, np.where(starts, pieces.count[j], 0), np.where(starts, pieces.tokens[j], 0)
