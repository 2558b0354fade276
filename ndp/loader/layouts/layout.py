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
  rows; the valid ones among them are placed end to end (``ndp.loader.layouts.packing``), and the
  batch ends
  at the first that does not fit.

Every packet is counted once, by the batch that reaches it (or at the epoch's end).

A layout is arrays, one row per batch (``Layout``): each output's row offsets, the state after
each batch, what each batch counted (``counts``, columns ``COUNTS`` then one per drop reason)
and the share positions it counted; no Python object per batch, so a chunk of 64 batches costs
a few NumPy calls. The consumer reads a batch's state and counts from them only when asked
(``ndp.loader.pipeline.taken``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ndp.loader.layouts.align import aligned_windows
from ndp.loader.layouts.documents import document_starts
from ndp.loader.layouts.packing_chunk import packing_chunk
from ndp.kernels._jit import cpu_kernel
from ndp.kernels.verdict import count, status_of, tokens_of
from ndp.wire.format import DropReason

#: the first columns of ``Layout.counts``: what each batch counted (``LoaderStats`` fields)
COUNTS = ("packets", "valid", "tokens", "truncated_tokens", "empty_batches", "repeated",
          "dropped_on_purpose", "left_over_tokens")
PACKETS, VALID, TOKENS, TRUNCATED, EMPTY, REPEATED, ON_PURPOSE, LEFT_OVER = range(len(COUNTS))
#: then one column per drop reason (``stats.corrupt``'s names), from code 1 on
REASONS = tuple(DropReason(c).name for c in range(1, len(DropReason)))
N_COUNTS = len(COUNTS) + len(REASONS)
_N_CODES = len(DropReason)


def count_rows(verdicts: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Packets, valid ones and drops by reason of each segment
    ``verdicts[bounds[i]:bounds[i + 1]]`` (ascending ``bounds``), as rows of ``N_COUNTS``
    columns (the others 0)."""
    n_seg = max(bounds.shape[0] - 1, 0)
    out = np.zeros((n_seg, N_COUNTS), np.int64)
    if not n_seg:
        return out
    a, b = int(bounds[0]), int(bounds[-1])
    sizes = np.diff(bounds)
    out[:, PACKETS] = sizes
    if b == a or int(verdicts[a:b].min()) >= 0:  # nothing dropped (the usual chunk)
        out[:, VALID] = sizes
        return out
    seg = np.repeat(np.arange(n_seg), sizes)
    codes = np.bincount(seg * _N_CODES + status_of(verdicts[a:b]),
                        minlength=n_seg * _N_CODES).reshape(n_seg, _N_CODES)
    out[:, VALID] = codes[:, DropReason.OK]
    out[:, len(COUNTS):] = codes[:, 1:]
    return out


@dataclass
class Layout:
    """A chunk's batches, as arrays (one row per batch), and what the build kernels need.

    ``rows[name]``: the ``n + 1`` row offsets of output ``name`` (batch ``i`` takes rows
    ``rows[name][i]:rows[name][i + 1]``); ``pos``, ``tok``: the state after each batch;
    ``counts``: what each batch counted (``COUNTS``, then ``REASONS``); ``ranges``: the share
    positions each batch counted, ``[a, b)``; ``extra``: what a batch counted beyond the
    columns (a mix's packets per source), by batch; ``first``: the epoch's batches before the
    chunk's first (the producer sets it). ``packets_used``: how many of the chunk's packets its
    batches took (the next chunk starts there, or, in packed mode, where the last state says).
    ``end`` is set when the share ended inside this chunk: what the epoch's end counted."""

    n: int
    rows: dict[str, np.ndarray]
    pos: np.ndarray
    tok: np.ndarray
    counts: np.ndarray
    ranges: np.ndarray
    build: dict[str, Any] = field(default_factory=dict)
    packets_used: int = 0
    end: dict[str, Any] | None = None
    first: int = 0
    extra: dict[int, dict] = field(default_factory=dict)

    def state(self, i: int) -> dict[str, int]:
        """The loader state after batch ``i`` (less its epoch)."""
        return {"pos": int(self.pos[i]), "tok": int(self.tok[i]), "batch": self.first + i + 1}


def _layout(n: int, rows: dict[str, np.ndarray], pos: np.ndarray, tok: np.ndarray,
            counts: np.ndarray, bounds: np.ndarray, at: int, **kw: Any) -> Layout:
    ranges = np.empty((n, 2), np.int64)
    ranges[:, 0], ranges[:, 1] = at + bounds[:-1], at + bounds[1:]
    return Layout(n, rows, pos.astype(np.int64), tok.astype(np.int64), counts, ranges, **kw)


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
              else np.concatenate([[0], ends])).astype(np.int64)
    nb = bounds.shape[0] - 1
    rows = np.concatenate([[0], np.cumsum(valid)]).astype(np.int64)[bounds]
    tokens = tokens_of(verdicts)
    total = np.diff(np.concatenate([[0], np.cumsum(tokens)])[bounds])
    kept = np.diff(np.concatenate([[0], np.cumsum(np.minimum(tokens, max_len))])[bounds])
    counts = count_rows(verdicts, bounds)
    counts[:, TOKENS] = kept
    counts[:, TRUNCATED] = total - kept
    counts[:, EMPTY] = rows[1:] == rows[:-1]  # every packet dropped: a batch of no row
    return _layout(nb, {"input_ids": rows, "labels": rows, "attention_mask": rows},
                   pos + bounds[1:], np.zeros(nb, np.int64), counts, bounds, pos,
                   build={"row_packet": row_packet}, packets_used=n)


def packed_layout(verdicts: np.ndarray, *, batch_size: int, seq_len: int, pos: int, tok: int,
                  counted_from: int, max_batches: int, share_ends: bool,
                  final: bool = False, units: np.ndarray | None = None,
                  aligned: bool = False, place_of: np.ndarray | None = None) -> Layout:
    """Up to ``max_batches`` batches of windows from stream token ``tok`` of the chunk (which
    starts at share position ``pos``). ``counted_from``: the first chunk packet no earlier batch
    counted. ``share_ends``: the chunk runs to the end of this rank's share, so what its
    batches leave is the epoch's end (``Layout.end``: the rest of its packets, and the tokens
    left unused); so is ``final`` when the batches are all ``max_batches``: the chunk ends
    the epoch's last batch and holds the rest of the share. ``units``: where each place's
    packets start among the chunk's (and their end), when a place holds several (a document,
    ``ndp.loader.ordering.units``): a batch that reaches a place's first packet counts all of them.
    ``aligned``: windows start at documents (``align="bos"``, ``ndp.loader.layouts.align``; the
    state
    after a batch is then its search point); ``place_of``: each packet's place, where places
    hold documents split over packets (a document starts at a place's first valid packet).
    The build plan is ``rows``, ``cum`` (stream position of each row, and the total),
    ``start`` and ``windows`` (and aligned, ``wins``: each window's start)."""
    per_batch = batch_size * seq_len
    n = verdicts.shape[0]
    counted_from = min(counted_from, n)
    verdicts = np.ascontiguousarray(verdicts)
    run = np.empty(n, np.int64)  # stream position after each packet
    rows = np.empty(n, np.int64)  # the valid packets
    cum = np.empty(n + 1, np.int64)  # stream position of each valid packet, and the total
    k = int(_stream(verdicts, run, rows, cum))
    rows, cum = rows[:k], cum[:k + 1]
    total = int(run[-1]) if n else 0
    wins = left = docs = None
    if not aligned:
        nb = max(0, min(max_batches, (total - tok - 1) // per_batch))
        ends = tok + np.arange(1, nb + 1, dtype=np.int64) * per_batch  # next batch's start
    else:  # each window at a document's start; ``ends``: each batch's search point after it
        docs = document_starts(rows, cum, place_of)
        wins, ends, left = aligned_windows(docs, total=total, tok=tok,
                                           batch_size=batch_size, seq_len=seq_len,
                                           most=max(max_batches, 0))
        nb = ends.shape[0]
    # per batch: the packets it reaches (those starting before one past the last token it
    # reads), those wholly before the next batch, and where the last of these ends
    ends = np.ascontiguousarray(ends, np.int64)
    reached, skips, before = (np.empty(nb, np.int64) for _ in range(3))
    _reach(verdicts, run, ends, np.int64(counted_from), reached, skips, before)
    if units is not None:  # to the end of the place (document) reached
        reached = units[np.searchsorted(units, reached, side="left")]
    bounds = np.concatenate([[counted_from], reached]).astype(np.int64)
    counts = count_rows(verdicts, bounds)
    counts[:, TOKENS] = per_batch
    build = {"rows": rows, "cum": cum, "start": tok, "windows": nb * batch_size}
    if left is not None:
        counts[:, LEFT_OVER] = left
        build["wins"], build["doc_starts"] = wins, docs
    windows = np.arange(nb + 1, dtype=np.int64) * batch_size
    first = int(bounds[-1])
    layout = _layout(nb, {"x": windows, "y": windows}, pos + skips, ends - before, counts,
                     bounds, pos, build=build, packets_used=first)
    if (share_ends and nb < max_batches) or (final and nb == max_batches):
        end = count(verdicts[first:])
        end["unused_tokens"] = max(total - (int(ends[-1]) if nb else tok), 0)
        end["_range"] = (pos + first, pos + verdicts.shape[0])
        layout.end = end
        layout.packets_used = verdicts.shape[0]
    return layout


def packing_layout(verdicts: np.ndarray, toks: np.ndarray, *, batch_size: int, row_len: int,
                   pos: int, max_batches: int, share_ends: bool, complete: bool,
                   budget: int = 0) -> Layout:
    """Up to ``max_batches`` packed-row batches from share position ``pos``. A batch's
    candidates are the packets whose index token counts (``toks``: the share's from ``pos``
    on, the chunk's packets' and the one after, unless ``complete``: to the share's end) fill
    its rows or its token ``budget``; its valid ones are placed end to end
    (``ndp.loader.layouts.packing``), and the batch ends at the first that does not fit. A batch
    whose
    candidates run past the chunk is left to the next chunk, unless the share ends here
    (``share_ends``). One compiled pass (``ndp.loader.layouts.packing_chunk``).

    The build plan: ``doc_packet``, ``doc_col``, ``doc_len`` per document and ``row_docs``
    (row ``r``'s documents are ``row_docs[r]:row_docs[r + 1]``) over the chunk's output rows
    (batch ``b`` has rows ``[bB, bB + B)``; with a token ``budget``, as many rows as its
    candidates fill, one batch's after the other's), and ``cu_seqlens`` (int32, every batch's
    own, one after the other)."""
    got = packing_chunk(verdicts, toks, rows=batch_size, row_len=row_len, budget=budget,
                        max_batches=max_batches, share_ends=share_ends, complete=complete)
    edges = got["bounds"]
    nb = edges.shape[0] - 1
    counts = count_rows(verdicts, edges)
    counts[:, TOKENS] = got["kept"]
    counts[:, TRUNCATED] = got["cut"]
    rows = got["row_at"]
    total = int(rows[-1])
    row_docs = np.searchsorted(got["doc_row"], np.arange(total + 1), side="left")
    build = {"doc_packet": got["doc_packet"], "doc_col": got["doc_col"],
             "doc_len": got["doc_len"], "row_docs": row_docs.astype(np.int64), "rows": total,
             "cu_seqlens": got["cu_seqlens"]}
    return _layout(nb, {name: rows for name in
                        ("input_ids", "labels", "attention_mask", "position_ids")}
                   | {"cu_seqlens": got["cu_at"]},
                   pos + edges[1:], np.zeros(nb, np.int64), counts, edges, pos, build=build,
                   packets_used=int(edges[-1]))


@cpu_kernel
def _stream(verdicts, run, rows, cum):  # pragma: no cover - compiled
    """A packed chunk's stream: ``run`` the position after each packet (a dropped one adds no
    token), ``rows`` the valid packets and ``cum`` their positions, then the total; returns
    how many are valid. ``np.cumsum`` of ``tokens_of(verdicts)``, ``np.flatnonzero`` and
    ``np.cumsum`` again, in one pass."""
    s = 0
    k = 0
    cum[0] = 0
    for i in range(verdicts.shape[0]):
        v = verdicts[i]
        if v >= 0:
            s += v
            rows[k] = i
            k += 1
            cum[k] = s
        run[i] = s
    return k


@cpu_kernel
def _reach(verdicts, run, ends, counted_from, reached, skips, before):  # pragma: no cover
    """For each batch ending where the next starts, ``ends[b]`` (stream positions): the
    packets it reaches, ``reached[b]`` (those starting at or before ``ends[b]``: numpy's
    ``searchsorted(starts, ends + 1, "left")``, at least ``counted_from`` and never fewer than
    the batch before's), ``skips[b]`` the packets wholly before ``ends[b]``
    (``searchsorted(run, ends, "right")``) and ``before[b]`` where the last of these ends."""
    n = run.shape[0]
    most = counted_from
    for b in range(ends.shape[0]):
        e = ends[b]
        lo, hi = 0, n  # the first packet that starts past e (its start: run less its tokens)
        while lo < hi:
            mid = (lo + hi) >> 1
            if run[mid] - max(verdicts[mid], 0) < e + 1:
                lo = mid + 1
            else:
                hi = mid
        most = max(most, lo)
        reached[b] = most
        lo, hi = 0, n  # the first packet that ends past e
        while lo < hi:
            mid = (lo + hi) >> 1
            if run[mid] <= e:
                lo = mid + 1
            else:
                hi = mid
        skips[b] = lo
        before[b] = run[lo - 1] if lo > 0 else 0
    return 0
