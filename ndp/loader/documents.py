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
    wins = build.get("wins")
    build["cu_seqlens"], at = (
        _cu_seqlens(doc_cum, int(build["start"]), layout.n, batch_size, seq_len)
        if wins is None else _cu_seqlens_at(doc_cum, wins, layout.n, batch_size, seq_len))
    layout.rows["position_ids"] = layout.rows["document_ids"] = layout.rows["x"]
    layout.rows["cu_seqlens"] = at
    return layout


def _cu_seqlens_at(doc_cum: np.ndarray, wins: np.ndarray, n: int, B: int, T: int
                   ) -> tuple[np.ndarray, np.ndarray]:
    """``_cu_seqlens`` of windows that start at stream positions ``wins`` (``align="bos"``,
    ``ndp.loader.align``): per window its start, then the documents starting inside it."""
    lo = np.searchsorted(doc_cum, wins, side="right")  # the first document past its start
    hi = np.searchsorted(doc_cum, wins + T, side="left")  # the first at or past its end
    k = (hi - lo).astype(np.int64)
    w = np.arange(wins.shape[0], dtype=np.int64)
    batch = w // B
    first = np.cumsum(1 + k) - (1 + k) + batch  # where each window's start goes
    at = np.concatenate([[0], np.cumsum(k.reshape(n, B).sum(axis=1) + B + 1)]).astype(np.int64)
    cu = np.empty(int(at[-1]), np.int64)
    cu[first] = (w % B) * T
    win_of = np.repeat(w, k)
    j = np.arange(win_of.shape[0], dtype=np.int64) - (np.cumsum(k) - k)[win_of]
    cu[first[win_of] + 1 + j] = (win_of % B) * T + doc_cum[lo[win_of] + j] - wins[win_of]
    cu[at[1:] - 1] = B * T
    return cu.astype(np.int32), at


def _cu_seqlens(doc_cum: np.ndarray, start: int, n: int, B: int, T: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """Every batch's ``cu_seqlens``, one after the other, and where each begins: batch ``i``'s
    are its windows' starts ``0, T, .., B*T`` merged with the documents starting inside a
    window (stream positions ``doc_cum``, the chunk's first window at ``start``). Merged by
    their ranks, without a sort: a window start is preceded by the documents before it, a
    document by the window starts at or before it."""
    per = B * T
    inner = doc_cum[(doc_cum > start) & (doc_cum < start + n * per)] - start
    inner = inner[inner % T != 0]  # a document starting at a window's start adds nothing
    b_of = inner // per
    k = np.bincount(b_of, minlength=n)
    at = np.concatenate([[0], np.cumsum(k + B + 1)]).astype(np.int64)
    first = np.concatenate([[0], np.cumsum(k)])[:-1]
    cu = np.empty(int(at[-1]), np.int64)
    rel = inner - b_of * per
    cu[at[b_of] + rel // T + 1 + np.arange(inner.shape[0]) - first[b_of]] = rel
    w = np.arange(B + 1, dtype=np.int64)
    grid = (np.arange(n, dtype=np.int64) * per)[:, None] + w * T  # (n, B + 1) chunk positions
    below = np.searchsorted(inner, grid.ravel()).reshape(n, B + 1) - first[:, None]
    cu[(at[:-1, None] + w + below).ravel()] = np.broadcast_to(w * T, (n, B + 1)).ravel()
    return cu.astype(np.int32), at
