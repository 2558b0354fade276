"""Shard files read with pread(2): a bounded set of open files, and a file changed under ndp as
an error that names it.

Nothing in ndp memory-maps a shard: not the Loader, not the tools (every read goes through
``ndp.store.shard.Shard``, which reads through here). A mapped file cut under its reader kills
the process with SIGBUS, without a traceback, and every mapping holds a file descriptor for as
long as it lives (a data set of thousands of shards then runs out of them). Instead, bytes are
read into buffers ndp owns (the host staging buffer, the GPU's pinned bounce buffers, a
whole-shard pass's block):

* a read that comes back short (the file was cut) raises ``ShardChangedError`` naming the file,
  the bytes asked for and its size now;
* what is not a regular file (a FIFO, a directory, a device named ``*.ndp``) is refused before
  it is opened (``regular_file``): opening a FIFO for reading waits for a writer, forever;
* a file is opened when it is read, and at most ``max_open()`` files are open at once in a
  process (the least recently used is closed first, never one a read is using); a file reopened
  must be the same file (device, inode, size and modification time as when first opened), else
  ``ShardChangedError``: it was replaced;
* ``close`` closes a shard's file (``Corpus.close``, hence ``Loader.close``);
* ``check_same``: after a whole-shard pass, the file must still be the one it read.

Many small reads (an SFT chunk's packets scattered over a shard) are one compiled loop of
pread calls on ndp's threads, without the GIL.
"""

from __future__ import annotations

import os
import resource
import stat
import threading
from collections import OrderedDict
from pathlib import Path

import numba
import numpy as np

from ndp.errors import ShardChangedError, ShardFormatError

#: libc's pread(2), called by name from compiled code (so the compiled loop can be cached on
#: disk, which a ctypes function pointer prevents); the buffer is passed as its address
_pread = numba.types.ExternalFunction(
    "pread", numba.types.intp(numba.types.intc, numba.types.intp, numba.types.uintp,
                              numba.types.int64))


@numba.njit(nogil=True, cache=True)
def _read_ranges(fd, offsets, sizes, dst, starts, got, lo, hi):  # pragma: no cover - compiled
    """``got[k]`` = bytes pread(2) read of range ``k`` (``sizes[k]`` at file offset
    ``offsets[k]``) into ``dst[starts[k]:]``; a short read retries until EOF or an error."""
    base = dst.ctypes.data
    for k in range(lo, hi):
        done = 0
        while done < sizes[k]:
            n = _pread(fd, base + starts[k] + done, sizes[k] - done, offsets[k] + done)
            if n <= 0:
                break
            done += n
        got[k] = done


