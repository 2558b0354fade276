"""Atomic writes: a file appears under its name whole or not at all.

Every file ndp writes (shards, indexes, manifests, exported token files, benchmark results) goes
through ``AtomicFile``: it is written to ``<name>.tmp`` beside its target, flushed and fsynced,
then renamed over the target (``os.replace``, atomic on POSIX) and its directory fsynced, so a
crash or a kill leaves the old file or the new one, and at worst a ``.tmp`` that no reader
takes for data. An exception discards the temporary file.

    with atomic_file(path) as f:       # or AtomicFile(path) ... .commit() / .abort()
        f.write(data)
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

TMP_SUFFIX = ".tmp"


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_tmp(tmp: Path) -> int:
    """A descriptor of ``tmp`` open for writing, empty: never written through to another
    file. A symbolic link there (``O_NOFOLLOW``), or a file with other names (a hard link to a
    shard: truncating it would cut the shard), is removed and a new file made in its place;
    a plain leftover of a killed writer is truncated."""
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(3):
        try:
            fd = os.open(tmp, flags, 0o666)
        except OSError as exc:
            if exc.errno != errno.ELOOP:  # ELOOP: a symbolic link in the way
                raise
            tmp.unlink(missing_ok=True)
            continue
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink <= 1:
            os.ftruncate(fd, 0)
            return fd
        os.close(fd)  # a file with other names, or no regular file: not ours to write
        tmp.unlink(missing_ok=True)
    raise FileExistsError(errno.EEXIST, "keeps being replaced while opened", str(tmp))


class AtomicFile:
    """``path`` being written: ``file`` is the open temporary file; ``commit()`` puts it in
    place, ``abort()`` removes it."""

    def __init__(self, path: str | os.PathLike, mode: str = "wb", **open_kw: Any) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + TMP_SUFFIX)
        self.file: IO = os.fdopen(_open_tmp(self.tmp), mode, **open_kw)

    def commit(self, *, sync_dir: bool = True) -> Path:
        """Flush, fsync, rename over ``path`` (and fsync its directory unless the caller will,
        after several files). On an error the temporary file is removed."""
        try:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise
        if sync_dir:
            fsync_dir(self.path.parent)
        return self.path

    def abort(self) -> None:
        """Close and remove the temporary file (idempotent), even when closing fails: on a
        full disk the close cannot write what is buffered, and raises (the file is closed
        anyway), which once left the temporary file behind."""
        try:
            self.file.close()
        except OSError:
            pass  # what it could not write is thrown away with the file
        finally:
            self.tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb", **open_kw: Any) -> Iterator[IO]:
    """``path``'s temporary file, put in place when the block ends normally."""
    out = AtomicFile(path, mode, **open_kw)
    try:
        yield out.file
    except BaseException:
        out.abort()
        raise
    out.commit()


def atomic_write(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write ``data`` to ``path`` atomically."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w",
                     **({} if isinstance(data, bytes) else {"encoding": "utf-8"})) as f:
        f.write(data)
    return Path(path)
