"""One rank's plan of an epoch in a pass over the epoch's shuffle windows: how many packets
every rank keeps after CRC-Drop, the shortest of those counts (``length``: every rank's share
is cut to it), this rank's own packets, and the batches the ranks' cut shares make. Nothing
the size of the dataset is built: not the epoch's order, not a drop mask, not another rank's
share; only one window's packets at a time (``ndp.loader.ordering.order.epoch_windows``), O(W)
counters, and this rank's own share, which the producer reads.

Position ``p`` of the epoch's order goes to rank ``p % W``. A window's positions are laid out as
a table of W columns (column: rank; rows: consecutive positions, the first and last row padded),
so per-rank counts, each kept packet's place in its rank's share and per-rank token sums are
column operations on the window: O(window + W) memory.

* ``length``: without CRC-Drop every rank keeps its positions and the shortest share is
  ``packets // W``, known before any pass; with it, a first pass counts every rank's kept
  packets (and collects this rank's).
* the batches: ``padded`` needs only ``length``; ``packed`` sums each rank's first ``length``
  kept packets' tokens; ``packing`` streams them through the greedy placement, every rank's
  open batch carried from window to window (``ndp.loader.layouts.packing.count_batches_by_rank``).
  With CRC-Drop this is a second pass, which draws the windows again from the seed (the same
  draws) and stops once every rank has reached ``length``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ndp.engine.threads import parallel_for
from ndp.loader.layouts import align as aligned

from ndp.loader.ordering import units
from ndp.loader.ordering.order import Window, check_drop_rate, drop_ranges, epoch_windows
from ndp.loader.layouts.packing import count_batches_by_rank, new_carry
from ndp.loader.planning.shapes import Shapes
from ndp.loader.layouts.truncation import Cut, cut_of, row_lens


class Stopped(Exception):
    """A pass abandoned by its ``stop`` (a plan made ahead that is no longer wanted)."""


@dataclass(frozen=True)
class EpochPlan:
    """What ``plan_epoch`` works out (``ndp.loader.planning.plan.Share`` is made of it)."""

    own: np.ndarray  #: this rank's packets after CRC-Drop, cut to ``length``
    length: int  #: the shortest rank's packet count after CRC-Drop
    batches: int  #: the smallest batch count of any rank's first ``length`` packets
    dropped: int  #: CRC-Drop: packets of this rank's part of the order dropped on purpose
    balanced: int  #: this rank's kept packets past ``length``
    peak: int  #: the most elements of any per-packet array the pass built (own share aside)
    #: padded mode: what rows of ``seq_len`` cut from this rank's packets (by the index)
    cut: Cut | None = None


def plan_epoch(corpus: Any, *, epoch: int, seed: int, shuffle: bool, shard_bytes: np.ndarray,
               window_bytes: int | None, rate: float, rank: int, world_size: int, mode: str,
               shapes: Shapes, stop: Any = None, align: str | None = None) -> EpochPlan:
    """This rank's plan of ``epoch`` (see the module docstring): the same packets and counts
    as building the whole order and every rank's share would give; ``shapes``: the epoch's
    batch shapes from its first batch (``ndp.loader.planning.shapes``); ``align``: packed windows
    start at documents (``ndp.loader.layouts.align``). ``stop``: a callable,
    asked before each window, that abandons the pass (``Stopped``) when it returns true."""
    check_drop_rate(rate)
    walk = _Walk(corpus, epoch=epoch, seed=seed, shuffle=shuffle, shard_bytes=shard_bytes,
                 window_bytes=window_bytes, rate=rate, rank=rank, world_size=world_size,
                 mode=mode, shapes=shapes, stop=stop, align=align)
    n, W = int(corpus.n_packets), world_size
    own = np.empty(max(0, (n - rank + W - 1) // W), np.int64)  # this rank's positions
    # padded: their token counts too, for the cut at seq_len (``ndp.loader.layouts.truncation``)
    own_tokens = np.empty(own.shape[0], np.int32) if mode == "padded" else None
    if rate > 0:
        counted = walk.run(own=own, own_tokens=own_tokens)
        length, kept, dropped = int(counted.kept.min()), counted.n_own, counted.dropped
        own_done = True
    else:
        length, kept, dropped, own_done = n // W, own.shape[0], 0, False
    if mode == "padded" and not shapes.budgeted:
        if not own_done:
            walk.run(own=own, own_tokens=own_tokens)
        batches = shapes.padded_batches(length)
    else:  # every rank's tokens (packed) or greedy batches (packing, a token budget)
        totals = walk.run(own=None if own_done else own, length=length,
                          own_tokens=None if own_done else own_tokens)
        if mode == "packed" and align is not None:
            batches = int(aligned.batches(totals.aligned).min())
        elif mode == "packed":
            batches = shapes.packed_batches(int(totals.sums.min()))
        else:
            batches = int(totals.carry[2].min())
    cut = None if mode != "padded" else cut_of(own_tokens[:length],
                                               row_lens(shapes, own_tokens[:length]))
    balanced = kept - length  # in packets: packed mode's places hold documents (``units``)
    if balanced and units.active(corpus, mode):
        balanced = int(units.place_sizes(corpus, own[length:kept]).sum())
    return EpochPlan(own[:length], length, batches, dropped, balanced, walk.peak, cut)


@dataclass
class _Totals:
    kept: np.ndarray  # per rank: packets kept so far (after CRC-Drop)
    sums: np.ndarray  # packed, per rank: tokens of its first ``length`` kept packets
    carry: np.ndarray  # packing: ``count_batches_by_rank``'s carry
    aligned: np.ndarray  # packed, align="bos": ``ndp.loader.layouts.align.count_aligned_by_rank``'s
    n_own: int = 0  # this rank's kept packets collected
    dropped: int = 0  # this rank's packets dropped


class _Walk:
    """Passes over one epoch's windows for one rank (``run``)."""

    def __init__(self, corpus: Any, *, epoch: int, seed: int, shuffle: bool,
                 shard_bytes: np.ndarray, window_bytes: int | None, rate: float, rank: int,
                 world_size: int, mode: str, shapes: Shapes, stop: Any = None,
                 align: str | None = None) -> None:
        self.corpus, self.epoch, self.seed, self.rate = corpus, epoch, seed, rate
        self.order = {"seed": seed, "epoch": epoch, "shuffle": shuffle,
                      "shard_bytes": shard_bytes, "window_bytes": window_bytes}
        self.rank, self.world, self.mode = rank, world_size, mode
        self.shapes, self.align = shapes, align
        self.peak = 0
        self.stop = stop

    def _held(self, *arrays: np.ndarray | None) -> None:
        for a in arrays:
            if a is not None:
                self.peak = max(self.peak, a.size)

    def run(self, *, own: np.ndarray | None = None, length: int | None = None,
            own_tokens: np.ndarray | None = None) -> _Totals:
        """One pass: counts every rank's kept packets; with ``own``, collects this rank's kept
        packets into it (and with ``own_tokens`` their token counts); with ``length``, every
        rank's tokens (packed) or batches (packing) over its first ``length`` kept packets,
        stopping when all are reached (and ``own`` is not being collected)."""
        W, rank = self.world, self.rank
        tot = _Totals(np.zeros(W, np.int64), np.zeros(W, np.int64), new_carry(W),
                      aligned.new_carry(W))
        at = 0  # the epoch position of the window's first packet
        for win in epoch_windows(self.corpus.base, **self.order):
            if own is None and length is not None and tot.kept.min() >= length:
                break
            if self.stop is not None and self.stop():
                raise Stopped(f"planning epoch {self.epoch} stopped")
            size = win.size
            perm = None if win.keys is None else win.order()  # O(window): CRC-Drop's pass
            drop = None
            if self.rate > 0:
                drop = drop_ranges(win.starts, win.stops, seed=self.seed, epoch=self.epoch,
                                   rate=self.rate)
                drop = drop if perm is None else drop[perm]
            self._held(perm, drop)
            if own is not None:
                first = (rank - at) % W
                mine = win.every(first, W)
                self._held(mine)
                toks = None
                if own_tokens is not None:  # the padded cut's: this rank's packets' tokens
                    toks = window_tokens(self.corpus, win)
                    toks = toks[first::W] if perm is None else toks[perm[first::W]]
                    self._held(toks)
                if drop is not None:
                    lost = drop[first::W]
                    tot.dropped += (int(lost.sum()) if not units.active(self.corpus, self.mode)
                                    else int(units.place_sizes(self.corpus, mine[lost]).sum()))
                    mine = mine[~lost]
                    toks = None if toks is None else toks[~lost]
                own[tot.n_own: tot.n_own + mine.shape[0]] = mine
                if toks is not None:
                    own_tokens[tot.n_own: tot.n_own + mine.shape[0]] = toks
                tot.n_own += mine.shape[0]
            if drop is not None or length is not None:
                kept = _table(np.ones(size, bool) if drop is None else ~drop,
                              at % W, W, False)
                self._held(kept)
                counts = kept.sum(axis=0)
                if length is not None and (self.mode != "padded" or self.shapes.budgeted) \
                        and tot.kept.min() < length:
                    self._tokens(win, perm, kept, at % W, tot, length,
                                 every=int((tot.kept + counts).max()) <= length)
                tot.kept += counts
            at += size
        return tot

    def _tokens(self, win: Window, perm: np.ndarray | None, kept: np.ndarray, off: int,
                tot: _Totals, length: int, every: bool) -> None:
        """Add the window's packets that are among their rank's first ``length`` kept ones
        (``every``: all its kept ones are) to the token sums (packed) or the batch counts
        (packing)."""
        W = self.world
        # a kept packet's place in its rank's share: kept before it, this window and earlier
        take = kept if every else kept & (np.cumsum(kept, axis=0) + tot.kept <= length)
        tokens = window_tokens(self.corpus, win, documents=self.mode == "packed")
        table = _table(tokens if perm is None else tokens[perm], off, W, 0)
        self._held(take, table)
        if self.mode == "packed" and self.align is not None:  # in order: windows at documents
            aligned.count_aligned_by_rank(table.ravel(), take.ravel(), W, self.shapes,
                                          tot.aligned)
        elif self.mode == "packed":
            tot.sums += np.where(take, table, 0).sum(axis=0)
        else:
            count_batches_by_rank(table.ravel(), take.ravel(), W, self.shapes, tot.carry)


