"""Marks: where every ``every``-th batch of each rank starts in its share, noted by the pass that
counts the epoch (``ndp.loader.planning.count``) and kept with the count, so that a far batch
is planned from the mark before it rather than from the epoch's start
(``ndp.loader.explain``: any step of an epoch at 1e8 documents in well under a second).

A mark is ``(position, token)``: the batch's first window starts at token ``token`` of the
place at share position ``position``, which is what a state after the batch before it records
(``packing``: always token 0).

* ``packing``: where the greedy placement by the index's token counts opens the batch
  (``ndp.loader.layouts.packing.count_batches_by_rank``). The Loader's batches start exactly
  there whatever it drops (a batch takes its candidates whole), so the marks are exact.
* ``packed`` (one batch shape, windows not at documents): where the stream of the places'
  index token counts reaches ``batch * batch_size * seq_len``. The Loader's stream is of the
  *valid* tokens, so the marks are where its batches start only if every packet's verdict
  holds the tokens its index entry says: no packet damaged since it was indexed, none with an
  id out of the vocabulary, none left out by ``skip_packets``. ``ndp.store.clean`` checks the
  first two once per shard (and keeps the answer); the explainer uses the marks only then.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ndp.kernels._jit import cpu_kernel

#: the pass marks where every this many batches start in each rank's share (packing: more
#: apart for shares so long that marks would be more than ``MOST_MARKS`` a rank; packed:
#: fewer batches apart where that many hold more than ``MARK_TOKENS`` tokens, as a far step's
#: explanation reads the packets from its mark)
MARK_EVERY = 256
MOST_MARKS = 1 << 16
MARK_TOKENS = 1 << 20


def mark_every(length: int, *, per_batch: int | None = None) -> int:
    """How many batches apart the marks of shares of ``length`` places are (a power of two,
    or ``MARK_EVERY``); ``per_batch``: packed batches of that many tokens."""
    if per_batch is not None:
        every = 1
        while every * 2 * per_batch <= MARK_TOKENS:
            every *= 2
        return min(every, MARK_EVERY)
    every = MARK_EVERY
    while length // every > MOST_MARKS:
        every *= 2
    return every


@cpu_kernel
def _packed_marks(toks, first, ranks, sums, made, per_batch, every,
                  out):  # pragma: no cover - compiled
    """Epoch places ``first, first + 1, ..`` (rank ``place % ranks``'s), of ``toks`` tokens
    each: each added to its rank's stream ``sums``, and a mark noted in ``out`` wherever a
    rank's stream passes its next marked batch's first token."""
    k_out = 0
    k = first % ranks
    for i in range(toks.shape[0]):
        place = first + i
        s = sums[k]
        end = s + np.int64(toks[i])
        # the next marked batch starts at token ``made[k] * every * per_batch``
        while made[k] * every * per_batch < end:
            out[k_out, 0] = k
            out[k_out, 1] = made[k] * every
            out[k_out, 2] = place // ranks
            out[k_out, 3] = made[k] * every * per_batch - s
            if made[k] == 0:  # the epoch's first batch: at its start, as a state says
                out[k_out, 2] = 0
                out[k_out, 3] = 0
            k_out += 1
            made[k] += 1
        sums[k] = end
        k += 1
        if k == ranks:
            k = 0
    return k_out


class Marks:
    """The marks of every rank as a pass makes them, piece by piece (``add``), in batch order;
    ``as_dict`` for the count's file: ``{"every": e, "at": [per rank, [position, token] of
    its batches 0, e, 2e, ..]}``."""

    def __init__(self, ranks: int, every: int) -> None:
        self.every = every
        self.at: list[list[list[int]]] = [[] for _ in range(ranks)]
        self.sums = np.zeros(ranks, np.int64)  # packed: each rank's stream so far
        self.made = np.zeros(ranks, np.int64)  # packed: each rank's marks so far

    def add(self, rows: np.ndarray) -> None:
        """Rows ``(rank, batch, position[, token])`` of a piece, in batch order per rank."""
        for row in rows.tolist():
            k, b, p = row[0], row[1], row[2]
            if b == len(self.at[k]) * self.every:
                self.at[k].append([p, row[3] if len(row) > 3 else 0])

    def packed(self, column: np.ndarray, win: Any, a: int, b: int, *, at: int, limit: int,
               per_batch: int, most_tokens: int) -> None:
        """The marks of the packed stream over places ``[a, b)`` of window ``win`` (whose
        first place is epoch place ``at``; places from ``limit`` on are cut), the places'
        tokens read from ``column`` (the window's, in file order) through the window's order
        (``Window.take``: compiled, on ndp's threads), then one compiled pass over them.
        ``most_tokens``: at most that many tokens a place (the size of the marks' buffer)."""
        b = min(b, limit - at)  # places from ``limit`` on are cut from every rank
        if b <= a:
            return
        ranks = self.sums.shape[0]
        # a mark per ``every * per_batch`` tokens of each rank's stream, one more per rank
        most = most_tokens * (b - a) // (self.every * per_batch) + ranks
        out = np.empty((most, 4), np.int64)
        got = _packed_marks(win.take(column, a, b), np.int64(at + a), np.int64(ranks),
                            self.sums, self.made, np.int64(per_batch), np.int64(self.every),
                            out)
        self.add(out[:got])

    def as_dict(self) -> dict:
        return {"every": self.every, "at": self.at}
