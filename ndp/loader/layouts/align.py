"""Windows that start at documents: packed mode's ``align="bos"`` (what modded-nanogpt's
BOS-aligned loader does, and what a document mask wants: no window opens mid-document).

Unaligned, window ``k`` of a packed stream reads ``T + 1`` tokens from ``tok + k*T``. Aligned,
each window reads ``T + 1`` tokens from a document's first token:

* window 0 starts at the first document that starts at or after ``tok`` (the state's search
  point: the stream position after the last batch);
* window ``k + 1`` starts at the first document that starts at or after ``s_k + T`` (``s_k``:
  where window ``k`` starts). A document that starts at ``s_k + T`` exactly is read as in
  unaligned windows: its first token is window ``k``'s last target and window ``k + 1``'s first
  input;
* the tokens from ``s_k + T`` to the next document's start are read as inputs by no window:
  the rest of a document longer than a window, or the end of the one window ``k`` ends in. They
  are counted (``stats.left_over_tokens``), never lost silently;
* the state after a batch is the search point ``s_last + T`` as a (packet, token) pair, as in
  unaligned windows, so a resume finds the same next window.

A document is a valid packet of the stream, or with documents split over packets
(``ndp.loader.ordering.units``) a place's first valid packet; one of no tokens starts nothing.

The same greedy counts batches by the index (every rank's epoch, ``len()``, a chunk's reach):
``count_aligned``, ``count_aligned_by_rank`` and ``aligned_reach`` walk document lengths with a
small carry, batch shapes from ``ndp.loader.planning.shapes`` (a window's ``T`` is its batch's). All
of it
is compiled, one pass, O(documents).
"""

from __future__ import annotations

import numpy as np

from ndp.kernels._jit import cpu_kernel
from ndp.loader.layouts.packing import phase_of
from ndp.loader.planning.shapes import Shapes

#: the values ``Loader(align=...)`` takes: None (windows wherever the stream puts them), "bos"
ALIGNS = (None, "bos")

# the carry of one stream: tokens to its search point (<= 0: passed), tokens its last window
# still needs (> 0: incomplete), batches whose windows all started, windows of the open batch
GAP, NEED, BATCHES, OPEN = range(4)
CARRY = 4


@cpu_kernel
def _windows(starts, total, tok, B, T, most, wins, ends, left):  # pragma: no cover - compiled
    n = starts.shape[0]
    i = 0
    p = tok
    done = 0
    for b in range(most):
        q = p
        k = i
        lo = 0
        ok = True
        for j in range(B):
            while k < n and starts[k] < q:
                k += 1
            if k == n or starts[k] + T + 1 > total:
                ok = False
                break
            s = starts[k]
            wins[b * B + j] = s
            lo += s - q
            q = s + T
        if not ok:
            break
        i, p = k, q
        ends[b] = q
        left[b] = lo
        done += 1
    return done


