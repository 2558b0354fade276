"""The Loader's producer thread: plan, stage and decode chunk after chunk, epoch after epoch,
into a bounded queue that the consumer (``ndp.loader.loader``) serves from (``ndp.loader.serve``).

Each epoch delivers exactly its ``Share.batches`` batches (``ndp.loader.plan``), starting before
they are counted (``ndp.loader.count``: it delivers those below the count's bound); what it
leaves out, repeats or finds corrupt is counted by the batch that reaches it or at the epoch's
end.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from ndp.loader import units
from ndp.loader.chunks import ChunkDecoder
from ndp.errors import DataError
from ndp.loader.plan import Plan
from ndp.loader.serve import Ring
from ndp.loader.warm import Warmer


class Failure:
    """An exception raised in the producer, handed to the consumer in place of a chunk."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


EPOCH_END = object()  # the producer's last item of an epoch


class Producer:
    """The producer thread's work: plan, stage, decode, chunk after chunk, epoch after epoch.
    It references only what makes batches, not the ``Loader`` the consumer holds, so dropping
    the last reference to a ``Loader`` collects it (and its ``__del__`` stops the thread)."""

    def __init__(self, plan: Plan, chunks: ChunkDecoder, ring: Ring) -> None:
        self.plan, self.chunks, self.ring = plan, chunks, ring
        self._size = 1  # batches in the next chunk
        #: builds the next window's entry table ahead (``ndp.loader.warm``)
        self.warmer = Warmer()

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

    def _next_size(self, count: Any, done: int, stop: Any) -> tuple[int, bool] | None:
        """Batches of the next chunk, and whether it ends the epoch (``None``: the epoch is
        delivered). Below the count, or the bound every rank delivers while it is being made
        (``ndp.loader.count``; a stopped producer abandons the wait): a chunk stops a batch
        short of a bound, so that no chunk ends the epoch before the count says it does (the
        batches and what is counted do not depend on how far the count had got)."""
        want = done
        while True:
            cap, exact = count.bound(want, stop)
            if done >= cap:
                return None
            size = min(self._size, cap - done)
            if exact or size < cap - done:
                return size, exact and size == cap - done
            if size > 1:
                return size - 1, False
            want = cap  # one batch below the bound: wait for a bound past it, or the count

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
        while pos < n:
            shape = shapes.at(done)
            if done and not shapes.constant and shape != shapes.at(done - 1):
                # a new shape: its chunks start small again (1, 2, 4, ...), as an epoch's do,
                # so that the chunk cut short before the change is not followed by a whole
                # chunk's decode, which a consumer would wait for
                self._size = 1
            step = self._next_size(sh.count, done, stop.is_set)
            if step is None:
                break
            size, last = step
            change = shapes.phase_end(done)  # a chunk holds one shape: it ends before a change
            if change is not None and done + size > change:
                size, last = change - done, False
            slot = self.ring.acquire(stop)
            if slot is None:
                return None
            plan.corpus.advance(pos)
            self.warmer.current(share, pos)  # its window's entry table, if nothing builds it
            # packed: the chunk that makes the epoch's last batch reads to the share's end when
            # that is all it needs, so that the leftover packets are decoded and counted
            own_end = sh.length if plan.mode == "packed" and last else None
            chunk = self.chunks.decode(slot, share, pos, tok, counted_upto, size, own_end, shape,
                                       shapes.budget_at(done))
            self._size = min(2 * self._size, self.chunks.per_chunk(*shape))
            layout = chunk.layout
            for batch in layout.batches:
                done += 1
                batch.state["batch"] = done
                a, b = batch.counted["_range"]
                if b > sh.length:  # packed: past the share's own packets, repeating it
                    batch.counted["repeated"] = (plan.place_packets(share[max(a, sh.length):b])
                                                 if documents else b - max(a, sh.length))
                plan.by_source(share, batch.counted)
            if layout.batches:
                layout.batches[0].counted.update(pending)
                pending = {}
                counted_upto = (pos + layout.packets_used if plan.mode == "packed"
                                else layout.batches[-1].state["pos"])
                pos, tok = layout.batches[-1].state["pos"], layout.batches[-1].state["tok"]
                self.warmer.ahead(share, pos, lambda: plan.planned(epoch + 1))
                if not put(("chunk", epoch, chunk)):
                    return None
            else:
                self.ring.give_back(slot)
            if layout.end is not None:
                end = layout.end
                plan.by_source(share, end)
                break
            if not layout.batches:
                break
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
