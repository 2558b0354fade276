"""The index entries of the next shuffle window, read before the producer needs them
(``Warmer``).

A chunk's packets are read at the offsets their index entries give, and a shard's entries are
read (and on their first read checked) when a chunk first needs them (``ndp.store.lazy``): a
window of tiny documents is a few shards of 1.7 M entries each, 26 MB apiece, 25-60 ms each off
a cold page cache on this project's VM. So the chunk that enters a window, the first of an
epoch among them, waited for its whole window's entries. The producer tells the ``Warmer``
where it is after each chunk; the warmer reads the entries of the window after that one (at an
epoch's last window, the first window of the next epoch, planned ahead) on a thread of its own
(``ndp-warm``: one at a time, gone when done; reading a file waits on the disk with the GIL
released), into the corpus' entry cache, which holds two windows' (``EntryCache.fit``). Only
for shares read place by place (``ndp.loader.share.RankOrder``), whose windows are known ahead.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from ndp.loader.share import RankOrder


class Warmer:
    """Reads the next window's index entries ahead of the producer (module docstring)."""

    def __init__(self, corpus: Any) -> None:
        self.corpus = corpus
        self._thread: threading.Thread | None = None
        self._warmed: tuple | None = None  # (share, window) last read ahead
        #: windows whose entries were read ahead (for tests and stats)
        self.windows = 0

    def ahead(self, share: Any, pos: int, after: Callable[[], Any] | None = None) -> None:
        """The producer is at share position ``pos`` of ``share``: read the next window's
        entries, unless read already or a read is under way. ``after()``: the next epoch's
        share if planned (else ``None``), for the window after an epoch's last."""
        if not isinstance(share, RankOrder) or (self._thread is not None
                                                and self._thread.is_alive()):
            return
        k = share.window_at(min(pos, len(share) - 1)) + 1 if len(share) else 0
        if k < len(share.windows):
            target = (id(share), k)
            window = share.windows[k]
        else:
            nxt = after() if after is not None else None
            if not isinstance(nxt, RankOrder) or not nxt.windows:
                return
            target, window = (id(nxt), 0), nxt.windows[0]
        if target == self._warmed:
            return
        self._warmed = target
        shards = self._shards(window)
        indexes = self.corpus.indexes

        def read() -> None:
            for s in shards:
                try:
                    indexes[s].entries  # read (and checked) into the cache
                except BaseException:  # noqa: BLE001 - the producer reads it again, and raises
                    return

        self._thread = threading.Thread(target=read, name="ndp-warm", daemon=True)
        self._thread.start()
        self.windows += 1

    def _shards(self, window: Any) -> list[int]:
        """The shards ``window``'s packet ranges lie in."""
        base = self.corpus.base
        first = np.searchsorted(base, window.starts, side="right") - 1
        last = np.searchsorted(base, np.maximum(window.stops - 1, window.starts), side="right") - 1
        out: list[int] = []
        for a, b in zip(first.tolist(), last.tolist()):
            out.extend(s for s in range(a, b + 1) if s not in out)
        return out

    def join(self) -> None:
        """Wait for a read under way (closing)."""
        thread = self._thread
        if thread is not None:
            thread.join()
