"""The shard cache of remote datasets (``ndp.store.remote``): shards downloaded whole, checked, and
shared by the processes of a node.

``<cache_dir>/<key>/`` holds one dataset: its indexes, fetched when it is opened, and the shards
downloaded so far, under their manifest names. The key hashes the URL and the manifest, so a
dataset rewritten under the same URL gets a directory of its own.

* **Checked before trusted.** A shard is written to ``<name>.tmp`` (``ndp.store.atomic``) while its
  size and crc32 are counted, and is renamed into place only when both are the manifest's. A
  file under a shard's name in the cache is whole and checked; a partial or wrong download
  never is, and a ``.tmp`` left by a killed process is overwritten by the next download.
* **Once per node.** A download holds a per-shard file lock (``filelock``); another process
  that needs the shard meanwhile waits for the lock, then finds the file there.
* **A size limit.** With ``limit`` (bytes of shards), a download first evicts shards that no
  process pins, least recently used first. Each process pins the shards it reads now and those
  its prefetch fetches ahead (``.pins/<pid>-<n>``; the pins of a process that died are
  ignored). When pins alone fill the limit the download waits for the other processes to move
  on, up to ``wait`` seconds, then raises ``CacheFullError`` naming the limit.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from filelock import FileLock, Timeout

from ndp.store.atomic import TMP_SUFFIX, AtomicFile, atomic_write
from ndp.errors import CacheFullError, ConfigError
from ndp.wire.format import SHARD_SUFFIX
from ndp.store.manifest import pid_alive

PINS = ".pins"
LOCK_SUFFIX = ".lock"
#: how long a download waits for other processes to unpin shards when the cache is full
WAIT_S = 600.0


def default_cache_dir() -> Path:
    """``NDP_CACHE_DIR``, else ``$XDG_CACHE_HOME/ndp``, else ``~/.cache/ndp``."""
    env = os.environ.get("NDP_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ndp"


@dataclass
class CacheStats:
    """What this process' cache did: shards found in place, downloaded (and their bytes),
    download attempts repeated after a transient error, shards evicted, and downloads that
    waited for room."""

    hits: int = 0
    downloads: int = 0
    bytes_downloaded: int = 0
    retries: int = 0
    evicted: int = 0
    waits: int = 0


class ShardCache:
    """One dataset's directory in the cache (see the module docstring)."""

    _serial = 0

    def __init__(self, directory: str | os.PathLike, *, limit: int | None = None,
                 wait: float = WAIT_S) -> None:
        if limit is not None and limit < 1:
            raise CacheFullError(f"cache_limit must be a positive number of bytes, got {limit}")
        self.dir = Path(directory)
        ShardCache._serial += 1
        self._check_writable()
        self.limit, self.wait = limit, wait
        self.stats = CacheStats()
        self._pin_file = self.dir / PINS / f"{os.getpid()}-{ShardCache._serial}"
        self._pins: frozenset[str] = frozenset()
        self._mutex = threading.Lock()

    def _check_writable(self) -> None:
        """Make the directory and write (then remove) an empty file in it, so that a cache
        that cannot hold a shard is a ``ConfigError`` when the dataset is opened, not an
        ``OSError`` at the first download. The probe's name starts with a dot and no pid: no
        listing of pins or shards counts it."""
        probe = self.dir / f".probe-{os.getpid()}-{ShardCache._serial}"
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
        """Whether the checked shard ``name`` (of ``size`` bytes) is in the cache."""
        try:
            return os.stat(self.dir / name).st_size == size
        except FileNotFoundError:
            return False

    # ---------------------------------------------------------------------------- pins
    def pin(self, names: set[str] | frozenset[str]) -> None:
        """This process reads ``names`` now or soon: no process evicts them."""
        names = frozenset(names)
        with self._mutex:
            if names == self._pins:
                return
            self._pins = names
            atomic_write(self._pin_file, json.dumps(sorted(names)))

    def close(self) -> None:
        """Drop this process' pins."""
        with self._mutex:
            self._pins = frozenset()
            self._pin_file.unlink(missing_ok=True)

    def _all_pins(self) -> set[str]:
        pinned = set(self._pins)
        for entry in (self.dir / PINS).iterdir():
            pid = entry.name.split("-", 1)[0]
            if entry.name.endswith(TMP_SUFFIX) or not pid.isdigit():
                continue
            if not pid_alive(int(pid)):
                entry.unlink(missing_ok=True)
                continue
            try:
                pinned.update(json.loads(entry.read_text()))
            except (OSError, ValueError):
                continue  # replaced or removed while read: its next version counts
        return pinned

    # ------------------------------------------------------------------------- get / evict
    def get(self, name: str, size: int, download: Callable[[IO[bytes]], None], *,
            wait: bool = True) -> Path:
        """The path of shard ``name`` in the cache, downloaded first if it is not there:
        ``download(file)`` writes it and raises unless what it wrote is the manifest's (size and
        crc32); only then is it renamed into place. Without ``wait``, a full cache raises
        ``CacheFullError`` at once instead of waiting for room."""
        path = self.dir / name
        if self.present(name, size):
            self.touch(name)
            self.stats.hits += 1
            return path
        with FileLock(str(path) + LOCK_SUFFIX):
            if self.present(name, size):  # another process downloaded it meanwhile
                self.stats.hits += 1
                return path
            out = self._make_room(name, size, wait=self.wait if wait else 0.0)
            try:
                download(out.file)
                out.commit()
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
        self.stats.downloads += 1
        self.stats.bytes_downloaded += size
        return path

    def touch(self, name: str) -> None:
        """Mark ``name`` used now (eviction takes the least recently used first)."""
        try:
            os.utime(self.dir / name)
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
                out.append((entry.name, st.st_size, st.st_mtime))
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
        deadline = time.monotonic() + wait
        waited = False
        while True:
            with FileLock(str(self.dir / ".cache") + LOCK_SUFFIX):
                held = [h for h in self._shards(downloading=True) if not self._stale(h[0])]
                total = sum(s for _, s, _ in held)
                if total + size > self.limit:
                    pinned = self._all_pins()
                    for victim, vsize, _ in sorted(held, key=lambda h: h[2]):
                        if total + size <= self.limit:
                            break
                        if victim in pinned or not victim.endswith(SHARD_SUFFIX):
                            continue
                        (self.dir / victim).unlink(missing_ok=True)
                        total -= vsize
                        self.stats.evicted += 1
                if total + size <= self.limit:
                    out = AtomicFile(self.dir / name)
                    out.file.truncate(size)  # counted by the next process that makes room
                    return out
            if time.monotonic() > deadline:
                raise CacheFullError(
                    f"{self.dir}: caching {name} ({size:,} bytes) needs room that the shards "
                    f"pinned by the loaders reading this dataset ({total:,} bytes) do not "
                    f"leave under cache_limit={self.limit:,} (waited {wait:.0f} s): raise "
                    f"cache_limit to at least the shuffle windows every rank of this node "
                    f"reads at once, or give each job its own cache_dir")
            if not waited:
                self.stats.waits += 1
                waited = True
            time.sleep(0.1)
