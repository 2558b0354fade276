"""The shard cache of remote datasets (``ndp.store.remote``): shards downloaded whole, checked, and
shared by the processes of a node.

``<cache_dir>/<key>/`` holds one dataset: its indexes, fetched when it is opened, and the shards
downloaded so far, under their manifest names. The key hashes the URL and the manifest, so a
dataset rewritten under the same URL gets a directory of its own.

* **Checked before trusted.** A shard is written to ``<name>.tmp`` (``ndp.store.atomic``) while its
  size and crc32 are counted, and is renamed into place only when both are the manifest's. A
  file under a shard's name in the cache is whole and checked; a partial or wrong download
  never is, and a ``.tmp`` left by a killed process is overwritten by the next download.
* **Still the file that was checked.** Another program may write over a cached shard, or rename
  a file of the same size over it, long after it was checked. What was checked is recorded
  with it: ``.verified/<name>.json`` holds the file's identity then (device, inode, size and
  modification time, ``ndp.store.files``) and its crc32. Each use compares the file's identity
  now (one ``stat``) with it; only a file that differs, or has no record (a crash between the
  rename and the record, a cache an older ndp made), has its crc32 counted again, and one that
  is not the manifest's is downloaded again, with a warning naming it: the remote copy is the
  truth. Counting every shard's crc32 at every use would read each shard twice.
* **Once per node.** A download holds a per-shard file lock (``filelock``); another process
  that needs the shard meanwhile waits for the lock, then finds the file there.
* **A size limit.** With ``limit`` (bytes of shards), a download first evicts shards that no
  process pins, least recently used first (by their access time, which ``touch`` sets: their
  modification time is part of the identity above). Each reader (a ``ShardCache`` of a
  process) registers in ``.pins/`` for as long as it is open, with the shards it reads now and
  those its prefetch fetches ahead (``ndp.store.readers``; the files of a reader that died are
  removed). When pins alone fill the limit the download waits for the other readers to move
  on, up to ``wait`` seconds, then raises ``CacheFullError`` naming the limit. A limit too
  small for the readers of the node to make progress at all is refused when the dataset is
  opened (``ndp.store.remote.least_cache_limit``, for the readers registered then).
* **No wait that cannot end.** A reader's waits (for room, or for a shard's lock) are in its
  registration; when every live reader waits so and their pins leave no room for any shard
  waited for, none can unpin one (``ndp.store.readers.stuck``): the wait raises
  ``CacheFullError`` at once, naming the pins and their readers, and gives up as below.
* **No rank outlives the one that gave up.** Once one rank raises ``CacheFullError`` the job
  is lost (the others would wait out their own timeout, then hang in a collective). So a wait
  that gives up writes ``.full`` (its pid, host, time, shard) under the cache's lock, and each
  wait for room in that cache begun before it raises ``CacheFullError`` at its next poll
  (0.1 s), naming it. A download that succeeds removes ``.full``; an older one is ignored. A
  download without ``wait`` (the prefetcher's) gives nothing up.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from filelock import FileLock, Timeout

from ndp.store.atomic import TMP_SUFFIX, AtomicFile, atomic_write
from ndp.errors import CacheFullError, ConfigError
from ndp.wire.format import SHARD_SUFFIX
from ndp.store.readers import (CACHE_LOCK, FULL, Registry, ShardBusy, gave_up, give_up,
                               stuck, stuck_error)

PINS = ".pins"
VERIFIED = ".verified"
LOCK_SUFFIX = ".lock"
#: how long a download waits for other processes to unpin shards when the cache is full
WAIT_S = 600.0
#: bytes per read when a cached shard's crc32 is counted again
BLOCK = 8 << 20


def default_cache_dir() -> Path:
    """``NDP_CACHE_DIR``, else ``$XDG_CACHE_HOME/ndp``, else ``~/.cache/ndp``."""
    env = os.environ.get("NDP_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ndp"


@dataclass
class CacheStats:
    """What this process' cache did: shards found in place, downloaded (and their bytes),
    download attempts repeated after a transient error, shards evicted, downloads that
    waited for room, and cached shards whose crc32 was counted again (their identity was not
    the one recorded when they were checked)."""

    hits: int = 0
    downloads: int = 0
    bytes_downloaded: int = 0
    retries: int = 0
    evicted: int = 0
    waits: int = 0
    rechecked: int = 0


class ShardCache:
    """One dataset's directory in the cache (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike, *, limit: int | None = None,
                 wait: float = WAIT_S) -> None:
        if limit is not None and limit < 1:
            raise CacheFullError(f"cache_limit must be a positive number of bytes, got {limit}")
        self.dir = Path(directory)
        self._check_writable()
        self.limit, self.wait = limit, wait
        self.stats = CacheStats()
        #: this reader's registration among the cache's readers (``close`` ends it)
        self._readers = Registry(self.dir / PINS)
        #: identity of each shard this process found recorded as checked (saves reading it)
        self._known: dict[str, tuple[int, int, int, int]] = {}

    def _check_writable(self) -> None:
        """Make the directory and write (then remove) an empty file in it, so that a cache
        that cannot hold a shard is a ``ConfigError`` when the dataset is opened, not an
        ``OSError`` at the first download. The probe's name starts with a dot and no pid: no
        listing of pins or shards counts it."""
        probe = self.dir / f".probe-{os.getpid()}-{threading.get_ident()}"
        try:
            try:
                (self.dir / PINS).mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError):
                file = next((p for p in (self.dir / PINS, self.dir, *self.dir.parents)
                             if p.is_file()), self.dir)
                raise ConfigError(
                    f"{self.dir}: the shard cache cannot be made there: {file} is a file, not "
                    f"a directory; remove it, or point `cache_dir` (NDP_CACHE_DIR) at a "
                    f"directory") from None
            # not O_EXCL: a probe left by a killed process of the same pid is written over
            os.close(os.open(probe, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o600))
            probe.unlink()
        except OSError as exc:
            raise ConfigError(
                f"{self.dir}: the shard cache cannot write there ({exc.strerror}); make it "
                f"writable by this user, or point `cache_dir` (NDP_CACHE_DIR) at a directory "
                f"it can write") from None

    def path(self, name: str) -> Path:
        return self.dir / name

    def present(self, name: str, size: int) -> bool:
        """Whether the checked shard ``name`` (of ``size`` bytes) is in the cache, still the
        file that was checked (a file changed since is checked again by ``get``)."""
        return self._trusted(name, size) is not None

    def _trusted(self, name: str, size: int) -> os.stat_result | None:
        """The stat of ``name`` if it is the file recorded as checked, else None."""
        try:
            st = os.stat(self.dir / name)
        except FileNotFoundError:
            return None
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if st.st_size != size:
            return None
        if self._known.get(name) == identity:
            return st
        try:
            record = json.loads(self._record_path(name).read_text())
            recorded = tuple(record["identity"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # none, or unreadable: the crc32 is counted again
        if recorded != identity:
            return None
        self._known[name] = identity
        return st

    def _record_path(self, name: str) -> Path:
        return self.dir / VERIFIED / f"{name}.json"

    def _record(self, name: str, crc32: int | None) -> None:
        """Record ``name`` as checked now, as the file it is (under its lock)."""
        st = os.stat(self.dir / name)
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        (self.dir / VERIFIED).mkdir(exist_ok=True)
        atomic_write(self._record_path(name),
                     json.dumps({"identity": identity, "crc32": crc32}))
        self._known[name] = identity

    def _forget(self, name: str) -> None:
        """Remove shard ``name`` and its record (evicted, or not the manifest's)."""
        (self.dir / name).unlink(missing_ok=True)
        self._record_path(name).unlink(missing_ok=True)
        self._known.pop(name, None)

    def _recheck(self, name: str, size: int, crc32: int | None) -> bool:
        """Under ``name``'s lock, with a file there that is not the one recorded as checked:
        whether it is the manifest's all the same (its size and crc32; then recorded). One
        that is not is removed, with a warning naming it, for ``get`` to download again."""
        path = self.dir / name
        try:
            n = os.stat(path).st_size
        except FileNotFoundError:
            return False
        self.stats.rechecked += 1
        crc = None
        if n == size and crc32 is not None:
            crc = 0
            with open(path, "rb") as f:
                while piece := f.read(BLOCK):
                    crc = zlib.crc32(piece, crc)
            if crc == crc32:
                self._record(name, crc32)
                return True
        found = f"{n:,} bytes" + ("" if crc is None else f" with crc32 {crc:#010x}")
        wanted = f"{size:,} bytes" + ("" if crc32 is None else f" and {crc32:#010x}")
        warnings.warn(f"{path}: {found} in the cache where the manifest lists {wanted}: not "
                      f"the shard that was downloaded and checked there (changed since by "
                      f"another program); downloaded again", stacklevel=3)
        self._forget(name)
        return False

    # ---------------------------------------------------------------------------- pins
    def pin(self, names: set[str] | frozenset[str]) -> None:
        """This process reads ``names`` now or soon: no process evicts them."""
        self._readers.pin(frozenset(names))

    def readers(self) -> int:
        """The live readers of this cache now (open ``ShardCache``s of any process, this one
        included while it is open)."""
        return len(self._readers.readers())

    def close(self) -> None:
        """Drop this reader's pins and registration (a later use registers it again)."""
        self._readers.close()

    # ------------------------------------------------------------------------- get / evict
    def get(self, name: str, size: int, download: Callable[[IO[bytes]], None], *,
            crc32: int | None = None, wait: bool = True) -> Path:
        """The path of shard ``name`` in the cache, downloaded first if it is not there:
        ``download(file)`` writes it and raises unless what it wrote is the manifest's (size and
        crc32); only then is it renamed into place. A file there that is not the one recorded
        as checked is checked against ``size`` and ``crc32`` (without ``crc32``: downloaded
        again). Without ``wait``, a full cache raises ``CacheFullError`` at once instead of
        waiting for room, and a shard being downloaded by another fetch raises ``ShardBusy``
        instead of waiting for its lock (a prefetch that waited would download the shard
        again after that fetch failed)."""
        path = self.dir / name
        st = self._trusted(name, size)
        if st is not None:
            self._touch(path, st)
            self.stats.hits += 1
            return path
        lock = FileLock(str(path) + LOCK_SUFFIX)
        self._take(lock, name, size, record=wait and self.limit is not None, wait=wait)
        try:
            # another process downloaded it meanwhile, or it is the manifest's all the same
            if self._trusted(name, size) is not None or self._recheck(name, size, crc32):
                self.stats.hits += 1
                return path
            out = self._make_room(name, size, wait=self.wait if wait else 0.0)
            try:
                download(out.file)
                out.commit()
                self._record(name, crc32)
                if self.limit is not None:  # room was made: an earlier give-up is over
                    (self.dir / FULL).unlink(missing_ok=True)
            except OSError as exc:
                out.abort()
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise CacheFullError(
                        f"{self.dir}: the disk is full while caching {name} ({size:,} bytes); "
                        f"free space there, set cache_limit= below the free space, or point "
                        f"`cache_dir` (NDP_CACHE_DIR) at a larger disk") from exc
                raise
            except BaseException:
                out.abort()
                raise
        finally:
            lock.release()
        self.stats.downloads += 1
        self.stats.bytes_downloaded += size
        return path

    def _take(self, lock: FileLock, name: str, size: int, *, record: bool,
              wait: bool = True) -> None:
        """Take shard ``name``'s ``lock``. While another fetch holds it (downloading the
        shard, or waiting for room to) the wait is registered if ``record`` (a reader's own
        fetch, not its prefetch's): a wait on a reader that cannot move on cannot end either
        (``ndp.store.readers``). Without ``wait``: ``ShardBusy`` at once."""
        try:
            lock.acquire(timeout=0)
            return
        except Timeout:
            if not wait:
                raise ShardBusy(name) from None
        if record:
            self._readers.wait(name, size, "lock")
        try:
            lock.acquire()
        finally:
            if record:
                self._readers.done()

    def touch(self, name: str) -> None:
        """Mark ``name`` used now (eviction takes the least recently used first)."""
        try:
            self._touch(self.dir / name, os.stat(self.dir / name))
        except FileNotFoundError:
            pass

    @staticmethod
    def _touch(path: Path, st: os.stat_result) -> None:
        """Set ``path``'s access time to now and keep its modification time (``st``'s): that
        is part of the identity recorded when it was checked."""
        try:
            os.utime(path, ns=(time.time_ns(), st.st_mtime_ns))
        except FileNotFoundError:
            pass

    def held_bytes(self) -> int:
        """Bytes of shards in the cache now."""
        return sum(size for _, size, _ in self._shards())

    def _shards(self, *, downloading: bool = False) -> list[tuple[str, int, float]]:
        """(name, bytes, last use) of the shards in the cache (and, with ``downloading``, of
        the downloads under way: their temporary files are made at full size)."""
        out = []
        ends = (SHARD_SUFFIX, SHARD_SUFFIX + TMP_SUFFIX) if downloading else SHARD_SUFFIX
        for entry in os.scandir(self.dir):
            if entry.name.endswith(ends):
                try:
                    st = entry.stat()
                except FileNotFoundError:
                    continue
                out.append((entry.name, st.st_size, st.st_atime))
        return out

    def _stale(self, name: str) -> bool:
        """Whether ``name`` is the temporary file of a download no process is making (one
        killed mid-way): removed, so that it holds no room."""
        if not name.endswith(TMP_SUFFIX):
            return False
        shard = name[: -len(TMP_SUFFIX)]
        try:
            with FileLock(str(self.dir / shard) + LOCK_SUFFIX, timeout=0):
                (self.dir / name).unlink(missing_ok=True)
        except Timeout:
            return False  # a download under way
        return True

    def _make_room(self, name: str, size: int, *, wait: float) -> AtomicFile:
        """The temporary file ``name`` downloads into, made at its full size once the shards
        and downloads in the cache leave room for it under ``limit``."""
        if self.limit is None:
            return AtomicFile(self.dir / name)
        if size > self.limit:
            raise CacheFullError(f"{self.dir}: shard {name} is {size:,} bytes, more than "
                                 f"cache_limit={self.limit:,}; raise cache_limit")
        try:
            return self._wait_for_room(name, size, wait=wait)
        finally:
            self._readers.done()  # under way, or given up: no longer waiting

    def _wait_for_room(self, name: str, size: int, *, wait: float) -> AtomicFile:
        deadline = time.monotonic() + wait
        since = time.time()  # a give-up written after this ends this wait too
        waited = False
        while True:
            blocked = None
            with FileLock(str(self.dir / CACHE_LOCK)):
                held = [h for h in self._shards(downloading=True) if not self._stale(h[0])]
                total = sum(s for _, s, _ in held)
                if total + size > self.limit:
                    pinned = set().union(*(r.pins for r in self._readers.readers()))
                    for entry in sorted(held, key=lambda h: h[2]):
                        victim, vsize, _ = entry
                        if total + size <= self.limit:
                            break
                        if victim in pinned or not victim.endswith(SHARD_SUFFIX):
                            continue
                        self._forget(victim)
                        held.remove(entry)
                        total -= vsize
                        self.stats.evicted += 1
                if total + size <= self.limit:
                    self._readers.done()  # before the cache's lock goes: not stuck, under way
                    out = AtomicFile(self.dir / name)
                    out.file.truncate(size)  # counted by the next process that makes room
                    return out
                if wait > 0:  # registered, then judged, under the cache's lock
                    self._readers.wait(name, size, "room")
                    blocked = stuck(self._readers.readers(),
                                    [(n, s) for n, s, _ in held], self.limit)
            if blocked is not None:
                give_up(self.dir, name, size, self.limit)  # the others waiting stop too
                raise stuck_error(self.dir, name, size, self.limit, blocked)
            other = gave_up(self.dir, since) if wait > 0 else None
            if other is None and time.monotonic() <= deadline:
                if not waited:
                    self.stats.waits += 1
                    waited = True
                time.sleep(0.1)
                continue
            why = f"waited {wait:.0f} s" if other is None else (
                f"process {other['pid']} on {other['host']}, waiting on this cache too, gave "
                f"up at {time.strftime('%H:%M:%S', time.localtime(other['time']))} caching "
                f"{other['shard']}: stopped waiting after "
                f"{wait - max(0.0, deadline - time.monotonic()):.1f} s of {wait:.0f} s rather "
                f"than outlive it")
            if other is None and wait > 0:
                give_up(self.dir, name, size, self.limit)
            raise CacheFullError(
                f"{self.dir}: caching {name} ({size:,} bytes) needs room that the shards "
                f"pinned by the loaders reading this dataset ({total:,} bytes) do not "
                f"leave under cache_limit={self.limit:,} ({why}): raise cache_limit to at "
                f"least the shuffle windows every rank of this node reads at once, or give "
                f"each job its own cache_dir")
