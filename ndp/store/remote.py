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
  by ranks stalled on each other's pins for the cache's wait (``least_cache_limit``): each of
  the node's ``LOCAL_WORLD_SIZE`` ranks (torchrun sets it) pins the shard it reads and the
  next, which its prefetch fetches meanwhile, so the limit must hold that many of the
  manifest's largest shards (the whole dataset at most); a ``CacheFullError`` says so.
* **Errors**: a transient error (a dropped connection, a timeout, a 5xx) is retried with
  exponential backoff (``retries``, 5 by default); a missing object, a refused request or an
  object that is not what the manifest says (after the retries) raises ``RemoteError`` naming
  the URL, in the consumer's ``next()`` when the Loader's producer met it.

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

import numpy as np

from ndp.store.atomic import atomic_write
from ndp.store.cache import ShardCache, default_cache_dir
from ndp.errors import (CacheFullError, IndexMismatchError, ManifestError, RemoteError,
                        ShardChangedError)
from ndp.wire.format import (
    INDEX_HEADER_BYTES,
    INDEX_HEADER_DTYPE,
    INDEX_SUFFIX,
    SHARD_HEADER_BYTES,
    SHARD_VERSION,
)
from ndp.store.index import parse_index
from ndp.store.manifest import MANIFEST, parse_manifest
from ndp.store.shard import Shard, ShardHeader, parse_shard_header

T = TypeVar("T")
#: bytes per read of a download (and the filesystem's block size)
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
            if isinstance(exc, OSError) and exc.errno is not None and exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise  # ENOSPC / EDQUOT: the local disk, not the network
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
        #: the ranks of this node sharing the cache (``node_ranks``): the prefetch of each
        #: pins at most its share of ``cache_limit``
        self.ranks = node_ranks()
        self.entries = list(self.manifest["shards"])
        self._check_limit()
        self.entries.sort(key=lambda e: e["name"])
        self._fetch_indexes()
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
            f"rank(s) of this node sharing the cache pin at once (LOCAL_WORLD_SIZE="
            f"{local if local is not None else 'unset, so 1'}): {need:,} bytes, each rank's "
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
    def download(self, entry: dict, out: IO[bytes]) -> None:
        """Shard ``entry`` into ``out``, its size and crc32 counted as it arrives; again after
        a transient error or a copy that is not the manifest's; ``RemoteError`` if it stays
        wrong or the error is permanent."""
        name, url = entry["name"], f"{self.url}/{entry['name']}"

        def attempt() -> None:
            out.seek(0)
            crc, n = 0, 0
            with self.fs.open(f"{self.root}/{name}", "rb", block_size=BLOCK) as src:
                while True:
                    piece = src.read(BLOCK)
                    if not piece:
                        break
                    crc, n = zlib.crc32(piece, crc), n + len(piece)
                    out.write(piece)
            out.truncate()  # made at full size to hold its room in the cache
            if (n, crc) != (entry["bytes"], entry["crc32"]):
                raise _Mismatch(f"{n:,} bytes with crc32 {crc:#010x} arrived where the "
                                f"manifest lists {entry['bytes']:,} bytes and "
                                f"{entry['crc32']:#010x}")

        def count() -> None:
            self.cache.stats.retries += 1

        try:
            with_retries(url, attempt, retries=self.retries, on_retry=count)
        except RemoteError as exc:
            if isinstance(exc.__cause__, _Mismatch):
                raise RemoteError(
                    f"{url}: {exc.__cause__} (every one of {self.retries + 1} tries): the "
                    f"object was replaced or damaged after the dataset was written; nothing "
                    f"was cached. Restore it, or convert the dataset again") from None
            raise

    def fetch(self, entry: dict, *, wait: bool = True) -> Path:
        """Shard ``entry``'s checked file in the cache (downloaded now if it is not there;
        without ``wait``, ``CacheFullError`` at once if the cache has no room for it now)."""
        return self.cache.get(entry["name"], entry["bytes"], lambda out: self.download(entry, out),
                              crc32=entry["crc32"], wait=wait)

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


class RemoteShard(Shard):
    """A shard of a ``RemoteDataset``: its size and header from the manifest and index, its
    bytes read from the cache, fetched on first use (``Shard``'s interface otherwise)."""

    def __init__(self, dataset: RemoteDataset, entry: dict) -> None:  # Shard.__init__ opens a file
        self.dataset, self.entry = dataset, entry
        self.url = f"{dataset.url}/{entry['name']}"
        self.path = dataset.cache.path(entry["name"])
        self._data: np.ndarray | None = None
        self._checked: tuple | None = None  # identity of the file whose header was checked
        self._offset: int | None = None  # where packets start, as the index's header says

    @property
    def data_offset(self) -> int:
        """Where the shard's packets start, from its index's header (read once; the whole
        index is read and checked by ``load_index``)."""
        if self._offset is None:
            with open(self.index_path, "rb") as f:
                head = f.read(INDEX_HEADER_BYTES)
            if len(head) < INDEX_HEADER_BYTES:
                raise IndexMismatchError(f"{self.index_path}: not an ndp index (too short)")
            self._offset = int(np.frombuffer(head, INDEX_HEADER_DTYPE)[0]["data_offset"])
        return self._offset

    @property
    def size(self) -> int:
        return int(self.entry["bytes"])

    @property
    def header(self) -> ShardHeader:
        offset = self.data_offset
        return ShardHeader(SHARD_VERSION if offset == SHARD_HEADER_BYTES else None, offset)

    @property
    def identity(self) -> tuple[int, int, int, int]:
        """The cached file's identity, fetching it first (and checking its header against
        the index the first time)."""
        from ndp.store.files import FILES, identity_of

        path = self.dataset.fetch(self.entry)
        identity = identity_of(path)
        if identity != self._checked:
            head = np.zeros(min(self.size, SHARD_HEADER_BYTES), np.uint8)
            FILES.read_ranges(path, identity, np.zeros(1, np.int64),
                              np.array([head.shape[0]], np.int64), head, np.zeros(1, np.int64))
            if parse_shard_header(head, self.url, size=self.size).data_offset \
                    != self.data_offset:
                raise IndexMismatchError(f"{self.url}{INDEX_SUFFIX}: its packets start at "
                                         f"byte {self.data_offset}, the shard's header says "
                                         f"otherwise; rebuild the index ('ndp index')")
            self._checked = identity
        return identity

    def read_ranges(self, offsets: np.ndarray, sizes: np.ndarray, dst: np.ndarray,
                    starts: np.ndarray) -> None:
        from ndp.store.files import FILES

        for attempt in range(2):
            try:
                FILES.read_ranges(self.path, self.identity, offsets, sizes, dst, starts)
                return
            except (ShardChangedError, FileNotFoundError):
                if attempt:  # evicted by another process between the fetch and the read
                    raise
                self._checked = None

    @property
    def data(self) -> np.ndarray:
        if self._data is None:
            self.identity  # noqa: B018 - fetched and checked
        return super().data

    def crc32(self) -> int:
        """The manifest's: a shard enters the cache only with it."""
        return int(self.entry["crc32"])

    def __repr__(self) -> str:
        return f"RemoteShard({self.url!r}, size={self.size})"
