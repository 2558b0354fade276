"""Document boundaries in ``packed`` windows (``Loader(documents=True)``): per window its
tokens' ``position_ids`` (restarting at each document and at the window's start),
``document_ids`` (0 for the document the window starts in, then 1, 2, ...), and per batch the
``cu_seqlens`` of its flattened ``(B*T)`` tokens, every window and every document inside one a
segment of its own: the inputs of FlashAttention's varlen kernels (``cu_seqlens``,
``position_ids``) and of a FlexAttention or SDPA document mask (``document_ids``).

A document starts at each valid packet of the stream (a packed stream is documents end to
end), or, with documents split over packets (``ndp.loader.units``), at the first valid packet
of each place. The host lays out, per chunk, where they start in the stream (``doc_cum``) and
the ``cu_seqlens`` (a few NumPy calls over the chunk's documents); the build kernels
(``ndp.kernels.build.build_documents_cpu``, ``build_cuda.build_documents_cuda``) write the
two (W, T) arrays from ``doc_cum`` alone, reading no packet.
"""

from __future__ import annotations

from typing import Any

import numpy as np

def add_documents(layout: Any, ex: Any, *, batch_size: int, seq_len: int) -> Any:
    """``layout`` (a ``packed_layout`` of a chunk, ``ex`` its places' packets or None) with
    its documents: ``build["doc_cum"]``, ``build["cu_seqlens"]`` (every batch's, one after the
    other) and the row offsets of the three outputs."""
    build = layout.build
    rows, cum, start = build["rows"], build["cum"], int(build["start"])
    starts = cum[:-1]
    if ex is not None and rows.shape[0]:  # a place's first valid packet starts its document
        place = ex.place_of[rows]
        starts = starts[np.concatenate([[True], place[1:] != place[:-1]])]
    doc_cum = np.ascontiguousarray(starts if starts.shape[0] else np.zeros(1), np.int64)
    n, B, T = layout.n, batch_size, seq_len
    per = B * T
    inner = doc_cum[(doc_cum > start) & (doc_cum < start + n * per)] - start
    edges = np.union1d(np.arange(n * B + 1, dtype=np.int64) * T, inner[inner % T != 0])
    batch = np.arange(n + 1, dtype=np.int64) * per
    lo = np.searchsorted(edges, batch[:-1], side="left")
    hi = np.searchsorted(edges, batch[1:], side="right")
    counts = hi - lo
    at = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    take = np.arange(int(at[-1]), dtype=np.int64) - np.repeat(at[:-1] - lo, counts)
    cu = edges[take] - np.repeat(batch[:-1], counts)
    build["doc_cum"], build["cu_seqlens"] = doc_cum, cu.astype(np.int32)
    layout.rows["position_ids"] = layout.rows["document_ids"] = layout.rows["x"]
    layout.rows["cu_seqlens"] = at
    return layout
