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
manifest is written; the old one is deleted only after that.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ndp.store.atomic import atomic_write
from ndp.errors import ConfigError, ManifestError
from ndp.store.manifest_fields import check_fields
from ndp.wire.format import INDEX_SUFFIX, SHARD_SUFFIX

MANIFEST = "ndp.json"
_STAGING = ".ndp-partial-"  # sibling directories a writer builds in: ".<name>.ndp-partial-<pid>"
_OLD = ".ndp-old-"


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
def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _clean_leftovers(output: Path) -> None:
    """Remove staging and old directories that killed writers left beside ``output``."""
    for kind in (_STAGING, _OLD):
        for left in output.parent.glob(f".{output.name}{kind}*"):
            pid = left.name.rsplit("-", 1)[-1]
            if pid.isdigit() and not pid_alive(int(pid)):
                shutil.rmtree(left, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where
    that is not available."""
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    ok = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0
    return ok


def _is_dataset_file(name: str) -> bool:
    return (name.endswith((SHARD_SUFFIX, SHARD_SUFFIX + INDEX_SUFFIX, ".tmp"))
            or name in (MANIFEST,))


@contextlib.contextmanager
def staged_output(output: str | os.PathLike, *, overwrite: bool) -> Iterator[Path]:
    """A directory to build a dataset in, swapped in as ``output`` when the block ends
    normally (after the writer wrote the manifest); on an exception it is deleted and
    ``output`` is as it was. ``ConfigError`` if ``output`` is a file, or holds a dataset and
    ``overwrite`` is False, or holds files that are not a dataset's (the swap would lose them).
    """
    output = Path(output)
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
    output.parent.mkdir(parents=True, exist_ok=True)
    _clean_leftovers(output)
    staging = output.parent / f".{output.name}{_STAGING}{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if not old:
        if output.is_dir():
            output.rmdir()
        os.rename(staging, output)
        return
    if _exchange(staging, output):  # staging now holds the old dataset
        shutil.rmtree(staging, ignore_errors=True)
        return
    retired = output.parent / f".{output.name}{_OLD}{os.getpid()}"
    os.rename(output, retired)  # without an atomic swap: a moment with no dataset at all,
    os.rename(staging, output)  # but never a partial one
    shutil.rmtree(retired, ignore_errors=True)
