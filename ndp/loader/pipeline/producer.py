"""The Loader's producer thread: plan, stage and decode chunk after chunk, epoch after epoch,
into a bounded queue that the consumer (``ndp.loader.loader``) serves from
(``ndp.loader.pipeline.serve``).

Each epoch delivers exactly its ``Share.batches`` batches (``ndp.loader.planning.plan``), starting
before
they are counted (``ndp.loader.planning.count``: it delivers those below the count's bound); what it
leaves out, repeats or finds corrupt is counted by the batch that reaches it or at the epoch's
end.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import numpy as np

from ndp.loader.ordering import units
from ndp.loader.pipeline.ahead import Ahead, Next, guess_end, plan_chunk
from ndp.loader.pipeline.chunks import ChunkDecoder, Started
from ndp.loader.layouts.layout import COUNTS, REPEATED, Layout
from ndp.errors import DataError
from ndp.loader.planning.plan import Plan
from ndp.loader.pipeline.serve import Ring
from ndp.loader.ordering.warm import Warmer


class Failure:
    """An exception raised in the producer, handed to the consumer in place of a chunk."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


EPOCH_END = object()  # the producer's last item of an epoch
#: ``Layout.counts``' column of each field an epoch's start leaves to its first batch
COLUMN = {name: i for i, name in enumerate(COUNTS)}