def aligned_windows(starts: np.ndarray, *, total: int, tok: int, batch_size: int,
                    seq_len: int, most: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Up to ``most`` batches of ``batch_size`` aligned windows of ``seq_len + 1`` tokens in a
    stream of ``total`` tokens whose documents start at ``starts`` (ascending stream
    positions), searching from ``tok``: each window's start (``n * batch_size``), each batch's
    search point after it and the tokens it left over (module docstring). A batch whose
    windows do not all fit is not made."""
    starts = np.ascontiguousarray(starts, np.int64)
    wins = np.empty(max(most, 0) * batch_size, np.int64)
    ends = np.empty(max(most, 0), np.int64)
    left = np.empty(max(most, 0), np.int64)
    n = int(_windows(starts, np.int64(total), np.int64(tok), np.int64(batch_size),
                     np.int64(seq_len), np.int64(most), wins, ends, left))
    return wins[:n * batch_size], ends[:n], left[:n]


@cpu_kernel
def _step(carry, k, length, starts, sizes, lens):  # pragma: no cover - compiled
    """One document of ``length`` tokens of stream ``k`` (column of ``carry``)."""
    if length <= 0:
        return
    if carry[GAP, k] <= 0:  # it starts at or past the search point: a window starts here
        p = phase_of(starts, carry[BATCHES, k])
        T = lens[p]
        carry[GAP, k] = T
        carry[NEED, k] = T + 1
        carry[OPEN, k] += 1
        if carry[OPEN, k] == sizes[p]:
            carry[BATCHES, k] += 1
            carry[OPEN, k] = 0
    carry[GAP, k] -= length
    carry[NEED, k] -= length


@cpu_kernel
def _count(lengths, starts, sizes, lens, carry):  # pragma: no cover - compiled
    for i in range(lengths.shape[0]):
        _step(carry, 0, lengths[i], starts, sizes, lens)


@cpu_kernel
def _count_by_rank(lengths, take, ranks, starts, sizes, lens, carry):  # pragma: no cover
    for i in range(lengths.shape[0]):
        if take[i]:
            _step(carry, i % ranks, lengths[i], starts, sizes, lens)


def new_carry(ranks: int = 1, *, tok: int = 0) -> np.ndarray:
    """The carry of ``ranks`` streams before any document (``tok``: the search point, tokens
    from the first document's start)."""
    carry = np.zeros((CARRY, ranks), np.int64)
    carry[GAP] = tok
    return carry


def batches(carry: np.ndarray) -> np.ndarray:
    """Per stream, the batches whose windows all fit the documents walked: those started,
    less one whose last window still needs tokens (every earlier window is whole: a later one
    started past its end)."""
    short = (carry[NEED] > 0) & (carry[OPEN] == 0) & (carry[BATCHES] > 0)
    return carry[BATCHES] - short


def count_aligned(lengths: np.ndarray, shapes: Shapes, *, tok: int = 0) -> int:
    """Aligned batches a stream of documents of ``lengths`` tokens makes (``shapes`` from its
    first batch; ``tok``: the search point in the first document)."""
    carry = new_carry(tok=tok)
    _count(np.ascontiguousarray(lengths, np.int64), *shapes.arrays()[:3], carry)
    return int(batches(carry)[0])


def count_aligned_by_rank(lengths: np.ndarray, take: np.ndarray, ranks: int, shapes: Shapes,
                          carry: np.ndarray) -> None:
    """``count_aligned`` of ``ranks`` interleaved streams at once, fed a piece at a time:
    element ``i`` of ``lengths`` is a document of stream ``i % ranks`` where ``take[i]``;
    ``carry`` (``new_carry(ranks)``) goes from piece to piece (``batches(carry)``)."""
    _count_by_rank(np.ascontiguousarray(lengths, np.int64),
                   np.ascontiguousarray(take, np.bool_), ranks, *shapes.arrays()[:3], carry)


@cpu_kernel
def _reach(lengths, tok, B, T, most, point):  # pragma: no cover - compiled
    starts = np.zeros(1, np.int64)
    sizes = np.full(1, B, np.int64)
    lens = np.full(1, T, np.int64)
    carry = np.zeros((CARRY, 1), np.int64)
    carry[GAP, 0] = tok
    at = 0  # stream position of document i's first token
    for i in range(lengths.shape[0]):
        m = lengths[i]
        if m <= 0:
            continue
        if carry[BATCHES, 0] >= most:  # only the last window's tail is read from here on
            if carry[NEED, 0] <= m:
                return i + 1
            carry[NEED, 0] -= m
            at += m
            continue
        _step(carry, 0, m, starts, sizes, lens)
        if carry[BATCHES, 0] >= most:  # the last batch's last window starts here
            point[0] = at + T
            if carry[NEED, 0] <= 0:
                return i + 1
        at += m
    return -1


def aligned_reach(lengths: np.ndarray, *, tok: int, batch_size: int, seq_len: int,
                  batches: int) -> tuple[int, int]:
    """How many of the documents ``lengths`` (from the chunk's first, search point ``tok``)
    ``batches`` aligned batches of one shape read, their last window whole (-1 if they do
    not fit), and the search point after them (tokens from the first document's start)."""
    point = np.zeros(1, np.int64)
    q = int(_reach(np.ascontiguousarray(lengths, np.int64), np.int64(tok),
                   np.int64(batch_size), np.int64(seq_len), np.int64(batches), point))
    return q, int(point[0])
