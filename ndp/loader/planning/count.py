"""An epoch's batch count, worked out while its batches are delivered (``Count``), and the
pass that works it out for a share read place by place (``count_pass``).

Every rank must deliver the same number of batches (``ndp.loader.planning.plan``): in ``packed`` and
``packing`` mode that is the smallest any rank's share makes by the index's token counts, a
pass over every packet of the epoch (seconds at 1e8 packets). The producer does not wait for
it: the pass runs on the plan's thread (``ndp-plan``) and publishes, block by block, a lower
bound of the count (token sums and batch counts only grow as packets are added), and the
producer delivers any batch below the bound, waiting only if it catches up with the pass
(it never has in the benchmarks: the pass reads the index ~100x faster than batches are
decoded). ``padded`` counts need no pass; its pass counts what rows cut (``Cut``) for the
report, and nobody waits for it.

The first bound comes early: in ``packing`` and ``packed`` mode the pass first counts the
epoch's first ``PRIME`` places from their index entries read one by one (a bound from a few of
every shard's entries, before the first window's index is read whole), then waits until the
rest of the count is wanted (``Count.hold``): when the producer asks for a bound past its first
chunk, or anyone for the count itself (``len()``), or after ``GO_WAIT`` seconds. So the first
batch does not share the host's cores with reading and checking a window of indexes (at 1e8
documents, a second of CPU); a count wanted before the pass starts skips the first bound.

The pass holds a block of ``BLOCK`` packets at a time (``packing``: and the token counts of
one window, int32): it reads each window's index in file order and finds each packet's place
in the epoch by the inverse permutation (``Window.places``), so the reads are sequential; only
``packing``, whose count depends on the order, gathers in the order's places.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from ndp.loader.layouts import align as aligned
from ndp.loader.ordering import units
from ndp.loader.planning.epoch import Stopped, window_tokens
from ndp.loader.layouts.packing import count_batches_by_rank, new_carry
from ndp.loader.planning.shapes import Shapes
from ndp.loader.layouts.truncation import Cut
from ndp.loader.planning.marks import Marks, mark_every

#: packets a pass handles at once (a few arrays of 8 bytes a packet: ~10 MB)
BLOCK = 1 << 18
#: packing and packed: the epoch's first places counted from their entries read one by one,
#: for a first bound before the first window's tokens are read whole (1 s for 27 M packets here)
PRIME = 1 << 15
#: seconds a pass waits after its first bound for the rest of the count to be wanted, at most
GO_WAIT = 2.0


def tokens_one_by_one(corpus: Any, win: Any, n: int) -> np.ndarray:
    """The token counts of the first ``n`` places of ``win``'s order, their index entries
    read one by one (``ndp.store.columns.entries_one_by_one``; a held index: a gather)."""
    from ndp.store.columns import entries_one_by_one, tokens_of

    packets = win.at(np.arange(n, dtype=np.int64))
    if getattr(corpus, "indexes", None) is None:  # token counts held whole
        return np.asarray(corpus.tokens[packets], np.int64)
    e = entries_one_by_one(corpus, packets)
    return tokens_of(e["length"], e["typ"])


class Count:
    """An epoch's batch count: known (``batches``), or being counted by ``work`` (a callable
    of this ``Count`` and a ``stop``, that ``publish``es bounds and ``finish``es), which
    ``run`` runs once, on whichever thread asks first."""

    def __init__(self, batches: int | None = None, *, cut: Cut | None = None,
                 work: Callable[[Count, Any], None] | None = None) -> None:
        self._cond = threading.Condition()
        self._batches = batches
        self._bound = batches if batches is not None else 0
        self.cut = cut
        self._work = work
        self._error: BaseException | None = None
        self._running = threading.Lock()
        #: the rest of the pass is wanted (``hold``): set by a bound asked past the first
        #: chunk, a wait for the count, or ``GO_WAIT`` seconds
        self._go = threading.Event()
        self.final = work is None  #: the pass is done (or there is none)
        self.peak = 0  #: the most elements of any per-packet array the pass built
        #: ``(every, at)``: batch ``j * every`` of this rank starts at ``at[j]``, a
        #: ``[position, token]`` of its share (``ndp.loader.planning.marks``), or None
        self.marks: tuple[int, list[list[int]]] | None = None

    @property
    def known(self) -> bool:
        """The count is known (waiting for it returns at once)."""
        return self._batches is not None

    @property
    def wanted(self) -> bool:
        """Someone waits for more than the pass's first bound (``hold`` does not wait)."""
        return self._go.is_set()

    def hold(self, stop: Any = None) -> None:
        """The pass, its first bound published: wait until the rest is wanted (at most
        ``GO_WAIT`` seconds; not at all with no bound to deliver from); ``stop`` abandons it
        (``Stopped``)."""
        if self._bound <= 0:
            return
        waited = 0.0
        while not self._go.wait(0.05):
            waited += 0.05
            if stop is not None and stop():
                raise Stopped("counting an epoch's batches stopped")
            if waited >= GO_WAIT:
                return

    def publish(self, bound: int) -> None:
        """At least ``bound`` batches: every rank delivers that many."""
        with self._cond:
            if bound > self._bound:
                self._bound = bound
                self._cond.notify_all()

    def finish(self, batches: int | None = None, cut: Cut | None = None,
               marks: tuple[int, list[list[int]]] | None = None) -> None:
        """The pass is done: the count (if it counted it), the cut and the marks."""
        with self._cond:
            if batches is not None:
                self._batches = self._bound = batches
            if cut is not None:
                self.cut = cut
            if marks is not None:
                self.marks = marks
            self.final = True
            self._cond.notify_all()

    def run(self, stop: Any = None) -> None:
        """Run the pass unless it is done or running (a ``Stopped`` pass is left undone, to
        be run again; a failed one fails every wait on this count)."""
        if self.final or not self._running.acquire(blocking=False):
            return
        try:
            if not self.final:
                self._work(self, stop)
        except Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - raised to whoever waits for the count
            with self._cond:
                self._error = exc
                self._cond.notify_all()
        finally:
            self._running.release()

    def _wait(self, ready: Callable[[], bool], stop: Any) -> None:
        while True:
            with self._cond:
                if self._error is not None:
                    raise self._error
                if ready():
                    return
                self._cond.wait(0.05)
                if ready():
                    return
            if stop is not None and stop():
                raise Stopped("waiting for an epoch's batch count stopped")
            if not self._running.locked() and not self.final:
                self.run(stop)  # nobody is counting (the plan's thread was stopped): count here

    def batches(self, stop: Any = None) -> int:
        """The count; waits for the pass if it is still counting."""
        self._go.set()
        self._wait(lambda: self._batches is not None, stop)
        return int(self._batches)

    def counted(self, stop: Any = None) -> None:
        """Wait for the pass to be done (the padded cut too)."""
        self._go.set()
        self._wait(lambda: self.final, stop)

    def peek(self) -> tuple[int, bool]:
        """``bound``'s answer as it stands, never waiting: ``(the count, True)`` if it is
        known, else ``(the bound so far, False)``."""
        with self._cond:
            if self._batches is not None:
                return int(self._batches), True
            return self._bound, False

    def bound(self, done: int, stop: Any = None) -> tuple[int, bool]:
        """A number of batches above ``done`` that every rank delivers, or the count if it is
        not above it: ``(batches, exact)``. Waits for the pass only while its bound is not
        above ``done``; ``stop`` abandons the wait (``Stopped``). Asked past the first chunk
        (``done`` > 0), it lets a held pass go on (``hold``)."""
        if done > 0:
            self._go.set()
        self._wait(lambda: self._batches is not None or self._bound > done, stop)
        with self._cond:
            if self._batches is not None:
                return int(self._batches), True
            return self._bound, False


