"""The next shuffle window's table of this rank's index entries, built before the producer needs
it (``Warmer``).

A share read place by place holds its own packets' index entries a window at a time
(``ndp.loader.ordering.share_entries``); a window's table is built by reading its shards' entries
(26 MB
a 64 MiB shard of 16-token documents, 10-60 ms each from the page cache or the disk), so the
chunk that entered a window, the first of an epoch among them, waited for it. The producer tells
the ``Warmer`` where it is after each chunk; the warmer builds the table of the window after
that one (at an epoch's last window, the next epoch's first, from its share planned ahead) on a
thread of its own (``ndp-warm``: one at a time, gone when done). Before each chunk it builds
the table of the window the chunk reads if nothing has (a run's start, a resume): that chunk
reads its entries one by one meanwhile, and the build waits for it to be laid out (at most
``GO_WAIT`` seconds): the first batch does not share the host's cores with a build of tens of
millions of entries. Only for shares read place by place (``ndp.loader.ordering.share.RankOrder``),
whose windows are known ahead.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from ndp.loader.ordering.share import RankOrder

#: seconds a build started before a chunk waits for that chunk to be laid out, at most
GO_WAIT = 2.0


class Warmer:
    """Builds the next window's entry table ahead of the producer (module docstring)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._stop = np.zeros(1, np.uint8)  # the build under way's stop flag
        self._warmed: tuple | None = None  # (share, window) last built ahead
        #: set when the chunk a ``current`` build was started for is laid out (or on ``stop``)
        self._go = threading.Event()
        self._go.set()
        #: windows whose tables were built ahead (for tests and stats)
        self.windows = 0

    def current(self, share: Any, pos: int) -> None:
        """The producer is about to read from share position ``pos``: build that window's
        table on the thread unless it is held or a build is under way (a chunk of a window
        being built reads its entries one by one meanwhile, ``ShareEntries.entries``)."""
        if (not isinstance(share, RankOrder) or share.tables is None or not len(share)
                or (self._thread is not None and self._thread.is_alive())):
            return
        k = share.window_at(min(pos, len(share) - 1))
        if k not in share.tables.held():
            self._go.clear()  # the chunk first: ``ahead`` (after it) lets the build go
            self._start(share, k)

    def ahead(self, share: Any, pos: int, after: Callable[[], Any] | None = None) -> None:
        """The producer is at share position ``pos`` of ``share``: build the next window's
        table, unless built already or a build is under way. ``after()``: the next epoch's
        share if planned (else ``None``), for the window after an epoch's last. A build that
        ``current`` started waits until this first call after it."""
        self._go.set()
        if (not isinstance(share, RankOrder) or share.tables is None or not len(share)
                or (self._thread is not None and self._thread.is_alive())):
            return
        k = share.window_at(min(pos, len(share) - 1)) + 1
        target = share
        if k >= len(share.windows) or share.tables.span(k)[0] >= share.length:
            nxt = after() if after is not None else None
            if not isinstance(nxt, RankOrder) or nxt.tables is None or not nxt.windows:
                return
            target, k = nxt, 0
        if (id(target), k) == self._warmed or k in target.tables.held():
            return
        self._start(target, k)

    def _start(self, share: Any, k: int) -> None:
        """Build ``share``'s window ``k`` table on the thread (marked as being built before
        the thread starts: a chunk asking for it meanwhile reads its entries one by one)."""
        self._warmed = (id(share), k)
        tables = share.tables
        if not tables.claim(k):
            return  # being built already
        stop = self._stop = np.zeros(1, np.uint8)  # set by ``join``: the build is abandoned

        go = self._go

        def build() -> None:
            try:
                go.wait(GO_WAIT)
                tables.prepare(k, stop)
            except BaseException:  # noqa: BLE001 - the producer builds it again, and raises
                pass
            finally:
                tables.unclaim(k)

        thread = threading.Thread(target=build, name="ndp-warm", daemon=True)
        thread.start()  # then published: a thread that joins it finds it started
        self._thread = thread
        self.windows += 1

    def join(self) -> None:
        """Wait for a build under way."""
        thread = self._thread
        if thread is not None:
            thread.join()

    def stop(self) -> None:
        """Abandon a build under way and wait for its thread (closing): its window's table is
        built again when next needed, so that a loop left at 1e8 documents does not wait
        seconds for a table no one will read."""
        self._stop[0] = 1
        self._go.set()
        self.join()
        self._warmed = None  # a loop started again builds it ahead again
