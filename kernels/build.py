"""Decode and build, fused: big-endian tokens straight into training arrays (CPU reference).

Three layouts, all written into caller-owned int64 arrays:

* padded (SFT): one packet per row, truncated to ``max_len``; ``input_ids`` padded with
  ``pad_id``; ``labels`` equal to the token where its mask bit is 1 (or the packet has no mask)
  and ``IGNORE_INDEX`` (-100) at masked tokens and padding; ``attention_mask`` 1 then 0.
* packed (pretraining): the tokens of the rows, concatenated in order, read as one stream; window
  ``w`` is ``stream[start + w*T : start + w*T + T + 1]`` split into ``x[w] = window[:-1]`` and
  ``y[w] = window[1:]`` (``y`` is -100 where that token's mask bit is 0).
* packing (SFT, packed rows): documents laid end to end in rows (placed by ``ndp.packing``):
  per document its tokens, labels (-100 at its first token, so no document learns to predict
  the next one's start), attention 1 and ``position_ids`` from 0; padding elsewhere.

Callers pass only packets whose verdict is OK (``verdict``); layouts are read from the packet
header again here, so each row is independent. Every function takes ``lo, hi`` last: the range
of rows (windows) it fills, so ``ndp.threads.parallel_for`` can split the work.
"""

from __future__ import annotations

import numpy as np
from ndp.format import (
    HEADER_BYTES,
    IGNORE_INDEX,
    MASK_COUNT_BYTES,
    TYP_MASKED_TABLE,
    TYP_WIDTH_TABLE,
)
from ndp.kernels._jit import cpu_kernel
from ndp.threads import parallel_for

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
def _build_padded(shard, offsets, row_packet, pad_id, input_ids, labels, attention_mask, w_t, m_t,
                  lo, hi):  # pragma: no cover - compiled
    max_len = input_ids.shape[1]
    for r in range(lo, hi):
        off = np.int64(offsets[row_packet[r]])
        n, tok, mask, width = token_layout(shard, off, w_t, m_t)
        m = min(n, max_len)
        for t in range(m):
            value = token_at(shard, tok, t, width)
            input_ids[r, t] = value
            labels[r, t] = value if in_loss(shard, mask, t) else IGNORE_INDEX
            attention_mask[r, t] = 1
        for t in range(m, max_len):
            input_ids[r, t] = pad_id
            labels[r, t] = IGNORE_INDEX
            attention_mask[r, t] = 0


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
def _build_packed(shard, offsets, rows, cum, start, x, y, w_t, m_t, lo, hi):  # pragma: no cover
    seq = x.shape[1]
    for b in range(lo, hi):
        s = start + b * seq  # stream position of x[b, 0]
        r = np.searchsorted(cum, s, side="right") - 1  # cum[r] <= s < cum[r + 1]
        n, tok, mask, width = token_layout(shard, np.int64(offsets[rows[r]]), w_t, m_t)
        t = s - cum[r]
        for j in range(seq + 1):
            while t >= n:  # move on to the next non-empty packet of the stream
                r += 1
                t = 0
                n, tok, mask, width = token_layout(shard, np.int64(offsets[rows[r]]), w_t, m_t)
            value = token_at(shard, tok, t, width)
            if j < seq:
                x[b, j] = value
            if j > 0:
                y[b, j - 1] = value if in_loss(shard, mask, t) else IGNORE_INDEX
            t += 1


def build_packed_cpu(
    shard: np.ndarray,
    offsets: np.ndarray,
    rows: np.ndarray,
    cum: np.ndarray,
    start: int,
    x: np.ndarray,
    y: np.ndarray,
) -> None:
    """Fill (W, T) int64 ``x``/``y`` with windows of T+1 tokens from the concatenated stream.

    ``cum`` is the exclusive prefix sum of the rows' token counts with the total appended
    (length ``n_rows + 1``); the caller guarantees ``start + W*T + 1 <= cum[-1]``.
    Synchronous; allocates nothing.
    """
    parallel_for(_build_packed, x.shape[0], shard, offsets, rows, cum, np.int64(start), x, y,
                 TYP_WIDTH_TABLE, TYP_MASKED_TABLE,
                 grain=max(1, GRAIN_TOKENS // max(1, x.shape[1])))


@cpu_kernel
def _build_packing(shard, offsets, doc_packet, doc_col, doc_len, row_docs, pad_id, input_ids,
                   labels, attention_mask, position_ids, w_t, m_t, lo, hi):  # pragma: no cover
    row_len = input_ids.shape[1]
    for r in range(lo, hi):
        for c in range(row_len):
            input_ids[r, c] = pad_id
            labels[r, c] = IGNORE_INDEX
            attention_mask[r, c] = 0
            position_ids[r, c] = 0
        for d in range(row_docs[r], row_docs[r + 1]):
            n, tok, mask, width = token_layout(shard, np.int64(offsets[doc_packet[d]]), w_t, m_t)
            col = doc_col[d]
            for t in range(doc_len[d]):
                value = token_at(shard, tok, t, width)
                input_ids[r, col + t] = value
                if t > 0 and in_loss(shard, mask, t):
                    labels[r, col + t] = value
                attention_mask[r, col + t] = 1
                position_ids[r, col + t] = t


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
