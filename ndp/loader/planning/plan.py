"""Plan: which packets this rank reads each epoch, in which order, and how they are cut into
chunks (the first stage of the Loader's pipeline: plan, stage, decode, serve).

The order, rank split, CRC-Drop and mixing are ``ndp.loader.ordering.order``'s pure functions of the
seed and
epoch.

Every epoch has a batch count (``len(loader)``), and every rank delivers that many (else a
distributed training loop waits on a collective that one rank never joins): each rank works
out, with no communication (all of it is a function of the seed, the epoch and the index),
how many packets every rank's share keeps; the shares are cut to the shortest one's count
(what is cut is counted as ``rank_balance``), and the epoch's batch count is the smallest any
rank's cut share makes by the index. Without CRC-Drop, mixing or an elastic remainder, every
share keeps ``packets // W``: the share is read place by place (``ndp.loader.ordering.share``), and
the
count is worked out on the plan's thread while the batches are delivered
(``ndp.loader.planning.count``: ``len(loader)`` waits for it, the producer only if it catches up).
With CRC-Drop, a pass over the epoch's shuffle windows (two in ``packed`` and ``packing``
mode; ``ndp.loader.planning.epoch``) that holds one window's packets at a time, per-rank counters
and
this rank's own share, never the epoch's whole order or another rank's share. With mixing (which
draws over a rank's whole
share) or in an elastic remainder (``ndp.loader.states.elastic``: a whole order already), the whole
order and every rank's share are built, O(packets). That count is exact for ``padded`` and
``packing`` batches whatever is corrupt (a corrupt packet makes its batch shorter, not
absent); in ``packed`` mode a rank whose corrupt packets leave its stream short goes on from
the start of its share (counted as ``repeated``) to deliver it, with one rank as with
several.

A chunk is a run of consecutive packets of the share that holds ``batches`` batches by the
index's token counts; the batches themselves are laid out after decoding
(``ndp.loader.layouts.layout``), from what the packets really hold, so the cut never changes a
batch:
with fewer batches per chunk, or more, the Loader delivers the same ones.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from ndp.loader.ordering import units
from ndp.loader.layouts.align import count_aligned
from ndp.loader.planning.count import Count
from ndp.loader.planning.epoch import plan_epoch
from ndp.loader.ordering.order import (
    ORDER,
    WINDOW_BYTES,
    check_mix_size,
    check_window,
    epoch_windows,
    packets_at_once,
)
from ndp.loader.layouts.packing import count_batches
from ndp.loader.planning.reach import Reach
from ndp.loader.ordering.share import RankOrder, Share
from ndp.loader.planning.shapes import Shapes
from ndp.loader.planning.steps import RunSteps
from ndp.loader.planning.shared_count import epoch_count
from ndp.loader.ordering.sources import Mixing
from ndp.loader.ordering.whole import share_whole
from ndp.store.corpus import Corpus
from ndp.wire.format import INDEX_ENTRY_DTYPE


ENTRY_BYTES = INDEX_ENTRY_DTYPE.itemsize


class Plan(Reach, RunSteps, Mixing):
    """This rank's share of each epoch and the chunks of it (see the module docstring)."""

    #: packed windows with their documents' boundaries (``ndp.loader.layouts.documents``)
    documents = False
    #: packed windows that start at documents: "bos", else None (``ndp.loader.layouts.align``)
    align: str | None = None

    def __init__(self, corpus: Corpus, *, mode: str, batch_size: Any, seq_len: Any,
                 shuffle: bool, seed: int, rank: int, world_size: int, crc_drop_rate: float,
                 mix: dict | None, mix_by: str, mix_size: str | int = "shortest",
                 shuffle_window: int | str = WINDOW_BYTES, batch_tokens: Any = None) -> None:
        self.corpus, self.mode = corpus, mode
        self._set_shapes(batch_size, seq_len, batch_tokens)
        #: the run step of each epoch's first batch, where known (``start_step``)
        self._starts: dict[int, int] = {0: 0}
        self.shuffle, self.seed, self.rank, self.world_size = shuffle, seed, rank, world_size
        self.crc_drop_rate = crc_drop_rate
        check_mix_size(mix_size)
        self._window_bytes = check_window(shuffle_window)
        self.shuffle_window = "all" if self._window_bytes is None else self._window_bytes
        self.mix_size = mix_size if isinstance(mix_size, str) else int(mix_size)
        self._setup_mix(mix, mix_by)
        self._shares: dict[int, Share] = {}
        self._batches: dict[int, int] = {}  # each epoch's batch count, once planned
        self._shard_bytes = np.array([s.size for s in corpus.shards], np.int64)
        self._fit_cache(whole=crc_drop_rate > 0 or mix is not None or self._budget_padded)
        self._blocks_of: np.ndarray | None = None  # the share ``share_tokens`` remembers
        self._blocks: dict[int, np.ndarray] = {}
        self._ahead: threading.Thread | None = None  # the plan's thread (``plan_ahead``)
        self._ahead_stop = threading.Event()
        self._wanted = -1  # the epoch the producer wants planned ahead
        self._store = threading.Lock()  # guards _shares and _batches
        # : an epoch whose rest comes from a run with other ranks
        # (``ndp.loader.states.elastic.Remainder``)
        self.elastic: Any = None
        #: the plan of the dataset before it grew, for the epoch resumed in (``set_elastic``)
        self.grown: Plan | None = None
        self.resumed = -1  #: a ``grown`` plan's epoch
        self._whole: dict | None = None  # ``memo``
        #: the most elements of any per-packet array the last epoch's planning built (this
        #: rank's own share aside): a window's packets (``ndp.loader.planning.epoch``), or the whole
        #: order with mixing or an elastic remainder
        self.peak_plan_elements = 0

    @property
    def _budget_padded(self) -> bool:
        """Padded batches cut by a token budget: planned by a pass over the windows."""
        return self.mode == "padded" and self.shapes.budgeted

    def _fit_cache(self, *, whole: bool) -> None:
        """The corpus' entry cache: a share built ``whole`` gathers entries by packet, so it
        holds those of what a chunk may read among (two windows); a share read place by place
        holds its own (``ndp.loader.ordering.share_entries``), and the cache only what else asks."""
        cache = getattr(self.corpus, "entry_cache", None)
        if cache is not None:
            cache.fit(ENTRY_BYTES * packets_at_once(
                np.diff(self.corpus.base), self._shard_bytes, shuffle=self.shuffle,
                window=self._window_bytes) if whole else 0)

    def variant(self, *, rank: int, world_size: int, batch_size: Any, seq_len: Any,
                start: int | None = None, epoch: int | None = None,
                batch_tokens: Any = "same", mix: Any = "same", mix_size: Any = "same",
                corpus: Corpus | None = None) -> Plan:
        """This plan for another rank, world size, batch shape or mix (the same order,
        CRC-Drop and elastic remainder): how an earlier run's ranks cut their epochs;
        ``start``: the run step ``epoch`` began at in that run; ``mix``: ``mix=`` as given to
        a Loader, ``mix_size`` as a state records it; ``corpus``: the first shards of this
        plan's, as the dataset was before it grew (``ndp.store.growth``)."""
        other = copy.copy(self)
        if corpus is not None:
            other.corpus, other._shard_bytes = corpus, self._shard_bytes[:len(corpus.shards)]
        other.rank, other.world_size = rank, world_size
        other._set_shapes(batch_size, seq_len,
                          self.tokens_setting if batch_tokens == "same" else batch_tokens)
        if mix_size != "same":
            check_mix_size(mix_size)
            other.mix_size = mix_size if isinstance(mix_size, str) else int(mix_size)
        if mix != "same":
            other._setup_mix(mix, self._mix_by)
        other._starts = dict(self._starts)
        if start is not None:
            other._starts = {epoch: start}
        other._shares = {}
        other._blocks_of, other._blocks = None, {}
        other._batches = {}
        other._ahead, other._ahead_stop, other._wanted = None, threading.Event(), -1
        other._store = threading.Lock()
        other.grown, other.resumed = None, -1
        return other

    def go_on(self, resumed: Any) -> None:
        """Plan from where a resume goes on (``ndp.loader.states.resume.Resumed``): its remainder,
        the dataset as it was, its epoch's first step, and its share as planned already."""
        self.set_elastic(resumed.rest, resumed.grown)
        epoch = resumed.position["epoch"]
        self.set_start(epoch, resumed.start)
        if resumed.planned is not None:  # counted already (``ndp.loader.states.resume``)
            plans = resumed.grown if resumed.grown is not None else self
            with plans._store:
                plans._shares[epoch] = resumed.planned
                plans._batches[epoch] = resumed.planned.batches

    def planned_share(self, epoch: int) -> Share | None:
        """``epoch``'s share if planned (never plans it)."""
        return self._shares.get(epoch)

    def set_elastic(self, remainder: Any, grown: Plan | None = None) -> None:
        """Take the rest of ``remainder.epoch`` from ``remainder`` (or nothing: ``None``);
        ``grown``: the plan of the dataset before it grew, which plans the epoch resumed in
        (``ndp.loader.states.resume``; ``None``: none)."""
        self.stop_ahead()
        self.elastic, self.grown = remainder, grown
        self._shares, self._batches = {}, {}
        self._fit_cache(whole=remainder is not None or self.crc_drop_rate > 0
                        or self._mix_keys is not None or self._budget_padded)

    @contextlib.contextmanager
    def memo(self) -> Iterator[None]:
        """Within: this plan and those made from it (``variant``) share the last epoch built
        whole (``ndp.loader.ordering.whole``), so that a resume from many old ranks builds it
        once."""
        self._whole = {}
        try:
            yield
        finally:
            self._whole = None

    def plan_ahead(self, epoch: int) -> None:
        """Plan ``epoch`` ahead, on the plan's thread (``ndp-plan``; one at most, ending when
        it has nothing to do): the producer asks for the next epoch when it starts one, so that
        the epoch's boundary waits neither for its plan nor for its batch count (seconds at
        1e8 packets). ``share`` takes what it made; ``stop_ahead`` abandons it."""
        with self._store:
            self._wanted = max(self._wanted, epoch)
        self._planner()

    def _planner(self) -> None:
        """Start the plan's thread unless it runs: it counts the shares whose counts are not
        done (oldest epoch first), then plans the epoch wanted ahead."""
        with self._store:
            if self._ahead is not None and self._ahead.is_alive():
                return
            self._ahead_stop.clear()
            stop = self._ahead_stop.is_set

            def run() -> None:
                while not stop():
                    with self._store:
                        todo = [self._shares[e] for e in sorted(self._shares)
                                if not self._shares[e].count.final]
                        wanted = self._wanted
                    if todo:
                        todo[0].count.run(stop)
                        if not todo[0].count.final:
                            return  # stopped, or failed: raised to whoever waits for it
                        continue
                    if wanted < 0 or wanted in self._shares:
                        return
                    try:
                        self.share(wanted, stop=stop)
                    except BaseException:  # noqa: BLE001 - stopped, or failed: share() plans
                        return  # it again when it is needed, and raises there

            thread = threading.Thread(target=run, name="ndp-plan", daemon=True)
            thread.start()  # then published: a thread that joins it finds it started
            self._ahead = thread

    def stop_ahead(self) -> None:
        """Abandon what the plan's thread is doing (a count or a plan made ahead, taken up
        again when wanted), and wait for it (at most a block's or a window's pass); and the
        thread of the plan of the dataset as it was (``grown``) too."""
        if self.grown is not None:
            self.grown.stop_ahead()
        thread = self._ahead
        if thread is not None:
            self._ahead_stop.set()
            thread.join()
            self._ahead = None
        self._wanted = -1

    # ------------------------------------------------------------------------------ shares
    def share(self, epoch: int, *, stop: Any = None) -> Share:
        """This rank's ``Share`` of ``epoch`` (after CRC-Drop, mixing and the rank balance);
        ``stop``: a callable that abandons the pass (``ndp.loader.planning.epoch.Stopped``) when
        true.
        Without CRC-Drop, mixing or an elastic remainder it is made at once (a ``RankOrder``)
        and its batch count is counted on the plan's thread (``ndp.loader.planning.count``)."""
        have = self._shares.get(epoch)
        if have is not None:
            if not have.count.final:
                self._planner()  # counted on the plan's thread (again, if it was stopped)
            return have
        ahead = self._ahead
        if (ahead is not None and ahead is not threading.current_thread()
                and self._wanted == epoch):
            ahead.join()  # the epoch is being planned ahead: take it when made
            have = self._shares.get(epoch)
            if have is not None:
                return self.share(epoch)
        rest = self.elastic if self.elastic is not None and self.elastic.epoch == epoch else None
        # padded batches cut by a token budget are counted by the pass over the windows
        lazy = (rest is None and self._mix_keys is None and self.crc_drop_rate == 0
                and not self._budget_padded)
        if self.grown is not None and self.grown.resumed == epoch:
            share = self.grown.share(epoch, stop=stop)  # the dataset as it was then
        elif lazy:
            share = self._share_lazy(epoch)
        elif rest is None and self._mix_keys is None:  # a pass over the windows
        # (ndp.loader.planning.epoch)
            walked = plan_epoch(self.corpus, epoch=epoch, seed=self.seed, shuffle=self.shuffle,
                                shard_bytes=self._shard_bytes, window_bytes=self._window_bytes,
                                rate=self.crc_drop_rate, rank=self.rank,
                                world_size=self.world_size, mode=self.mode,
                                shapes=self.shapes_of(epoch), stop=stop, align=self.align)
            self.peak_plan_elements = walked.peak
            own, m = walked.own, walked.length
            packets = np.concatenate([own, own]) if self.mode == "packed" else own
            share = Share(packets, m, Count(walked.batches, cut=walked.cut), walked.dropped,
                          {}, {}, walked.balanced)
        else:
            share = share_whole(self, epoch, rest)
        # the producer works an epoch ahead of the consumer (and of len()), and plans the one
        # after it ahead: keep two shares, and every batch count
        with self._store:  # the producer, the consumer and the plan's thread
            if share.count.final:
                self._batches[epoch] = share.batches
            self._shares[epoch] = share
            while len(self._shares) > 2:
                self._shares.pop(next(iter(self._shares)), None)
        if not share.count.final:
            self._planner()
        return share

    def _share_lazy(self, epoch: int) -> Share:
        """The share read place by place (``ndp.loader.ordering.share.RankOrder``), its batch count
        (and padded cut) found written or left to a count made on the plan's thread
        (``ndp.loader.planning.shared_count.epoch_count``)."""
        n, W = int(self.corpus.n_packets), self.world_size
        length = n // W
        windows = list(epoch_windows(self.corpus.base, seed=self.seed, epoch=epoch,
                                     shuffle=self.shuffle, shard_bytes=self._shard_bytes,
                                     window_bytes=self._window_bytes))
        order = RankOrder(windows, rank=self.rank, world_size=W, length=length,
                          repeat=self.mode == "packed", corpus=self.corpus)
        shapes = self.shapes_of(epoch)
        known = shapes.padded_batches(length) if self.mode == "padded" else None

        def done(batches: int | None, peak: int) -> None:
            self.peak_plan_elements = peak
            with self._store:
                self._batches[epoch] = known if batches is None else batches

        count = epoch_count(self.corpus, windows, self.count_fields(epoch), rank=self.rank,
                            world_size=W, length=length, mode=self.mode, shapes=shapes,
                            known=known, done=done)
        own = (n - self.rank + W - 1) // W  # this rank's places of the epoch
        cut = own - length  # its places past the shares' length: counted as rank_balance
        if cut and units.active(self.corpus, self.mode):  # in packets: each a document's
            cut = self.place_packets(order.beyond(length, own))
        return Share(order, length, count, 0, {}, {}, cut)

    def dataset_of(self, epoch: int) -> dict:
        """The ``fingerprint`` and ``n_packets`` of the data ``epoch`` is read from (a state
        records them)."""
        corpus = self.grown.corpus if self.grown and self.grown.resumed == epoch else self.corpus
        return {"fingerprint": corpus.fingerprint, "n_packets": corpus.n_packets}

    def count_fields(self, epoch: int) -> dict:
        """What ``epoch``'s count depends on: its key among shared counts
        (``ndp.loader.planning.shared_count``)."""
        shapes = self.shapes_of(epoch)
        fields = {"fingerprint": getattr(self.corpus, "fingerprint", None),
                  "indexes": getattr(self.corpus, "index_stamp", None), "order": ORDER,
                  "mode": self.mode, "batch_size": shapes.sizes[0], "seq_len": shapes.lens[0],
                  "world_size": self.world_size, "seed": self.seed, "epoch": epoch,
                  "shuffle": self.shuffle, "shuffle_window": self.shuffle_window}
        if self.align is not None:  # windows at documents: other batches (one setting: as
            fields["align"] = self.align  # before)
        if not shapes.constant or shapes.budgeted:  # the epoch's shapes from its first step
            # (and a budget's: its rows are only an estimate); one shape of rows: as before
            fields["shapes"] = shapes.record()
        return fields

    def epoch_batches(self, epoch: int) -> int:
        """``share(epoch).batches`` (``len(loader)``), without planning the epoch again once
        planned: the consumer may ask for an epoch whose share the producer, ahead of it, has
        let go."""
        have = self._batches.get(epoch)
        return have if have is not None else self.share(epoch).batches

    def planned(self, epoch: int) -> Any:
        """``epoch``'s share positions (``Share.packets``) if it is planned, else ``None``
        (never plans it)."""
        have = self._shares.get(epoch)
        return None if have is None else have.packets

    def counted(self, epoch: int) -> bool:
        """``epoch_batches(epoch)`` is known without waiting."""
        have = self._shares.get(epoch)
        return epoch in self._batches or (have is not None and have.count.known)

    def batches_of(self, share: np.ndarray, shapes: Shapes) -> int:
        """Batches ``share`` makes by the index's token counts (what it makes when nothing in
        it is corrupt), with ``shapes`` from its first batch."""
        if self.mode == "padded" and not shapes.budgeted:
            return shapes.padded_batches(share.shape[0])
        tokens = self.corpus.tokens[share]
        if self.mode == "packed":
            if units.active(self.corpus, self.mode):  # each place's document
                tokens = units.place_tokens(self.corpus, share, tokens)
            if self.align is not None:  # windows at documents: the greedy, in order
                return count_aligned(tokens, shapes)
            return shapes.packed_batches(int(tokens.sum()))
        return count_batches(tokens, shapes)

    def place_sizes(self, places: np.ndarray) -> np.ndarray:
        """The packets each place holds (``ndp.loader.ordering.units``: packed mode's documents;
        else one each)."""
        places = np.asarray(places, np.int64)
        if units.active(self.corpus, self.mode):
            return units.place_sizes(self.corpus, places)
        return np.ones(places.shape[0], np.int64)

    def place_tokens(self, places: np.ndarray) -> np.ndarray:
        """The index tokens each place holds (``ndp.loader.ordering.units``: packed mode's
        documents)."""
        places = np.asarray(places, np.int64)
        tokens = np.asarray(self.corpus.tokens[places], np.int64)
        if units.active(self.corpus, self.mode):
            tokens = units.place_tokens(self.corpus, places, tokens)
        return tokens

    def place_packets(self, places: np.ndarray) -> int:
        """The packets the places hold, together."""
        return int(self.place_sizes(places).sum())
