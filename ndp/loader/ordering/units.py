"""Packed mode reads documents, not packets: a document split over packets reaches the stream
whole and in order, wherever the shuffle puts it.

A document longer than one packet is written as consecutive packets of one shard, the pieces
after the first marked (DST bit 7; ``ndp.store.pieces``). Packed mode concatenates what a
rank reads into one token stream, so a piece shuffled away from the piece before it would
follow another document's piece with no EOS between them. So in packed mode a *place* of the
epoch's order stands for a document: a place whose packet starts a document holds that packet
and the later pieces after it in its shard (``expand``), and a place whose packet is a later
piece holds nothing. The order, the rank split, the shares and what a state records stay place
by place, exactly as before (a dataset with no split document reads as it always did, and pays
nothing: ``active`` is false); what a place holds is what changes: its token count for the
plan's reach and counts (``place_tokens``), its packet count for what is counted as left out,
dropped or repeated (``place_sizes``), and the packets a chunk stages (``expand``), whose
layout is then written back in places (``to_places``).

Padded and packing rows take one packet each, so there a piece stays an example of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ndp.kernels.verdict import tokens_of as verdict_tokens
from ndp.store.pieces import runs_after
from ndp.wire.format import INDEX_ENTRY_DTYPE


def active(corpus: Any, mode: str) -> bool:
    """Whether places hold documents rather than packets: packed mode, on data with split
    documents (the corpus' index headers say so at open)."""
    return mode == "packed" and bool(getattr(corpus, "has_pieces", False))


def _runs(corpus: Any, packets: np.ndarray, shard_ids: np.ndarray | None
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``ndp.store.pieces.runs_after`` for global ``packets``: whether each is a later piece,
    and the pieces and tokens of the run after each."""
    n = packets.shape[0]
    inside, count, tokens = np.zeros(n, bool), np.zeros(n, np.int64), np.zeros(n, np.int64)
    if not n:
        return inside, count, tokens
    ids = corpus.shard_of(packets) if shard_ids is None else shard_ids
    split = np.flatnonzero(np.asarray(corpus.continued) > 0)
    for s in np.intersect1d(np.unique(ids), split).tolist():
        where = ids == s
        i, c, t = runs_after(corpus.pieces(s), packets[where] - corpus.base[s])
        inside[where], count[where], tokens[where] = i, c, t
    return inside, count, tokens


def place_sizes(corpus: Any, packets: np.ndarray, shard_ids: np.ndarray | None = None
                ) -> np.ndarray:
    """The packets each place holds: 1 + its document's later pieces, or 0 for a later
    piece's own place."""
    inside, count, _ = _runs(corpus, packets, shard_ids)
    return np.where(inside, 0, 1 + count)


def place_packets(corpus: Any, mode: str, packets: np.ndarray) -> int:
    """The packets the places ``packets`` hold (their number, unless ``active``)."""
    packets = np.asarray(packets, np.int64)
    if not active(corpus, mode):
        return int(packets.shape[0])
    return int(place_sizes(corpus, packets).sum())


def place_tokens(corpus: Any, packets: np.ndarray, tokens: np.ndarray,
                 shard_ids: np.ndarray | None = None) -> np.ndarray:
    """The tokens each place holds, from its packet's own ``tokens``: a document's whole, 0 for
    a later piece's own place."""
    inside, _, run = _runs(corpus, packets, shard_ids)
    return np.where(inside, 0, np.asarray(tokens, np.int64) + run)


@dataclass
class Expanded:
    """A chunk's places as the packets they hold: ``packets`` (with their ``shard_ids`` and
    index ``entries``), the chunk place each belongs to (``place_of``), and where each place's
    packets start (``first_of``: one more, the end, for the place after the last)."""

    packets: np.ndarray
    shard_ids: np.ndarray
    entries: np.ndarray | None
    place_of: np.ndarray
    first_of: np.ndarray


def expand(corpus: Any, packets: np.ndarray, shard_ids: np.ndarray | None,
           entries: np.ndarray | None) -> Expanded:
    """The packets the chunk places ``packets`` hold, in order (``entries``: the places'
    own packets' index entries, if the caller holds them: the later pieces' are gathered)."""
    ids = corpus.shard_of(packets) if shard_ids is None else shard_ids
    inside, count, _ = _runs(corpus, packets, ids)
    sizes = np.where(inside, 0, 1 + count)
    first_of = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    m = int(first_of[-1])
    place_of = np.repeat(np.arange(packets.shape[0], dtype=np.int64), sizes)
    step = np.arange(m, dtype=np.int64) - first_of[place_of]  # 0: the place's own packet
    out = packets[place_of] + step
    out_ids = ids[place_of]
    got = None
    if entries is not None:
        got = np.empty(m, entries.dtype)
        own = step == 0
        got[own] = entries[place_of[own]]
        if not own.all():
            got[~own] = _entries(corpus, out[~own], out_ids[~own])
    return Expanded(out, out_ids, got, place_of, first_of)


def _entries(corpus: Any, packets: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The index entries of later pieces: from the held entries, else read one by one
    (``LazyIndex.read_at``, from a checked index), so that a chunk's pieces never pull a whole
    index into the corpus' entry cache (which holds ~32 MB when a rank keeps its own
    entries' tables) and push out what the others use."""
    out = np.empty(packets.shape[0], INDEX_ENTRY_DTYPE)
    for s in np.unique(ids).tolist():
        where = ids == s
        local = packets[where] - corpus.base[s]
        index = corpus.indexes[s]
        read_at = getattr(index, "read_at", None)
        out[where] = index.entries[local] if read_at is None else read_at(local)
    return out


def to_places(layout: Any, ex: Expanded, verdicts: np.ndarray, pos: int) -> Any:
    """A packed ``layout`` made over ``ex.packets`` (the chunk that starts at share position
    ``pos``), written in places: each state's position is the place of the document its next
    window starts in, and its token offset counts from that document's first token; each
    counted range, and what the chunk used, ends at the first place no packet of it left."""
    run = np.concatenate([[0], np.cumsum(verdict_tokens(verdicts))])  # stream at each packet
    m = ex.packets.shape[0]
    places = ex.first_of.shape[0] - 1

    def place_ceil(j: np.ndarray) -> np.ndarray:  # the first place whose packets all lie
        # at or after j
        return np.where(j >= m, places, np.searchsorted(ex.first_of, j, side="left"))

    if layout.n:
        skip = layout.pos - pos  # an expanded packet: the first the next window needs
        inside = skip < m
        at = np.minimum(skip, max(m - 1, 0))
        u = ex.place_of[at].astype(np.int64)
        layout.tok = np.where(inside, layout.tok + run[at] - run[ex.first_of[u]], layout.tok)
        layout.pos = np.where(inside, pos + u, pos + places).astype(np.int64)
        layout.ranges = (pos + place_ceil(layout.ranges - pos)).astype(np.int64)
    if layout.end is not None:
        a, b = layout.end["_range"]
        layout.end["_range"] = (pos + int(place_ceil(np.int64(a - pos))),
                                pos + int(place_ceil(np.int64(b - pos))))
    layout.packets_used = int(place_ceil(np.int64(layout.packets_used)))
    return layout


def counted_from(ex: Expanded, place: int) -> int:
    """The first expanded packet of chunk place ``place`` (a layout's ``counted_from``)."""
    return int(ex.first_of[min(max(place, 0), ex.first_of.shape[0] - 1)])


def unmarked_splits(corpus: Any) -> int:
    """Documents the manifests say were split over packets (a conversion's ``split``, a token
    import's ``continued``) in a corpus whose indexes mark no piece: data converted before
    the marks, whose pieces packed mode can only shuffle as packets of their own."""
    if getattr(corpus, "has_pieces", True):
        return 0
    total = 0
    for manifest in getattr(corpus, "manifests", []):
        summary = manifest.get("summary")
        if isinstance(summary, dict):
            for key in ("split", "continued"):
                value = summary.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    total += value
    return total


def warn_unmarked(corpus: Any, where: str, *, stacklevel: int) -> None:
    """Warn, in packed mode, about data whose split documents are not marked
    (``unmarked_splits``)."""
    unmarked = unmarked_splits(corpus)
    if unmarked:
        import warnings

        warnings.warn(
            f"{where}: its manifest says {unmarked:,} documents were split over packets, and "
            f"its shards do not mark their pieces (converted before ndp did): packed mode "
            f"shuffles those pieces as packets of their own, so a piece may follow another "
            f"document's with no EOS between them. Convert it again to read each document "
            f"whole", stacklevel=stacklevel)
