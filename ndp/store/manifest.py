"""The manifest ``ndp.json``: a dataset's commit record.

A dataset is a directory of shards (``*.ndp``, each with its ``.idx``) and one ``ndp.json``,
written last, atomically, that lists every shard:

    {"format_version": 1, ...what wrote it (tokenizer, options, summary)...,
     "shards": [{"name": "shard-00000.ndp", "bytes": 268435392, "packets": 131071,
                 "crc32": 2914710455}, ...]}

Until the manifest is in place there is no dataset, only shards: a conversion killed half way
leaves shards and no manifest (or, while overwriting, the old dataset whole). So a reader given
a directory (``Loader``, ``NDPDataset``, ``ndp verify``) checks it against its manifest: no
manifest, a listed shard missing or of another size or crc32 (as its index records it), or a
shard the manifest does not list is refused with a ``ManifestError`` that says what happened
and what to do. ``manifest="ignore"`` (``ndp verify --no-manifest``) reads a directory's
shards as they are, on purpose; ``ndp index --write-manifest`` commits such a directory after
the fact.

``staged_output`` is how a writer replaces a dataset: the new one is built in a hidden sibling
directory and swapped in whole (``renameat2(RENAME_EXCHANGE)`` where Linux has it) once its
manifest is written; the old one is deleted only after that. One writer at a time: it holds a
lock file beside the output (``.<name>.ndp-lock``, kept) while it writes, and a writer stopped
by an exception, Ctrl-C, SIGTERM or SIGHUP removes what it staged.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import glob
import json
import logging
import os
import shutil
import signal
import socket
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from filelock import FileLock, SoftFileLock, Timeout

from ndp.store.atomic import atomic_write
from ndp.errors import ConfigError, ManifestError
from ndp.store.manifest_fields import check_fields
from ndp.wire.format import INDEX_SUFFIX, SHARD_SUFFIX

MANIFEST = "ndp.json"
_STAGING = ".ndp-partial-"  # sibling directories a writer builds in: ".<name>.ndp-partial-<pid>"
_OLD = ".ndp-old-"
_LOCK = ".ndp-lock"  # ".<name>.ndp-lock" beside the output: held while a writer writes it


def read_manifest(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The manifest of ``directory``; None if it has none; ``ManifestError`` if it cannot be
    read or does not list shards."""
    path = Path(directory) / MANIFEST
    try:
        text = path.read_bytes()  # decoded by parse_manifest, which names a bad byte
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ManifestError(f"{path}: cannot be read ({exc.strerror})") from None
    return parse_manifest(text, path, directory)


def parse_manifest(text: str | bytes, where: str | os.PathLike,
                   directory: str | os.PathLike) -> dict[str, Any]:
    """The manifest in ``text`` (read from ``where``, of the dataset ``directory``);
    ``ManifestError`` if it is not UTF-8 text, not valid JSON or does not list shards."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ManifestError(
                f"{where}: not UTF-8 text (ndp writes it so): byte 0x{text[exc.start]:02x} at "
                f"offset {exc.start} ({exc.reason}); the manifest is damaged or was edited "
                f"in another encoding: re-run the conversion, or 'ndp index --write-manifest "
                f"{directory}' after 'ndp verify --no-manifest' passes") from None
    try:
        manifest = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested past Python's limit
        why = "nested too deep" if isinstance(exc, RecursionError) else str(exc)
        raise ManifestError(f"{where}: not valid JSON ({why}); the manifest is damaged: "
                            f"re-run the conversion, or 'ndp index --write-manifest "
                            f"{directory}' after 'ndp verify --no-manifest' passes") from None
    shards = manifest.get("shards") if isinstance(manifest, dict) else None
    if not isinstance(shards, list) or not all(
            isinstance(s, dict) and isinstance(s.get("name"), str)
            and isinstance(s.get("bytes"), int) and isinstance(s.get("crc32"), int)
            for s in shards):
        raise ManifestError(f"{where}: has no list of shards with name, bytes and crc32; it "
                            f"was not written by ndp or is damaged")
    names = [s["name"] for s in shards]
    if len(set(names)) != len(names) or any("/" in n or n.startswith(".") for n in names):
        raise ManifestError(f"{where}: lists a shard twice or a name that is not a file of "
                            f"its directory; the manifest is damaged")
    check_fields(manifest, where)  # every field ndp reads, by type and range
    return manifest


def write_manifest(directory: str | os.PathLike, manifest: dict[str, Any]) -> Path:
    """Write ``manifest`` as ``directory/ndp.json`` atomically (``ndp.store.atomic``): the
    dataset's commit."""
    return atomic_write(Path(directory) / MANIFEST, json.dumps(manifest, indent=2))