class Producer:
    """The producer thread's work: plan, stage, decode, chunk after chunk, epoch after epoch.
    It references only what makes batches, not the ``Loader`` the consumer holds, so dropping
    the last reference to a ``Loader`` collects it (and its ``__del__`` stops the thread)."""

    def __init__(self, plan: Plan, chunks: ChunkDecoder, ring: Ring) -> None:
        self.plan, self.chunks, self.ring = plan, chunks, ring
        self._size = 1  # batches in the next chunk
        #: builds the next window's entry table ahead (``ndp.loader.ordering.warm``)
        self.warmer = Warmer()
        self._ahead: Ahead | None = None  # the next chunk, staged ahead
        # (``ndp.loader.pipeline.ahead``)
        self.overlap = False
        self.set_overlap(chunks.engine.has_streams)

    def set_overlap(self, on: bool) -> None:
        """Stage each chunk ahead of the one before's layout (``ndp.loader.pipeline.ahead``): on
        where
        the engine queues work on streams (a GPU), where it buys device time; tests turn it on
        for the CPU backend too, where it changes the order of host work only."""
        self.overlap = on
        if hasattr(self.chunks.stager, "per_slot"):
            self.chunks.stager.per_slot = on

    def _stage_ahead(self, st: Started, sh: Any, shapes: Any, cur: Next, stop: Any
                     ) -> Ahead | None:
        """Chunk ``st`` (planned as ``cur``) has its verdicts queued: stage the chunk after
        it where the index says it starts, if it is known without waiting and a ring slot is
        free (``ndp.loader.pipeline.ahead``)."""
        share = sh.packets
        guess = guess_end(self.plan, share, st, cur.size)
        if guess is None or guess[0] >= share.shape[0]:
            return None
        grow = min(2 * cur.grow, self.chunks.per_chunk(*cur.shape))
        nxt = plan_chunk(self.plan.mode, sh, shapes, guess[0], guess[1], cur.done + cur.size,
                         grow, stop.is_set, wait=False)
        if nxt is None:
            return None
        slot = self.ring.try_acquire()
        if slot is None:
            return None
        self.warmer.current(share, nxt.pos)
        try:
            started = self.chunks.start(slot, share, nxt.pos, nxt.tok, nxt.size, nxt.shape,
                                        nxt.budget, nxt.own_end, keep=st.staged.shards)
        except Exception:  # noqa: BLE001 - no room beside the chunk in flight, or an error
            # that staging it in its turn raises, after this chunk is delivered
            self.ring.give_back(slot)
            return None
        self.chunks.engine.counters.staged_ahead += 1
        return Ahead(nxt, started, st)

    def _count(self, layout: Layout, sh: Any, done: int, pending: dict, documents: bool
               ) -> None:
        """What the chunk's batches counted beyond their layout: the epoch's batches before
        them, the share's repeat (packed: a batch past the share's own packets), packets per
        source (mixing), and what the epoch's start left to its first batch (``pending``,
        which replaces what that batch counted of the same)."""
        plan, share = self.plan, sh.packets
        layout.first = done
        counts, ranges = layout.counts, layout.ranges
        for i in np.flatnonzero(ranges[:, 1] > sh.length).tolist():  # past the share's own
            a, b = max(int(ranges[i, 0]), sh.length), int(ranges[i, 1])
            counts[i, REPEATED] = plan.place_packets(share[a:b]) if documents else b - a
        if plan.mixes:
            for i, (a, b) in enumerate(ranges.tolist()):
                found = plan.sources_in(share, a, b)
                if found is not None:
                    layout.extra[i] = {"sources": found}
        for key, value in pending.items():
            counts[0, COLUMN[key]] = value

    def _drop(self, ahead: Ahead | None = None) -> None:
        """Let go of a chunk staged ahead that is not decoded (``ahead``, or the one held)."""
        if ahead is None:
            ahead, self._ahead = self._ahead, None
        if ahead is not None:
            self.chunks.drop(ahead.started)
            self.ring.give_back(ahead.started.slot)
            self.chunks.engine.counters.ahead_dropped += 1

    def run(self, state: dict, out: queue.Queue, stop: threading.Event) -> None:
        """Put ``("chunk", epoch, Chunk)`` and, at each epoch's end, ``(EPOCH_END, next
        state, what the end counted)`` into ``out`` from ``state`` on, until ``stop``; an
        exception is handed to the consumer in place of a chunk."""
        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        # the first chunks after a start are small (1, 2, 4, ... batches): the first batch
        # comes after one batch's decode, not a whole chunk's
        self._size = 1
        try:
            self.chunks.engine.enter_thread()  # the Loader's GPU, not the thread's default
            while not stop.is_set():
                tail = self._epoch(state, put, stop)
                if tail is None:
                    return
                state = tail[1]
                if not put(tail):
                    return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            put(Failure(exc))
        finally:
            try:  # a chunk staged ahead when the producer stopped (or failed: a device
                self._drop()  # error raised again here is the consumer's already)
            except Exception:  # noqa: BLE001
                self._ahead = None

    def _epoch(self, state: dict, put: Any, stop: threading.Event) -> tuple | None:
        """The chunks of the rest of ``state``'s epoch; returns the epoch's end item (None if
        stopped)."""
        plan = self.plan
        epoch, pos, tok, done = state["epoch"], state["pos"], state["tok"], state["batch"]
        sh = plan.share(epoch, stop=stop.is_set)  # a stopped producer abandons the pass
        shapes = plan.shapes_of(epoch)  # batch shapes from the epoch's first batch
        plan.plan_ahead(epoch + 1)  # while this one is delivered: no wait at its end
        share, n = sh.packets, sh.packets.shape[0]
        fresh = pos == 0 and tok == 0
        pending = {"dropped_on_purpose": sh.dropped} if fresh else {}
        if fresh and sh.redelivered:
            pending["repeated"] = sh.redelivered
        counted_upto = pos  # share positions before this were counted by an earlier batch
        documents = units.active(plan.corpus, plan.mode)  # places hold whole documents
        end: dict = {}
        plan.corpus.will_read(share, pos, end=sh.length)  # remote shards: fetched in this order
        self._drop()
        while pos < n:
            ahead, self._ahead = self._ahead, None
            if ahead is not None and (ahead.next.pos, ahead.next.tok, ahead.next.done) == (
                    pos, tok, done):  # staged ahead, where the chunk before ended
                nxt, slot, started = ahead.next, ahead.started.slot, ahead.started
            else:
                self._drop(ahead)
                nxt = plan_chunk(plan.mode, sh, shapes, pos, tok, done, self._size, stop.is_set)
                if nxt is None:
                    break
                slot, started = self.ring.acquire(stop), None
                if slot is None:
                    return None
            self._size = nxt.grow
            size, last, shape = nxt.size, nxt.last, nxt.shape
            plan.corpus.advance(pos)
            self.warmer.current(share, pos)  # its window's entry table, if nothing builds it

            def then(st: Started, nxt: Next = nxt) -> bool:  # the next chunk, staged ahead
                self._ahead = self._stage_ahead(st, sh, shapes, nxt, stop)
                return self._ahead is not None

            chunk = self.chunks.decode(slot, share, pos, tok, counted_upto, size, nxt.own_end,
                                       shape, nxt.budget, started=started,
                                       then=then if self.overlap else None)
            if self._ahead is not None and self._ahead.after is not chunk.started:
                self._drop()  # staged after an attempt that was laid out again, larger
            self._size = min(2 * self._size, self.chunks.per_chunk(*shape))
            layout = chunk.layout
            if layout.n:
                self._count(layout, sh, done, pending, documents)
                pending = {}
                done += layout.n
                counted_upto = (pos + layout.packets_used if plan.mode == "packed"
                                else int(layout.pos[-1]))
                pos, tok = int(layout.pos[-1]), int(layout.tok[-1])
                self.warmer.ahead(share, pos, lambda: plan.planned(epoch + 1))
                chunk.batches = self.ring.prepare(chunk.slot, layout)  # next() hands them out
                if not put(("chunk", epoch, chunk)):
                    return None
            else:
                self.ring.give_back(slot)
            if layout.end is not None:
                end = layout.end
                plan.by_source(share, end)
                break
            if not layout.n:
                break
        self._drop()  # a chunk staged ahead of the epoch's last
        tables = getattr(share, "tables", None)
        if tables is not None:  # read: its entry tables go (the plan keeps the share)
            tables.clear()
        cap = sh.count.batches(stop.is_set)
        if done < cap:
            raise DataError(
                f"rank {plan.rank}: epoch {epoch} holds too few valid tokens to deliver the "
                f"{cap} batches every rank delivers (it delivered {done}, even repeating its "
                f"share); its shards are mostly corrupt: run 'ndp verify' on the data")
        # every rank stops at the same batch: the rest of this share, and what was cut from
        # its end to make the shares equal, is left out, counted
        left = sh.balanced + (plan.place_packets(share[counted_upto:sh.length]) if documents
                              else max(sh.length - counted_upto, 0))
        if left:
            end["rank_balance"] = left
        end.update(pending)
        if sh.mix_unused:
            end["mix_unused"] = sh.mix_unused
        if sh.mix_repeated:
            end["mix_repeated"] = sh.mix_repeated
        return (EPOCH_END, {"epoch": epoch + 1, "pos": 0, "tok": 0, "batch": 0}, end)
