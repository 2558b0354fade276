"""Where ``ndp export`` may write: a new path, or a file an export wrote before (an llm.c token
file), replaced only with ``overwrite``. Everything else is refused, by name, before a byte is
written:

* a device, FIFO, socket or directory: an export writes regular files, and its atomic rename
  would replace the node itself (``--overwrite`` onto ``/dev/null`` once replaced the device
  with a regular file, as root);
* a regular file that is not an llm.c token file (a script, a dataset of another tool): an
  export replaces only what an export could have written;
* one of the dataset's own files (its shards, their indexes, its manifests), by name or
  through a symbolic or hard link (the same device and inode): an export onto a shard
  destroyed the data it was reading;
* a dangling symbolic link, and a ``<name>.tmp`` beside a destination that is not a plain
  leftover file: the atomic write opens that name for writing, and would follow a link there.
"""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path

from ndp.convert.tokenfiles import LLMC_HEADER_BYTES, LLMC_MAGIC
from ndp.errors import ConfigError
from ndp.store.atomic import TMP_SUFFIX
from ndp.store.files import kind_of
from ndp.store.manifest import MANIFEST

#: llm.c versions an export writes -> bytes per token
_WIDTHS = {1: 2, 2: 4}


def destinations(out: Path, paths: list[Path], corpus, *, overwrite: bool) -> list[Path]:
    """Check every file an export to ``out`` would write (``paths``, and the ``.tmp`` files
    written first) or remove (numbered files of an earlier export beside ``out`` that this
    one does not rewrite, and ``out`` itself); return those to remove. ``ConfigError`` (module
    docstring) for a destination that is neither new nor an earlier export's, and for an
    earlier export's file without ``overwrite``."""
    if out.is_dir():
        raise ConfigError(f"{out} is a directory; the output is a file name (for example "
                          f"{out / 'train.bin'})")
    stem = out.name[:-4] if out.name.endswith(".bin") else out.name
    earlier = sorted(set(out.parent.glob(f"{stem}_[0-9][0-9][0-9][0-9][0-9][0-9].bin"))
                     | ({out} if os.path.lexists(out) else set()))
    own = _own_files(corpus)
    for path in sorted({*paths, *earlier}):
        _check(path, own)
    for path in paths:
        _check_tmp(path.with_name(path.name + TMP_SUFFIX), own)
    if earlier and not overwrite:
        raise ConfigError(f"{earlier[0]} exists ({len(earlier)} file(s) of an earlier export); "
                          f"pass `overwrite=True` or choose another output")
    return [p for p in earlier if p not in paths]


def _own_files(corpus) -> dict[tuple[int, int], str]:
    """(device, inode) -> what it is, for every file of the dataset being read."""
    own: dict[tuple[int, int], str] = {}
    for shard in corpus.shards:
        for path, what in ((shard.path, "a shard"), (shard.index_path, "an index"),
                           (shard.path.parent / MANIFEST, "a manifest")):
            try:
                st = os.stat(path)
            except OSError:  # no index, no manifest: nothing to protect there
                continue
            own.setdefault((st.st_dev, st.st_ino), f"{what} of the dataset being exported "
                                                   f"({path})")
    return own


def _check(path: Path, own: dict[tuple[int, int], str]) -> None:
    """``ConfigError`` unless ``path`` is new or an llm.c token file not of the dataset."""
    try:
        st = os.stat(path)  # links followed: what the write would reach
    except FileNotFoundError:
        if os.path.islink(path):
            raise ConfigError(
                f"{path}: a symbolic link to {os.readlink(path)}, which does not exist, not a "
                f"file an export wrote; remove the link or choose another output") from None
        return  # a new path
    _refuse_own(path, st, own)
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(
            f"{path}: {kind_of(st)}, not a file an export wrote: an export writes regular "
            f"llm.c files and replaces only those. Choose a new output path")
    found = _llmc_header(path, st)
    if found is not None:
        raise ConfigError(
            f"{path}: a regular file that is not an llm.c token file (expected magic "
            f"{LLMC_MAGIC}, version 1 or 2 and {LLMC_HEADER_BYTES} + N x 2 or 4 bytes; found "
            f"{found}): an export replaces only files an export wrote. Move it away, or "
            f"choose another output")


def _check_tmp(tmp: Path, own: dict[tuple[int, int], str]) -> None:
    """The temporary name a destination is written under first: opened for writing, so a
    link there would be followed and its target cut to nothing. A leftover regular file of
    an interrupted export is fine (it is replaced)."""
    try:
        st = os.lstat(tmp)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else (
            "a file with other hard links" if stat.S_ISREG(st.st_mode) else kind_of(st))
        raise ConfigError(
            f"{tmp}: {what}, where the export writes its temporary file (it would be written "
            f"through); remove it, or choose another output")
    _refuse_own(tmp, st, own)


def _refuse_own(path: Path, st: os.stat_result, own: dict[tuple[int, int], str]) -> None:
    what = own.get((st.st_dev, st.st_ino))
    if what is not None:
        via = "" if not os.path.islink(path) else " (through a symbolic link)"
        raise ConfigError(
            f"{path}: is {what}{via}: an export there would destroy the data it reads. "
            f"Choose an output outside the dataset's files")


def _llmc_header(path: Path, st: os.stat_result) -> str | None:
    """None if ``path`` (a regular file of ``st``) is an llm.c token file of a version an
    export writes, else what it holds instead."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # never waits, should a FIFO appear here
    try:
        head = os.read(fd, 12)
    finally:
        os.close(fd)
    if len(head) < 12:
        return f"{st.st_size} bytes"
    magic, version, n = struct.unpack("<iii", head)
    width = _WIDTHS.get(version) if magic == LLMC_MAGIC else None
    if width is None or n < 0:
        return f"magic {magic}, version {version}"
    if st.st_size != LLMC_HEADER_BYTES + n * width:
        return f"{st.st_size:,} bytes where its header's {n:,} tokens make " \
               f"{LLMC_HEADER_BYTES + n * width:,}"
    return None
