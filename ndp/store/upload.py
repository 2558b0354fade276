"""A dataset written to object storage: ``ndp convert ... s3://bucket/prefix/``.

The converter writes shards into a local temporary directory as usual (``ShardWriter``); each
finished shard and its index are uploaded on one thread while the next shard is written, then
removed locally, and the manifest ``ndp.json`` is uploaded last, once every shard is there. A
reader finds a dataset through its manifest only (``ndp.store.remote``), so it never sees one
without all of its shards; a conversion that fails or is killed leaves shards and no manifest,
which readers refuse, as on a local disk.

Overwriting (``overwrite=True``) never touches the old dataset before the new one is
complete: its shards go up under names the old manifest does not use (the old names with a tag
of this conversion, ``shard-00000-<tag>.ndp``, in the same order), the new manifest replaces the
old one in one PUT, and only then are the old shards deleted. So a conversion that fails or is
killed part way leaves the old dataset whole and readable (and some new shards that no manifest
lists), as a killed overwrite does on a local disk; a reader still on the old dataset when its
shards are deleted gets a ``RemoteError`` (a shard is missing), never another dataset's tokens.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import secrets
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from ndp.errors import ConfigError, RemoteError
from ndp.store.atomic import atomic_write
from ndp.wire.format import INDEX_SUFFIX
from ndp.store.manifest import MANIFEST, parse_manifest, staged_output
from ndp.store.remote import RETRIES, filesystem, is_url, with_retries
from ndp.store.shard import index_path_for
from ndp.store.writer import ShardInfo


class RemoteOutput:
    """Uploads a conversion to ``url`` (see the module docstring)."""

    def __init__(self, url: str, *, storage_options: dict | None = None,
                 overwrite: bool = False, retries: int = RETRIES,
                 keep_manifest: bool = False) -> None:
        """``keep_manifest``: only upload shards (a task of a conversion whose driver deals
        with the manifest, ``ndp.convert.ray_engine``)."""
        self.url = url.rstrip("/")
        self.fs, self.root = filesystem(url, storage_options)
        self.retries = retries
        where = f"{self.url}/{MANIFEST}"
        exists = not keep_manifest and with_retries(
            where, lambda: self.fs.exists(f"{self.root}/{MANIFEST}"), retries=retries)
        self.old: dict | None = None
        #: what the new shards' names carry when they replace a dataset (``name``)
        self.tag: str | None = None
        if exists:
            if not overwrite:
                raise ConfigError(f"{self.url} already holds a dataset ({MANIFEST}); choose "
                                  f"another prefix or pass `overwrite=True` to replace it")
            text = with_retries(where, lambda: self.fs.cat_file(f"{self.root}/{MANIFEST}"),
                                retries=retries)
            self.old = parse_manifest(text, where, self.url)
            old_names = {e["name"] for e in self.old["shards"]}
            while self.tag is None or any(f"-{self.tag}" in n for n in old_names):
                self.tag = secrets.token_hex(4)
        self.uploaded: list[str] = []  # the names the shards have at the URL
        self._queue: queue.Queue[ShardInfo | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ndp-upload", daemon=True)
        self._thread.start()

    def put(self, shard: ShardInfo) -> None:
        """Upload ``shard`` (and its index), then remove them locally; raises the error of an
        earlier upload, if one failed."""
        if self._error is not None:
            raise self._error
        self._queue.put(shard)

    def name(self, local: str) -> str:
        """The name a shard written as ``local`` has at the URL: its own, or, replacing a
        dataset, with this conversion's tag (``shard-00000.ndp`` -> ``shard-00000-<tag>.ndp``:
        shards keep their order by name)."""
        if self.tag is None:
            return local
        stem, dot, suffix = local.partition(".")
        return f"{stem}-{self.tag}{dot}{suffix}"

    def _put_file(self, local: Path, name: str | None = None) -> None:
        name = local.name if name is None else name
        remote = f"{self.root}/{name}"
        with_retries(f"{self.url}/{name}", lambda: self.fs.put_file(str(local), remote),
                     retries=self.retries)

    def _run(self) -> None:
        while (shard := self._queue.get()) is not None:
            if self._error is not None:
                continue
            try:
                name = self.name(shard.path.name)
                self._put_file(shard.path, name)
                self._put_file(index_path_for(shard.path), name + INDEX_SUFFIX)
                self.uploaded.append(name)
                shard.path.unlink()
                index_path_for(shard.path).unlink()
            except BaseException as exc:  # noqa: BLE001 - raised by put() or finish()
                self._error = exc

    def wait(self) -> None:
        """Wait for the shards' uploads; raise the error of one that failed."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if self._error is not None:
            raise self._error

    def finish(self, manifest: Path) -> None:
        """Wait for the shards' uploads, then upload ``manifest`` (the commit, with the names
        the shards have at the URL) and delete the old dataset's shards that the new one does
        not have."""
        self.wait()
        record = json.loads(manifest.read_text())
        uploaded = set(self.uploaded)
        for entry in record["shards"]:  # renamed here, or named by whoever uploaded them
            if entry["name"] not in uploaded:
                entry["name"] = self.name(entry["name"])
        missing = sorted({e["name"] for e in record["shards"]} - uploaded)
        if missing:
            raise RemoteError(f"{self.url}: shards {missing[:3]} were not uploaded; nothing "
                              f"was committed")
        if self.tag is not None:
            atomic_write(manifest, json.dumps(record, indent=1) + "\n")
        self._put_file(manifest)
        if self.old is not None:
            kept = set(self.uploaded)
            stale = [e["name"] for e in self.old["shards"] if e["name"] not in kept]
            for name in stale:
                for key in (name, name + INDEX_SUFFIX):
                    try:
                        self.fs.rm_file(f"{self.root}/{key}")
                    except FileNotFoundError:
                        pass

    def abort(self) -> None:
        """Stop uploading (what is up stays, without a manifest: not a dataset)."""
        self._error = self._error or RemoteError(f"{self.url}: conversion aborted")
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()


@contextlib.contextmanager
def dataset_output(output: str | os.PathLike, *, overwrite: bool,
                   storage_options: dict | None = None) -> Iterator[tuple]:
    """For a converter: the directory its ``ShardWriter`` writes in, what the writer calls with
    each finished shard (``on_finish``), and what publishes the committed manifest. A local
    ``output`` is built in a staged directory and swapped in whole (``ndp.store.manifest``); a URL
    gets its shards uploaded as they are finished and the manifest last (``RemoteOutput``)."""
    if not is_url(output):
        with staged_output(Path(output), overwrite=overwrite) as stage:
            yield stage, None, lambda manifest: None
        return
    uploader = RemoteOutput(str(output), storage_options=storage_options, overwrite=overwrite)
    with tempfile.TemporaryDirectory(prefix="ndp-convert-") as tmp:
        try:
            yield Path(tmp), uploader.put, uploader.finish
        except BaseException:
            uploader.abort()
            raise
