"""The readers of one shard cache (``ndp.store.cache``), known from the cache's directory itself:
each ``ShardCache`` of each process registers there, so the processes sharing a cache know of
each other whatever started them (torchrun sets ``LOCAL_WORLD_SIZE``; other launchers do not),
and can tell when none of them can ever move on.

``<cache>/.pins/`` holds, for each reader:

* ``<pid>-<n>-<token>.live``: a lock (``filelock``) the reader holds for as long as it is open.
  The kernel releases it when the process ends, however it ends, so a reader whose lock another
  process can take is gone, and its files are removed. A pid can be reused, or belong to
  another pid namespace (containers sharing a node's disk); a held lock cannot mislead so.
* ``<pid>-<n>-<token>``: its state, JSON written atomically: ``pid``, ``host``, ``pins`` (the
  shards it reads now or soon: no reader evicts them) and ``waits``: for each of its threads
  that waits (its prefetch never does), what for: ``room`` in the cache for a shard, or a
  shard's ``lock``, held by a process downloading that shard or waiting for room to; and
  whether that thread is the one that moves its pins (the last to ``pin``; any, if it never
  pinned).

A reader is *stuck* when the thread that moves its pins waits for room, or for the lock of a
shard a reader waits for room for: its pins cannot change until that wait ends (a Loader's
producer moves its pins on only once the shards of its chunk are read). A wait in another of
its threads does not make it stuck: its producer may still move on. When every live reader is
stuck and the shards they pin leave no room under the limit for any shard waited for
(downloads under way of shards no one pins will end and become evictable, so they are not
counted), no reader can ever move on (``stuck``).
A wait that gives up, so or after its timeout, writes ``FULL`` in the cache (``give_up``): the
others waiting for room stop at their next poll rather than outlive it (``gave_up``).

A pin file of an older ndp (``<pid>-<n>``, a JSON list of names, no lock) still pins while its
pid runs on this machine; such a reader is never known to wait, so it never counts as stuck.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from ndp.errors import CacheFullError
from ndp.store.atomic import TMP_SUFFIX, atomic_write
from ndp.store.manifest import pid_alive

LIVE = ".live"
#: the lock under which a cache's readers make room, judge a wait and give up (in the cache)
CACHE_LOCK = ".cache.lock"
#: written in the cache by a reader that gave up waiting for room: the others waiting stop too
FULL = ".full"
_serial = itertools.count(1)


class ShardBusy(Exception):
    """A fetch that does not wait (a prefetch) found the shard being downloaded by another
    fetch, which will have it: there is nothing to move earlier."""


@dataclass(frozen=True)
class Reader:
    """A live reader of a cache, as its files say."""

    name: str
    pid: int
    host: str
    pins: frozenset[str]
    #: (shard, bytes, "room" or "lock", whether the thread moves its pins) for each of its
    #: threads that waits
    waits: tuple[tuple[str, int, str, bool], ...]
    #: registered by this ndp, so its waits are known (an older ndp's pin file: False)
    known: bool


class Registry:
    """This reader's files in ``directory`` (a cache's ``.pins/``), and the live readers'."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.dir = Path(directory)
        self.name = ""
        self._mutex = threading.Lock()
        self._pins: frozenset[str] = frozenset()
        self._waits: dict[int, tuple[str, int, str, bool]] = {}  # by thread
        self._pinner: int | None = None  # the thread that moves the pins
        self._live: FileLock | None = None
        self._pid = 0
        self.open()

    def open(self) -> None:
        """Register (again after ``close``; anew in a child forked from the process that did:
        filelock gives a forked child no hold on its parent's lock, so the child is a reader of
        its own)."""
        with self._mutex:
            self._open()

    def _open(self) -> None:
        if self._live is not None and self._pid == os.getpid():
            return
        if self._pid != os.getpid():
            self._waits.clear()  # the parent's threads: not the child's
            self._pinner = None
        self._pid = os.getpid()
        self.name = f"{self._pid}-{next(_serial)}-{secrets.token_hex(4)}"
        live = FileLock(str(self.dir / (self.name + LIVE)), thread_local=False)
        live.acquire(timeout=0)  # a name of its own: no one else holds it
        self._live = live
        self._write()

    def _write(self) -> None:
        atomic_write(self.dir / self.name, json.dumps({
            "pid": self._pid, "host": os.uname().nodename, "pins": sorted(self._pins),
            "waits": sorted(self._waits.values())}))

    def close(self) -> None:
        """Unregister: pins and waits dropped, files removed (the state first: a reader whose
        lock is free but whose state is still there is taken for one gone, and removed)."""
        with self._mutex:
            self._pins = frozenset()
            self._waits.clear()
            live, self._live = self._live, None
            if live is None or self._pid != os.getpid():
                return
            (self.dir / self.name).unlink(missing_ok=True)
            Path(live.lock_file).unlink(missing_ok=True)
            live.release()

    def pin(self, names: frozenset[str]) -> None:
        """This reader reads ``names`` now or soon."""
        with self._mutex:
            self._pinner = threading.get_ident()
            if names == self._pins and self._live is not None and self._pid == os.getpid():
                return
            self._pins = names
            self._open()
            self._write()

    def wait(self, shard: str, size: int, kind: str) -> None:
        """The calling thread waits for ``kind`` ("room" or "lock") for ``shard`` from now."""
        me = threading.get_ident()
        with self._mutex:
            self._open()
            wait = (shard, size, kind, self._pinner in (None, me))
            if self._waits.get(me) != wait:
                self._waits[me] = wait
                self._write()

    def done(self) -> None:
        """The calling thread waits no more."""
        with self._mutex:
            if self._waits.pop(threading.get_ident(), None) is not None \
                    and self._live is not None and self._pid == os.getpid():
                self._write()

    def readers(self) -> list[Reader]:
        """The live readers of the cache, this one first (if open); the files of readers gone
        are removed."""
        with self._mutex:
            own = self._live is not None and self._pid == os.getpid()
            out = [Reader(self.name, self._pid, os.uname().nodename, self._pins,
                          tuple(self._waits.values()), True)] if own else []
            mine = self.name if own else None
        for entry in os.scandir(self.dir):
            name, parts = entry.name, entry.name.split("-")
            if name == mine or name.endswith((LIVE, TMP_SUFFIX)) or not parts[0].isdigit():
                continue
            if len(parts) == 3:
                reader = self._registered(name)
            else:
                reader = self._legacy(name)
            if reader is not None:
                out.append(reader)
        return out

    def _registered(self, name: str) -> Reader | None:
        """The reader ``name`` if its lock is held (else its files are removed: it is gone)."""
        probe = FileLock(str(self.dir / (name + LIVE)), thread_local=False)
        try:
            probe.acquire(timeout=0)
        except Timeout:
            pass  # held: alive
        else:
            try:
                (self.dir / name).unlink(missing_ok=True)
                (self.dir / (name + LIVE)).unlink(missing_ok=True)
            finally:
                probe.release()
            return None
        try:
            state = json.loads((self.dir / name).read_text())
            pins = frozenset(state["pins"])
            waits = tuple((str(s), int(b), str(k), bool(m)) for s, b, k, m in state["waits"])
            return Reader(name, int(state["pid"]), str(state["host"]), pins, waits, True)
        except FileNotFoundError:
            return None  # closed meanwhile
        except (OSError, ValueError, KeyError, TypeError):
            # unreadable: alive, but what it pins and waits for is unknown: never stuck
            return Reader(name, int(name.split("-")[0]), "?", frozenset(), (), False)

    def _legacy(self, name: str) -> Reader | None:
        """An older ndp's pin file: live while its pid runs here (else removed)."""
        pid = int(name.split("-")[0])
        if not pid_alive(pid):
            (self.dir / name).unlink(missing_ok=True)
            return None
        try:
            pins = frozenset(json.loads((self.dir / name).read_text()))
        except (OSError, ValueError, TypeError):
            pins = frozenset()  # replaced or removed while read: its next version counts
        return Reader(name, pid, "?", pins, (), False)


