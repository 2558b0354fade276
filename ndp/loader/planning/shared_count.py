"""An epoch's count made once and shared: by the ranks of a node as it is made, and by every
later run with the same dataset and settings (``SharedCount``).

In ``packed`` and ``packing`` mode an epoch's batch count is a pass over every packet's token
count (``ndp.loader.planning.count``): seconds of a core at 1e8 documents, on every rank, every
epoch,
although every rank of a node counts the same thing (the count is the smallest any rank's
share makes; ``padded`` mode's cut is worked out for every rank in the same pass). So the
first rank to ask for an epoch's count takes a lock (``filelock``) and counts, writing the
bound it has reached beside it as it goes (``<key>.bound``, at most every ``BOUND_EVERY``
seconds) and the count when done (``<key>.json``, atomically); the other ranks read those
instead of counting: their producers deliver every batch below the bound they read, as they
would below their own. A rank that finds the count written takes it at once (a resumed or
restarted run, a second job with the same settings). If the rank counting dies, its lock goes
with it and the next rank to look takes over.

The files live in ``NDP_COUNT_CACHE`` (a directory; ``off`` turns this off), by default
``counts/`` in ndp's cache directory (``ndp.store.cache.default_cache_dir``; not beside a
dataset that may be read-only). The lock and the bound are named after the node (its host
name), so a folder several nodes share (a home directory on NFS, whose locks and new files
other nodes may see late) never makes a rank wait on another node: only the finished count
is shared between nodes.
A count is keyed by what it depends on, the dataset's fingerprint (its shards' names, sizes,
crc32s and packet counts), the version of every index it was counted from (each sidecar's
size and modification time: ``Corpus.index_stamp``), the order's name and every setting that
changes it, and is checked when read: its own key and a crc32 of its contents; a file that
fails is counted again and written over. It also names the exact entries it was counted from
(a 64-bit hash of each index's checked entries, ``ndp.store.lazy.entries_digest``), and a count
taken from the file is checked against them as each index passes its first-use check: one
that differs (an index changed in place with its size and time kept) removes the file and
raises ``CountCacheError``, before a batch of that index is delivered. The count is only ever
made from checked entries (``LazyIndex.read_at`` checks an index before it gives out an
entry), so a damaged index it was made from was rescanned first. Whatever races, the count
written is a pure function of the key: two ranks that both count write the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import time
import zlib
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from ndp.store.atomic import atomic_write

#: seconds between two writes of the bound by the rank counting
BOUND_EVERY = 0.25
#: seconds between two looks at the files by a rank waiting for another's count
POLL = 0.05
#: what ``NDP_COUNT_CACHE`` is set to to turn the shared count off
OFF = ("off", "0", "no", "false")


def count_dir() -> Path | None:
    """Where shared counts live (``NDP_COUNT_CACHE``, else ``counts/`` in ndp's cache
    directory), or ``None`` when turned off."""
    raw = os.environ.get("NDP_COUNT_CACHE", "")
    if raw.strip().lower() in OFF:
        return None
    if raw:
        return Path(raw)
    from ndp.store.cache import default_cache_dir

    return default_cache_dir() / "counts"


class SharedCount:
    """One epoch's count as a node's ranks share it: ``key`` fields (a dict of plain values)
    name it. ``found`` reads a finished count; ``claim`` takes the lock to count it;
    ``bound`` reads how far the rank counting has got."""

    def __init__(self, directory: Path, fields: dict) -> None:
        self.fields = fields
        text = json.dumps(fields, sort_keys=True)
        self.key = hashlib.sha256(text.encode()).hexdigest()[:24]
        self.dir = directory
        self.path = directory / f"{self.key}.json"
        # the lock and the bound are the node's own: where the folder is shared by several
        # nodes (a home on NFS), a rank never waits on another node's rank, whose files its
        # filesystem may show late; the finished count is anyone's
        node = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "node"
        self._bound_path = directory / f"{self.key}.{node}.bound"
        self.lock_path = directory / f"{self.key}.{node}.lock"
        self._lock = FileLock(str(self.lock_path))
        self._last_write = 0.0
        self._written = -1

    @classmethod
    def open(cls, fields: dict) -> SharedCount | None:
        """The shared count named by ``fields``, or ``None`` if the count directory is turned
        off or cannot be made (the rank then counts on its own)."""
        directory = count_dir()
        if directory is None:
            return None
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        if not os.access(directory, os.W_OK | os.X_OK):
            return None
        return cls(directory, fields)

    # ------------------------------------------------------------------------------ reading
    def found(self) -> dict | None:
        """The finished count (the ``result`` given to ``save``), or ``None`` if it is not
        written, or is not what this key's count must be (another key, damaged)."""
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(raw, dict) or raw.get("key") != self.fields:
            return None
        result = raw.get("result")
        body = json.dumps(result, sort_keys=True)
        if raw.get("crc32") != zlib.crc32(body.encode()):
            return None
        return result

    def bound(self) -> int:
        """Batches every rank delivers at least, as far as the rank counting has got (0 if
        it has written nothing yet)."""
        try:
            value = int(self._bound_path.read_text(encoding="ascii"))
        except (OSError, ValueError):
            return 0
        return max(value, 0)

    # ------------------------------------------------------------------------------ counting
    def claim(self) -> FileLock | None:
        """The lock for counting this epoch (held: release it when the count is saved), or
        ``None`` if another rank holds it."""
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            return None
        except OSError:
            return None
        return self._lock

    def publish(self, bound: int) -> None:
        """The counting rank has reached ``bound``: written for the others, at most every
        ``BOUND_EVERY`` seconds."""
        now = time.monotonic()
        if bound > self._written and now - self._last_write >= BOUND_EVERY:
            self._last_write, self._written = now, bound
            try:
                atomic_write(self._bound_path, str(int(bound)))
            except OSError:
                pass

    def save(self, result: dict) -> None:
        """The finished count, written atomically (the bound's file removed); a write that
        fails leaves the others to count on their own."""
        body = json.dumps(result, sort_keys=True)
        text = json.dumps({"key": self.fields, "result": result,
                           "crc32": zlib.crc32(body.encode())}, sort_keys=True)
        try:
            atomic_write(self.path, text)
            self._bound_path.unlink(missing_ok=True)
        except OSError:
            pass


