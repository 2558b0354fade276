"""From verdicts to batches: how a chunk's packets become training batches (host side).

A chunk is a run of consecutive packets of this rank's order. Once its verdicts are known
(``ndp.kernels.verdict``: per packet its token count, or minus its drop reason), everything
about its batches follows on the host from that one small array, for every backend alike:
which packet fills which row, which windows are whole, how many tokens each batch delivers,
cuts or leaves, what it drops and why, and the loader state after it. The kernels then build
all of the chunk's batches in one launch.

Each layout is the one the Loader has always delivered, batch for batch (see ``ndp.loader.loader``):

* ``padded_layout``: batch ``j`` takes packets ``[jB, jB + B)``; its rows are the valid ones, in
  order, so a corrupt packet makes its batch one row shorter (and a batch whose packets are all
  dropped has no row: ``stats.empty_batches``, warned about once; every rank still delivers as
  many batches).
* ``packed_layout``: the valid tokens of the chunk form one stream; batch ``i`` is the ``B``
  windows of ``T + 1`` tokens from ``tok + i*B*T``. After each batch the state moves past the
  packets the next window no longer needs, so it stays a small (packet, token) pair.
* ``packing_layout``: per batch, the candidates are the packets whose index lengths fill ``B``
  rows; the valid ones among them are placed end to end (``ndp.loader.packing``), and the batch ends
  at the first that does not fit.

Every packet is counted once, by the batch that reaches it (or at the epoch's end).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import numpy as np

from ndp.loader.packing import plan as place, segments
from ndp.kernels.verdict import count, count_segments, tokens_of



@dataclass
class Batch:
    """One batch of a chunk: the rows (start, stop) it takes of each of the chunk's output
    arrays, the loader state after it, and what it counted (``LoaderStats.add``)."""

    rows: dict[str, tuple[int, int]]
    state: dict[str, int]
    counted: dict[str, Any]


@dataclass
class Layout:
    """A chunk's batches and what the build kernels need for them.

    ``packets_used``: how many of the chunk's packets its batches took (the next chunk starts
    there, or, in packed mode, where ``batches[-1].state`` says). ``end`` is set when the
    share ended inside this chunk: what the epoch's end counted."""

    batches: list[Batch]
    build: dict[str, Any] = field(default_factory=dict)
    packets_used: int = 0
    end: dict[str, Any] | None = None


def _sums(values: np.ndarray, bounds: np.ndarray) -> list[int]:
    """The sum of ``values`` over each segment between consecutive ``bounds``."""
    cum = np.concatenate([[0], np.cumsum(values)])
    return np.diff(cum[bounds]).tolist()


def padded_layout(verdicts: np.ndarray, *, batch_size: int, max_len: int, pos: int,
                  ends: np.ndarray | None = None) -> Layout:
    """Batches of ``batch_size`` packets from share position ``pos`` (or ending at ``ends``,
    the chunk packets where batches cut by a token budget end by the index); the build plan
    is ``row_packet`` (the chunk packet of each output row; batch ``j``'s rows are
    consecutive)."""
    n = verdicts.shape[0]
    valid = verdicts >= 0
    row_packet = np.flatnonzero(valid).astype(np.int64)
    bounds = (np.append(np.arange(0, n, batch_size), n) if ends is None
              else np.concatenate([[0], ends]).astype(np.int64))
    rows_before = np.concatenate([[0], np.cumsum(valid)])[bounds].tolist()
    tokens = tokens_of(verdicts)
    kept = _sums(np.minimum(tokens, max_len), bounds)
    total = _sums(tokens, bounds)
    batches = []
    edges = bounds.tolist()  # Python ints: indexing the array per batch costs more
    for j, counted in enumerate(count_segments(verdicts, bounds)):
        a, b = edges[j], edges[j + 1]
        counted["tokens"] = kept[j]
        counted["truncated_tokens"] = total[j] - kept[j]
        counted["_range"] = (pos + a, pos + b)
        rows = (rows_before[j], rows_before[j + 1])
        if rows[0] == rows[1]:  # every packet dropped: a batch of no row (counted, warned)
            counted["empty_batches"] = 1
        batches.append(Batch({"input_ids": rows, "labels": rows, "attention_mask": rows},
                             {"pos": pos + b, "tok": 0}, counted))
    return Layout(batches, {"row_packet": row_packet}, packets_used=n)


