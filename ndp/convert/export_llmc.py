"""Out to llm.c: an ndp dataset written back as llm.c token shards (``ndp export``).

The llm.c format is specified in ``ndp.convert.tokenfiles``. The header also records where the
dataset's documents are cut (its EOS id and split rule, from its manifest) when that is not
what ``ndp convert`` assumes for a plain llm.c file, so that converting the export gives the
documents back; llm.c's readers ignore those words.
"""


from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ndp.store.atomic import AtomicFile, fsync_dir
from ndp.convert.tokenfiles import (
    LLMC_HEADER_WORDS,
    LLMC_MAGIC,
    LLMC_NDP_WORD,
    llmc_default_documents,
    llmc_document_words,
)
from ndp.errors import ConfigError, PacketError
from ndp.wire.format import (
    FRAME_BYTES,
    HEADER_BYTES,
    MASK_COUNT_BYTES,
    MASKED_TYPES,
    TOKEN_WIDTH,
    DropReason,
)
from ndp.progress import progress_bar

log = logging.getLogger("ndp.convert")


@dataclass
class ExportSummary:
    """What an export to llm.c did."""

    files: list[str]
    version: int
    tokens: int = 0
    packets: int = 0
    masked_packets: int = 0  # exported whole: llm.c files cannot hold a loss mask
    skipped_packets: int = 0  # valid packets without tokens (FLOAT16, BFLOAT16, reserved TYPs)
    #: where the documents are cut: the EOS id and the split rule (before, after, none), from
    #: the datasets' manifests; None when they do not say (shards named without their manifest)
    eos_token_id: int | None = None
    split: str | None = None
    recorded: bool = False  # written in the header (words 253-255): not llm.c's default
    seconds: float = 0.0

    def describe(self) -> str:
        return (
            f"{len(self.files)} llm.c version {self.version} file(s): tokens {self.tokens:,}  "
            f"from packets {self.packets:,} (masked {self.masked_packets:,}, "
            f"without tokens skipped {self.skipped_packets:,})  [{self.seconds:.1f} s]\n"
            f"{self._documents()}"
        )

    def _documents(self) -> str:
        if self.split is None:
            return ("documents: not recorded (shards named without their dataset's ndp.json, "
                    "or datasets cut by different rules); 'ndp convert' of the export cuts it "
                    "as a plain llm.c file unless --eos-id / --split say where")
        rule = {"after": f"end with EOS id {self.eos_token_id}",
                "before": f"start at EOS id {self.eos_token_id}",
                "none": "one stream, not cut"}[self.split]
        where = ("recorded in the header, so 'ndp convert' of the export cuts them there again"
                 if self.recorded else "llm.c's default, so the header stays llm.c's own")
        return f"documents {rule} ({where})"


_BIG_ENDIAN = {2: ">u2", 4: ">u4"}


def _token_packets(shard, index) -> tuple[np.ndarray, int]:
    """Index entries of ``shard``'s token packets, after validating every packet: a corrupt one
    raises ``PacketError`` naming the shard and byte offset. Also the count of valid packets
    that carry no tokens."""
    from ndp.engine.reference import validate

    offsets = index.offsets
    ends = offsets + FRAME_BYTES + index.entries["length"].astype(np.int64)
    starts = np.concatenate([[index.data_offset], ends]).astype(np.int64)
    gaps = np.flatnonzero(np.append(offsets, shard.size) != starts)
    if gaps.size:  # bytes no packet covers: damage a rebuilt index steps over
        k = int(gaps[0])
        end = int(offsets[k]) if k < offsets.shape[0] else shard.size
        raise PacketError(
            f"{shard.path}: bytes {int(starts[k])}..{end} hold no valid packet (the index steps "
            "over them); an export would lose their tokens. Run 'ndp verify "
            f"{shard.path}' and re-convert the shard from its source."
        )
    status = validate(shard.data, offsets)
    bad = np.flatnonzero(~np.isin(status, (DropReason.OK, DropReason.NOT_TOKENS,
                                           DropReason.UNKNOWN_TYPE)))
    if bad.size:
        k = int(bad[0])
        raise PacketError(
            f"{shard.path}: packet at byte {int(offsets[k])} is corrupt "
            f"({DropReason(int(status[k])).name}); {bad.size} corrupt packet(s) in this shard. "
            f"An export would silently lose their tokens: run 'ndp verify {shard.path}' and "
            "re-convert the shard from its source."
        )
    ok = status == DropReason.OK
    return index.entries[ok], int(status.shape[0] - ok.sum())