def stuck(readers: list[Reader], held: list[tuple[str, int]], limit: int) -> dict | None:
    """What keeps every reader from moving on, or None if one may (see the module docstring):
    ``held`` is (name, bytes) of the shards and downloads in the cache."""
    rooms = {shard: size for r in readers for shard, size, kind, _ in r.waits if kind == "room"}
    if not rooms:
        return None
    for r in readers:
        if not r.known or not any(mover and (kind == "room" or shard in rooms)
                                  for shard, _, kind, mover in r.waits):
            return None  # it may move on, and unpin
    pinned = set().union(*(r.pins for r in readers))
    occupied = {name: size for name, size in held
                if (name[: -len(TMP_SUFFIX)] if name.endswith(TMP_SUFFIX) else name) in pinned}
    least = min(rooms.values())
    if sum(occupied.values()) + least <= limit:
        return None
    return {"readers": readers, "pinned": occupied, "waited": rooms, "least": least}


def stuck_error(directory: Path, name: str, size: int, limit: int,
                blocked: dict) -> CacheFullError:
    """The ``CacheFullError`` of a wait for room for shard ``name`` that no reader can end
    (``blocked``, from ``stuck``)."""
    readers, pinned = blocked["readers"], blocked["pinned"]
    procs = sorted({(r.host, r.pid) for r in readers})
    held, least = sum(pinned.values()), blocked["least"]
    names = ", ".join(sorted(pinned)[:6]) + (", ..." if len(pinned) > 6 else "")
    who = ", ".join(f"pid {p} on {h}" for h, p in procs[:8]) + (", ..." if len(procs) > 8 else "")
    return CacheFullError(
        f"{directory}: caching {name} ({size:,} bytes) can never happen: every one of the "
        f"{len(readers)} reader(s) of this cache, in {len(procs)} process(es) ({who}), waits "
        f"for room or for a shard another waits for room for, and the {len(pinned)} shard(s) "
        f"they pin ({held:,} bytes: {names}) leave less than {least:,} bytes under "
        f"cache_limit={limit:,}, so none can read on to unpin one. Raise cache_limit to at "
        f"least {held + least:,} bytes for one of them to move on (each reader pins the shard "
        f"it reads and the next its prefetch fetches: two of the largest shards per reader let "
        f"all of them move on), run fewer readers on this cache, or give each its own cache_dir")


def give_up(directory: Path, name: str, size: int, limit: int | None) -> None:
    """Record that this process gave up waiting for room for ``name`` (``FULL``, written
    under the cache's lock: one writer at a time), for the others waiting to stop too."""
    record = {"pid": os.getpid(), "host": os.uname().nodename, "time": time.time(),
              "shard": name, "bytes": size, "limit": limit}
    try:
        with FileLock(str(directory / CACHE_LOCK)):
            atomic_write(directory / FULL, json.dumps(record))
    except OSError:
        pass  # the CacheFullError raised next says what matters


def gave_up(directory: Path, since: float) -> dict | None:
    """The give-up recorded in ``FULL`` at or after ``since`` (``time.time()``), if any."""
    try:
        record = json.loads((directory / FULL).read_text())
        if float(record["time"]) >= since:
            return {k: record.get(k, "?") for k in ("pid", "host", "time", "shard")}
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none, or one being replaced: the next poll reads it
    return None