def shard_entry(path: Path, size: int, packets: int, crc32: int) -> dict[str, Any]:
    return {"name": path.name, "bytes": int(size), "packets": int(packets), "crc32": int(crc32)}


def listed_shards(directory: Path, *, manifest: str = "check") -> tuple[list[Path],
                                                                        dict | None]:
    """The shards of ``directory`` in name order, and its manifest (None with
    ``manifest="ignore"``: the shards as they are, whatever a manifest says). ``ManifestError``
    when the directory is not the whole dataset its manifest lists."""
    if manifest not in ("check", "ignore"):
        raise ConfigError(f"manifest must be 'check' or 'ignore', got {manifest!r}")
    found = sorted(directory.glob(f"*{SHARD_SUFFIX}"))
    if manifest == "ignore":
        return found, None
    record = read_manifest(directory)
    if record is None and not found:
        return [], None  # no dataset at all: the caller says there are no shards
    if record is None:
        raise ManifestError(
            f"{directory}: {len(found)} shard(s) but no {MANIFEST}: the dataset was never "
            f"committed (a conversion that was killed or is still running leaves shards "
            f"without one). Re-run the conversion; or, to read these shards as they are on "
            f"purpose, pass manifest='ignore' (ndp verify --no-manifest), or commit them with "
            f"'ndp index --write-manifest {directory}'")
    entries = entries_by_name(record)
    missing = sorted(set(entries) - {p.name for p in found})
    if missing:
        raise ManifestError(
            f"{directory}: {MANIFEST} lists {len(missing)} shard(s) that are not there "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): the dataset is "
            f"incomplete (a partial copy or a deleted shard). Copy the missing shards back or "
            f"re-run the conversion")
    extra = [p.name for p in found if p.name not in entries]
    if extra:
        raise ManifestError(
            f"{directory}: holds {len(extra)} shard(s) that {MANIFEST} does not list "
            f"({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}): left by an "
            f"interrupted conversion or copied in from elsewhere, they are not part of this "
            f"dataset. Move them out, or re-run the conversion")
    return [directory / name for name in sorted(entries)], record


def entries_by_name(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in manifest["shards"]}


# ------------------------------------------------------------------------- replacing a dataset
log = logging.getLogger(__name__)

#: signals that end a process on the spot by default; SIGINT raises KeyboardInterrupt already
_ENDING = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: Path) -> None:
    """Delete the directory ``path``; a warning, not silence, where that fails."""
    error: OSError | None = None
    for _ in range(3):  # again: a writer still closing a file may have added one meanwhile
        try:
            shutil.rmtree(path)
        except OSError as exc:
            error = exc
        if not os.path.lexists(path):
            return
    warnings.warn(f"{path}: could not be removed ({error}); delete it by hand (the next "
                  f"conversion into the same output also removes it)", stacklevel=3)


def _clean_leftovers(output: Path, *, locked: bool) -> None:
    """Remove the staging and retired directories that dead writers (SIGKILL, a crash, a power
    cut) left beside ``output``. Under the lock every one is a dead writer's, from whatever
    host (a live writer would hold the lock); without a lock, those of pids gone from here."""
    for kind in (_STAGING, _OLD):
        for left in output.parent.glob(f".{glob.escape(output.name)}{kind}*"):
            pid = left.name.rsplit("-", 1)[-1]
            if locked or (pid.isdigit() and not pid_alive(int(pid))):
                log.info("removing %s, left by a writer that is gone", left)
                _remove(left)


