"""A corpus: the shards a batch source reads, their indexes, and one packet numbering.

Packets are numbered globally in shard order (shards sorted by name inside a directory): packet
``g`` is packet ``g - base[s]`` of shard ``s``. Orders, rank splits and resume states are
written in these numbers, so they do not depend on which backend decodes.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ndp.checks import choice
from ndp.errors import ConfigError, DataError, ShardFormatError, past_aliases
from ndp.wire.format import SYNC
from ndp.store.index import Corruption, Index, ScanResult, check_headers, scan_shard
from ndp.store.columns import Column, entries_at
from ndp.store.digests import IndexDigests
from ndp.store.growth import fingerprint_of
from ndp.store.lazy import EntryCache, LazyIndex, entries_digest, open_index
from ndp.store.pieces import Pieces, pieces_of
from ndp.store.listing import PathLike, listed
from ndp.store.manifest import ManifestError
from ndp.store.manifest_fields import check_identity, check_tokenizers, tokenizer_of
from ndp.store.remote import RemoteDataset, RemoteShard
from ndp.store.shard import Shard


#: bytes of a file that is no shard quoted in the error, to show what it is (JSONL, CSV, ...)
_PREVIEW = 16


def no_data(shard: Shard, index: Index | LazyIndex) -> tuple[str, str] | None:
    """Why ``shard`` holds nothing a reader can use, and what to do; None if it holds packets
    (damaged ones too: they are dropped and counted as they are decoded) or is a shard header
    alone (empty, not damaged).

    A file with no NDP shard header whose first bytes are no packet is not a shard (a JSONL, a
    CSV renamed), even where a scan finds a "packet" further on: text can hold a 0xAA byte
    followed by a matching CRC-16 by chance (about 1 in 65,536 per 0xAA byte, which UTF-8 has
    plenty of). A shard whose bytes after its header hold no valid packet is all damage. Reads
    nothing for a file that starts with a header or a packet (every shard a converter writes)."""
    head = shard.header
    has_magic = head.version is not None or head.problem is not None
    first = index.first_offset if isinstance(index, LazyIndex) else (
        int(index.entries["offset"][0]) if len(index) else -1)
    if not has_magic and first != 0:
        begins = bytes(shard.read(0, min(_PREVIEW, shard.size))) if shard.size else b""
        if not begins or begins[0] != SYNC:  # else a headerless stream, damaged at its start
            what = "an empty file" if not begins else (
                f"no shard header, and its first bytes ({begins!r}...) are no packet")
            return (f"{shard.path}: not an NDP shard: {what}",
                    f"ndp reads the shards 'ndp convert' writes: convert it with 'ndp convert "
                    f"{shard.path} OUT_DIR --tokenizer NAME' and read OUT_DIR")
    if len(index) == 0 and (shard.size > head.data_offset or head.problem):
        header = f"; {head.problem}" if head.problem else ""
        return (f"{shard.path}: holds no valid packet ({shard.size:,} bytes{header}): all of it "
                f"is damaged, and a shard with no packet is no dataset",
                f"'ndp verify {shard.path}' shows the damage; restore the shard, or convert its "
                f"source again with 'ndp convert'")
    return None


class Corpus:
    """Shards opened (read with pread, ``ndp.store.files``) with their indexes.

    Opening costs O(shards), whatever the number of packets: each index's header is read and
    checked against its shard, and its entries are read and checked when used, a bounded number at once
    (``ndp.store.lazy``); per-packet fields are read from them when asked
    (``corpus.tokens[packets]``: ``ndp.store.columns``). Packet counts come from the headers.

    ``paths``: a shard, a directory of shards, a list of them, or a dict naming groups of them
    (``{"code": "data/code/", "chat": ["a.ndp", "b.ndp"]}``) for mixing by group.
    ``on_stale`` is passed to ``load_index``: "rebuild" rescans a shard whose sidecar index
    does not match it (with a warning), "error" refuses it. ``verify`` says how an index is
    matched to its shard: "size" (the default: size and entries, no read of the data, so a
    training run does not read the whole data set before its first batch; the decoders check
    every packet's CRC anyway) or "full" (also the crc32 of every shard, one full read).
    A URL (``s3://bucket/prefix/``, any fsspec URL) is a remote dataset (``ndp.store.remote``)
    opened with ``storage_options``, ``cache_dir`` and ``cache_limit``; its shards are fetched
    into the cache as they are read (``will_read``/``advance`` say in which order).
    A directory must be a whole dataset by its manifest ``ndp.json`` (``ndp.store.manifest``: a
    ``ManifestError`` otherwise) unless ``manifest`` is "ignore"; a shard whose crc32 or
    packet count differs from its manifest entry was damaged after it was written: a warning,
    and its damaged packets are dropped and counted as they are decoded. A file that is not an
    NDP shard (a JSONL, a CSV renamed), a shard with no valid packet, and data with no packet
    at all are refused (``no_data``: a ``ShardFormatError``, a ``DataError``), since a reader
    would deliver nothing from them; ``manifest="ignore"`` reads them as they are, warned.
    """

    def __init__(self, paths: PathLike | Sequence[PathLike] | Mapping[str, Any], *,
                 on_stale: str = "rebuild", verify: str = "size", manifest: str = "check",
                 storage_options: dict | None = None, cache_dir: PathLike | None = None,
                 cache_limit: int | None = None):
        choice("on_stale", on_stale, ("rebuild", "error"))
        choice("verify", verify, ("size", "full"))
        choice("manifest", manifest, ("check", "ignore"))
        remote = {"storage_options": storage_options, "cache_dir": cache_dir,
                  "cache_limit": cache_limit}
        #: the remote datasets read (``ndp.store.remote.RemoteDataset``)
        self.remotes: list[RemoteDataset] = []
        sources: list[str] = []  # where each manifest was read, for messages
        if isinstance(paths, Mapping):
            self.groups = list(paths)
            grouped = [listed(paths[name], manifest=manifest, remote=remote,
                              datasets=self.remotes, sources=sources) for name in self.groups]
        else:
            self.groups = ["all"]
            grouped = [listed(paths, manifest=manifest, remote=remote, datasets=self.remotes,
                              sources=sources)]
        pairs = [pair for ps, _ in grouped for pair in ps]
        shard_group = [g for g, (ps, _) in enumerate(grouped) for _ in ps]
        #: the manifests of the directories read (``ndp.json``, as dicts)
        self.manifests = [m for _, ms in grouped for m in ms]
        check_tokenizers(self.manifests, sources)  # token ids of one vocabulary only
        #: the largest vocabulary size the manifests record (None if none does)
        sizes = [tokenizer_of(m).get("vocab_size") for m in self.manifests]
        self.vocab_size = max([v for v in sizes if isinstance(v, int) and v > 0], default=None)
        #: the padding id the manifests' tokenizer records (None if none does, or they differ)
        pads = {tokenizer_of(m).get("pad_token_id") for m in self.manifests} - {None}
        self.pad_token_id = pads.pop() if len(pads) == 1 else None
        if not pairs:
            raise ConfigError("no shards given")
        self.shards = [p if isinstance(p, Shard) else Shard(p) for p, _ in pairs]
        self.paths = [s.path for s in self.shards]
        for path, (_, entry), shard in zip(self.paths, pairs, self.shards):
            if entry is not None and shard.size != entry["bytes"]:
                raise ManifestError(
                    f"{path}: {shard.size:,} bytes where the dataset's manifest recorded "
                    f"{entry['bytes']:,}: the shard was cut, extended or replaced after the "
                    f"dataset was written (or is still being copied). Restore it or re-run the "
                    f"conversion")
        #: each shard's index: by its header alone until first used (``ndp.store.lazy``)
        self.indexes: list[Index | LazyIndex] = []
        #: the index entries held (``ndp.store.lazy.EntryCache``: bounded in bytes)
        self.entry_cache = EntryCache()
        #: (shard path, region) for every corrupt region a framing scan found while rebuilding a
        #: stale or missing index: damage the index no longer lists as packets (an index found
        #: wrong when first used adds its shard's then)
        self.corruption: list[tuple[Path, Corruption]] = []
        #: each index's entries digest once checked, held against the counts made from them
        #: (``ndp.store.digests``)
        self.index_digests = IndexDigests()
        #: per shard, the later pieces of split documents its index counts, and their runs
        #: for the indexes read whole at open (``ndp.store.pieces``)
        self.continued: list[int] = []
        self._pieces: dict[int, Pieces | None] = {}
        stamps = []  # which version of each index was opened (``index_stamp``)
        for s, (shard, (_, entry)) in enumerate(zip(self.shards, pairs)):
            def found(scan: ScanResult, path: Path = shard.path) -> None:
                self.corruption.extend((path, c) for c in scan.corrupt)

            index, scan = open_index(shard, on_stale=on_stale, verify=verify, found=found,
                                      cache=self.entry_cache)
            if entry is not None:  # the shard the manifest lists, or refused
                index, scan = as_listed(shard, entry, index, scan)
            self.indexes.append(index)
            if isinstance(index, LazyIndex):
                self.index_digests.add()
                self.continued.append(index.continued)
                stamps.append(index.stamp)
                index.on_checked = lambda digest, s=s: self.index_digests.checked(s, digest)
            else:  # held whole: checked now
                self.index_digests.add(entries_digest(index.entries))
                self._pieces[s] = pieces_of(index.entries)
                self.continued.append(0 if self._pieces[s] is None else self._pieces[s].packets)
                if scan is None:
                    st = os.stat(shard.index_path)
                    stamps.append((st.st_size, st.st_mtime_ns))
                else:  # the shard's own packets: named by the shard's bytes
                    stamps.append(("scan", index.shard_crc32, len(index)))
            if scan is not None:
                found(scan)
            _refuse(no_data(shard, index), manifest)
            shard.close()  # a rebuild scanned its mapping: read on with pread, files closed
        sizes = np.array([len(i) for i in self.indexes], np.int64)
        self.base = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.n_packets = int(self.base[-1])
        if not self.n_packets:  # shards of a header alone
            more = f" and {len(self.paths) - 1} more" if len(self.paths) > 1 else ""
            _refuse((f"{self.paths[0]}{more}: no packet in the data: nothing to read",
                     "convert data into it with 'ndp convert'"), manifest, DataError)
        #: per packet, by global packet number, gathered from the indexes when indexed
        #: (``corpus.tokens[packets]``; ``Column``): nothing per packet is held
        self.offsets = Column(self, "offset")
        self.src = Column(self, "src")
        #: each packet's frame in its file, as its index entry says: 6 + LEN + 2 bytes
        self.frame_bytes = Column(self, "frame_bytes")
        #: whether every entry was checked against its packet's header when loaded ("full");
        #: else ``check_headers`` checks the packets as they are decoded
        self.headers_checked = verify == "full"
        #: per shard, whether its index passed its first-use check (``settle``; made there)
        self._settled: np.ndarray | None = None
        self.tokens = Column(self, "tokens")
        #: group number of each global packet (``groups[g]`` names it)
        self.shard_group = np.asarray(shard_group, np.int64)
        self.group = Column(self, "group")
        #: what a resume state must have been made on (``fingerprint_of``), shard by shard
        self._marks = [f"{self.groups[group]}/{path.name}:{shard.size}:{index.shard_crc32}:"
                       f"{len(index)};".encode()
                       for group, path, shard, index in zip(shard_group, self.paths,
                                                            self.shards, self.indexes)]
        self.fingerprint = fingerprint_of(self._marks)
        #: which versions of the index files were opened (each sidecar's size and modification
        #: time; a scan's shard crc32), hashed: what a count made from them is keyed by beside
        #: the fingerprint (an index damaged or rebuilt in place is another version)
        self.index_stamp = hashlib.sha256(repr(stamps).encode()).hexdigest()[:16]
        self.index_stamps = stamps  #: each shard's (``ndp.store.clean``'s key)

    def __len__(self) -> int:
        return self.n_packets

    def shard_of(self, packets: np.ndarray) -> np.ndarray:
        """Shard number of each global packet number."""
        return np.searchsorted(self.base, packets, side="right") - 1

    def entries_at(self, packets: np.ndarray, shard_ids: np.ndarray | None = None
                   ) -> np.ndarray:
        """The index entries of ``packets`` (global numbers), every field in one gather
        (``ndp.store.columns.entries_at``); ``shard_ids``: their ``shard_of``, if known."""
        return entries_at(self, packets, shard_ids)

    def check_headers(self, packets: np.ndarray, data: np.ndarray | None = None,
                      at: np.ndarray | None = None, entries: np.ndarray | None = None) -> None:
        """``IndexMismatchError`` if a packet's header disagrees with its index entry (LEN,
        SRC, DST, TYP): what an index matched by size alone leaves to be checked when the
        packets are read. ``data``/``at``: the packets' bytes already read (host staging:
        packet ``k`` at ``data[at[k]:]``), else their headers are read from the files;
        ``entries``: the packets' entries, if the caller holds them. Nothing to do when the
        indexes were checked whole at load."""
        if self.headers_checked or packets.shape[0] == 0:
            return
        shard_ids = self.shard_of(packets)
        for s in np.unique(shard_ids).tolist():
            mine = shard_ids == s
            local = packets[mine] - self.base[s]
            check_headers(self.indexes[s].entries if entries is None else entries[mine],
                          local if entries is None else np.arange(local.shape[0]),
                          self.shards[s], where=self.shards[s].index_path, data=data,
                          at=None if at is None else at[mine],
                          numbers=None if entries is None else local)

    @property
    def digests(self) -> list[int | None]:
        """Each index's entries digest, once checked (``ndp.store.digests``)."""
        return self.index_digests.known

    def expect_digests(self, digests: list, differs: Any) -> None:
        """``IndexDigests.expect``: a count made from entries of ``digests`` is in use."""
        self.index_digests.expect(digests, differs)

    @property
    def has_pieces(self) -> bool:
        """Whether any shard holds a split document's later pieces (its index header says)."""
        return any(self.continued)

    def pieces(self, s: int) -> Pieces | None:
        """Shard ``s``'s runs of later pieces (``ndp.store.pieces``; its index checked first
        if it was not), or None if it has none."""
        if not self.continued[s]:
            return None
        if s in self._pieces:
            return self._pieces[s]
        index = self.indexes[s]
        if not index.loaded:
            index.entries  # noqa: B018 - the first-use check finds them
        return index.pieces

    def settle(self, packets: np.ndarray) -> bool:
        """Make the first-use check of the indexes of ``packets``' shards that were not checked
        yet, and hold their entries for the chunk that reads them next (a GPU's stage copies
        them whole): an index that fails it is rescanned, with a warning, or refused
        (``IndexMismatchError``). Whether any was checked now."""
        settled = self._settled
        if settled is None:
            settled = self._settled = np.array(
                [getattr(index, "loaded", True) for index in self.indexes], bool)
        if settled.all():  # every index checked: nothing to do (a steady loop's case)
            return False
        checked = False
        shards = np.unique(self.shard_of(packets))
        for s in shards[~settled[shards]].tolist():
            index = self.indexes[s]
            if not getattr(index, "loaded", True):
                index.entries  # noqa: B018 - read whole, checked, and held (within the
                # entry cache's budget): the chunk's stage reads them next (a GPU's copy, whole)
                checked = True
            settled[s] = True
        return checked

    def will_read(self, share: Any, pos: int, end: int | None = None) -> None:
        """A reader will read the packets ``share[:end]`` in order, from position ``pos`` on:
        remote datasets fetch their shards in that order (``ndp.store.prefetch``). Nothing for
        local shards (``share`` is not read)."""
        if not self.remotes:
            return
        from ndp.store.prefetch import Prefetcher

        share = np.asarray(share[:end])
        shard_ids = self.shard_of(share)
        n = len(self.shards)
        first = np.full(n, -1, np.int64)
        last = np.full(n, -1, np.int64)
        seen, at = np.unique(shard_ids, return_index=True)
        first[seen] = at
        seen, at = np.unique(shard_ids[::-1], return_index=True)
        last[seen] = share.shape[0] - 1 - at
        lo = 0
        for dataset in self.remotes:  # its shards are consecutive in the corpus
            while not (isinstance(self.shards[lo], RemoteShard)
                       and self.shards[lo].dataset is dataset):
                lo += 1
            hi = lo + len(dataset.shards)
            if dataset.prefetcher is None:
                dataset.prefetcher = Prefetcher(dataset)
            dataset.prefetcher.plan(first[lo:hi], last[lo:hi], pos)
            lo = hi

    def advance(self, pos: int) -> None:
        """The reader of ``will_read`` is at position ``pos``."""
        for dataset in self.remotes:
            if dataset.prefetcher is not None:
                dataset.prefetcher.advance(pos)

    def close(self) -> None:
        """Close every shard's file (a new read opens it again) and stop remote datasets'
        prefetching."""
        for shard in self.shards:
            shard.close()
        for dataset in self.remotes:
            dataset.close()

    def __repr__(self) -> str:
        return f"Corpus({len(self.shards)} shards, {self.n_packets} packets)"


