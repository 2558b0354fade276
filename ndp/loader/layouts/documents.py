"""Document boundaries in ``packed`` windows (``Loader(documents=True)``): per window its
tokens' ``position_ids`` (restarting at each document and at the window's start),
``document_ids`` (0 for the document the window starts in, then 1, 2, ...), and per batch the
``cu_seqlens`` of its flattened ``(B*T)`` tokens, every window and every document inside one a
segment of its own: the inputs of FlashAttention's varlen kernels (``cu_seqlens``,
``position_ids``) and of a FlexAttention or SDPA document mask (``document_ids``).

A document starts at each valid packet of the stream (a packed stream is documents end to
end), or, with documents split over packets (``ndp.loader.ordering.units``), at the first valid
packet
of each place. The host lays out, per chunk, where they start in the stream (``doc_cum``) and
the ``cu_seqlens`` (one compiled pass over the chunk's windows and documents); the build kernels
(``ndp.kernels.build.build_documents_cpu``, ``build_cuda.build_documents_cuda``) write the
two (W, T) arrays from ``doc_cum`` alone, reading no packet.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ndp.engine.cpu import NO_WINS
from ndp.kernels._jit import cpu_kernel


def document_starts(rows: np.ndarray, cum: np.ndarray, place_of: np.ndarray | None
                    ) -> np.ndarray:
    """Where a chunk's documents start in its stream: at each valid packet (``rows``, whose
    stream positions are ``cum[:-1]``), or with documents split over packets (``place_of``:
    each of the chunk's packets' place) at each place's first valid packet."""
    starts = cum[:-1]
    if place_of is not None and rows.shape[0]:  # a place's first valid packet starts it
        place = place_of[rows]
        starts = starts[np.concatenate([[True], place[1:] != place[:-1]])]
    return np.ascontiguousarray(starts, np.int64)


def add_documents(layout: Any, ex: Any, *, batch_size: int, seq_len: int) -> Any:
    """``layout`` (a ``packed_layout`` of a chunk, ``ex`` its places' packets or None) with
    its documents: ``build["doc_cum"]``, ``build["cu_seqlens"]`` (every batch's, one after the
    other) and the row offsets of the three outputs."""
    build = layout.build
    starts = build.get("doc_starts")
    if starts is None:
        starts = document_starts(build["rows"], build["cum"],
                                 None if ex is None else ex.place_of)
    doc_cum = starts if starts.shape[0] else np.zeros(1, np.int64)
    build["doc_cum"] = doc_cum
    build["cu_seqlens"], at = _cu_seqlens(doc_cum, int(build["start"]),
                                          build.get("wins", NO_WINS), layout.n, batch_size,
                                          seq_len)
    layout.rows["position_ids"] = layout.rows["document_ids"] = layout.rows["x"]
    layout.rows["cu_seqlens"] = at
    return layout


@cpu_kernel
def _segments(doc_cum, start, wins, n, B, T, cu, at):  # pragma: no cover - compiled
    k = 0
    d = 0
    m = doc_cum.shape[0]
    for b in range(n):
        at[b] = k
        for w in range(B):
            s = wins[b * B + w] if wins.shape[0] else start + (b * B + w) * T
            cu[k] = w * T
            k += 1
            while d < m and doc_cum[d] <= s:  # one at the window's start adds nothing
                d += 1
            while d < m and doc_cum[d] < s + T:
                cu[k] = w * T + doc_cum[d] - s
                k += 1
                d += 1
        cu[k] = B * T
        k += 1
    at[n] = k
    return k


def _cu_seqlens(doc_cum: np.ndarray, start: int, wins: np.ndarray, n: int, B: int, T: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Every batch's ``cu_seqlens``, one after the other, and where each begins (``n + 1``
    offsets): batch ``i``'s are, window by window, the window's start (``0, T, ..``) and the
    documents starting inside it (stream positions ``doc_cum``), then ``B*T``. Window ``w``
    of the chunk starts at ``start + w*T``, or at ``wins[w]`` where ``wins`` is not empty
    (windows at documents, ``ndp.loader.layouts.align``). One compiled pass over the windows and
    documents."""
    cu = np.empty(n * (B + 1) + doc_cum.shape[0], np.int32)
    at = np.empty(n + 1, np.int64)
    k = int(_segments(doc_cum, np.int64(start), np.ascontiguousarray(wins, np.int64),
                      np.int64(n), np.int64(B), np.int64(T), cu, at))
    return cu[:k], at
