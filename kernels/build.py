"""Decode and build, fused: big-endian tokens straight into training arrays (CPU reference).

Three layouts, all written into caller-owned int64 arrays:

* padded (SFT): one packet per row, truncated to ``max_len``; ``input_ids`` padded with
  ``pad_id``; ``labels`` equal to the token where its mask bit is 1 (or the packet has no mask)
  and ``IGNORE_INDEX`` (-100) at masked tokens and padding; ``attention_mask`` 1 then 0.
* packed (pretraining): the tokens of the rows, concatenated in order, read as one stream; window
  ``w`` is ``stream[start + w*T : start + w*T + T + 1]`` split into ``x[w] = window[:-1]`` and
  ``y[w] = window[1:]`` (``y`` is -100 where that token's mask bit is 0).
* packing (SFT, packed rows): documents laid end to end in rows (placed by
  ``ndp.loader.layouts.packing``):
  per document its tokens, labels (-100 at its first token), attention 1 and ``position_ids``
  from 0; padding elsewhere.

Which layouts shift labels (only packed), and why: ``ndp.loader.loader``, "Modes".

Callers pass only packets whose verdict is OK (``verdict``); layouts are read from the packet
header again here, so each row is independent. Every function takes ``lo, hi`` last: the range
of rows (windows) it fills, so ``ndp.engine.threads.parallel_for`` can split the work.
"""

from __future__ import annotations

import numpy as np
from ndp.wire.format import (
    HEADER_BYTES,
    IGNORE_INDEX,
    MASK_COUNT_BYTES,
    TYP_MASKED_TABLE,
    TYP_WIDTH_TABLE,
)
from ndp.kernels._jit import cpu_kernel
from ndp.engine.threads import parallel_for

#: tokens per thread at least: a hand-off to a worker costs ~100 us on a busy 2-core machine, so a
#: part must hold a few hundred microseconds of work (a single 64 x 1024 batch stays in one thread)
GRAIN_TOKENS = 131072


@cpu_kernel
def token_layout(shard, off, width_table, masked_table):  # pragma: no cover - compiled
    """(n_tokens, first token byte, first mask byte or -1, width) of a valid token packet."""
    typ = shard[off + 3]
    width = np.int64(width_table[typ])
    length = (np.int64(shard[off + 4]) << 8) | np.int64(shard[off + 5])
    p = off + HEADER_BYTES
    if masked_table[typ] != 0:
        n = (np.int64(shard[p]) << 8) | np.int64(shard[p + 1])
        tok = p + MASK_COUNT_BYTES
        return n, tok, tok + n * width, width
    return length // width, p, np.int64(-1), width


@cpu_kernel
def token_at(shard, tok, t, width):  # pragma: no cover - compiled
    """Token ``t`` of a payload whose tokens start at byte ``tok`` (big-endian)."""
    p = tok + t * width
    if width == 4:
        return (
            (np.int64(shard[p]) << 24)
            | (np.int64(shard[p + 1]) << 16)
            | (np.int64(shard[p + 2]) << 8)
            | np.int64(shard[p + 3])
        )
    return (np.int64(shard[p]) << 8) | np.int64(shard[p + 1])