def window_tokens(corpus: Any, win: Window, a: int = 0, b: int | None = None, *,
                  documents: bool = False, out: np.ndarray | None = None,
                  stop: Any = None) -> np.ndarray:
    """The token counts of ``win``'s packets in file order (before its permutation), those at
    file-order indices ``[a, b)`` (all by default; int32: a packet holds at most 65,535
    tokens): each range (a shard) read as a slice of the corpus' tokens, which reads an index
    in order (a gather of permuted packet numbers would sort them by shard first), in passing
    (``Column.passing``: the pass does not push the decoder's entries out). ``documents``:
    the tokens each place holds in packed mode (``ndp.loader.ordering.units.place_tokens``: a whole
    document's at its first piece, int64). ``out``: an int32 buffer of at least ``b - a`` to
    write them into (a pass over an epoch's windows reuses one: its pages are touched once).
    ``stop``: a callable checked before each range is read; once true, the rest are left and
    ``Stopped`` is raised (a closing Loader waits for one shard's read, not a window's)."""
    b = win.size if b is None else b
    n = max(b - a, 0)
    out = np.empty(n, np.int32) if out is None else out[:n]
    tokens = corpus.tokens
    passing = getattr(tokens, "passing", None)  # a corpus' Column: read without holding
    pieces = []  # (first packet, end, out's first index) of each range's part of [a, b)
    at = 0  # file-order index of the range's first packet
    for lo, hi in zip(win.starts.tolist(), win.stops.tolist()):
        x, y = max(a, at), min(b, at + hi - lo)  # the part of [a, b) in this range
        if x < y:
            pieces.append((lo + x - at, lo + y - at, x - a))
        at += hi - lo
        if at >= b:
            break
    if passing is None:
        for s, e, o in pieces:
            out[o: o + e - s] = tokens[s:e]
    else:  # the counts written straight into ``out``; the ranges (shards: each index read
        # and checked on its first use, nogil) on ndp's threads at once

        left: list = []  # ranges left unread (the pass was stopped)

        def read(lo: int, hi: int) -> None:
            for s, e, o in pieces[lo:hi]:
                if stop is not None and stop():
                    left.append(s)
                    return
                passing(s, e, out[o: o + e - s])

        parallel_for(read, len(pieces))
        if left:  # never a column with ranges missing, whatever ``stop`` says by now
            raise Stopped("reading a window's token counts stopped")
    if documents and units.active(corpus, "packed"):
        return units.place_tokens(corpus, win.packets_of(np.arange(a, b, dtype=np.int64)), out)
    return out


def _table(values: np.ndarray, off: int, width: int, fill: Any) -> np.ndarray:
    """``values`` laid out row by row in ``width`` columns from flat place ``off`` on, the
    places before and after them ``fill``."""
    rows = -(-(off + values.shape[0]) // width)
    flat = np.full(rows * width, fill, values.dtype)
    flat[off: off + values.shape[0]] = values
    return flat.reshape(rows, width)