def max_open() -> int:
    """Files ndp keeps open at once in this process: ``NDP_MAX_OPEN_FILES``, else an eighth of
    the soft limit on open files (``ulimit -n``), between 4 and 128."""
    env = os.environ.get("NDP_MAX_OPEN_FILES")
    if env:
        return max(1, int(env))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 16
    return max(4, min(128, soft // 8))


class _Open:
    __slots__ = ("fd", "users")

    def __init__(self, fd: int) -> None:
        self.fd, self.users = fd, 0


class _Files:
    """The process' open shard files (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: OrderedDict[tuple, _Open] = OrderedDict()
        self._pid = os.getpid()

    def _acquire(self, path: Path, identity: tuple) -> tuple[tuple, _Open]:
        key = (str(path), identity)
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's descriptors are not ours
                self._open.clear()
                self._pid = os.getpid()
            entry = self._open.get(key)
            if entry is None:
                self._evict(max_open() - 1)
                try:
                    # O_NONBLOCK: a FIFO put in the shard's place opens at once (and fails the
                    # identity check) instead of waiting for a writer; regular files ignore it
                    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
                except FileNotFoundError:
                    raise ShardChangedError(f"{path}: the shard is gone (deleted or moved "
                                            f"since ndp opened it)") from None
                st = os.fstat(fd)
                if _identity(st) != identity:
                    os.close(fd)
                    raise ShardChangedError(
                        f"{path}: not the file ndp opened (now {st.st_size:,} bytes, inode "
                        f"{st.st_ino}, modified at {st.st_mtime_ns} ns; it was "
                        f"{identity[2]:,} bytes, inode {identity[1]}, modified at "
                        f"{identity[3]} ns): it was replaced or rewritten while ndp read it. "
                        f"Restart on data that does not change under a running job")
                entry = self._open[key] = _Open(fd)
            self._open.move_to_end(key)
            entry.users += 1
            return key, entry

    def _release(self, entry: _Open) -> None:
        with self._lock:
            entry.users -= 1

    def _evict(self, keep: int) -> None:
        for key in [k for k, e in self._open.items() if e.users == 0]:
            if len(self._open) <= keep:
                break
            os.close(self._open.pop(key).fd)

    def read_ranges(self, path: Path, identity: tuple, offsets: np.ndarray, sizes: np.ndarray,
                    dst: np.ndarray, starts: np.ndarray) -> None:
        """Read range ``k`` (``sizes[k]`` bytes at ``offsets[k]``) into ``dst[starts[k]:]``;
        ``ShardChangedError`` if a range runs past the file's end."""
        from ndp.engine.threads import parallel_for

        n = offsets.shape[0]
        if n == 0:
            return
        got = np.empty(n, np.int64)
        _, entry = self._acquire(path, identity)
        try:
            # a few hundred packets per thread, or one piece of a MiB or more
            grain = max(1, min(256, (1 << 20) // max(1, int(sizes.mean()))))
            parallel_for(_read_ranges, n, entry.fd, offsets, sizes, dst, starts, got,
                         grain=grain)
        finally:
            self._release(entry)
        short = np.flatnonzero(got != sizes)
        if short.shape[0]:
            k = int(short[0])
            try:
                now = f"{os.stat(path).st_size:,} bytes now"
            except OSError as exc:
                now = exc.strerror or "unreadable now"
            raise ShardChangedError(
                f"{path}: {int(got[k]):,} of {int(sizes[k]):,} bytes at offset "
                f"{int(offsets[k]):,} could be read (the shard was {identity[2]:,} bytes when "
                f"ndp opened it, {now}): it was cut or changed while ndp read it. Restore it, "
                f"or restart on data that does not change under a running job")

    def close(self, path: Path) -> None:
        """Close ``path``'s file if it is open and no read is using it."""
        with self._lock:
            for key in [k for k in self._open if k[0] == str(path)]:
                if self._open[key].users == 0:
                    os.close(self._open.pop(key).fd)

    def count(self, under: str | os.PathLike = "") -> int:
        """Files open now (under the directory ``under``, if given)."""
        with self._lock:
            return sum(1 for path, _ in self._open if path.startswith(str(under)))


FILES = _Files()


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def check_same(path: Path, identity: tuple) -> None:
    """``ShardChangedError`` unless ``path`` is still the file of ``identity`` (device, inode,
    size, modification time): a whole-shard pass checks it after its last read, since bytes
    cut after that read would leave its result describing a file that is no longer there."""
    try:
        now = _identity(os.stat(path))
    except FileNotFoundError:
        raise ShardChangedError(f"{path}: the shard is gone (deleted or moved while ndp read "
                                f"it)") from None
    if now != identity:
        raise ShardChangedError(
            f"{path}: changed while ndp read it (now {now[2]:,} bytes, inode {now[1]}, "
            f"modified at {now[3]} ns; it was {identity[2]:,} bytes, inode {identity[1]}, "
            f"modified at {identity[3]} ns when opened): it was cut, extended or replaced. "
            f"Read it again once nothing writes to it")


def identity_of(path: Path) -> tuple[int, int, int, int]:
    """(device, inode, size, modification time) of ``path``: what a reopened file must still
    be. ``ShardFormatError`` if it is not a regular file (``regular_file``)."""
    return _identity(regular_file(path))


#: what a path that is not a regular file is, by its ``st_mode``
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def kind_of(st: os.stat_result) -> str:
    """What a path with this ``stat`` is, in words: "a regular file", "a FIFO", ..."""
    if stat.S_ISREG(st.st_mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(st.st_mode)), "not a file")


def regular_file(path: str | os.PathLike) -> os.stat_result:
    """``os.stat(path)`` (links followed), or ``ShardFormatError`` naming ``path`` and what it
    is if it is not a regular file. Stats without opening: an ``open(2)`` of a FIFO blocks."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ShardFormatError(
            f"{path}: {kind_of(st)}, not a regular file: a shard is a file that 'ndp convert' "
            f"wrote. Move it out of the dataset, or name the shards to read")
    return st