def _packet_tokens(data: np.ndarray, entries: np.ndarray) -> Iterator[tuple[np.ndarray, bool]]:
    """Each token packet's tokens (a big-endian view of the shard) and whether it is masked."""
    for off, length, typ in zip(entries["offset"].tolist(), entries["length"].tolist(),
                                entries["typ"].tolist()):
        width = TOKEN_WIDTH[typ]
        start = off + HEADER_BYTES
        masked = typ in MASKED_TYPES
        if masked:
            n = (int(data[start]) << 8) | int(data[start + 1])
            start += MASK_COUNT_BYTES
        else:
            n = length // width
        yield data[start: start + n * width].view(_BIG_ENDIAN[width]), masked


class _LlmcWriter:
    """Writes a known number of tokens into llm.c files of known sizes, each atomically."""

    def __init__(self, paths: list[Path], counts: list[int], version: int,
                 documents: np.ndarray | None = None) -> None:
        self.paths, self.counts, self.version = paths, counts, version
        self.documents = documents  # header words 253-255, or None (left 0)
        self.dtype = "<u2" if version == 1 else "<u4"
        self.done: list[Path] = []
        self._file = None
        self._left = 0

    def _next(self) -> None:
        path = self.paths[len(self.done)]
        count = self.counts[len(self.done)]
        header = np.zeros(LLMC_HEADER_WORDS, "<i4")
        header[:3] = (LLMC_MAGIC, self.version, count)
        if self.documents is not None:
            header[LLMC_NDP_WORD:] = self.documents
        self._file = AtomicFile(path)
        self._file.file.write(header.tobytes())
        self._left = count

    def _finish(self) -> None:
        out, self._file = self._file, None
        self.done.append(out.commit(sync_dir=False))  # nothing half-written is left behind

    def write(self, tokens: np.ndarray) -> None:
        while tokens.shape[0]:
            if self._file is None:
                self._next()
            take = min(self._left, tokens.shape[0])
            self._file.file.write(tokens[:take].astype(self.dtype).tobytes())
            self._left -= take
            tokens = tokens[take:]
            if self._left == 0:
                self._finish()

    def close(self) -> None:
        while len(self.done) < len(self.paths):  # only empty files can be left (no tokens)
            assert self._file is None or self._left == 0
            if self._file is None:
                self._next()
            self._finish()
        for directory in {p.parent for p in self.paths}:
            fsync_dir(directory)

    def abort(self) -> None:
        if self._file is not None:
            self._file.abort()
            self._file = None


def _manifest_documents(manifest: dict) -> tuple[int | None, str] | None:
    """(EOS id, split rule) a dataset's documents are cut by, as its manifest says."""
    source = manifest.get("source") or {}
    if source.get("kind") == "token_files":  # the rule each token file was cut by
        rules = {(f.get("eos_token_id"), f.get("split")) for f in source.get("files", [])}
        eos, split = rules.pop() if len(rules) == 1 else (None, None)
    else:  # converted records: the converter appends EOS to every example
        eos = (manifest.get("tokenizer") or {}).get("eos_token_id")
        split = "after"
    if split == "none":
        return None, "none"
    return (eos, split) if isinstance(eos, int) and split in ("before", "after") else None


def _document_rule(data, manifests: list[dict]) -> tuple[int | None, str] | None:
    """The document rule of every dataset in ``data``, or None if one is not known (a shard
    named directly, without its manifest) or they differ."""
    from ndp.store.remote import is_url

    items = [data] if isinstance(data, (str, os.PathLike)) else list(data)
    if any(not is_url(i) and not Path(i).is_dir() for i in items) or \
            len(manifests) != len(items):
        return None
    rules = {_manifest_documents(m) for m in manifests}
    return rules.pop() if len(rules) == 1 else None


