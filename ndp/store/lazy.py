"""Indexes opened at the cost of their header: entries read and checked when used.

Opening a dataset reads each sidecar index's 64-byte header (packet count, shard size and
crc32) and checks it against its shard's size and the file's length: O(shards), whatever the
number of packets. The entries stay on disk until a reader asks for them (the plan of the
shuffle window holding the shard, a decode, an export); they are read then (not memory-mapped:
a mapping holds a file descriptor for as long as it lives, see ``ndp.store.files``) into an
``EntryCache`` that holds at most ``budget`` bytes of them for the whole corpus (the least
recently used shard's go first, and are read again when asked for, their header compared). The
first read gets the structural checks of ``ndp.store.index.check_structure`` (entries inside
the file, in order, not overlapping, no packet left out between them, the entries that a gap
follows matching their packets' headers). An index that fails them then is scanned again (a warning; on
``on_stale="error"`` an ``IndexMismatchError``) if the scan finds as many packets as the header
said, since packets are numbered by those counts from the open on; else the error names the
index and says to rebuild it.
"""

from __future__ import annotations

import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any
from pathlib import Path

import numpy as np

from ndp.errors import ConfigError, IndexMismatchError
from ndp.store.index import (
    Index,
    ScanResult,
    check_size,
    check_structure,
    index_or_scan,
    load_index_and_scan,
    parse_header,
    scan_shard,
)
from ndp.store.shard import Shard
from ndp.store.index_walk import digest
from ndp.store.pieces import Pieces, pieces_of
from ndp.wire.format import INDEX_ENTRY_DTYPE, INDEX_HEADER_BYTES, INDEX_HEADER_DTYPE


#: bytes of index entries a corpus holds at once by default (``NDP_INDEX_CACHE_BYTES``): two
#: default shuffle windows' (1 GiB of shards each) of documents of ~100 tokens or more. A
#: Loader sets its own, from the windows it reads (``EntryCache.fit``).
DEFAULT_CACHE_BYTES = 512 << 20
#: the least a Loader's cache holds (``EntryCache.fit``)
LEAST_CACHE_BYTES = 32 << 20


def entries_digest(entries: np.ndarray) -> int:
    """The digest of index entries that a count made from them names them by
    (``ndp.loader.planning.shared_count``): ``ndp.store.index_walk.digest``, one compiled pass
    beside
    the first-use check's read."""
    return digest(entries)


def _configured() -> str | None:
    return os.environ.get("NDP_INDEX_CACHE_BYTES") or None


def cache_budget() -> int:
    """``NDP_INDEX_CACHE_BYTES`` if set, else ``DEFAULT_CACHE_BYTES``."""
    raw = _configured()
    if not raw:
        return DEFAULT_CACHE_BYTES
    try:
        return max(0, int(raw))
    except ValueError:
        raise ConfigError(f"NDP_INDEX_CACHE_BYTES={raw!r}: give a number of bytes (the index "
                          f"entries a dataset holds at once; default {DEFAULT_CACHE_BYTES})"
                          ) from None


