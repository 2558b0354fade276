"""Which packets made a step: ``loader.explain(step)`` (``Explanation``), past or future.

A Loader's order is a pure function of (seed, epoch, rank, world size, mix, batch shapes), so
the batch of any run step follows from the index and the packets themselves, with nothing
stored per step. ``explain`` works it out apart from the running Loader, on the CPU and on a
plan of its own (``Plan.variant``: the same order, CRC-Drop, mix and elastic remainder), with
the pipeline's own plan and layout (``ndp.loader.pipeline.chunks``: verdicts, then the layout of the
mode), so what it says is what the Loader delivers, on either backend, row for row:

* the step's epoch and its batch in the epoch (the run's epoch starts,
  ``ndp.loader.planning.steps``);
* where that batch starts in the rank's share: ``padded`` and ``packing`` batches start where
  the index's token counts say (``Plan.chunk_end``: one compiled pass over the positions
  before it, no packet read; in ``packing``, from the last of the count's marks before it,
  where every 256th batch starts, ``ndp.loader.planning.marks``); a ``packed`` batch starts
  after the valid tokens before it: from the count's marks (every ``e``-th batch, ``e`` the
  most batches, a power of two up to 256, that hold at most 2**20 tokens) where every packet is known to decode to
  the tokens its index entry says (``ndp.store.clean``, a pass over the data once, kept),
  else the packets between the epoch's start (or the last step explained in that
  epoch) and it are read and checked, as the Loader would (chunks without outputs);
* the batch itself, decoded without outputs: per row, the pieces of packets it holds
  (``Piece``: shard, packet, byte offset, SRC/DST/TYP, the tokens ``[start, stop)`` of the
  packet and the column they begin at), and what the batch dropped and why (``Dropped``: the
  packets its counted range held that failed, as ``loader.stats.corrupt`` counts them).

In ``packed`` mode a row is a window of ``seq_len + 1`` tokens: ``x`` is its first
``seq_len``, ``y`` its last; a piece at column ``seq_len`` is the last target only.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import numpy as np

from ndp.engine.cpu import CpuEngine, Slot
from ndp.errors import StepError
from ndp.kernels.verdict import NO_VOCAB, status_of, tokens_of
from ndp.store.columns import tokens_of as tokens_of_entries
from ndp.loader.ordering import units
from ndp.loader.pipeline.ahead import plan_chunk
from ndp.loader.pipeline.chunks import ChunkDecoder, batches_per_chunk
from ndp.loader.explanation import Dropped, Explanation, Piece
from ndp.loader.pipeline.stage import HostStager
from ndp.loader.planning.shared_count import count_dir
from ndp.store.clean import all_clean
from ndp.wire.format import DropReason


#: the most epochs ``locate`` counts its way through to find a run step's epoch
MAX_EPOCHS_AHEAD = 1000


class Explainer:
    """A Loader's explanations: its plan's variant, a CPU decoder over its corpus, and the
    last place reached per epoch (explaining step after step reads each packet once)."""

    def __init__(self, plan: Any, *, vocab: int | None = None) -> None:
        self.source = plan
        self.plan = plan.variant(rank=plan.rank, world_size=plan.world_size,
                                 batch_size=plan.batch_setting, seq_len=plan.len_setting)
        self.plan.max_steps = plan.max_steps
        if plan.grown is not None:  # the epoch resumed in is read from the dataset as it was
            self.plan.grown = plan.grown.variant(
                rank=plan.rank, world_size=plan.world_size, batch_size=plan.batch_setting,
                seq_len=plan.len_setting)
            self.plan.grown.resumed = plan.grown.resumed
        self.vocab = vocab or NO_VOCAB
        self.engine = CpuEngine()
        self.decoder = ChunkDecoder(self.engine, HostStager(plan.corpus), self.plan,
                                    pad_token_id=0, per_chunk=batches_per_chunk("cpu", None),
                                    vocab=self.vocab)
        self.slot = Slot(0)
        self._clean: bool | None = None  # ``ndp.store.clean.all_clean``, once asked
        self._orders: dict[int, Any] = {}  # epoch: its RankOrder, entries ``_Held``
        self._reached: dict[int, tuple[int, int, int, int]] = {}  # epoch: pos, tok, batch,
        # counted_upto at a chunk's start
        self._lock = threading.Lock()

    def _marks(self, sh: Any) -> tuple[int, list] | None:
        """The count's marks of ``sh`` (``ndp.loader.planning.marks``) where they are where
        this plan's batches start: packing's always; packed ones when no packet is left out
        (``skip_packets``) and every packet decodes to the tokens its index entry says
        (``ndp.store.clean``: checked once, and kept)."""
        marks = sh.count.marks if sh.count.final else None
        if marks is None or not marks[1]:
            return None
        if self.plan.mode == "packed":
            if self._clean is None:
                skipped = getattr(self.source, "skip_packets", None)
                self._clean = ((skipped is None or not len(skipped))
                               and all_clean(self.plan.corpus, self.vocab, keep=count_dir()))
            if not self._clean:
                return None
        return marks

    def fits(self, plan: Any) -> bool:
        """Whether this explainer still plans as ``plan`` does (no resume since)."""
        return (self.plan.elastic is plan.elastic and
                (plan.grown is None) == (self.plan.grown is None) and
                all(self.plan._starts.get(e) == s for e, s in plan._starts.items()))

    def close(self) -> None:
        self.plan.stop_ahead()

    # ----------------------------------------------------------------------------- steps
    def locate(self, step: int, epoch: int | None) -> tuple[int, int, int]:
        """``(epoch, batch, run step)`` of run ``step``, or of batch ``step`` of ``epoch``."""
        plan = self.plan
        step = int(step)
        if step < 0:
            raise StepError(f"step {step} is negative: steps count from 0")
        if epoch is not None:
            epoch = int(epoch)
            start = self._start(epoch)
            n = plan.run_batches(epoch)
            if step >= n:
                raise StepError(f"epoch {epoch} has {n:,} batches on this rank: batch {step} "
                                f"is past its end (pass a run step without epoch=)")
            return epoch, step, start + step
        known = [e for e, s in plan._starts.items() if s <= step]
        if not known:
            first = min(plan._starts)
            raise StepError(f"step {step} is before the epoch this run resumed in (epoch "
                            f"{first}, from step {plan._starts[first]:,}): a Loader resumed "
                            f"later does not know where earlier epochs began")
        e = first = max(known)
        while True:
            start, n = plan.start_step(e), plan.run_batches(e)
            if step < start + n:
                return e, step - start, step
            if plan.ended(start + n) or n == 0:
                raise StepError(f"step {step} is past the run's end (step {start + n:,}: "
                                f"max_steps={plan.max_steps})")
            e += 1
            if e - first > MAX_EPOCHS_AHEAD:  # each epoch between is counted to get there
                raise StepError(f"step {step:,} lies more than {MAX_EPOCHS_AHEAD:,} epochs "
                                f"past epoch {first} (step {plan.start_step(first):,}): "
                                f"name its epoch (epoch=) to explain it")

    def _start(self, epoch: int) -> int:
        try:
            return self.plan.start_step(epoch)
        except ValueError as exc:
            raise StepError(str(exc)) from None

    # ------------------------------------------------------------------------- the batch
    def explain(self, step: int, *, epoch: int | None = None,
                at: dict | None = None) -> Explanation:
        """``at``: where the Loader stands (its state's epoch, pos, tok, batch), exact: a step
        after it in its epoch is found from there, not from the epoch's start."""
        with self._lock:
            epoch, batch, run_step = self.locate(step, epoch)
            start = None
            if at is not None and at["epoch"] == epoch and at["batch"] <= batch:
                start = (at["pos"], at["tok"], at["batch"], at["pos"])
            chunk, i = self._find(epoch, batch, start)
            plan = self.plan
            B, T = chunk.started.shape
            out = Explanation(run_step, epoch, batch, plan.rank, plan.world_size, plan.mode,
                              0, T)
            _describe(out, chunk, i, self.engine, plan.corpus)
            out.skipped = any(a <= run_step < b for a, b in self.source.skips)
            return out

    def _find(self, epoch: int, batch: int, start: tuple | None = None) -> tuple[Any, int]:
        """The chunk (decoded without outputs) that holds ``batch``, and its index there;
        found from the latest place known before it: the epoch's start, ``start`` (pos, tok,
        batch, counted_upto), or the last chunk found."""
        plan, dec = self.plan, self.decoder
        sh = plan.share(epoch)
        shapes = plan.shapes_of(epoch)
        share = sh.packets
        if getattr(share, "tables", None) is not None:  # a RankOrder: its entries gathered
            share = self._orders.get(epoch)  # a range at a time, not a window's table built
            if share is None or share.windows is not sh.packets.windows:
                share = self._orders[epoch] = _Held.over(sh.packets, plan)
            plan.share_tokens = share.tables.share_tokens
        pos, tok, done, upto = 0, 0, 0, 0
        for have in (self._reached.get(epoch), start):
            if have is not None and done < have[2] <= batch:
                pos, tok, done, upto = have
        never = lambda: False  # noqa: E731 - the wait for the count is never abandoned
        marks = self._marks(sh)  # where every ``every``-th batch starts, if they hold
        if marks is not None:
            every, at = marks
            j = min(batch // every, len(at) - 1)
            if j * every > done:  # batch j * every - 1 reached the packet it ends in
                pos, tok, done = int(at[j][0]), int(at[j][1]), j * every
                upto = pos + 1 if plan.mode == "packed" else pos
        if plan.mode != "packed":  # by the index: to the batch itself
            while done < batch:
                nxt = plan_chunk(plan.mode, sh, shapes, pos, tok, done, batch - done, never)
                if nxt is None:
                    break
                pos = plan.chunk_end(share, pos, 0, nxt.size, nxt.shape, nxt.budget)
                done += nxt.size
            upto = pos
        while True:
            want = 1 if done >= batch else batch - done
            nxt = plan_chunk(plan.mode, sh, shapes, pos, tok, done,
                             min(want, dec.per_chunk(*shapes.at(done))), never)
            if nxt is None:
                raise StepError(f"epoch {epoch} ended after {done:,} batches on rank "
                                f"{plan.rank}: batch {batch} is past it")
            chunk = dec.decode(self.slot, share, pos, tok, upto, nxt.size, nxt.own_end,
                               nxt.shape, nxt.budget, build=False)
            layout = chunk.layout
            if not layout.n:
                raise StepError(f"epoch {epoch} ended after {done:,} batches on rank "
                                f"{plan.rank}: batch {batch} is past it")
            if done + layout.n > batch:
                self._reached[epoch] = (pos, tok, done, upto)
                return chunk, batch - done
            done += layout.n
            upto = (pos + layout.packets_used if plan.mode == "packed"
                    else int(layout.pos[-1]))
            pos, tok = int(layout.pos[-1]), int(layout.tok[-1])


class _Held:
    """The explainer's share's entries (``ShareEntries``' place, as ``ChunkDecoder.start`` and
    ``share_tokens`` ask it): those of a range of share positions in one gather, each shard's
    index read once (not a window's table, seconds at 1e8 documents, nor the Loader's blocks,
    which read every shard's index again per block with no table), the last range kept and
    grown ahead as the positions asked for move on."""

    MOST = 1 << 22  # positions gathered at once, at most (64 MB of entries)

    def __init__(self, order: Any, walk: Any, corpus: Any, mode: str) -> None:
        self.order, self.walk, self.corpus, self.mode = order, walk, corpus, mode
        self.a = self.b = 0
        self.got: tuple = ()

    def _range(self, a: int, b: int) -> tuple:
        if a < self.a or b > self.b:
            grow = min(max(2 * (self.b - self.a), 4096), self.MOST)
            lo, hi = a, min(self.order.shape[0], max(b, a + grow))
            packets, shards = self.walk.with_shards(lo, hi)
            if shards is None:
                shards = self.corpus.shard_of(packets)
            entries = self.corpus.entries_at(packets, shards)
            toks = tokens_of_entries(entries["length"], entries["typ"]).astype(np.int64)
            if units.active(self.corpus, self.mode):  # a place's tokens: its document's
                toks = units.place_tokens(self.corpus, packets, toks)
            self.a, self.b, self.got = lo, hi, (packets, shards, entries, toks)
        return tuple(x[a - self.a:b - self.a] for x in self.got)

    @classmethod
    def over(cls, order: Any, plan: Any) -> Any:
        """A copy of the RankOrder ``order`` whose entries are held so."""
        walk = copy.copy(order)
        walk.tables = None  # walks the order itself
        mine = copy.copy(order)
        mine.tables = cls(mine, walk, plan.corpus, plan.mode)
        return mine

    def entries(self, a: int, b: int) -> np.ndarray:
        return self._range(a, b)[2]

    def packets(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        return self._range(a, b)[:2]

    def clear(self) -> None:
        self.a = self.b = 0
        self.got = ()

    def share_tokens(self, share: Any, a: int, b: int) -> np.ndarray:
        """``Reach.share_tokens`` for this share (the plan's, replaced)."""
        b = min(b, share.shape[0])
        if b <= a:
            return np.zeros(0, np.int64)
        if share is not self.order:  # not a RankOrder's: as the Loader gathers
            packets = np.asarray(share[a:b], np.int64)
            toks = np.asarray(self.corpus.tokens[packets], np.int64)
            return (units.place_tokens(self.corpus, packets, toks)
                    if units.active(self.corpus, self.mode) else toks)
        return self._range(a, b)[3]


def _describe(out: Explanation, chunk: Any, i: int, engine: CpuEngine, corpus: Any) -> None:
    """Fill ``out`` with batch ``i`` of ``chunk``: its pieces and drops."""
    st, layout = chunk.started, chunk.layout
    verdicts = st.verdicts if st.verdicts is not None else engine.read_verdicts(
        st.slot, st.staged.n)
    tokens = tokens_of(verdicts)
    mode, (B, T) = out.mode, st.shape
    build = layout.build
    pieces: list[tuple[int, int, int, int, int]] = []  # row, col, chunk packet, start, stop
    if mode == "padded":
        a, b = layout.rows["input_ids"][i:i + 2]
        for r, k in enumerate(build["row_packet"][a:b].tolist()):
            pieces.append((r, 0, k, 0, min(int(tokens[k]), T)))
        out.rows = int(b - a)
    elif mode == "packing":
        a, b = layout.rows["input_ids"][i:i + 2]
        row_docs = build["row_docs"]
        for r in range(int(a), int(b)):
            for d in range(int(row_docs[r]), int(row_docs[r + 1])):
                pieces.append((r - int(a), int(build["doc_col"][d]), int(build["doc_packet"][d]),
                               0, int(build["doc_len"][d])))
        out.rows = int(b - a)
    else:
        rows, cum, start = build["rows"], build["cum"], int(build["start"])
        wins = build.get("wins")  # windows at documents (``ndp.loader.layouts.align``)
        for w in range(i * B, (i + 1) * B):
            s = start + w * T if wins is None else int(wins[w])
            e = s + T + 1  # the window's T + 1 tokens: x its first T, y its last T
            j = int(np.searchsorted(cum, s, side="right")) - 1
            while j < rows.shape[0] and cum[j] < e:
                a = max(s - int(cum[j]), 0)
                pieces.append((w - i * B, int(cum[j]) + a - s, int(rows[j]), a,
                               min(e - int(cum[j]), int(cum[j + 1] - cum[j]))))
                j += 1
        out.rows = B
    ex = st.ex
    place = (lambda k: st.pos + int(ex.place_of[k])) if ex is not None else (
        lambda k: st.pos + int(k))
    lo, hi = (int(v) for v in layout.ranges[i])
    bad = [k for k in np.flatnonzero(verdicts < 0).tolist() if lo <= place(k) < hi]
    ks = sorted({p[2] for p in pieces} | set(bad))
    where = _where(corpus, st.packets, ks)
    out.pieces = [Piece(r, c, place(k), *where[k], s, e) for r, c, k, s, e in pieces]
    out.dropped = [Dropped(place(k), *where[k][:3],
                           DropReason(int(status_of(verdicts[k:k + 1])[0])).name)
                   for k in bad]


def _where(corpus: Any, packets: np.ndarray, ks: list[int]) -> dict[int, tuple]:
    """Chunk packet ``k`` -> (packet, shard path, offset, src, dst, typ)."""
    if not ks:
        return {}
    glob = np.asarray(packets, np.int64)[np.asarray(ks, np.int64)]
    shard = corpus.shard_of(glob)
    entries = corpus.entries_at(glob, shard)
    return {k: (int(g), str(corpus.paths[int(s)]), int(en["offset"]), int(en["src"]),
                int(en["dst"]), int(en["typ"]))
            for k, g, s, en in zip(ks, glob.tolist(), shard.tolist(), entries)}


class ExplainViews:
    """``Loader.explain`` (the Loader gives ``plan`` and ``vocab_size``)."""

    plan: Any
    vocab_size: int
    _state: dict
    _explainer: Explainer | None = None

    def explain(self, step: int, *, epoch: int | None = None) -> Explanation:
        """Which packets make (or made) run step ``step`` of this rank: per row, the pieces of
        packets it holds (shard, packet, byte offset, SRC/DST/TYP, tokens used), and what it
        dropped and why (``ndp.loader.explain``). With ``epoch``, ``step`` is the batch's
        number in that epoch. Past or future steps alike, on the CPU, apart from the running
        loop; equal to what the loop delivers. A step after where the Loader stands (a loop's,
        or a resumed state's) is found from there. ``StepError`` for a step the run has
        not."""
        have = self._explainer
        if have is None or not have.fits(self.plan):
            if have is not None:
                have.close()
            have = self._explainer = Explainer(self.plan, vocab=self.vocab_size)
        if have.plan.skip_packets is not self.plan.skip_packets:  # a resume named others:
            have.plan.skip_packets = self.plan.skip_packets  # the same order, other verdicts
            have._reached.clear()
        return have.explain(step, epoch=epoch, at=self._state)