def export_llmc(
    data: str | os.PathLike | Sequence[str | os.PathLike],
    output: str | os.PathLike,
    *,
    version: int | str = "auto",
    shard_tokens: int | None = None,
    overwrite: bool = False,
    progress: bool = False,
    storage_options: dict | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> ExportSummary:
    """Write the tokens of an NDP dataset (a directory of shards, or shards) as llm.c files.

    Packets are read in corpus order (shards sorted by name) and all validated first.
    ``version``: 1 (uint16), 2 (uint32) or ``"auto"`` (1 when every id fits). Without
    ``shard_tokens`` one file ``output`` is written; with it, files of that many tokens (the
    last one shorter) named ``<output minus .bin>_000000.bin``, ``_000001.bin``, ...
    Existing files of those names, or numbered files of an earlier export beside them, are an
    error unless ``overwrite`` (which also removes such stale numbered files). A dataset URL
    is read through the shard cache (``ndp.store.remote``: ``storage_options``, ``cache_dir``).
    """
    from ndp.store.corpus import Corpus

    if version not in ("auto", 1, 2):
        raise ConfigError(f"llm.c `version` must be 'auto', 1 or 2, got {version!r}")
    if shard_tokens is not None and shard_tokens < 1:
        raise ConfigError(f"`shard_tokens` must be >= 1 (tokens per file), got {shard_tokens}")
    started = time.perf_counter()
    corpus = Corpus(data, verify="full", storage_options=storage_options, cache_dir=cache_dir)
    try:
        if corpus.corruption:
            path, c = corpus.corruption[0]
            raise PacketError(
                f"{path}: {c.describe()}, not a packet the index lists; an export would lose "
                f"its tokens. Run 'ndp verify {path}' and re-convert the shard from its source."
            )
        shards = [(s, *_token_packets(s, i)) for s, i in zip(corpus.shards, corpus.indexes)]
        max_id, total, masked = -1, 0, 0
        for shard, entries, _ in shards:
            for tokens, is_masked in _packet_tokens(shard.data, entries):
                total += tokens.shape[0]
                masked += is_masked
                if tokens.dtype.itemsize == 4 and tokens.shape[0]:
                    max_id = max(max_id, int(tokens.max()))
        if version == "auto":
            version = 1 if max_id < 1 << 16 else 2
        if version == 1 and max_id >= 1 << 16:
            raise ConfigError(f"token id {max_id} does not fit llm.c version 1 (uint16); "
                              "export as llm.c version 2 (`version=2`, uint32)")
        out = Path(output)
        if out.is_dir():
            raise ConfigError(f"{out} is a directory; the output is a file name (for example "
                              f"{out / 'train.bin'})")
        out.parent.mkdir(parents=True, exist_ok=True)
        if shard_tokens is None:
            paths, counts = [out], [total]
        else:
            stem = out.name[:-4] if out.name.endswith(".bin") else out.name
            n_files = max(1, -(-total // shard_tokens))
            paths = [out.with_name(f"{stem}_{i:06d}.bin") for i in range(n_files)]
            counts = [min(shard_tokens, total - i * shard_tokens) for i in range(n_files)]
        stem = out.name[:-4] if out.name.endswith(".bin") else out.name
        stale = sorted(set(out.parent.glob(f"{stem}_[0-9][0-9][0-9][0-9][0-9][0-9].bin"))
                       | ({out} if out.exists() else set()))
        if stale and not overwrite:
            raise ConfigError(f"{stale[0]} exists ({len(stale)} file(s) of an earlier export); "
                              f"pass `overwrite=True` or choose another output")
        for path in stale:
            if path not in paths:
                path.unlink()
        summary = ExportSummary(files=[str(p) for p in paths], version=version, tokens=total,
                                masked_packets=masked,
                                skipped_packets=sum(s[2] for s in shards))
        rule = _document_rule(data, corpus.manifests)
        words = None
        if rule is not None:
            summary.eos_token_id, summary.split = rule
            summary.recorded = rule != llmc_default_documents(version)
            words = llmc_document_words(*rule) if summary.recorded else None
        if masked:
            log.warning("%d packet(s) carry a loss mask; llm.c files cannot hold one, so their "
                        "tokens are exported whole and the mask is dropped", masked)
        writer = _LlmcWriter(paths, counts, version, words)
        try:
            with progress_bar(total=total, unit="tok", unit_scale=True, desc="export",
                              enabled=progress) as bar:
                for shard, entries, _ in shards:
                    for tokens, _ in _packet_tokens(shard.data, entries):
                        writer.write(tokens)
                        summary.packets += 1
                        bar.update(tokens.shape[0])
            writer.close()
        except BaseException:
            writer.abort()
            raise
    finally:
        corpus.close()
    summary.seconds = time.perf_counter() - started
    return summary