class EntryCache:
    """The index entries read, for a whole corpus: at most ``budget`` bytes (the entries in use
    always stay, even past it), the least recently used shard's dropped first."""

    def __init__(self, budget: int | None = None) -> None:
        self.budget = cache_budget() if budget is None else budget
        self._held: OrderedDict[int, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        #: how many times a shard's entries were read from disk (its first read included)
        self.reads = 0

    def get(self, key: int) -> np.ndarray | None:
        with self._lock:
            got = self._held.get(key)
            if got is not None:
                self._held.move_to_end(key)
            return got

    def put(self, key: int, entries: np.ndarray) -> None:
        with self._lock:
            self.reads += 1
            old = self._held.pop(key, None)
            self._bytes += entries.nbytes - (0 if old is None else old.nbytes)
            self._held[key] = entries
            while self._bytes > self.budget and len(self._held) > 1:
                _, gone = self._held.popitem(last=False)
                self._bytes -= gone.nbytes

    def fit(self, need: int) -> None:
        """Hold ``need`` bytes of entries (at least ``LEAST_CACHE_BYTES``), what a reader
        reads among at once (a Loader: two shuffle windows' packets,
        ``ndp.loader.ordering.order.packets_at_once``): more would only hold entries no chunk needs
        soon (an epoch touches every shard), less would read a window's entries again and
        again. ``NDP_INDEX_CACHE_BYTES``, when set, is kept."""
        if _configured() is None:
            with self._lock:
                self.budget = max(int(need), LEAST_CACHE_BYTES)

    @property
    def held_bytes(self) -> int:
        return self._bytes


class LazyIndex:
    """A sidecar index whose header was checked at open; ``entries`` reads and checks the rest
    when asked for, through the corpus' ``EntryCache`` (thread-safe: the Loader's producer and
    consumer both read them). Quacks like ``ndp.store.index.Index``."""

    def __init__(self, shard: Shard, path: Path, n: int, shard_size: int, shard_crc32: int,
                 data_offset: int, *, on_stale: str, found: Callable[[ScanResult], None],
                 cache: EntryCache) -> None:
        self.shard, self.path, self._n = shard, path, n
        self.shard_size, self.shard_crc32, self.data_offset = shard_size, shard_crc32, data_offset
        self._on_stale, self._found, self._cache = on_stale, found, cache
        self._head = (n, shard_size, shard_crc32, data_offset)
        #: entries that replace the sidecar's (a scan's, or none): held for good, not cached
        self._pinned: np.ndarray | None = None
        self._read = False
        self._lock = threading.Lock()
        #: the first entry's packet offset as the file gave it at open, unchecked (-1 for
        #: none): what ``ndp.store.corpus.no_data`` looks at
        self.first_offset = -1
        #: the file's (size, modification time in ns) at open: which version of it was opened
        self.stamp: tuple[int, int] = (0, 0)
        #: ``entries_digest`` of the entries its first-use check passed (a scan's, where it
        #: replaced them), None until then; ``on_checked`` is called with it
        self.digest: int | None = None
        self.on_checked: Callable[[int], None] = lambda digest: None
        #: the later pieces of split documents its header counts (``ndp.store.pieces``), and
        #: their runs once its entries passed their check (None: none)
        self.continued = 0
        self.pieces: Pieces | None = None

    @classmethod
    def open(cls, shard: Shard, *, on_stale: str = "rebuild",
             found: Callable[[ScanResult], None] = lambda scan: None,
             cache: EntryCache | None = None) -> LazyIndex:
        """``shard``'s index by its header alone; ``IndexMismatchError`` if the header is
        damaged, the file's length disagrees with it or it was made for another size of shard
        (``FileNotFoundError``/``OSError`` as reading it raises them). ``found`` is given the
        scan of an index that fails its checks when first used."""
        path = shard.index_path
        with path.open("rb") as f:  # the header, and the first entry for ``first_offset``
            head = f.read(INDEX_HEADER_BYTES + INDEX_ENTRY_DTYPE.itemsize)
            st = os.fstat(f.fileno())
            size = st.st_size
        n, shard_size, crc, data_offset = parse_header(head[:INDEX_HEADER_BYTES], size, path)
        index = cls(shard, path, n, shard_size, crc, data_offset, on_stale=on_stale,
                    found=found, cache=EntryCache() if cache is None else cache)
        check_size(shard_size, shard, path)  # ``check_index``'s (crc32: verify="full" only)
        index.stamp = (size, st.st_mtime_ns)
        index.continued = int(np.frombuffer(head[:INDEX_HEADER_BYTES], INDEX_HEADER_DTYPE)[0][
            "continued"])
        if n:  # the file's length matched the header: the first entry is there
            index.first_offset = int(np.frombuffer(head, INDEX_ENTRY_DTYPE,
                                                   offset=INDEX_HEADER_BYTES)["offset"][0])
        if n == 0:  # nothing to read: the one gap (the whole shard) is checked now
            index._pinned = index._read_checked()
            index._read = True
            index.digest = entries_digest(index._pinned)
        return index

    def __len__(self) -> int:
        return self._n

    @property
    def loaded(self) -> bool:
        """Whether the entries were read (and checked) yet."""
        return self._read

    @property
    def entries(self) -> np.ndarray:
        """The entries (``INDEX_ENTRY_DTYPE``), read and checked when not held."""
        got = self._pinned
        if got is None:
            got = self._cache.get(id(self))
        if got is None:
            with self._lock:  # one read of a shard's entries at a time
                got = self._pinned if self._pinned is not None else self._cache.get(id(self))
                if got is None:
                    got = self._load(hold=True)
        return got

    def passing(self, local: slice = slice(None)) -> np.ndarray:
        """Entries ``local`` for a reader passing through every shard once (the plan's count
        of an epoch, a rank's table of its own entries: a block at a time), without holding
        them, so that the pass does not push out the entries others use: from the held ones if
        held, else only that range read (the whole index on its first read, to check it)."""
        got = self._pinned
        if got is None:
            got = self._cache.get(id(self))
        if got is None:
            with self._lock:
                if self._pinned is not None:
                    return self._pinned[local]
                if not self._read:
                    return self._load(hold=False)[local]
                start, stop, _ = local.indices(self._n)
                return self._read_entries(start, max(start, stop))
        return got[local]

    @property
    def offsets(self) -> np.ndarray:
        return self.entries["offset"].astype(np.int64)

    def _read_checked(self) -> np.ndarray:
        """The entries, read and checked (``IndexMismatchError`` if they fail)."""
        entries = self._read_entries()
        check_structure(Index(entries, self.shard_size, self.shard_crc32, self.data_offset),
                        self.shard, where=self.path, headers=False)
        return entries

    def _same_header(self, f: Any) -> None:
        """``IndexMismatchError`` unless the open file ``f``'s header is the one the dataset
        was opened with."""
        head = f.read(INDEX_HEADER_BYTES)
        size = os.fstat(f.fileno()).st_size
        if parse_header(head, size, self.path) != self._head:
            raise IndexMismatchError(
                f"{self.path}: changed since the dataset was opened (its header says other "
                f"counts now). Rebuild it with 'ndp index {self.shard.path}' and open the "
                f"dataset again.")

    def _read_entries(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """The entries ``start`` to ``stop`` (all by default) as the file holds them now, its
        header the one the dataset was opened with (``IndexMismatchError`` otherwise)."""
        path = self.path
        stop = self._n if stop is None else stop
        with path.open("rb") as f:
            self._same_header(f)
            if start:
                f.seek(INDEX_HEADER_BYTES + start * INDEX_ENTRY_DTYPE.itemsize)
            entries = np.fromfile(f, dtype=INDEX_ENTRY_DTYPE, count=stop - start)
        if entries.shape[0] != stop - start:
            raise IndexMismatchError(f"{path}: cut short while read. Rebuild it with "
                                     f"'ndp index {self.shard.path}'.")
        return entries

    def read_at(self, local: np.ndarray) -> np.ndarray:
        """Entries ``local`` (in ``[0, len)``), from the held ones if held, else read one by
        one (16 bytes each): for a reader that needs a few entries of a shard while a whole
        read of its index is being done for another (a rank's first chunk of a window while
        the window's table is built, ``ndp.loader.ordering.share_entries``). An index not checked
        yet
        is read whole and checked first (its first use): an entry is never given out
        unchecked, since a lie that keeps the packet headers (an entry repeated, two swapped)
        passes the check each packet gets as it is decoded, and only the whole index shows
        it."""
        got = self._pinned if self._pinned is not None else self._cache.get(id(self))
        if got is None and not self._read:
            got = self.entries  # the first-use check (a lie rescanned, or refused)
        if got is not None:
            return got[local]
        size = INDEX_ENTRY_DTYPE.itemsize
        out = np.empty(local.shape[0], INDEX_ENTRY_DTYPE)
        raw = out.view(np.uint8).reshape(-1, size)
        with self.path.open("rb") as f:
            self._same_header(f)
            fd = f.fileno()
            for i, at in enumerate(local.tolist()):
                piece = os.pread(fd, size, INDEX_HEADER_BYTES + at * size)
                if len(piece) != size:
                    raise IndexMismatchError(f"{self.path}: cut short while read. Rebuild it "
                                             f"with 'ndp index {self.shard.path}'.")
                raw[i] = np.frombuffer(piece, np.uint8)
        return out

    def _load(self, *, hold: bool) -> np.ndarray:
        """``_read_checked`` (into the cache if ``hold``), or where the entries fail their
        checks a scan of the shard that finds as many packets, held for good (see the module
        docstring)."""
        try:  # checked the first time; read again after the cache let go of them, the
            # header compared (a file replaced since then is caught as its packets are decoded)
            first = not self._read
            entries = self._read_checked() if first else self._read_entries()
            if first:
                self._passed(entries)  # before it counts as read: a refusal stays one
            self._read = True
            if hold:
                self._cache.put(id(self), entries)
            return entries
        except IndexMismatchError as err:  # an OSError (no permission now) is raised as it is
            if self._on_stale == "error":
                raise
            problem = str(err)
        scan = scan_shard(self.shard)
        if scan.entries.shape[0] != self._n:
            raise IndexMismatchError(
                f"{problem}; a scan of {self.shard.path} finds {scan.entries.shape[0]:,} packets "
                f"where the index said {self._n:,} when the dataset was opened, and packets are "
                f"numbered by those counts: rebuild the index with 'ndp index "
                f"{self.shard.path}' and open the dataset again")
        warnings.warn(f"{problem}; scanning the shard instead", stacklevel=5)
        self._passed(scan.entries)
        self._found(scan)
        self._pinned = scan.entries
        self._read = True
        return scan.entries

    def _passed(self, entries: np.ndarray) -> None:
        """The first-use check passed with ``entries`` (the sidecar's, or a scan's): their
        split documents are the ones the header counts (the corpus planned by that count at
        open), and their digest is given to ``on_checked``."""
        pieces = pieces_of(entries)
        found = 0 if pieces is None else pieces.packets
        if found != self.continued:
            raise IndexMismatchError(
                f"{self.path}: its header counts {self.continued:,} packets that continue a "
                f"split document, its entries mark {found:,} (an index written by an older "
                f"ndp beside a newer shard, or damaged). Rebuild it with 'ndp index "
                f"{self.shard.path}' and open the dataset again")
        self.pieces = pieces
        self.digest = entries_digest(entries)
        self.on_checked(self.digest)


def open_index(shard: Shard, *, on_stale: str = "rebuild", verify: str = "size",
               found: Callable[[ScanResult], None] = lambda scan: None,
               cache: EntryCache | None = None) -> tuple[Index | LazyIndex, ScanResult | None]:
    """``shard``'s index for a reader, and the scan that replaced it (or None): with
    ``verify="full"`` read and checked whole now (``load_index_and_scan``), else by its header
    (``LazyIndex``), the rest when first used. A sidecar that is missing, unreadable or
    fails the header's checks is scanned now, as ``load_index_and_scan`` does."""
    if verify == "full":
        return load_index_and_scan(shard, on_stale=on_stale, verify=verify)
    if verify != "size":
        raise ValueError(f"verify must be one of ('full', 'size'), got {verify!r}")
    return index_or_scan(shard, lambda: LazyIndex.open(shard, on_stale=on_stale,
                                                       found=found, cache=cache),
                         on_stale=on_stale, stacklevel=5)