def packed_layout(verdicts: np.ndarray, *, batch_size: int, seq_len: int, pos: int, tok: int,
                  counted_from: int, max_batches: int, share_ends: bool,
                  final: bool = False, units: np.ndarray | None = None) -> Layout:
    """Up to ``max_batches`` batches of windows from stream token ``tok`` of the chunk (which
    starts at share position ``pos``). ``counted_from``: the first chunk packet no earlier batch
    counted. ``share_ends``: the chunk runs to the end of this rank's share, so what its
    batches leave is the epoch's end (``Layout.end``: the rest of its packets, and the tokens
    left unused); so is ``final`` when the batches are all ``max_batches``: the chunk ends
    the epoch's last batch and holds the rest of the share. ``units``: where each place's
    packets start among the chunk's (and their end), when a place holds several (a document,
    ``ndp.loader.units``): a batch that reaches a place's first packet counts all of them. The
    build plan is ``rows``, ``cum`` (stream position of each row, and the total), ``start``
    and ``windows``."""
    per_batch = batch_size * seq_len
    counted_from = min(counted_from, verdicts.shape[0])
    tokens = tokens_of(verdicts)
    run = np.cumsum(tokens)  # stream position after each packet
    starts = run - tokens  # stream position of each packet's first token
    total = int(run[-1]) if run.shape[0] else 0
    n_batches = max(0, min(max_batches, (total - tok - 1) // per_batch))
    rows = np.flatnonzero(verdicts >= 0).astype(np.int64)
    cum = np.concatenate([[0], np.cumsum(tokens[rows])]).astype(np.int64)
    ends = tok + np.arange(1, n_batches + 1, dtype=np.int64) * per_batch  # next batch's start
    # the packets each batch reaches: those starting before one past the last token it reads
    reached = np.maximum.accumulate(np.maximum(
        np.searchsorted(starts, ends + 1, side="left"), counted_from))
    if units is not None:  # to the end of the place (document) reached
        reached = units[np.searchsorted(units, reached, side="left")]
    bounds = np.concatenate([[counted_from], reached])
    skips = np.searchsorted(run, ends, side="right").tolist()  # packets wholly before it
    run_list = run.tolist()
    batches = []
    for i, counted in enumerate(count_segments(verdicts, bounds)):
        counted["tokens"] = per_batch
        counted["_range"] = (pos + int(bounds[i]), pos + int(bounds[i + 1]))
        skip = skips[i]
        state = {"pos": pos + skip, "tok": int(ends[i]) - (run_list[skip - 1] if skip else 0)}
        batches.append(Batch({"x": (i * batch_size, (i + 1) * batch_size),
                              "y": (i * batch_size, (i + 1) * batch_size)}, state, counted))
    first = int(bounds[-1])
    layout = Layout(batches, {"rows": rows, "cum": cum, "start": tok,
                              "windows": n_batches * batch_size},
                    packets_used=first)
    if (share_ends and n_batches < max_batches) or (final and n_batches == max_batches):
        end = count(verdicts[first:])
        end["unused_tokens"] = max(total - tok - n_batches * per_batch, 0)
        end["_range"] = (pos + first, pos + verdicts.shape[0])
        layout.end = end
        layout.packets_used = verdicts.shape[0]
    return layout


def packing_layout(verdicts: np.ndarray, candidates: Callable[[int], int], *, batch_size: int,
                   row_len: int, pos: int, max_batches: int, share_ends: bool,
                   budget: int = 0) -> Layout:
    """Up to ``max_batches`` packed-row batches from share position ``pos``.
    ``candidates(at)``: where the candidates of a batch starting at chunk packet ``at`` end
    (chosen by the index's token counts before decoding, as ``ndp.loader.plan.Plan.candidates``); a
    batch whose candidates run past the chunk is left to the next chunk, unless the share ends
    here.

    The build plan: ``doc_packet``, ``doc_col``, ``doc_len`` per document and ``row_docs``
    (row ``r``'s documents are ``row_docs[r]:row_docs[r + 1]``) over the chunk's output rows
    (batch ``b`` has rows ``[bB, bB + B)``; with a token ``budget``, as many rows as its
    candidates fill, one batch's after the other's), and ``cu_seqlens`` (int32, every batch's
    own, one after the other)."""
    B, L = batch_size, row_len
    n = verdicts.shape[0]
    tokens = tokens_of(verdicts)
    doc_packet, doc_row, doc_col, doc_len, cu_parts = [], [], [], [], []
    batches: list[Batch] = []
    at = 0  # chunk packet where the next batch starts
    cu_at = 0
    row_at = 0  # the chunk's output row where the next batch's rows start
    while at < n and len(batches) < max_batches:
        q = candidates(at)
        if q > n and not share_ends:
            break  # this batch's candidates are not all in the chunk: the next chunk has it
        q = min(q, n)
        valid = np.flatnonzero(verdicts[at:q] >= 0)
        lengths = np.minimum(tokens[at:q][valid], L)
        # a budget's candidates all fit it: as many rows as they fill (one at least)
        where_row, where_col, placed = place(lengths, rows=lengths.shape[0] + 1 if budget
                                             else B, row_len=L)
        rows = B if not budget else (int(where_row[-1]) + 1 if placed else 1)
        taken = int(valid[placed]) if placed < valid.shape[0] else q - at
        doc_packet.append(at + valid[:placed])
        doc_row.append(row_at + where_row)
        doc_col.append(where_col)
        doc_len.append(lengths[:placed])
        cu = segments(lengths[:placed], where_row, rows=rows, row_len=L)
        cu_parts.append(cu)
        counted = count(verdicts[at: at + taken])
        counted["tokens"] = int(lengths[:placed].sum())
        counted["truncated_tokens"] = int(np.maximum(tokens[at:q][valid[:placed]] - L, 0).sum())
        counted["_range"] = (pos + at, pos + at + taken)
        at += taken
        batches.append(Batch({name: (row_at, row_at + rows) for name in
                              ("input_ids", "labels", "attention_mask", "position_ids")}
                             | {"cu_seqlens": (cu_at, cu_at + cu.shape[0])},
                             {"pos": pos + at, "tok": 0}, counted))
        cu_at += cu.shape[0]
        row_at += rows
    rows_total = row_at
    doc_row_all = _cat(doc_row)
    row_docs = np.searchsorted(doc_row_all, np.arange(rows_total + 1), side="left")
    build = {"doc_packet": _cat(doc_packet), "doc_col": _cat(doc_col), "doc_len": _cat(doc_len),
             "row_docs": row_docs.astype(np.int64), "rows": rows_total,
             "cu_seqlens": np.concatenate(cu_parts).astype(np.int32) if cu_parts
             else np.zeros(0, np.int32)}
    return Layout(batches, build, packets_used=at)


def _cat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
