"""Datasets in object storage: any fsspec URL (``s3://bucket/prefix/``, ``gs://``, ``hf://``,
``memory://``, ...) read by ``Loader``, ``NDPDataset``, ``ndp inspect``, ``verify`` and
``export`` as a local directory is.

    loader = ndp.Loader("s3://bucket/tokens/", batch_size=8, seq_len=1024, mode="packed",
                        storage_options={"endpoint_url": ...}, cache_dir="/local/nvme/ndp",
                        cache_limit=200 << 30)

* **Opening is one small read**: the manifest ``ndp.json`` lists every shard with its size and
  crc32 (``ndp.store.manifest``), so the bucket is never listed. The shards' indexes are fetched
  into the cache once (all at once, concurrently where the filesystem can) and checked against
  the manifest: an index made for another shard never enters it.
* **Shards come whole into a local cache** shared by the processes of a node (``ndp.store.cache``:
  checked against the manifest before they are renamed into place, downloaded once per node,
  ``cache_limit`` evicts what no loader needs now). A Loader fetches only the shards its share
  reads, in the order it reads them, on one prefetch thread (``ndp.store.prefetch``) that stays
  ahead of the decoder; a shard not there yet when it is needed is downloaded on the spot.
* **A cache_limit too small for the node is refused when the dataset is opened**, not found
  by ranks stalled on each other's pins (``least_cache_limit``): each rank of the node pins the
  shard it reads and the next, which its prefetch fetches meanwhile, so the limit must hold
  that many of the manifest's largest shards (the whole dataset at most) for each of them; a
  ``CacheFullError`` says so. The ranks counted are the readers registered in the cache's
  directory when it is opened (``ndp.store.readers``: whatever launched them), or the node's
  ``LOCAL_WORLD_SIZE`` (torchrun sets it) if more; ranks opened later than this one, which it
  cannot count, are caught by the cache when no reader can move on.
* **Errors**: a transient error (a dropped connection, a timeout, a 5xx) is retried with
  exponential backoff (``retries``, 5 by default: 6 tries, each of which the filesystem may
  retry in turn, s3fs up to 5 times, for a dropped connection); a missing object, a refused
  request or an object that is not what the manifest says (after the retries) raises
  ``RemoteError`` naming the URL, in the consumer's ``next()`` when the Loader's producer met it.
* **Every read ends.** A shard is read in ranges of ``BLOCK`` bytes up to the manifest's size
  (one more byte asked with the last, to see an object longer than that), and each answer must
  be as long as the range asked: an answer that is not (a proxy's error page sent with ``200
  OK`` in place of the shard, a cut object) is a mismatch at once, not a position to read on
  from. So a try of a shard of ``B`` bytes is at most ``ceil(B / BLOCK)`` requests, and a shard
  that never comes whole is ``retries + 1`` tries, then a ``RemoteError`` saying what came back.
  Its crc32 is counted as it arrives and must be the manifest's.

``storage_options`` go to fsspec's filesystem as they are (for s3fs: ``key``, ``secret``,
``client_kwargs={"endpoint_url": ...}``, ``anon``; credentials are otherwise found the way
each filesystem finds them).
"""

from __future__ import annotations

import errno
import hashlib
import os
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

from ndp.store.atomic import atomic_write
from ndp.store.cache import ShardCache, default_cache_dir
from ndp.errors import CacheFullError, IndexMismatchError, ManifestError, RemoteError
from ndp.wire.format import INDEX_SUFFIX
from ndp.store.index import parse_index
from ndp.store.manifest import MANIFEST, parse_manifest
from ndp.store.remote_shard import RemoteShard  # a RemoteDataset's shards (read from here too)

T = TypeVar("T")
#: bytes per range request of a download (8 MiB: a 100 MB shard is 12 requests)
BLOCK = 8 << 20
RETRIES = 5
BACKOFF_S = 0.2
#: shards one reader pins at once, at the least: the one it reads and the next, which its
#: prefetch fetches while the first is decoded (``ndp.store.prefetch``)
READER_SHARDS = 2


def is_url(path: Any) -> bool:
    """Whether ``path`` names object storage (``scheme://...``, other than ``file://``)."""
    if not isinstance(path, str) or "://" not in path:
        return False
    return path.split("://", 1)[0] not in ("file", "local")