@contextlib.contextmanager
def _writer_lock(output: Path) -> Iterator[bool]:
    """Hold ``.<name>.ndp-lock`` beside ``output`` for the whole write (True), so that a
    second writer is refused at once with the first one's pid and host; False, with a warning,
    where the filesystem has no locks.

    A kernel lock (``flock``; Linux takes it on the server over NFS): the kernel releases it
    when its process ends however it ends, so no lock outlives a killed writer. The file stays:
    removing a lock file another process has open lets two writers hold "the" lock at once."""
    path = output.parent / f".{output.name}{_LOCK}"
    lock = FileLock(str(path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        holder = ""
        with contextlib.suppress(OSError):
            holder = path.read_text(encoding="utf-8", errors="replace").strip()
        raise ConfigError(
            f"{output}: another conversion ({holder or 'a process that did not say which'}) "
            f"is writing there now; wait until it ends, or write to another directory "
            f"(its lock {path} is released when that process ends)") from None
    except (NotImplementedError, OSError) as exc:  # NotImplementedError: older filelock's
        if isinstance(exc, OSError) and exc.errno not in (errno.ENOSYS, errno.ENOLCK,
                                                           errno.EOPNOTSUPP):
            raise
        warnings.warn(f"{path}: this filesystem cannot lock files ({exc}); a second "
                      f"conversion into {output} at the same time is refused only when it "
                      f"commits, after its work", stacklevel=4)
        yield False
        return
    soft = isinstance(lock, SoftFileLock)  # filelock's fallback: its file is its own record
    try:
        if not soft:  # who holds it, for the message above (another descriptor: the flock stays)
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        yield True
    finally:
        if not soft:
            with contextlib.suppress(OSError):
                os.truncate(path, 0)
        lock.release()


@contextlib.contextmanager
def _signals_unwind() -> Iterator[list[int]]:
    """Meanwhile SIGTERM and SIGHUP, which end a process on the spot by default, raise
    ``SystemExit(128 + signal)`` instead (the status a shell reports for them), so that what
    is staged is removed on the way out; the list collects the signals that came. Only in the
    main thread (where Python runs handlers) and where nobody set a handler of their own."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def stop(signum: int, frame: Any) -> None:
        received.append(signum)
        raise SystemExit(128 + signum)

    saved = {s: signal.getsignal(s) for s in _ENDING}
    for s, handler in saved.items():
        if handler is signal.SIG_DFL:
            signal.signal(s, stop)
    try:
        yield received
    finally:
        for s, handler in saved.items():
            if signal.getsignal(s) is stop:  # not replaced meanwhile (ray.init sets its own)
                signal.signal(s, handler)


@contextlib.contextmanager
def _signals_wait() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP wait until the block ends, then go to the handlers that were
    there: a swap (a rename or two) or a clean-up is never cut half way. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, *_ENDING)}
    for s, handler in saved.items():
        if handler is not None:  # None: set outside Python, left alone
            signal.signal(s, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for s, handler in saved.items():
            if handler is not None:
                signal.signal(s, handler)
        for s in dict.fromkeys(held):
            signal.raise_signal(s)


def _stopped(output: Path, exc: BaseException, received: list[int], *, committed: bool) -> str:
    """The one line that says why a write stopped and what ``output`` holds."""
    why = (f"{signal.Signals(received[-1]).name} received" if received
           else "interrupted: SIGINT or Ctrl-C" if isinstance(exc, KeyboardInterrupt)
           else f"the process is exiting with status {getattr(exc, 'code', None)}")
    return f"{output}: conversion stopped ({why})" + (
        " just after its dataset was committed" if committed
        else f"; its unfinished dataset is removed and {output} is as it was")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step (Linux ``renameat2(RENAME_EXCHANGE)``), or False."""
    libc_name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(libc_name, use_errno=True) if libc_name else None
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def _commit(staging: Path, output: Path, *, replacing: bool) -> None:
    """Swap the dataset built in ``staging`` in as ``output``."""
    if not replacing:
        try:
            os.rename(staging, output)  # over nothing or an empty directory, never over files
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise
            found = sorted(os.listdir(output))[:3] if output.is_dir() else ["a file"]
            raise ConfigError(
                f"{output}: another process wrote there while this conversion ran (it holds "
                f"{', '.join(found)} now); nothing of this conversion was kept: find what "
                f"writes there, then convert again") from None
        return
    if _exchange(staging, output):  # staging now holds the old dataset
        _remove(staging)
        return
    retired = output.parent / f".{output.name}{_OLD}{os.getpid()}"
    os.rename(output, retired)  # without an atomic swap: a moment with no dataset at all,
    try:  # but never a partial one
        os.rename(staging, output)
    except BaseException:
        os.rename(retired, output)
        raise
    _remove(retired)


def _is_dataset_file(name: str) -> bool:
    return (name.endswith((SHARD_SUFFIX, SHARD_SUFFIX + INDEX_SUFFIX, ".tmp"))
            or name in (MANIFEST,))


def _check_output(output: Path, *, overwrite: bool) -> list[str]:
    """The names in ``output`` ([] if it is new or empty); ``ConfigError`` where a writer may
    not replace it."""
    if output.exists() and not output.is_dir():
        raise ConfigError(f"output {output} is a file; the converter writes a directory")
    old = sorted(os.listdir(output)) if output.is_dir() else []
    if old:
        foreign = [n for n in old if not _is_dataset_file(n)]
        if foreign:
            raise ConfigError(
                f"{output} holds files that are not a dataset's ({', '.join(foreign[:3])}); "
                f"the converter writes a directory of its own: choose an empty or new one")
        if not overwrite:
            raise ConfigError(f"{output} already holds a dataset ({len(old)} file(s)); choose "
                              f"another directory or pass `overwrite=True` to replace it")
    return old


@contextlib.contextmanager
def staged_output(output: str | os.PathLike, *, overwrite: bool) -> Iterator[Path]:
    """A directory to build a dataset in, swapped in as ``output`` when the block ends
    normally (after the writer wrote the manifest); on an exception it is deleted and
    ``output`` is as it was. ``ConfigError`` if ``output`` is a file, or holds a dataset and
    ``overwrite`` is False, or holds files that are not a dataset's (the swap would lose them),
    or another process writes it now (the lock ``.<name>.ndp-lock`` beside it, held until the
    block ends, refuses a second writer before it does any work).

    SIGTERM and SIGHUP raise ``SystemExit`` in the block (see ``_signals_unwind``), so a
    process stopped by them, or by Ctrl-C, removes what it staged and says so in one logged
    line; what a SIGKILLed writer leaves, the next writer into ``output`` removes.
    """
    output = Path(output)
    _check_output(output, overwrite=overwrite)  # refused before anything is made
    output.parent.mkdir(parents=True, exist_ok=True)
    with _signals_unwind() as received, _writer_lock(output) as locked:
        old = _check_output(output, overwrite=overwrite)  # again, now no other ndp writes it
        _clean_leftovers(output, locked=locked)
        staging = output.parent / f".{output.name}{_STAGING}{os.getpid()}"
        _remove(staging)
        committed = False
        try:  # made inside: a signal that comes right after the mkdir still removes it
            staging.mkdir()
            yield staging
            if received:  # its SystemExit was swallowed (raised in a __del__ or a weakref
                # callback, where Python prints and ignores exceptions): stop here still
                raise SystemExit(128 + received[-1])
            with _signals_wait():
                _commit(staging, output, replacing=bool(old))
                committed = True
        except BaseException as exc:
            with _signals_wait():
                if not committed:
                    _remove(staging)
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    log.error("%s", _stopped(output, exc, received, committed=committed))
            raise
