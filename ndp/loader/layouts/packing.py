"""Sequence packing: short SFT examples laid end to end in full rows, with the per-document
``position_ids`` and ``cu_seqlens`` that keep attention (and the loss) inside each document.

The plan is made on the host from the examples' lengths alone (``ndp.loader.layouts.layout`` lays
out whole
chunks of batches with it); the build kernels (``ndp.kernels.build``) then write the tokens
straight from the packets into the rows.

Layout of a batch of ``B`` rows of ``L`` tokens:

* examples are placed in order, each truncated to ``L``; an example that does not fit in what is
  left of a row starts the next row; a batch ends when the next example would need row ``B``;
* ``input_ids`` (pad elsewhere), ``labels`` (not shifted; -100 at padding, at masked prompt
  tokens and at the first token of every document: why, ``ndp.loader.loader``, "Modes"),
  ``attention_mask`` (1 on document tokens), ``position_ids`` (0, 1, ... from each document's
  start; 0 on padding);
* ``cu_seqlens`` (int32): boundaries of the segments of the flattened (B*L) batch: every
  document, and each row's padding as a segment of its own; ``max_seqlen`` is the longest. This
  is what variable-length attention kernels (FlashAttention's ``*_varlen_*``) take.
"""

from __future__ import annotations

import numpy as np

from ndp.kernels._jit import cpu_kernel
from ndp.loader.planning.shapes import Shapes


@cpu_kernel
def _plan(lengths, rows, row_len, where_row, where_col):  # pragma: no cover - compiled
    r = 0
    c = 0
    for i in range(lengths.shape[0]):
        m = min(lengths[i], row_len)
        if c + m > row_len:
            r += 1
            c = 0
        if r == rows:
            return i
        where_row[i] = r
        where_col[i] = c
        c += m
    return lengths.shape[0]


@cpu_kernel
def phase_of(starts, batch):  # pragma: no cover - compiled
    """The phase of batch ``batch`` (``ndp.loader.planning.shapes``: few phases, searched in
    order)."""
    p = 0
    while p + 1 < starts.shape[0] and starts[p + 1] <= batch:
        p += 1
    return p


@cpu_kernel
def _budget_end(lengths, at, budget, row_len):  # pragma: no cover - compiled
    """Where a batch from ``at`` cut by a token budget ends: whole examples (each cut to
    ``row_len``) while they fit ``budget``, at least one."""
    used = 0
    i = at
    while i < lengths.shape[0]:
        m = min(lengths[i], row_len)
        if i > at and used + m > budget:
            break
        used += m
        i += 1
    return i


@cpu_kernel
def _rows_end(lengths, at, rows, row_len):  # pragma: no cover - compiled
    """Where examples placed from ``at`` as ``_plan`` places them stop filling ``rows`` rows
    of ``row_len``: the first that would need row ``rows`` (or the end)."""
    r = 0
    c = 0
    i = at
    while i < lengths.shape[0]:
        m = min(lengths[i], row_len)
        if c + m > row_len:
            r += 1
            c = 0
        if r == rows:
            break
        c += m
        i += 1
    return i


@cpu_kernel
def _count_batches(lengths, starts, sizes, lens, budgets, batch_of):  # pragma: no cover
    n = lengths.shape[0]
    at = 0
    count = 0
    while at < n:
        p = phase_of(starts, count)
        if budgets[p] > 0:
            i = _budget_end(lengths, at, budgets[p], lens[p])
        else:
            i = _rows_end(lengths, at, sizes[p], lens[p])
        end = max(i, at + 1)
        if batch_of.shape[0]:
            batch_of[at:end] = count
        at = end
        count += 1
    return count


@cpu_kernel
def _mark(marks, made, k, batch, position):  # pragma: no cover - compiled
    """Row ``made`` of ``marks``: stream ``k``'s batch ``batch`` opens at ``position``."""
    marks[made, 0] = k
    marks[made, 1] = batch
    marks[made, 2] = position
    return made + 1