def filesystem(url: str, storage_options: dict | None = None) -> tuple[Any, str]:
    """fsspec's filesystem for ``url`` and the path in it (no trailing slash)."""
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise RemoteError(f"{url}: reading object storage needs fsspec (and s3fs, gcsfs, "
                          f"huggingface_hub, ... for its scheme): "
                          f"pip install 'neural-datagram[remote]'"
                          ) from None
    try:
        fs, path = url_to_fs(url, **(storage_options or {}))
    except (ImportError, ValueError) as exc:
        raise RemoteError(f"{url}: no filesystem for this URL ({exc}); install the fsspec "
                          f"implementation of its scheme (s3fs for s3://, gcsfs for gs://)"
                          ) from None
    return fs, path.rstrip("/")


def node_ranks() -> int:
    """The ranks of this node that share its cache: ``LOCAL_WORLD_SIZE`` (torchrun sets it, with
    ``WORLD_SIZE``, which it cannot exceed); 1 where it is unset or not a positive integer."""
    def env(name: str) -> int | None:
        try:
            value = int(os.environ.get(name, ""))
        except ValueError:
            return None
        return value if value >= 1 else None

    local, world = env("LOCAL_WORLD_SIZE"), env("WORLD_SIZE")
    return min(local or 1, world or local or 1)


def least_cache_limit(sizes: list[int], ranks: int) -> int:
    """The least ``cache_limit`` with which ``ranks`` readers sharing a cache all make progress:
    each pins ``READER_SHARDS`` shards at once, in the worst case other shards than the others'
    and the largest ones (``sizes``: every shard's bytes), and all of them never need more than
    the whole dataset."""
    return sum(sorted(sizes, reverse=True)[:ranks * READER_SHARDS])


def permanent(exc: BaseException) -> bool:
    """Whether a storage error will not go away by retrying (missing object, no access)."""
    return isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError,
                            NotADirectoryError))


def with_retries(what: str, call: Callable[[], T], *, retries: int = RETRIES,
                 backoff: float | None = None, on_retry: Callable[[], None] | None = None) -> T:
    """``call()``, again after a transient error (up to ``retries`` times, waiting ``backoff``
    seconds, ``BACKOFF_S`` by default, doubled each time); ``RemoteError`` naming ``what`` for
    a permanent error or the last transient one."""
    backoff = BACKOFF_S if backoff is None else backoff
    for attempt in range(retries + 1):
        try:
            return call()
        except RemoteError:
            raise
        except Exception as exc:  # noqa: BLE001 - every filesystem raises its own kinds
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise  # the local disk, not the network
            if permanent(exc):
                kind = ("does not exist" if isinstance(exc, FileNotFoundError)
                        else "was refused (no access)")
                raise RemoteError(f"{what}: {kind} ({type(exc).__name__}: {exc}); check the "
                                  f"URL and the credentials in `storage_options`") from exc
            if attempt == retries:
                raise RemoteError(f"{what}: failed {retries + 1} times ({type(exc).__name__}: "
                                  f"{exc}); the storage is unreachable or failing") from exc
            if on_retry is not None:
                on_retry()
            time.sleep(backoff * 2 ** attempt)
    raise AssertionError("unreachable")