def wait_or_claim(shared: SharedCount, publish: Any, stop: Any) -> tuple[dict | None, Any]:
    """Either the count another rank made (``(result, None)``), or the lock to make it
    (``(None, lock)``): while another rank holds the lock, its bounds are given to
    ``publish``; ``stop`` abandons the wait (``ndp.loader.planning.epoch.Stopped``)."""
    from ndp.loader.planning.epoch import Stopped

    while True:
        result = shared.found()
        if result is not None:
            return result, None
        lock = shared.claim()
        if lock is not None:
            result = shared.found()  # written between the look and the lock
            if result is not None:
                lock.release()
                return result, None
            return None, lock
        publish(shared.bound())
        if stop is not None and stop():
            raise Stopped("waiting for another rank's count stopped")
        time.sleep(POLL)


#: the shared count's own version: a change to what a count holds must change it (2: the
#: indexes' stamps in the key and their entries' digests in the count; 3: the digests are
#: ``ndp.store.index_walk.digest``'s, not a crc32; 4, 5: packing, then packed counts keep
#: their marks, ``ndp.loader.planning.marks``)
VERSION = 5


def check_against(corpus: Any, shared: SharedCount | None, result: dict) -> None:
    """A count ``result`` taken from ``shared``'s file is in use for ``corpus``: its indexes'
    entries are checked against the digests it was made from, now and as they pass their
    first-use checks (``Corpus.expect_digests``); one that differs removes the file and raises
    ``CountCacheError``."""
    expect = getattr(corpus, "expect_digests", None)
    if expect is None or shared is None:
        return

    def differs(s: int) -> None:
        from ndp.errors import CountCacheError

        try:
            shared.path.unlink(missing_ok=True)
        except OSError:
            pass
        raise CountCacheError(
            f"{shared.path}: the batch count cached for this dataset was made from other index "
            f"entries than {corpus.shards[s].index_path} holds now (changed in place, its size and modification time kept); the cached "
            f"count is removed. Start again: the epoch is counted afresh (NDP_COUNT_CACHE=off "
            f"turns the cache off)")

    expect(result.get("digests") or [], differs)


def epoch_count(corpus: Any, windows: list, fields: dict, *, rank: int, world_size: int,
                length: int, mode: str, shapes: Any, known: int | None, done: Any) -> Any:
    """The ``ndp.loader.planning.count.Count`` of an epoch whose shares are ``RankOrder``s of
    ``length`` places over ``windows`` (``shapes``: the epoch's batch shapes, which ``fields``
    name): found written (known at once), or made on the plan's
    thread, by this rank or read from the one counting (see the module docstring).
    ``known``: the batch count when no pass is needed for it (``padded``); ``done(batches,
    peak)`` is called with the count made."""
    from ndp.loader.planning.count import Count, count_pass
    from ndp.loader.layouts.truncation import Cut

    shared = None if fields.get("fingerprint") is None else SharedCount.open(
        {**fields, "count_version": VERSION})  # no fingerprint: nothing to key it by

    def taken(result: dict) -> tuple[int | None, Cut | None, tuple | None]:
        check_against(corpus, shared, result)
        cuts, marks = result.get("cuts"), result.get("marks")
        return (result.get("batches"), None if cuts is None else Cut(*cuts[rank]),
                None if marks is None else (int(marks["every"]), marks["at"][rank]))

    result = shared.found() if shared is not None else None
    if result is not None:
        batches, cut, marks = taken(result)
        done(batches, 0)
        count = Count(known if batches is None else batches, cut=cut)
        count.marks = marks
        return count

    def work(count: Count, stop: Any) -> None:
        lock = None
        if shared is not None:
            result, lock = wait_or_claim(shared, count.publish, stop)
            if result is not None:
                batches, cut, marks = taken(result)
                done(batches, 0)
                count.finish(batches, cut, marks)
                return
        try:
            batches, cuts, marks = count_pass(corpus, windows, world_size=world_size, length=length,
                                       mode=mode, shapes=shapes, count=count, stop=stop,
                                       publish=None if lock is None else shared.publish,
                                       align=fields.get("align"))
            if lock is not None:  # with the digests of the entries it was counted from
                digests = [None if d is None else int(d)
                           for d in getattr(corpus, "digests", [])]
                shared.save({"batches": batches, "digests": digests, "marks": marks,
                             "cuts": None if cuts is None else
                             [[c.tokens, c.truncated, c.longer, c.longest] for c in cuts]})
        finally:
            if lock is not None:
                lock.release()
        done(batches, count.peak)
        count.finish(batches, None if cuts is None else cuts[rank],
                     None if marks is None else (marks["every"], marks["at"][rank]))

    return Count(known, work=work)