@cpu_kernel
def in_loss(shard, mask, t):  # pragma: no cover - compiled
    """Whether token ``t`` is a training target (mask bit 1, or no mask at ``mask == -1``)."""
    if mask < 0:
        return True
    return ((np.int64(shard[mask + t // 8]) >> (t % 8)) & 1) == 1


@cpu_kernel
def copy_ids(shard, tok, t, count, width, out, at):  # pragma: no cover - compiled
    """``out[at + k]`` = token ``t + k`` of a payload whose tokens start at byte ``tok``, for
    ``k < count``. Unsigned indices: a signed one is tested for a negative value (Python's
    wrap-around) on every access, which keeps LLVM from vectorizing the loop."""
    base = np.uint64(tok) + np.uint64(t) * np.uint64(width)
    o = np.uint64(at)
    one = np.uint64(1)
    if width == 2:
        for k in range(np.uint64(0), np.uint64(count)):
            p = base + np.uint64(2) * k
            out[o + k] = (np.int64(shard[p]) << 8) | np.int64(shard[p + one])
    else:
        for k in range(np.uint64(0), np.uint64(count)):
            p = base + np.uint64(4) * k
            out[o + k] = ((np.int64(shard[p]) << 24) | (np.int64(shard[p + one]) << 16)
                          | (np.int64(shard[p + np.uint64(2)]) << 8)
                          | np.int64(shard[p + np.uint64(3)]))


@cpu_kernel
def copy_labels(shard, tok, mask, t, count, width, out, at):  # pragma: no cover - compiled
    """``copy_ids``, then ``IGNORE_INDEX`` where a token's mask bit is 0 (``mask >= 0``)."""
    copy_ids(shard, tok, t, count, width, out, at)
    if mask >= 0:
        for k in range(count):
            if not in_loss(shard, mask, t + k):
                out[at + k] = IGNORE_INDEX


@cpu_kernel
def fill(out, lo, hi, value):  # pragma: no cover - compiled
    """``out[lo:hi] = value`` (``0 <= lo``), with unsigned indices."""
    v = np.int64(value)
    for k in range(np.uint64(lo), np.uint64(max(lo, hi))):
        out[k] = v


@cpu_kernel
def _build_padded(shard, offsets, row_packet, pad_id, input_ids, labels, attention_mask, w_t, m_t,
                  lo, hi):  # pragma: no cover - compiled
    max_len = input_ids.shape[1]
    for r in range(lo, hi):
        off = np.int64(offsets[row_packet[r]])
        n, tok, mask, width = token_layout(shard, off, w_t, m_t)
        m = min(n, max_len)
        copy_ids(shard, tok, 0, m, width, input_ids[r], 0)
        copy_labels(shard, tok, mask, 0, m, width, labels[r], 0)
        fill(attention_mask[r], 0, m, 1)
        fill(input_ids[r], m, max_len, pad_id)
        fill(labels[r], m, max_len, IGNORE_INDEX)
        fill(attention_mask[r], m, max_len, 0)


def build_padded_cpu(
    shard: np.ndarray,
    offsets: np.ndarray,
    row_packet: np.ndarray,
    pad_id: int,
    input_ids: np.ndarray,
    labels: np.ndarray,
    attention_mask: np.ndarray,
) -> None:
    """Fill row ``r`` of the (R, L) int64 outputs from packet ``offsets[row_packet[r]]``, for
    every ``r < row_packet.shape[0]`` (valid token packets only). Synchronous; allocates
    nothing."""
    parallel_for(_build_padded, row_packet.shape[0], shard, offsets, row_packet, pad_id,
                 input_ids, labels, attention_mask, TYP_WIDTH_TABLE, TYP_MASKED_TABLE,
                 grain=max(1, GRAIN_TOKENS // max(1, input_ids.shape[1])))


@cpu_kernel
def _token_counts(shard, offsets, rows, counts, w_t, m_t, lo, hi):  # pragma: no cover
    for r in range(lo, hi):
        counts[r] = token_layout(shard, np.int64(offsets[rows[r]]), w_t, m_t)[0]


def token_counts_cpu(
    shard: np.ndarray, offsets: np.ndarray, rows: np.ndarray, n_rows: int, counts: np.ndarray
) -> None:
    """Token count of each valid row's packet into ``counts[:n_rows]``."""
    parallel_for(_token_counts, n_rows, shard, offsets, rows, counts, TYP_WIDTH_TABLE,
                 TYP_MASKED_TABLE, grain=4096)


@cpu_kernel
def _build_packed(shard, offsets, rows, cum, start, wins, x, y, w_t, m_t, lo,
                  hi):  # pragma: no cover - compiled
    seq = x.shape[1]
    for b in range(lo, hi):
        s = wins[b] if wins.shape[0] else start + b * seq  # stream position of x[b, 0]
        r = np.searchsorted(cum, s, side="right") - 1  # cum[r] <= s < cum[r + 1]
        t = s - cum[r]
        xb, yb = x[b], y[b]
        j = 0  # window position: token j of the window is x[b, j] (j < seq), y[b, j - 1] (j > 0)
        while j <= seq:
            n, tok, mask, width = token_layout(shard, np.int64(offsets[rows[r]]), w_t, m_t)
            if t >= n:  # move on to the next non-empty packet of the stream
                r += 1
                t = 0
                continue
            run = min(n - t, seq + 1 - j)  # window positions j .. j + run - 1 from this packet
            if j < seq:
                copy_ids(shard, tok, t, min(run, seq - j), width, xb, j)
            if j == 0:
                copy_labels(shard, tok, mask, t + 1, run - 1, width, yb, 0)
            else:
                copy_labels(shard, tok, mask, t, run, width, yb, j - 1)
            j += run
            t += run


def build_packed_cpu(
    shard: np.ndarray,
    offsets: np.ndarray,
    rows: np.ndarray,
    cum: np.ndarray,
    start: int,
    wins: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
) -> None:
    """Fill (W, T) int64 ``x``/``y`` with windows of T+1 tokens from the concatenated stream:
    window ``b`` from stream position ``start + b*T``, or ``wins[b]`` where ``wins`` is not
    empty (windows aligned to documents, ``ndp.loader.layouts.align``).

    ``cum`` is the exclusive prefix sum of the rows' token counts with the total appended
    (length ``n_rows + 1``); the caller guarantees every window's ``T + 1`` tokens lie before
    ``cum[-1]``. Synchronous; allocates nothing.
    """
    parallel_for(_build_packed, x.shape[0], shard, offsets, rows, cum, np.int64(start),
                 np.ascontiguousarray(wins, np.int64), x, y,
                 TYP_WIDTH_TABLE, TYP_MASKED_TABLE,
                 grain=max(1, GRAIN_TOKENS // max(1, x.shape[1])))


@cpu_kernel
def _build_packing(shard, offsets, doc_packet, doc_col, doc_len, row_docs, pad_id, input_ids,
                   labels, attention_mask, position_ids, w_t, m_t, lo, hi):  # pragma: no cover
    row_len = input_ids.shape[1]
    for r in range(lo, hi):
        ids, lab, att, pos = input_ids[r], labels[r], attention_mask[r], position_ids[r]
        fill(ids, 0, row_len, pad_id)
        fill(lab, 0, row_len, IGNORE_INDEX)
        fill(att, 0, row_len, 0)
        fill(pos, 0, row_len, 0)
        for d in range(row_docs[r], row_docs[r + 1]):
            n, tok, mask, width = token_layout(shard, np.int64(offsets[doc_packet[d]]), w_t, m_t)
            col, m = doc_col[d], doc_len[d]
            copy_ids(shard, tok, 0, m, width, ids, col)
            if m > 1:  # labels from the second token: none predicts this document's start
                copy_labels(shard, tok, mask, 1, m - 1, width, lab, col + 1)
            fill(att, col, col + m, 1)
            c = np.uint64(col)
            for t in range(np.uint64(0), np.uint64(m)):
                pos[c + t] = np.int64(t)


def build_packing_cpu(
    shard: np.ndarray,
    offsets: np.ndarray,
    doc_packet: np.ndarray,
    doc_col: np.ndarray,
    doc_len: np.ndarray,
    row_docs: np.ndarray,
    pad_id: int,
    input_ids: np.ndarray,
    labels: np.ndarray,
    attention_mask: np.ndarray,
    position_ids: np.ndarray,
) -> None:
    """Fill rows ``[0, row_docs.shape[0] - 1)`` of the (R, L) int64 outputs: row ``r`` holds
    documents ``row_docs[r] <= d < row_docs[r + 1]``, document ``d`` being the first
    ``doc_len[d]`` (<= L) tokens of packet ``offsets[doc_packet[d]]`` at column ``doc_col[d]``;
    the rest of the row is padding. Synchronous; allocates nothing."""
    parallel_for(_build_packing, row_docs.shape[0] - 1, shard, offsets, doc_packet, doc_col,
                 doc_len, row_docs, pad_id, input_ids, labels, attention_mask, position_ids,
                 TYP_WIDTH_TABLE, TYP_MASKED_TABLE,
                 grain=max(1, GRAIN_TOKENS // max(1, input_ids.shape[1])))


@cpu_kernel
def _build_documents(doc_cum, start, wins, position_ids, document_ids, lo,
                     hi):  # pragma: no cover - compiled
    seq = position_ids.shape[1]
    n = doc_cum.shape[0]
    for b in range(lo, hi):
        s = wins[b] if wins.shape[0] else start + b * seq  # the window's first token
        d0 = np.searchsorted(doc_cum, s, side="right") - 1  # the document it starts in
        d = d0
        for j in range(seq):
            p = s + j
            while d + 1 < n and doc_cum[d + 1] <= p:
                d += 1
            first = doc_cum[d] if doc_cum[d] > s else s
            position_ids[b, j] = p - first
            document_ids[b, j] = d - d0


def build_documents_cpu(doc_cum: np.ndarray, start: int, wins: np.ndarray,
                        position_ids: np.ndarray, document_ids: np.ndarray) -> None:
    """Packed windows' document boundaries (``documents=True``): of (W, T) ``position_ids``
    (int64) and ``document_ids`` (int32), token ``j`` of window ``b`` (stream position
    ``p = start + b*T + j``, or ``wins[b] + j`` where ``wins`` is not empty) gets its place in its
    document counted from the window's start
    (``p - max(start + b*T, doc_cum[d])``, ``d`` its document: the last ``doc_cum <= p``) and
    its document's number in the window (0 for the one the window starts in). ``doc_cum``:
    the stream positions where documents start, ascending, the first at or before ``start``.
    Synchronous; allocates nothing; reads no packet."""
    parallel_for(_build_documents, position_ids.shape[0], doc_cum, np.int64(start),
                 np.ascontiguousarray(wins, np.int64), position_ids, document_ids,
                 grain=max(1, GRAIN_TOKENS // max(1, position_ids.shape[1])))
