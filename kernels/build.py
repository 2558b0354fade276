"""Decode and build, fused: big-endian tokens straight into training arrays (CPU reference).

Two layouts, both written into caller-owned int64 arrays:

* padded (SFT): one packet per row, truncated to ``max_len``; ``input_ids`` padded with
  ``pad_id``; ``labels`` equal to the token where its mask bit is 1 (or the packet has no mask)
  and ``IGNORE_INDEX`` (-100) at masked tokens and padding; ``attention_mask`` 1 then 0.
* packed (pretraining): the tokens of the rows, concatenated in order, read as one stream; row
  ``b`` of the batch is the window ``stream[start + b*T : start + b*T + T + 1]`` split into
  ``x = window[:-1]`` and ``y = window[1:]`` (``y`` is -100 where that token's mask bit is 0).

Callers pass only packets whose validation status is OK (see ``compact``); layouts are read
from the packet header again here, so each row is independent and runs on any core.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ndp.format import (
    HEADER_BYTES,
    IGNORE_INDEX,
    MASK_COUNT_BYTES,
    TYP_MASKED_TABLE,
    TYP_WIDTH_TABLE,
)
from ndp.kernels._jit import cpu_kernel, cpu_parallel_kernel


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


@cpu_parallel_kernel
def _build_padded(
    shard, offsets, rows, n_rows, pad_id, input_ids, labels, attention_mask, lengths, w_t, m_t
):  # pragma: no cover - compiled
    max_len = input_ids.shape[1]
    for r in prange(n_rows):
        off = np.int64(offsets[rows[r]])
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
        lengths[r] = n


def build_padded_cpu(
    shard: np.ndarray,
    offsets: np.ndarray,
    rows: np.ndarray,
    n_rows: int,
    pad_id: int,
    input_ids: np.ndarray,
    labels: np.ndarray,
    attention_mask: np.ndarray,
    lengths: np.ndarray,
) -> None:
    """Fill rows ``[0, n_rows)`` of the (R, L) int64 outputs from packets ``offsets[rows[r]]``.

    ``lengths[r]`` receives the packet's full token count (before truncation to L), so the
    caller can count truncated tokens. Synchronous; allocates nothing.
    """
    _build_padded(
        shard, offsets, rows, n_rows, pad_id, input_ids, labels, attention_mask, lengths,
        TYP_WIDTH_TABLE, TYP_MASKED_TABLE,
    )


@cpu_parallel_kernel
def _token_counts(shard, offsets, rows, n_rows, counts, w_t, m_t):  # pragma: no cover
    for r in prange(n_rows):
        counts[r] = token_layout(shard, np.int64(offsets[rows[r]]), w_t, m_t)[0]


def token_counts_cpu(
    shard: np.ndarray, offsets: np.ndarray, rows: np.ndarray, n_rows: int, counts: np.ndarray
) -> None:
    """Token count of each valid row's packet into ``counts[:n_rows]``."""
    _token_counts(shard, offsets, rows, n_rows, counts, TYP_WIDTH_TABLE, TYP_MASKED_TABLE)


@cpu_parallel_kernel
def _build_packed(shard, offsets, rows, cum, start, x, y, w_t, m_t):  # pragma: no cover
    n_batch, seq = x.shape
    for b in prange(n_batch):
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
    """Fill (B, T) int64 ``x``/``y`` with windows of T+1 tokens from the concatenated stream.

    ``cum`` is the exclusive prefix sum of the rows' token counts with the total appended
    (length ``n_rows + 1``); the caller guarantees ``start + B*T + 1 <= cum[-1]``.
    Synchronous; allocates nothing.
    """
    _build_packed(shard, offsets, rows, cum, start, x, y, TYP_WIDTH_TABLE, TYP_MASKED_TABLE)
