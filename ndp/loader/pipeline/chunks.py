"""Decode: a chunk of this rank's share in, its batches out, built into a ring slot (the third
stage of the Loader's pipeline: plan, stage, decode, serve).

Per chunk, on either backend: stage the packets (``ndp.loader.pipeline.stage`` /
``ndp.loader.pipeline.device_shards``), one verdict kernel, one small copy of the verdicts to the
host and
one wait for it, the layout of every batch of the chunk on the host (``ndp.loader.layouts.layout``),
one
build kernel for all of them (two copies of the plan for packing). On a GPU that is 2 launches, 3
copies and 1 host wait for ``chunk_batches`` batches, where decoding batch by batch paid a fixed
~1.3 ms of host work per batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import numpy as np

from ndp.engine.cpu import NO_WINS, CpuEngine, Slot, Staged, TooManyShards
from ndp.loader.layouts.layout import Layout, packed_layout, packing_layout, padded_layout
from ndp.loader.ordering import units
from ndp.loader.layouts.documents import add_documents
from ndp.loader.layouts.packing import budget_ends
from ndp.loader.planning.plan import Plan
from ndp.wire.format import DropReason


#: tokens per chunk by default: a GPU amortises its per-call cost over 64 batches of 64 x 1,024
#: (256 MB of int64 outputs per padded chunk, a ring of them on the device); on the CPU the
#: hand-off to ndp's threads is what is amortised, and smaller chunks keep host memory small
CHUNK_TOKENS = {"cuda": 1 << 22, "cpu": 1 << 20}
#: batches per chunk by default at least, and at most
CHUNK_BATCHES_MIN = {"cuda": 8, "cpu": 1}
CHUNK_BATCHES_MAX = 64


def batches_per_chunk(backend: str, chunk_batches: int | None) -> Any:
    """``per_chunk(B, T)``: the batches of shape ``(B, T)`` a chunk holds: ``chunk_batches``, or
    by default about ``CHUNK_TOKENS`` tokens' worth, within ``CHUNK_BATCHES_MIN`` and
    ``CHUNK_BATCHES_MAX`` (a batch shape that changes with the step, ``ndp.loader.planning.shapes``,
    changes it too)."""
    least, tokens = CHUNK_BATCHES_MIN[backend], CHUNK_TOKENS[backend]

    def per_chunk(b: int, t: int) -> int:
        return chunk_batches or max(least, min(CHUNK_BATCHES_MAX, tokens // (b * t)))

    return per_chunk


@dataclass
class Started:
    """A chunk planned and staged, its verdicts queued, not yet laid out
    (``ChunkDecoder.start``)."""

    slot: Slot
    pos: int
    tok: int
    q: int  # the share position it reads to
    final: bool  # it reads to the share's own end (packed: the epoch's last batches)
    reach: int  # the batches it was planned for
    shape: tuple[int, int]
    budget: int
    own_end: int | None
    packets: np.ndarray
    entries: Any
    staged: Staged
    ex: units.Expanded | None
    #: the verdicts the layout was made from (``lay_out``: the packets the run leaves out,
    #: ``skip_packets``, dropped as ``SKIPPED``)
    verdicts: np.ndarray | None = None


@dataclass
class Chunk:
    """A decoded chunk: the slot that holds its outputs and the layout of its batches (and
    what was staged for it: ``started``)."""

    slot: Slot
    layout: Layout
    started: Started | None = None
    #: its batches as the consumer hands them out (``Ring.prepare``, on the producer); taken
    #: once (``take``), so that afterwards only what the user keeps holds the chunk's lease
    batches: list | None = None

    def take(self) -> list:
        """The batches, let go of here."""
        batches, self.batches = self.batches or [], None
        return batches


class ChunkDecoder:
    """Decodes chunks of ``per_chunk(B, T)`` batches of shape ``(B, T)`` with ``engine``,
    staging with ``stager``; a packet with no tokens or with an id at or past ``vocab`` is
    dropped (``EMPTY``, ``TOKEN_RANGE``)."""

    def __init__(self, engine: CpuEngine, stager: Any, plan: Plan, *, pad_token_id: int,
                 per_chunk: Any, vocab: int) -> None:
        self.engine, self.stager, self.plan = engine, stager, plan
        self.pad_token_id, self.vocab = pad_token_id, vocab
        self.per_chunk = per_chunk
        #: batches per chunk of the run's first shape
        self.chunk_batches = per_chunk(*plan.shapes.at(0))
        # output elements of the largest chunk of any phase (and packing's cu_seqlens: at most
        # a segment per token and one of padding per row, plus 0): allocated at the first
        # chunk, so that a change of shape allocates nothing (``ndp.engine.cpu.outputs``)
        self._elements = plan.shapes.elements(lambda b, t: per_chunk(b, t) * b * t)
        self._segments = plan.shapes.elements(lambda b, t: per_chunk(b, t) * (b * (t + 1) + 1))

    def decode(self, slot: Slot, share: np.ndarray, pos: int, tok: int, counted_upto: int,
               batches: int | None = None, own_end: int | None = None,
               shape: tuple[int, int] | None = None, budget: int = 0, *,
               started: Started | None = None,
               then: Callable[[Started], bool] | None = None, build: bool = True) -> Chunk:
        """The next chunk from share position ``pos`` (and stream token ``tok``, packed mode),
        its batches of ``shape`` (B, T; default: the run's first; or cut by a token
        ``budget``, ``ndp.loader.planning.shapes``):
        at most ``batches`` (default ``per_chunk(B, T)``) batches, at least one unless the share
        ends in it (then ``layout.end`` or an exhausted share says so). ``counted_upto``: the
        first share position no earlier batch counted. ``own_end`` (packed mode, for the
        epoch's last batches): where the share's own packets end; a chunk that needs no packet
        past it reads up to it, and if it makes all ``batches`` its layout ends the epoch
        (counting the packets left over).

        ``started``: this chunk, already staged with its verdicts queued (``start``, with the
        same arguments). ``then(started)``: called once the chunk's verdicts are queued and
        before they are waited for, to stage the next chunk meanwhile
        (``ndp.loader.pipeline.ahead``);
        true if it did (then the next chunk's first shards need no prefetch). ``build=False``:
        the layout only, no output written (``ndp.loader.explain``)."""
        plan = self.plan
        shape = shape or plan.shapes.at(0)
        n = share.shape[0]
        most = reach = batches or self.per_chunk(*shape)  # batches it makes, and plans to reach
        while True:
            st, started = started, None
            if st is None:
                try:
                    st = self.start(slot, share, pos, tok, reach, shape, budget, own_end)
                except TooManyShards:
                    if reach == 1:
                        raise
                    reach = max(1, reach // 2)  # fewer batches, fewer shards at once
                    most = min(most, reach)
                    continue
            ahead = then(st) if then is not None else False
            then = None  # a chunk laid out again (below) is not followed by another guess
            if self.stager.prefetches and not ahead:  # the next chunk's first shards, while
                # this one decodes
                self.stager.prefetch(share[st.q: plan.chunk_end(share, st.q, 0, 1, shape,
                                                                budget)])
            layout = self.lay_out(st, share, counted_upto, most)
            if layout.n or layout.end is not None or st.q >= n:
                break
            reach *= 2  # dropped packets held too few tokens: take more of them (as many
            # batches still: the epoch's last chunk must not make more than it was asked)
        if build:
            self._build(layout, st.staged, slot, shape)
        self.stager.after(st.staged, self.engine)
        self.engine.finish(slot)
        self.engine.counters.chunks += 1
        self.engine.counters.batches += layout.n
        return Chunk(slot, layout, st)

    def start(self, slot: Slot, share: np.ndarray, pos: int, tok: int, reach: int,
              shape: tuple[int, int], budget: int = 0, own_end: int | None = None,
              keep: tuple[int, ...] = ()) -> Started:
        """Plan the chunk of ``reach`` batches from ``(pos, tok)``, stage its packets into
        ``slot`` and queue their verdicts (no wait). ``keep``: shards a chunk in flight still
        reads, which staging must not evict (``TooManyShards`` if it would have to)."""
        plan = self.plan
        self.engine.acquire(slot)
        q = plan.chunk_end(share, pos, tok, reach, shape, budget)
        final = own_end is not None and q <= own_end
        if final:
            q = own_end
        # a RankOrder's windows know their shards: the stage need not search for them
        take = getattr(share, "with_shards", None)
        packets, shard_ids = take(pos, q) if take is not None else (share[pos:q], None)
        tables = getattr(share, "tables", None)  # a RankOrder's own entries, if held
        if tables is not None and self.stager.checks_headers:
            # a GPU's stage reads these shards' indexes whole as it copies them: check
            # them first and hold them for it (a lie rescanned or refused)
            plan.corpus.settle(packets)
        entries = tables.entries(pos, q) if tables is not None else None
        ex = None
        if units.active(plan.corpus, plan.mode):  # each place's document: its packet and
            # the later pieces after it
            ex = units.expand(plan.corpus, packets, shard_ids, entries)
            packets, shard_ids, entries = ex.packets, ex.shard_ids, ex.entries
        staged = self.stager.stage(packets, slot, entries, shard_ids, keep=keep)
        self.engine.submit_verdicts(staged, slot, self.vocab)
        return Started(slot, pos, tok, q, final, reach, shape, budget, own_end, packets,
                       entries, staged, ex)

    def lay_out(self, st: Started, share: np.ndarray, counted_upto: int, most: int) -> Layout:
        """Wait for ``st``'s verdicts and lay out its batches (at most ``most``); a packet the
        run leaves out (``Plan.skip_packets``, ``ndp.loader.planning.skips``) is dropped as
        ``SKIPPED``, on the host, where every layout is made from the verdicts."""
        verdicts = self.engine.read_verdicts(st.slot, st.staged.n)
        leave = self.plan.skip_packets
        if leave.shape[0]:
            at = np.minimum(np.searchsorted(leave, st.packets), leave.shape[0] - 1)
            hit = leave[at] == st.packets
            if hit.any():
                verdicts = np.where(hit, -int(DropReason.SKIPPED), verdicts)
        st.verdicts = verdicts
        if not self.stager.checks_headers:  # an index matched by size alone: refuse a
            # lie, from the bytes staged on the host (a GPU's stage checks as it copies);
            # every entry passed its index's first-use check (``LazyIndex.read_at``)
            self.plan.corpus.check_headers(st.packets, st.staged.data, st.staged.offsets,
                                           st.entries)
        return self._layout(verdicts, share, st.pos, st.tok, counted_upto, most,
                            st.q >= share.shape[0], st.final, st.shape, st.budget, st.ex)

    def drop(self, st: Started) -> None:
        """A chunk staged ahead that is not decoded: its shards' slots may be reused once its
        verdict kernel ran."""
        self.stager.after(st.staged, self.engine)

    def _layout(self, verdicts: np.ndarray, share: np.ndarray, pos: int, tok: int,
                counted_upto: int, batches: int, share_ends: bool, final: bool,
                shape: tuple[int, int], budget: int,
                ex: units.Expanded | None = None) -> Layout:
        plan = self.plan
        B, T = shape
        if plan.mode == "padded":
            ends = None if not budget else budget_ends(  # by the index, as planned
                plan.share_tokens(share, pos, pos + verdicts.shape[0]), budget=budget,
                row_len=T, most=batches)
            return padded_layout(verdicts, batch_size=B, max_len=T, pos=pos, ends=ends)
        if plan.mode == "packed":
            since = max(counted_upto - pos, 0)
            layout = packed_layout(
                verdicts, batch_size=B, seq_len=T, pos=pos, tok=tok,
                counted_from=since if ex is None else units.counted_from(ex, since),
                max_batches=batches, share_ends=share_ends, final=final,
                units=None if ex is None else ex.first_of, aligned=plan.align is not None,
                place_of=None if ex is None else ex.place_of)
            if plan.documents:  # their boundaries in the windows (``ndp.loader.layouts.documents``)
                add_documents(layout, ex, batch_size=B, seq_len=T)
            return layout if ex is None else units.to_places(layout, ex, verdicts, pos)
        n = share.shape[0]
        end = min(pos + verdicts.shape[0] + 1, n)  # and the packet after: see packing_layout
        return packing_layout(verdicts, plan.share_tokens(share, pos, end), batch_size=B,
                              row_len=T, pos=pos, max_batches=batches, share_ends=share_ends,
                              complete=end >= n, budget=budget)

    def _build(self, layout: Layout, staged: Staged, slot: Slot, shape: tuple[int, int]) -> None:
        engine, mode = self.engine, self.plan.mode
        B, T = shape
        build = layout.build
        # outputs are allocated for a full chunk at once, so the small first chunks after a
        # start do not make the slots grow (and be wrapped for the consumer) again and again
        full, least = self.per_chunk(B, T) * B, self._elements
        if mode == "padded":
            rows = build["row_packet"]
            outs = engine.outputs(slot, mode, max(rows.shape[0], full), T, least=least)
            engine.build_padded(staged, slot, rows, self.pad_token_id, outs)
        elif mode == "packed":
            docs = "cu_seqlens" in build
            outs = engine.outputs(slot, "packed+documents" if docs else mode,
                                  max(build["windows"], full), T,
                                  max(build["cu_seqlens"].shape[0], self._segments)
                                  if docs else 0, least=least)
            wins = build.get("wins", NO_WINS)  # windows aligned to documents (align="bos")
            engine.build_packed(staged, slot, build["rows"], build["cum"], build["start"],
                                build["windows"], outs, wins)
            if docs:
                engine.build_documents(slot, build["doc_cum"], build["start"],
                                       build["windows"], build["cu_seqlens"], outs, wins)
        else:
            outs = engine.outputs(slot, mode, max(build["rows"], full), T,
                                  max(build["cu_seqlens"].shape[0], self._segments),
                                  least=least)
            engine.build_packing(staged, slot, build, self.pad_token_id, outs)
