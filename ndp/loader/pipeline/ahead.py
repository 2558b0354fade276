"""Two chunks in flight: the next chunk staged, its verdicts queued, before this one is laid out.

Per chunk the producer (``ndp.loader.pipeline.producer``) stages the packets, queues the verdict
kernel,
waits for the verdicts, lays the batches out on the host and queues the build. In that order
alone the device idles while the host lays a chunk out and plans the next, and the host idles
while the verdicts run: a chunk costs host + device. With a chunk ahead, once chunk k's verdicts
are queued the producer guesses where chunk k+1 starts, stages it into another ring slot and
queues its verdicts; then it waits for k's, lays k out and queues k's build. The device works
out k+1's verdicts while the host lays out k, so a chunk costs about max(host, device).

The guess is the index's (each packet's token count, as if none were dropped):

* padded: the next chunk starts where this one's packets end (a dropped packet leaves a row
  out, not a packet);
* packing: where this chunk's candidates end (a batch with no drop takes them all);
* packed: at the stream token ``size * B * T`` further on (not for documents split over
  packets, whose places the guess does not follow: no chunk ahead there).

It is kept only if chunk k, laid out, ends exactly there (share position, stream token and
batches made); otherwise it is dropped and the chunk is staged again from where k ended. So the
batches, states and stats are those of one chunk at a time, and a wrong guess costs one stage
and one verdict kernel (``Counters.ahead_dropped``; chunks with dropped packets, rare in real
data, are the ones that move).

What is planned ahead is what the producer would plan at that point (``plan_chunk``): the size
from the count's bound as it stands, never waiting for it (a bound not yet far enough: no chunk
ahead); the shape and token budget from the schedule; a change of shape ending it. A chunk
ahead also needs a free ring slot, taken without waiting (a producer that far ahead of the
consumer need not guess), and room in the device arena for its shards beside those of the
chunk in flight (else none). Within an epoch only: an epoch's first chunk is staged after the
last one of the epoch before is laid out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ndp.loader.pipeline.chunks import Started


@dataclass
class Next:
    """A chunk's plan: where it starts, the batches before it, and what it makes."""

    pos: int
    tok: int
    done: int  # batches of the epoch before it
    size: int  # batches it makes at most
    last: bool  # they end the epoch
    shape: tuple[int, int]
    budget: int
    own_end: int | None  # packed, the epoch's last batches: where the share's own packets end
    grow: int  # the producer's chunk size (1, 2, 4, ...) when it is planned


@dataclass
class Ahead:
    """A chunk staged ahead: its plan, what ``ChunkDecoder.start`` made of it, and the chunk
    it was staged after (one laid out again from a larger reach is not followed by it)."""

    next: Next
    started: Started
    after: Started


def next_size(count: Any, done: int, grow: int, stop: Any, wait: bool = True
              ) -> tuple[int, bool] | None:
    """Batches of the next chunk (at most ``grow``), and whether it ends the epoch (``None``: the
    epoch is delivered, or, with ``wait`` false, the count's bound does not say yet). Below the
    count, or the bound every rank delivers while it is being made (``ndp.loader.planning.count``; a
    stopped producer abandons the wait): a chunk stops a batch short of a bound, so that no
    chunk ends the epoch before the count says it does (the batches and what is counted do
    not depend on how far the count had got)."""
    want = done
    while True:
        if wait:
            cap, exact = count.bound(want, stop)
        else:
            cap, exact = count.peek()
            if not exact and cap <= want:
                return None
        if done >= cap:
            return None
        size = min(grow, cap - done)
        if exact or size < cap - done:
            return size, exact and size == cap - done
        if size > 1:
            return size - 1, False
        if not wait:
            return None
        want = cap  # one batch below the bound: wait for a bound past it, or the count


def plan_chunk(mode: str, sh: Any, shapes: Any, pos: int, tok: int, done: int, grow: int,
               stop: Any, wait: bool = True) -> Next | None:
    """The chunk after ``done`` batches, from ``(pos, tok)`` of share ``sh``
    (``ndp.loader.planning.plan.Share``) with batch ``shapes``; ``grow``: the producer's chunk size
    so
    far. ``None`` as ``next_size`` says."""
    shape = shapes.at(done)
    if done and not shapes.constant and shape != shapes.at(done - 1):
        # a new shape: its chunks start small again (1, 2, 4, ...), as an epoch's do, so
        # that the chunk cut short before the change is not followed by a whole chunk's
        # decode, which a consumer would wait for
        grow = 1
    step = next_size(sh.count, done, grow, stop, wait)
    if step is None:
        return None
    size, last = step
    change = shapes.phase_end(done)  # a chunk holds one shape: it ends before a change
    if change is not None and done + size > change:
        size, last = change - done, False
    # packed: the chunk that makes the epoch's last batch reads to the share's end when that
    # is all it needs, so that the leftover packets are decoded and counted
    own_end = sh.length if mode == "packed" and last else None
    return Next(pos, tok, done, size, last, shape, shapes.budget_at(done), own_end, grow)


def guess_end(plan: Any, share: np.ndarray, st: Started, size: int) -> tuple[int, int] | None:
    """Where the next chunk starts after ``st`` (planned for ``size`` batches) if none of its
    packets is dropped, by the index: ``(pos, tok)``; ``None`` where no guess is made (it ends
    the share or the epoch, or holds documents over several packets in packed mode)."""
    n = share.shape[0]
    if st.final or st.q >= n:
        return None
    if plan.mode != "packed":
        return st.q, 0
    if st.ex is not None:
        return None
    B, T = st.shape
    run = plan.stream_run(share, st.pos, st.q)
    if plan.align is not None:  # windows at documents: the search point after the batches
        # (``ndp.loader.layouts.align``)
        q, need = plan.aligned_point(share, st.pos, st.tok, size, B, T)
        if q < 0 or st.pos + q > st.q:
            return None
    else:
        need = st.tok + size * B * T  # the next chunk's first stream token
        if not run.shape[0] or int(run[-1]) < need + 1:  # fewer batches than planned
            return None
    skip = int(np.searchsorted(run, need, side="right"))  # packets wholly before it
    return st.pos + skip, need - (int(run[skip - 1]) if skip else 0)