class RemoteDataset:
    """A dataset at ``url``: its manifest, its indexes in the cache and its shards (see the
    module docstring)."""

    def __init__(self, url: str, *, storage_options: dict | None = None,
                 cache_dir: str | os.PathLike | None = None, cache_limit: int | None = None,
                 retries: int = RETRIES) -> None:
        self.url = url.rstrip("/")
        self.fs, self.root = filesystem(url, storage_options)
        self.retries = retries
        where = f"{self.url}/{MANIFEST}"
        try:
            text = with_retries(where, lambda: self.fs.cat_file(f"{self.root}/{MANIFEST}"),
                                retries=retries)
        except RemoteError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                raise ManifestError(
                    f"{where}: not there, so {self.url} holds no committed dataset (a "
                    f"conversion still uploading, or another prefix); convert to it with "
                    f"'ndp convert ... {self.url}', or commit shards already there with 'ndp "
                    f"index --write-manifest' on a local copy and upload its {MANIFEST}"
                ) from None
            raise
        self.manifest = parse_manifest(text, where, self.url)
        key = hashlib.sha256(self.url.encode() + b"\0" + text).hexdigest()
        self.cache = ShardCache(Path(cache_dir or default_cache_dir()) / key[:24],
                                limit=cache_limit)
        try:
            #: the readers of the cache now, this one included (``ndp.store.readers``)
            self.readers = self.cache.readers()
            #: the ranks of this node sharing the cache: its readers now, or the node's
            #: ``LOCAL_WORLD_SIZE`` if more (``node_ranks``); the prefetch of each pins at most
            #: its share of ``cache_limit``
            self.ranks = max(node_ranks(), self.readers)
            self.entries = list(self.manifest["shards"])
            self._check_limit()
            self.entries.sort(key=lambda e: e["name"])
            self._fetch_indexes()
        except BaseException:
            self.cache.close()  # not a reader of the cache after all
            raise
        self.shards = [RemoteShard(self, e) for e in self.entries]
        self.prefetcher = None  # made by the first ``will_read`` (``ndp.store.prefetch``)

    def _check_limit(self) -> None:
        """``CacheFullError`` if ``cache_limit`` is below ``least_cache_limit``."""
        limit, ranks = self.cache.limit, self.ranks
        need = least_cache_limit([int(e["bytes"]) for e in self.entries], ranks)
        if limit is None or limit >= need:
            return
        local = os.environ.get("LOCAL_WORLD_SIZE")
        raise CacheFullError(
            f"{self.url}: cache_limit={limit:,} bytes cannot hold the shards that the {ranks} "
            f"rank(s) of this node sharing the cache pin at once ({self.readers} reader(s) of "
            f"it open now, this one included, registered in {self.cache.dir}; LOCAL_WORLD_SIZE="
            f"{local if local is not None else 'unset'}): {need:,} bytes, each rank's "
            f"shard and the next its prefetch fetches, of the largest shards in the manifest; "
            f"with less the ranks wait on each other's pins until they fail. Raise "
            f"cache_limit to at least {need:,}, run fewer ranks per node on this cache, or give "
            f"each rank its own `cache_dir`")

    # ------------------------------------------------------------------------------ indexes
    def _fetch_indexes(self) -> None:
        """Every shard's index into the cache (those not there yet, in one batch of reads),
        each checked against the manifest first."""
        from filelock import FileLock

        with FileLock(str(self.cache.dir / ".indexes.lock")):  # the ranks of a node: once
            missing = [e for e in self.entries
                       if not self.cache.path(e["name"] + INDEX_SUFFIX).exists()]
            if missing:
                self._fetch(missing)

    def _fetch(self, missing: list[dict]) -> None:
        paths = [f"{self.root}/{e['name']}{INDEX_SUFFIX}" for e in missing]

        def fetch() -> dict:
            got = self.fs.cat(paths, on_error="return")
            if not isinstance(got, dict):  # one path: fsspec returns its bytes
                got = {paths[0]: got}
            failed = [v for v in got.values() if isinstance(v, Exception)]
            if failed:  # a permanent error first: retrying the others would not help
                raise ([v for v in failed if permanent(v)] or failed)[0]
            return got

        got = with_retries(f"{self.url}: the shards' indexes", fetch, retries=self.retries)
        for entry, path in zip(missing, paths):
            url = f"{self.url}/{entry['name']}{INDEX_SUFFIX}"
            raw = bytes(got[path])
            index = parse_index(raw, url)
            if index.shard_size != entry["bytes"] or index.shard_crc32 != entry["crc32"]:
                raise IndexMismatchError(
                    f"{url}: made for a shard of {index.shard_size:,} bytes with crc32 "
                    f"{index.shard_crc32:#010x}; the manifest lists {entry['bytes']:,} bytes "
                    f"and {entry['crc32']:#010x}: the index is stale. Rebuild it with 'ndp "
                    f"index' on a local copy and upload it")
            atomic_write(self.cache.path(entry["name"] + INDEX_SUFFIX), raw)

    # ------------------------------------------------------------------------------ shards
    def download(self, entry: dict, out: IO[bytes], *, retries: int | None = None) -> None:
        """Shard ``entry`` into ``out``, in ranges each checked to be as long as asked, its crc32
        counted as it arrives (see the module docstring); again after a transient error or a
        copy that is not the manifest's, up to ``retries`` times (the dataset's by default);
        ``RemoteError`` if it stays wrong or the error is permanent."""
        name, url = entry["name"], f"{self.url}/{entry['name']}"
        size, want_crc = int(entry["bytes"]), int(entry["crc32"])
        retries = self.retries if retries is None else retries

        def attempt() -> None:
            out.seek(0)
            crc, n = 0, 0
            while n < size:
                stop = min(n + BLOCK, size)
                # one byte more with the last range: an object longer than the manifest's
                # says so, where reading exactly its size would not see it
                ask = stop + 1 if stop == size else stop
                piece = self.fs.cat_file(f"{self.root}/{name}", start=n, end=ask)
                if len(piece) != stop - n:
                    raise _Mismatch(self._wrong_answer(piece, n, stop, size, want_crc))
                crc = zlib.crc32(piece, crc)
                out.write(piece)
                n = stop
            out.truncate()  # made at full size to hold its room in the cache
            if crc != want_crc:
                raise _Mismatch(f"{size:,} bytes with crc32 {crc:#010x} arrived where the "
                                f"manifest lists {size:,} bytes and {want_crc:#010x}")

        def count() -> None:
            self.cache.stats.retries += 1

        try:
            with_retries(url, attempt, retries=retries, on_retry=count)
        except RemoteError as exc:
            if isinstance(exc.__cause__, _Mismatch):
                raise RemoteError(
                    f"{url}: {exc.__cause__} (every one of {retries + 1} tries): not the shard "
                    f"the manifest lists, so nothing was cached. Either something on the way "
                    f"answers in the storage's place (a proxy or gateway's error page: check "
                    f"the endpoint in `storage_options` and any HTTP(S)_PROXY), or the object "
                    f"was replaced or damaged after the dataset was written (restore it, or "
                    f"convert the dataset again)") from None
            raise

    @staticmethod
    def _wrong_answer(piece: bytes, start: int, stop: int, size: int, crc: int) -> str:
        """What a range read of ``start:stop`` got instead (``piece``), in words."""
        more = "" if len(piece) < stop - start else (
            ": the object is longer than the manifest's shard" if stop == size
            else ": more than asked (a server that does not honour ranges)")
        return (f"{len(piece):,} bytes (beginning {bytes(piece[:40])!r}) arrived for bytes "
                f"{start:,}-{stop - 1:,} of a shard the manifest lists as {size:,} bytes with "
                f"crc32 {crc:#010x}{more}")

    def fetch(self, entry: dict, *, wait: bool = True) -> Path:
        """Shard ``entry``'s checked file in the cache (downloaded now if it is not there).
        Without ``wait`` (the prefetcher's call: a download moved earlier, which the reader's
        own fetch does again if it fails): ``CacheFullError`` at once if the cache has no room
        for it now, and one try, not ``retries + 1``: a shard that does not come is then asked
        for ``retries + 2`` times in all, not twice that."""
        tries = None if wait else 0
        try:
            return self.cache.get(entry["name"], entry["bytes"],
                                  lambda out: self.download(entry, out, retries=tries),
                                  crc32=entry["crc32"], wait=wait)
        except Exception:
            prefetcher = self.prefetcher
            if wait and prefetcher is not None:  # not asked for again behind the error
                prefetcher.gave_up(entry["name"])
            raise

    def fetch_all(self, *, progress: bool = False) -> list[Path]:
        """Every shard in the cache (for the tools that read a dataset whole)."""
        from ndp.progress import progress_bar

        with progress_bar(total=sum(e["bytes"] for e in self.entries), unit="B",
                          unit_scale=True, desc=f"fetching {self.url}",
                          enabled=progress) as bar:
            out = []
            for e in self.entries:
                out.append(self.fetch(e))
                bar.update(e["bytes"])
        return out

    def close(self) -> None:
        """Stop the prefetch thread and drop this process' pins."""
        if self.prefetcher is not None:
            self.prefetcher.close()
            self.prefetcher = None
        self.cache.close()


class _Mismatch(Exception):
    """A download that is not the manifest's shard (transient until the retries run out)."""
