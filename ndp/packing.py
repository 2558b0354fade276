"""Sequence packing: short SFT examples laid end to end in full rows, with the per-document
``position_ids`` and ``cu_seqlens`` that keep attention (and the loss) inside each document.

The plan is made on the host from the examples' lengths alone; the tokens move on the device
that holds them (CuPy on a GPU, NumPy otherwise), by one gather per output array.

Layout of a batch of ``B`` rows of ``L`` tokens:

* examples are placed in order, each truncated to ``L``; an example that does not fit in what is
  left of a row starts the next row; a batch ends when the next example would need row ``B``;
* ``input_ids`` (pad elsewhere), ``labels`` (-100 at padding, at masked prompt tokens and at the
  first token of every document, so no document learns to predict the next one's start),
  ``attention_mask`` (1 on document tokens), ``position_ids`` (0, 1, ... from each document's
  start; 0 on padding);
* ``cu_seqlens`` (int32): boundaries of the segments of the flattened (B*L) batch: every
  document, and each row's padding as a segment of its own; ``max_seqlen`` is the longest. This
  is what variable-length attention kernels (FlashAttention's ``*_varlen_*``) take.
"""

from __future__ import annotations

import numpy as np

from ndp.format import IGNORE_INDEX
from ndp.kernels._jit import cpu_kernel


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


def layout(lengths: np.ndarray, where_row: np.ndarray, where_col: np.ndarray, *, rows: int,
           row_len: int) -> dict[str, np.ndarray]:
    """Host-side index arrays for placed examples ``lengths`` (already cut to ``row_len``):
    ``src`` (flat source position in the padded (n, L) decode, -1 on padding), ``first``
    (document starts), ``position_ids``, ``cu_seqlens``."""
    n = lengths.shape[0]
    total = rows * row_len
    src = np.full(total, -1, np.int64)
    position_ids = np.zeros(total, np.int64)
    if n:
        t = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        doc = np.repeat(np.arange(n), lengths)
        dst = np.repeat(where_row * row_len + where_col, lengths) + t
        src[dst] = doc * row_len + t
        position_ids[dst] = t
    first = np.zeros(total, bool)
    starts = (where_row * row_len + where_col)[lengths > 0]
    first[starts] = True
    ends = np.empty(n + rows, np.int64)
    k = int(_segments(np.ascontiguousarray(lengths, np.int64), where_row, rows, row_len, ends))
    cu = np.concatenate([[0], ends[:k]]).astype(np.int32)
    return {"src": src, "first": first, "position_ids": position_ids.reshape(rows, row_len),
            "cu_seqlens": cu, "max_seqlen": int(np.diff(cu).max()) if cu.shape[0] > 1 else 0}


def gather(xp, padded_ids, padded_labels, idx: dict, *, pad_id: int, rows: int,
           row_len: int) -> dict:
    """The packed batch from a padded decode, with array module ``xp`` (numpy or cupy)."""
    src = xp.asarray(idx["src"])
    hole = src < 0
    safe = xp.where(hole, 0, src)
    ids = xp.take(padded_ids.reshape(-1), safe)
    labels = xp.take(padded_labels.reshape(-1), safe)
    ids = xp.where(hole, pad_id, ids).reshape(rows, row_len)
    labels = xp.where(hole | xp.asarray(idx["first"]), IGNORE_INDEX, labels).reshape(rows, row_len)
    return {
        "input_ids": ids,
        "labels": labels,
        "attention_mask": (~hole).astype(np.int64).reshape(rows, row_len),
        "position_ids": xp.asarray(idx["position_ids"]),
        "cu_seqlens": xp.asarray(idx["cu_seqlens"]),
    }
