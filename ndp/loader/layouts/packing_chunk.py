"""Packing's layout of a whole chunk in one compiled pass
(``ndp.loader.layouts.layout.packing_layout``).

Per batch, as ``ndp.loader.layouts.packing`` places examples: its candidates are the packets whose
index token counts fill its ``B`` rows of ``L`` (or its token ``budget``), at least one
(``packing._candidates_end``); of those, the valid ones (verdicts) are placed in order, each cut
to ``L``; the batch ends at the first that does not fit, and the next batch starts there. Where
a batch's candidates run past the chunk, the chunk ends before it (the next chunk has it),
unless the share ends there. What each batch takes, its documents' rows, columns and lengths,
its ``cu_seqlens`` and what it kept and cut are written into arrays; nothing per batch is a
Python object, so a chunk of 64 batches is one call.
"""

from __future__ import annotations

import numpy as np

from ndp.kernels._jit import cpu_kernel
from ndp.loader.layouts.packing import _candidates_end, _plan, _segments


@cpu_kernel
def _packing_chunk(verdicts, toks, rows, row_len, budget, max_batches, share_ends, complete,
                   bounds, row_at, cu_at, kept, cut, doc_packet, doc_row, doc_col, doc_len, cu,
                   s_idx, s_len, s_row, s_col):  # pragma: no cover - compiled
    n = verdicts.shape[0]
    at = 0
    nb = 0
    nd = 0
    ncu = 0
    total_rows = 0
    bounds[0] = 0
    row_at[0] = 0
    cu_at[0] = 0
    while at < n and nb < max_batches:
        q = _candidates_end(toks, at, rows, row_len, budget, complete)
        if q < 0 or q > n:
            if not share_ends:
                break  # its candidates are not all in the chunk: the next chunk has it
            q = n
        nv = 0
        for j in range(at, q):
            if verdicts[j] >= 0:
                s_idx[nv] = j
                s_len[nv] = min(verdicts[j], row_len)
                nv += 1
        limit = rows if budget == 0 else nv + 1  # a budget's candidates all fit it
        placed = _plan(s_len[:nv], limit, row_len, s_row, s_col)
        n_rows = rows
        if budget > 0:
            n_rows = s_row[placed - 1] + 1 if placed else 1
        taken = s_idx[placed] - at if placed < nv else q - at
        k_sum = 0
        c_sum = 0
        for k in range(placed):
            doc_packet[nd] = s_idx[k]
            doc_row[nd] = total_rows + s_row[k]
            doc_col[nd] = s_col[k]
            doc_len[nd] = s_len[k]
            nd += 1
            k_sum += s_len[k]
            c_sum += max(verdicts[s_idx[k]] - row_len, 0)
        cu[ncu] = 0  # the batch's segments: each document, then each row's padding
        ncu += 1
        ncu += _segments(s_len[:placed], s_row[:placed], n_rows, row_len, cu[ncu:])
        kept[nb] = k_sum
        cut[nb] = c_sum
        at += taken
        nb += 1
        total_rows += n_rows
        bounds[nb] = at
        row_at[nb] = total_rows
        cu_at[nb] = ncu
    return nb, nd, ncu


def packing_chunk(verdicts: np.ndarray, toks: np.ndarray, *, rows: int, row_len: int,
                  budget: int, max_batches: int, share_ends: bool, complete: bool) -> dict:
    """The chunk's batches (module docstring): ``verdicts`` of its packets, ``toks`` the
    index token counts of the share from its first packet on (its packets', and one more
    where the share goes on: whether a batch's candidates end at the chunk's end is decided
    by the packet after it; ``complete``: ``toks`` runs to the share's end). Arrays:
    ``bounds`` (the chunk packet where each batch starts, and the end), ``row_at`` and
    ``cu_at`` (each batch's first output row and ``cu_seqlens`` element, and the ends),
    ``kept`` and ``cut`` (tokens each batch delivers and cuts at ``row_len``), per document
    ``doc_packet``, ``doc_row``, ``doc_col``, ``doc_len``, and ``cu_seqlens``."""
    v = np.ascontiguousarray(verdicts, np.int64)
    n = v.shape[0]
    most = max(int(max_batches), 0)
    per = np.zeros(most + 1, np.int64)
    bounds, row_at, cu_at = per, per.copy(), per.copy()
    kept, cut = np.zeros(most, np.int64), np.zeros(most, np.int64)
    docs = [np.empty(n, np.int64) for _ in range(4)]
    scratch = [np.empty(n, np.int64) for _ in range(4)]
    cu = np.empty(2 * n + most * (rows + 2) + 2, np.int64)
    nb, nd, ncu = _packing_chunk(v, np.ascontiguousarray(toks, np.int64), rows, row_len,
                                 budget, most, share_ends, complete, bounds, row_at, cu_at,
                                 kept, cut, *docs, cu, *scratch)
    return {"bounds": bounds[:nb + 1], "row_at": row_at[:nb + 1], "cu_at": cu_at[:nb + 1],
            "kept": kept[:nb], "cut": cut[:nb], "doc_packet": docs[0][:nd],
            "doc_row": docs[1][:nd], "doc_col": docs[2][:nd], "doc_len": docs[3][:nd],
            "cu_seqlens": cu[:ncu].astype(np.int32)}
