"""What the paths given to a reader name: the shards of a directory (checked against its
manifest, ``ndp.store.manifest``), shards named directly, or a remote dataset by its URL
(``ndp.store.remote``), each shard with its manifest entry (``listed``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ndp.errors import ConfigError
from ndp.store.manifest import listed_shards, entries_by_name
from ndp.store.remote import RemoteDataset, is_url
from ndp.wire.format import SHARD_SUFFIX

PathLike = str | os.PathLike


def listed(paths: PathLike | Sequence[PathLike], *, manifest: str = "check",
           remote: dict | None = None, datasets: list | None = None,
           sources: list | None = None) -> tuple[list[tuple[Any, dict | None]], list[dict]]:
    """Each shard with its manifest entry (None for a shard named directly or read without a
    manifest), and the manifests read. A directory must be a whole dataset by its manifest
    (``ndp.store.manifest.listed_shards``) unless ``manifest`` is "ignore". A URL is a remote
    dataset (``ndp.store.remote``, opened with the options ``remote``, appended to ``datasets``):
    its shards are ``RemoteShard`` objects, the others paths."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out: list[tuple[Any, dict | None]] = []
    manifests: list[dict] = []
    for item in items:
        if is_url(item):
            if datasets is None:
                raise ConfigError(f"{item}: a URL; read it with ndp.Loader, NDPDataset or "
                                  f"RemoteDataset(...).fetch_all()")
            if manifest == "ignore":
                raise ConfigError(f"{item}: a remote dataset is found through its manifest "
                                  f"(the bucket is never listed); manifest='ignore' cannot "
                                  f"read it")
            dataset = RemoteDataset(item, **(remote or {}))
            datasets.append(dataset)
            out.extend(zip(dataset.shards, dataset.entries))
            manifests.append(dataset.manifest)
            if sources is not None:
                sources.append(str(item))
            continue
        p = Path(item)
        if p.is_dir():
            found, record = listed_shards(p, manifest=manifest)
            if not found:
                raise ConfigError(f"{p}: no *{SHARD_SUFFIX} shards in this directory; convert "
                                  f"data first (ndp convert)")
            entries = {} if record is None else entries_by_name(record)
            out.extend((f, entries.get(f.name)) for f in found)
            if record is not None:
                manifests.append(record)
                if sources is not None:
                    sources.append(str(p))
        elif p.exists():
            out.append((p, None))
        else:
            raise ConfigError(f"{p}: no such shard or directory")
    return out, manifests