def as_listed(shard: Shard, entry: dict, index: Index | LazyIndex, scan: ScanResult | None
              ) -> tuple[Index | LazyIndex, ScanResult | None]:
    """``shard``'s index and scan as opened, if its index records the crc32 and packet count
    of its manifest ``entry``; else what the shard's bytes are now says (a full read of this
    shard only, a rare path): the dataset's own bytes beside a stale index (rescanned, with a
    warning), or bytes changed since (``check_identity``: damage is read for its sound
    packets and counted, another shard of valid packets is refused)."""
    if index.shard_crc32 == entry["crc32"] and len(index) == entry.get("packets", len(index)):
        return index, scan
    if scan is None:
        if shard.crc32() == entry["crc32"]:
            warnings.warn(f"{shard.index_path}: made for other bytes than {shard.path} holds, "
                          f"which are the dataset's (its manifest's crc32): a stale index; "
                          f"scanning the shard instead", stacklevel=past_aliases(5))
            scan = scan_shard(shard)
            return Index(scan.entries, shard.size, entry["crc32"], shard.header.data_offset), \
                scan
        scan = scan_shard(shard)  # the shard changed: its damage, if that is what it is
    check_identity(shard.path, entry, index.shard_crc32, len(index), scan,
                   stacklevel=past_aliases(5))
    return index, scan


def _refuse(problem: tuple[str, str] | None, manifest: str, error: type = ShardFormatError
            ) -> None:
    """Raise ``error`` for ``problem`` (what, and what to do), from ``no_data``; with
    ``manifest="ignore"`` (shards read as they are, on purpose) warn instead."""
    if problem is None:
        return
    what, hint = problem
    if manifest != "ignore":
        raise error(f"{what}. {hint} (or pass `manifest='ignore'` to read such files as they "
                    f"are, on purpose)")
    warnings.warn(f"{what}; read as it is (`manifest='ignore'`)", stacklevel=past_aliases(4))
