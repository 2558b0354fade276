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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ndp.convert.export_paths import destinations
from ndp.convert.export_tokens import Measure, checked_packets, token_blocks
from ndp.store.atomic import AtomicFile, fsync_dir
from ndp.convert.tokenfiles import (
    LLMC_HEADER_WORDS,
    LLMC_MAGIC,
    LLMC_NDP_WORD,
    llmc_default_documents,
    llmc_document_words,
)
from ndp.errors import ConfigError, PacketError
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
    #: with ``shard_tokens``, where files end: "documents" (between documents, as the rule
    #: above cuts them) or "packets" (between packets: the rule is not known, or "none")
    files_cut: str | None = None
    oversized_files: int = 0  # files over ``shard_tokens``: each one document (packet) longer
    seconds: float = 0.0

    def describe(self) -> str:
        return (
            f"{len(self.files)} llm.c version {self.version} file(s): tokens {self.tokens:,}  "
            f"from packets {self.packets:,} (masked {self.masked_packets:,}, "
            f"without tokens skipped {self.skipped_packets:,})  [{self.seconds:.1f} s]\n"
            f"{self._documents()}{self._files()}"
        )

    def _files(self) -> str:
        if self.files_cut is None:
            return ""
        unit = "document" if self.files_cut == "documents" else "packet"
        over = (f"; {self.oversized_files} file(s) hold more tokens than asked for: each is one "
                f"{unit} longer than that, kept whole" if self.oversized_files else "")
        if self.files_cut == "documents":
            return f"\nfiles end between documents: each holds whole documents{over}"
        return ("\nfiles end between packets (the documents are not cut at a known EOS id): a "
                "document that continues over several packets may straddle two files" + over)

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
    ``shard_tokens`` one file ``output`` is written; with it, numbered files named
    ``<output minus .bin>_000000.bin``, ``_000001.bin``, ... of at most ``shard_tokens`` tokens
    that hold whole documents (``_file_counts``: a document never straddles two files, so
    ``ndp convert`` of the files gives the dataset's documents back); a file holds more only
    when it is one document longer than ``shard_tokens`` (counted: ``oversized_files``).

    Destinations (``ndp.convert.export_paths``): a new path, or a file an earlier export wrote
    (an llm.c token file) with ``overwrite`` (which also removes stale numbered files of that
    export); anything else is a ``ConfigError`` before a byte is written: a device, FIFO,
    socket or directory, a file that is not an llm.c token file, and any path that is (or
    links to) one of the dataset's own shards, indexes or manifests. A dataset URL is read
    through the shard cache (``ndp.store.remote``: ``storage_options``, ``cache_dir``).
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
        out = Path(output)
        destinations(out, [], corpus, overwrite=overwrite)  # refused before a dataset is read
        rule = _document_rule(data, corpus.manifests)
        eos, split = rule if rule is not None else (None, None)
        by_eos = eos is not None and split in ("before", "after")
        measure = Measure(eos if by_eos else None, split)
        shards = [(s, *checked_packets(s, i, measure))
                  for s, i in zip(corpus.shards, corpus.indexes)]
        total, max_id, masked = measure.total, measure.max_id, measure.masked
        if version == "auto":
            version = 1 if max_id < 1 << 16 else 2
        if version == 1 and max_id >= 1 << 16:
            raise ConfigError(f"token id {max_id} does not fit llm.c version 1 (uint16); "
                              "export as llm.c version 2 (`version=2`, uint32)")
        paths, counts, oversized = _plan(out, total, shard_tokens, measure.bounds())
        stale = destinations(out, paths, corpus, overwrite=overwrite)
        out.parent.mkdir(parents=True, exist_ok=True)
        for path in stale:
            path.unlink()
        summary = ExportSummary(files=[str(p) for p in paths], version=version, tokens=total,
                                masked_packets=masked,
                                skipped_packets=sum(s[2] for s in shards),
                                files_cut=None if shard_tokens is None else
                                "documents" if by_eos else "packets",
                                oversized_files=oversized)
        words = None
        if rule is not None:
            summary.eos_token_id, summary.split = rule
            summary.recorded = rule != llmc_default_documents(version)
            words = llmc_document_words(*rule) if summary.recorded else None
        if masked:
            log.warning("%d packet(s) carry a loss mask; llm.c files cannot hold one, so their "
                        "tokens are exported whole and the mask is dropped", masked)
        if oversized:
            log.warning("%d file(s) hold more than `shard_tokens=%d` tokens: each is one %s "
                        "longer than that, kept whole", oversized, shard_tokens,
                        "document" if by_eos else "packet")
        writer = _LlmcWriter(paths, counts, version, words)
        try:
            with progress_bar(total=total, unit="tok", unit_scale=True, desc="export",
                              enabled=progress) as bar:
                for shard, entries, _ in shards:
                    for tokens, per_packet, _ in token_blocks(shard, entries):
                        writer.write(tokens)
                        summary.packets += per_packet.shape[0]
                        bar.update(tokens.shape[0])
            writer.close()
        except BaseException:
            writer.abort()
            raise
    finally:
        corpus.close()
    summary.seconds = time.perf_counter() - started
    return summary


def _plan(out: Path, total: int, shard_tokens: int | None, bounds: np.ndarray
          ) -> tuple[list[Path], list[int], int]:
    """The files to write (paths, token counts) and how many hold more than ``shard_tokens``.

    Each file takes as many whole documents (``bounds``) as fit in ``shard_tokens``; a
    document longer than that is a file of its own, longer than ``shard_tokens``: splitting it
    would make two documents of it when the files are converted back (ndp convert cuts each
    file apart, as llm.c's readers read it)."""
    if shard_tokens is None:
        return [out], [total], 0
    counts, oversized, at = [], 0, 0
    while at < total:
        end = int(bounds[np.searchsorted(bounds, at + shard_tokens, side="right") - 1])
        if end <= at:  # no document ends within shard_tokens: one longer than a file
            end = int(bounds[np.searchsorted(bounds, at, side="right")])
            oversized += 1
        counts.append(end - at)
        at = end
    counts = counts or [0]  # no tokens: one empty file, as llm.c writes one
    stem = out.name[:-4] if out.name.endswith(".bin") else out.name
    paths = [out.with_name(f"{stem}_{i:06d}.bin") for i in range(len(counts))]
    return paths, counts, oversized
