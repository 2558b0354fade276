"""What the consumer has taken, kept lazily: the loader state after the last batch handed out
and the stats of the batches taken (``loader.state_dict()``, ``loader.stats``).

The training loop's ``next()`` is on the hot path of every step, and most steps read neither
the state nor the stats. So a batch handed out only counts itself (``Taken.n``): the state is
made from the chunk's layout when it is read, and each batch's counts (``Batch.counted``) are
added to the stats when they are read, when the next chunk is taken, or when the epoch ends,
batch by batch in the order they were taken (so the figures, and a warning naming a batch, are
the ones adding them at once gave). A ``LoaderStats`` kept from an earlier read is brought up
to date by the next read of ``loader.stats``.
"""

from __future__ import annotations

import threading

import numpy as np

from ndp.loader.layouts.layout import Layout
from ndp.loader.stats import LoaderStats

_NONE = Layout(0, {}, *(None,) * 4)  # no chunk taken yet


class Taken:
    """The chunk being served and how many of its batches were taken (module docstring)."""

    __slots__ = ("base", "_stats", "epoch", "layout", "n", "settled", "_lock", "skipped")

    def __init__(self, state: dict, stats: LoaderStats) -> None:
        self.base = state  # the state before the chunk's first batch
        self._stats = stats
        #: a read from another thread (a monitor reading ``loader.stats`` while the loop runs)
        #: settles once, not twice, and never sees one chunk's layout with another's count
        self._lock = threading.Lock()
        self.epoch = 0
        self.layout = _NONE
        self.n = 0  # batches of ``layout`` handed out
        self.settled = 0  # of those, added to the stats
        self.skipped = None  # which of the layout's batches are skipped steps (or None)

    def begin(self, epoch: int, layout: Layout, skipped: np.ndarray | None = None) -> None:
        """The consumer takes a new chunk of ``epoch``; ``skipped``: which of its batches are
        skipped steps (``ndp.loader.planning.skips``), passed over and counted as such."""
        with self._lock:
            self._settle()
            if self.n:
                self.base = self._last()
            self.epoch, self.layout, self.n, self.settled = epoch, layout, 0, 0
            self.skipped = skipped

    def _last(self) -> dict:
        return {"epoch": self.epoch, **self.layout.state(self.n - 1)}

    @property
    def state(self) -> dict:
        """The loader state after the last batch handed out."""
        with self._lock:
            return self._last() if self.n else self.base

    @state.setter
    def state(self, state: dict) -> None:
        """Another position (an epoch's end, a resume): the batches taken so far counted."""
        with self._lock:
            self._settle()
            self.layout, self.n, self.settled, self.base = _NONE, 0, 0, state
            self.skipped = None

    def settle(self) -> LoaderStats:
        """The stats, with every batch taken so far counted."""
        with self._lock:
            return self._settle()

    def _settle(self) -> LoaderStats:
        stats = self._stats
        a, b = self.settled, self.n
        if a < b:
            layout = self.layout
            extra, skipped = layout.extra, self.skipped
            if skipped is not None and skipped[a:b].any():  # batch by batch, as taken
                for i in range(a, b):
                    if skipped[i]:
                        stats.add_skipped(layout.counts[i:i + 1])
                    else:
                        stats.add_counts(layout.counts[i:i + 1])
                        if i in extra:
                            stats.add(extra[i])
            elif extra:  # a mix's sources: batch by batch (their order of first counting)
                for i in range(a, b):
                    stats.add_counts(layout.counts[i:i + 1])
                    if i in extra:
                        stats.add(extra[i])
            else:
                stats.add_counts(layout.counts[a:b])
            self.settled = b
        return stats


class TakenViews:
    """A ``Loader``'s ``stats`` and ``_state``, read through its ``Taken`` (``_taken``)."""

    _taken: Taken

    @property
    def stats(self) -> LoaderStats:
        """What the loader has delivered so far (``ndp.loader.stats.LoaderStats``): every batch
        handed out counted."""
        return self._taken.settle()

    @property
    def _state(self) -> dict:
        return self._taken.state

    @_state.setter
    def _state(self, state: dict) -> None:
        self._taken.state = state