@cpu_kernel
def _count_batches_by_rank(lengths, take, ranks, starts, sizes, lens, budgets, carry,
                           every, first, marks):  # pragma: no cover - compiled
    made = 0
    k = first % ranks - 1  # element i's stream, (first + i) % ranks, kept without a division
    every_taken = take.shape[0] == 0
    for i in range(lengths.shape[0]):
        k += 1
        if k == ranks:
            k = 0
        if not every_taken and not take[i]:
            continue
        if carry[2, k] == 0:  # the stream's first example opens its first batch
            carry[2, k] = 1
            carry[0, k] = 0
            carry[1, k] = 0
            carry[3, k] = 0
            if every > 0:
                made = _mark(marks, made, k, 0, (first + i) // ranks)
        p = phase_of(starts, carry[2, k] - 1)  # the open batch's shape
        row_len = lens[p]
        m = min(lengths[i], row_len)
        if budgets[p] > 0:  # a token budget: examples while they fit it, at least one
            if carry[0, k] > 0 and carry[3, k] + m > budgets[p]:
                carry[2, k] += 1
                m = min(lengths[i], lens[phase_of(starts, carry[2, k] - 1)])
                carry[0, k] = 0
                carry[3, k] = 0
                if every > 0 and (carry[2, k] - 1) % every == 0:
                    made = _mark(marks, made, k, carry[2, k] - 1, (first + i) // ranks)
            carry[0, k] += 1
            carry[3, k] += m
            continue
        r = carry[0, k]
        c = carry[1, k]
        if c + m > row_len:
            r += 1
            c = 0
        if r == sizes[p]:  # the batch is full: this example opens the next one, its shape
            carry[2, k] += 1
            m = min(lengths[i], lens[phase_of(starts, carry[2, k] - 1)])
            r = 0
            c = 0
            if every > 0 and (carry[2, k] - 1) % every == 0:
                made = _mark(marks, made, k, carry[2, k] - 1, (first + i) // ranks)
        carry[0, k] = r
        carry[1, k] = c + m
    return made


@cpu_kernel
def _segments(lengths, where_row, rows, row_len, out):  # pragma: no cover - compiled
    """Segment ends of the flattened batch: each document, then each row's padding."""
    k = 0
    i = 0
    n = lengths.shape[0]
    for r in range(rows):
        acc = r * row_len
        while i < n and where_row[i] == r:
            if lengths[i] > 0:
                acc += lengths[i]
                out[k] = acc
                k += 1
            i += 1
        if acc < (r + 1) * row_len:
            out[k] = (r + 1) * row_len
            k += 1
    return k


def plan(lengths: np.ndarray, *, rows: int, row_len: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(row, column) of each placed example and how many were placed (a prefix of them)."""
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    where_row = np.empty(lengths.shape[0], np.int64)
    where_col = np.empty(lengths.shape[0], np.int64)
    placed = int(_plan(lengths, rows, row_len, where_row, where_col))
    return where_row[:placed], where_col[:placed], placed


def segments(lengths: np.ndarray, where_row: np.ndarray, *, rows: int,
             row_len: int) -> np.ndarray:
    """``cu_seqlens`` (int32) of one batch of placed examples ``lengths`` (already cut to
    ``row_len``): 0, then the end of every document and of each row's padding, in the flattened
    (rows * row_len) batch."""
    ends = np.empty(lengths.shape[0] + rows, np.int64)
    k = int(_segments(np.ascontiguousarray(lengths, np.int64),
                      np.ascontiguousarray(where_row, np.int64), rows, row_len, ends))
    return np.concatenate([[0], ends[:k]]).astype(np.int32)


def count_batches(lengths: np.ndarray, shapes: Shapes, batch_of: np.ndarray | None = None
                  ) -> int:
    """How many batches the examples ``lengths`` fill when placed in order as ``plan`` places
    them, batch ``k`` in ``B_k`` rows of ``T_k`` or cut by its token budget (``shapes``,
    ``ndp.loader.planning.shapes``; each batch takes at least one example). ``batch_of``: filled
    with
    each example's batch, if given."""
    out = np.zeros(0, np.int64) if batch_of is None else batch_of
    return int(_count_batches(np.ascontiguousarray(lengths, np.int64), *shapes.arrays(), out))


def budget_ends(lengths: np.ndarray, *, budget: int, row_len: int, most: int) -> np.ndarray:
    """The ends of up to ``most`` batches of examples ``lengths`` cut by a token budget (whole
    examples, each cut to ``row_len``, while they fit ``budget``; at least one a batch),
    from the first example on; the last ends at the last example if they run out first."""
    lengths = np.ascontiguousarray(lengths, np.int64)
    ends = []
    at = 0
    while at < lengths.shape[0] and len(ends) < most:
        at = int(_budget_end(lengths, at, budget, row_len))
        ends.append(at)
    return np.array(ends, np.int64)


def count_batches_by_rank(lengths: np.ndarray, take: np.ndarray | None, ranks: int,
                          shapes: Shapes, carry: np.ndarray, *, every: int = 0, first: int = 0
                          ) -> np.ndarray:
    """``count_batches`` of ``ranks`` interleaved streams at once, fed a piece at a time:
    element ``i`` of ``lengths`` (int32 or int64) belongs to stream ``(first + i) % ranks``
    and is one of its examples where ``take[i]`` (``take`` None: every element is).
    ``carry`` (int64, 4 x ``ranks``, ``new_carry``: each stream's row and column in its open
    batch, its batches so far, and the open batch's tokens) goes from piece to piece, so that
    ``carry[2]`` is, per stream, ``count_batches`` of all its examples however they were cut.

    With ``every``, the marks of the piece: ``(stream, batch, position)`` rows (int64), one
    for each batch whose number is a multiple of ``every`` that opens in it, ``position``
    being ``(first + i) // ranks`` for the element ``i`` that opens it (``first``: the
    piece's first element's place in the epoch, so the position is its stream's share
    position). Empty without ``every``."""
    n = lengths.shape[0]
    # a stream opens at most one batch per element: a mark per ``every`` of them, one more
    marks = np.empty((min(n, n // every + ranks) if every > 0 else 0, 3), np.int64)
    if lengths.dtype not in (np.int32, np.int64):
        lengths = lengths.astype(np.int64)
    made = _count_batches_by_rank(np.ascontiguousarray(lengths),
                                  _EVERY if take is None else np.ascontiguousarray(take, np.bool_),
                                  ranks,
                                  *shapes.arrays(), carry, np.int64(every), np.int64(first),
                                  marks)
    return marks[:made]


#: ``take`` for ``_count_batches_by_rank`` when every element is taken
_EVERY = np.zeros(0, np.bool_)


def new_carry(ranks: int) -> np.ndarray:
    """The ``carry`` of ``count_batches_by_rank`` before any example."""
    return np.zeros((4, ranks), np.int64)


@cpu_kernel
def _candidates_end(toks, at, rows, row_len, budget, complete):  # pragma: no cover - compiled
    """Where the candidates of a batch from ``at`` end in ``toks`` (index token counts): the
    examples that fill ``rows`` rows of ``row_len`` (with a ``budget``: whole examples while
    they fit it), at least one; -1 where they run past ``toks`` and ``complete`` is false (the
    share goes on: more tokens decide it)."""
    n = toks.shape[0]
    if budget > 0:
        i = _budget_end(toks, at, budget, row_len)
    else:
        i = _rows_end(toks, at, rows, row_len)
    if i >= n and not complete:
        return -1
    return max(i, at + 1)


@cpu_kernel
def _chain_end(toks, batches, rows, row_len, budget, complete):  # pragma: no cover - compiled
    """Where ``batches`` batches from ``toks[0]`` end if each takes its candidates (no
    packet dropped), or -1 if ``toks`` is too short to say."""
    at = 0
    for _ in range(batches):
        if at >= toks.shape[0]:
            if not complete:
                return -1
            break
        at = _candidates_end(toks, at, rows, row_len, budget, complete)
        if at < 0:
            return -1
    return min(at, toks.shape[0])


def chain_end(toks: np.ndarray, *, batches: int, rows: int, row_len: int, budget: int,
              complete: bool) -> int:
    """``_chain_end`` (the end of a packing chunk of ``batches`` batches by the index token
    counts ``toks`` of the share from its start; ``complete``: ``toks`` runs to the share's
    end): the position, or -1 if more tokens are needed."""
    return int(_chain_end(np.ascontiguousarray(toks, np.int64), batches, rows, row_len,
                          budget, complete))