def primed(mode: str, align: str | None, corpus: Any) -> bool:
    """Whether a pass publishes a first bound from ``PRIME`` places read one by one: packing,
    and packed with windows not at documents and places that are packets (a greedy count at
    documents, or documents over several packets, are left to the whole pass)."""
    return mode == "packing" or (mode == "packed" and align is None
                                 and not units.active(corpus, "packed"))


def count_pass(corpus: Any, windows: list, *, world_size: int, length: int, mode: str,
               shapes: Shapes, count: Count, stop: Any = None,
               publish: Callable[[int], None] | None = None, block: int = BLOCK,
               align: str | None = None
               ) -> tuple[int | None, list[Cut] | None, dict | None]:
    """Count ``windows``' epoch for ``RankOrder`` shares of ``length`` places a rank
    (``ndp.loader.ordering.share``): ``packed``, every rank's token sum; ``packing``, every rank's
    greedy batch count; ``padded``, every rank's ``Cut`` (``shapes``: the epoch's batch shapes,
    ``ndp.loader.planning.shapes``); packed windows at documents (``align``), every rank's greedy
    window count (``ndp.loader.layouts.align``). Publishes bounds to ``count`` (and
    ``publish``; its ``peak`` too) as it goes; returns (the batch count, or None in padded
    mode; the cut of each rank, or None; the marks, ``ndp.loader.planning.marks.Marks``'
    ``as_dict``, in packing mode and in packed mode with one batch shape and windows not at
    documents, else None), for the caller to ``finish`` it with."""
    W, limit = world_size, length * world_size  # places from ``limit`` on are cut from all
    sums = np.zeros(W, np.int64)
    carry = new_carry(W)
    # packed marks: where the index's stream reaches each batch, in the order's places
    marked = mode == "packing" or (mode == "packed" and align is None and shapes.constant)
    per_batch = shapes.sizes[0] * shapes.lens[0]
    marks = Marks(W, mark_every(length, per_batch=per_batch if mode == "packed" else None))
    at_docs = aligned.new_carry(W)  # packed, align="bos"
    ordered = mode == "packing" or (mode == "packed" and (align is not None or marked))
    cuts = np.zeros((4, W), np.int64)  # per rank: tokens, truncated, longer, longest
    # padded: the T of each share position's row (one T: no array)
    seq_len = shapes.lens[0] if shapes.constant else None
    lens = shapes.row_lens(length) if mode == "padded" and seq_len is None else None

    def bound(value: int) -> None:
        count.publish(value)
        if publish is not None:
            publish(value)

    def greedy(toks: np.ndarray, a: int, b: int) -> None:
        """The window's places ``[a, b)`` (of tokens ``toks``) laid out by rank, in order:
        packing's greedy count, or packed windows at documents."""
        kept = max(min(b, limit - at) - a, 0)  # places from limit on: cut
        if mode == "packed" and align is not None:
            off = (at + a) % W  # element i of the laid-out block is rank i % W's
            lengths = np.zeros(off + b - a, np.int64)
            lengths[off:] = toks
            take = np.zeros(off + b - a, bool)
            take[off: off + kept] = True
            aligned.count_aligned_by_rank(lengths, take, W, shapes, at_docs)
            bound(int(aligned.batches(at_docs).min()))
            return
        # element i is epoch place at + a + i, rank (at + a + i) % W's
        marks.add(count_batches_by_rank(toks[:kept], None, W, shapes, carry,
                                        every=marks.every, first=at + a))
        bound(int(carry[2].min()))

    # the windows' token counts, one window at a time, in one buffer
    held = np.empty(max((w.size for w in windows), default=0) if ordered else 0, np.int32)
    at = 0  # the epoch place of the window's first packet
    for win in windows:
        if at >= limit:
            break
        size = win.size
        first = 0  # packing: the window's first places counted before its tokens are read
        if at == 0 and not count.wanted and primed(mode, align, corpus):
            # a first bound before a whole window is read, then the first chunk's turn
            n = min(PRIME, size, limit)
            toks = tokens_one_by_one(corpus, win, n)
            if mode == "packing":
                first = n
                greedy(toks, 0, n)
            else:  # packed: each rank's sum so far (the pass counts these places again)
                part = np.bincount(np.arange(n) % W, weights=toks, minlength=W)
                bound(shapes.packed_batches(int(part.min())))
            if n < size or len(windows) > 1:
                count.hold(stop)
        column = (window_tokens(corpus, win, documents=mode == "packed", out=held, stop=stop)
                  if ordered else None)
        count.peak = max(count.peak, 0 if column is None else size)
        most = int(column.max()) if column is not None and column.shape[0] else 0
        for a in range(first, size, block):
            if stop is not None and stop():
                raise Stopped("counting an epoch's batches stopped")
            b = min(a + block, size)
            count.peak = max(count.peak, b - a)
            if ordered:  # in the order's places: the greedy count follows the order
                if at + a >= limit:
                    break
                if marked and mode == "packed":  # each rank's stream, where it reaches each
                    # marked batch: one compiled pass, the walk of the order included
                    marks.packed(column, win, a, b, at=at, limit=limit, per_batch=per_batch,
                                 most_tokens=most)
                    bound(shapes.packed_batches(int(marks.sums.min())))
                    continue
                greedy(win.take(column, a, b), a, b)
                continue
            # in file order: the index read in order (packed: each place's document)
            toks = window_tokens(corpus, win, a, b, documents=mode == "packed", stop=stop)
            places = at + win.places(np.arange(a, b, dtype=np.int64))
            within = places < limit
            ranks, toks = places[within] % W, toks[within].astype(np.int64)
            if mode == "packed":
                sums += np.bincount(ranks, weights=toks, minlength=W).astype(np.int64)
                bound(shapes.packed_batches(int(sums.min())))
            else:  # a row's T: its batch's (a place's position in its share is place // W)
                row_len = seq_len if seq_len is not None else lens[places[within] // W]
                over = np.maximum(toks - row_len, 0)
                cuts[0] += np.bincount(ranks, weights=toks, minlength=W).astype(np.int64)
                cuts[1] += np.bincount(ranks, weights=over, minlength=W).astype(np.int64)
                cuts[2] += np.bincount(ranks[over > 0], minlength=W)
                np.maximum.at(cuts[3], ranks, toks)
        at += size
    if mode == "packed" and align is not None:
        return int(aligned.batches(at_docs).min()), None, None
    if mode == "packed" and marked:
        return shapes.packed_batches(int(marks.sums.min())), None, marks.as_dict()
    if mode == "packed":
        return shapes.packed_batches(int(sums.min())), None, None
    if mode == "packing":
        return int(carry[2].min()), None, marks.as_dict()
    return None, [Cut(*(int(v) for v in cuts[:, r])) for r in range(W)], None
