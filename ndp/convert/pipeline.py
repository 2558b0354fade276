"""The converter: input files -> tokenized examples -> packets -> shards with indexes.

Records are read in order, tokenized in batches (the fast tokenizer encodes a batch on every
core), cut to ``max_tokens`` (truncate or split, see ``ndp.format``) and written as packets by
an atomic ``ShardWriter``. A bad record is skipped and counted under its reason (default) or
stops the run (``strict``, which also refuses fields no schema has instead of ignoring them).
A run that would write no example, or skip more than ``max_skipped`` of its records, raises
``ConvertError`` and commits nothing; one whose truncation cuts more than ``TRUNCATION_WARN``
of the tokens says so loudly, with the options that keep them. The dataset is built beside ``output`` and swapped in whole once
its manifest ``ndp.json`` (the commit record, ``ndp.manifest``) is written: a run killed at any
moment leaves ``output`` as it was (nothing, or the old dataset when overwriting), never part
of a dataset. An output URL (``s3://bucket/prefix/``) gets each shard uploaded as it is
finished and the manifest last (``ndp.upload``).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ndp.convert.records import KNOWN_FIELDS, SCHEMAS, Example, to_example
from ndp.convert.sources import expand_inputs, input_size, read_inputs
from ndp.convert.tokenizer import (
    chat_renderer,
    load_tokenizer,
    tokenize_examples,
    tokenizer_info,
)
from ndp.errors import ConfigError, ConvertError, RecordError
from ndp.format import Dst, Src, max_tokens_per_packet, token_typ
from ndp.packet import encode_tokens
from ndp.progress import progress_bar
from ndp.remote import is_url
from ndp.shard import ShardWriter
from ndp.upload import dataset_output

log = logging.getLogger("ndp.convert")
OVERFLOW_RULES = ("truncate", "split")
#: share of the tokens that truncation may cut before the converter warns loudly
TRUNCATION_WARN = 0.01
#: records read before a run that has skipped nearly all of them is stopped early
EARLY_CHECK = 1000
SCHEMA_FIELDS = frozenset().union(*(req | opt for req, opt in SCHEMAS.values()))


@dataclass(frozen=True)
class ConvertOptions:
    """How to convert. ``token_width`` 0 picks 2 bytes when the vocabulary fits, else 4."""

    max_tokens: int = 2048
    overflow: str = "truncate"
    src: Src = Src.TEXT_CORPUS
    dst: Dst = Dst.EMBEDDING
    token_width: int = 0
    strict: bool = False
    batch_size: int = 512
    max_shard_bytes: int = 256 << 20
    text_unit: str = "file"
    eos_token_id: int | None = None
    overwrite: bool = False
    progress: bool = True
    #: columns read as schema fields, e.g. {"text": "content"} (``ndp.convert.records``)
    fields: dict[str, str] = field(default_factory=dict)
    #: the share of records that may be skipped as bad before the run fails (0.01: 1%)
    max_skipped: float = 0.01
    #: the split of a save_to_disk DatasetDict or of an ``hf:`` dataset
    hf_split: str = "train"
    #: fsspec's options for an output URL (``ndp.upload``)
    storage_options: dict | None = None


@dataclass
class ConvertSummary:
    """What a conversion did."""

    output: str
    tokenizer: str
    token_width: int
    examples: int = 0
    packets: int = 0
    tokens: int = 0
    truncated: int = 0  # examples cut to max_tokens
    truncated_tokens: int = 0
    split: int = 0  # examples written as several packets
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> records
    ignored_fields: list[str] = field(default_factory=list)  # columns no schema reads
    shards: list[str] = field(default_factory=list)
    bytes: int = 0
    input_bytes: int = 0
    seconds: float = 0.0

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    def describe(self) -> str:
        rate = self.tokens / self.seconds if self.seconds else 0.0
        skipped = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped.items())) or "none"
        return (
            f"examples {self.examples:,}  packets {self.packets:,}  tokens {self.tokens:,}\n"
            f"truncated {self.truncated:,} ({self.truncated_tokens:,} tokens)  "
            f"split {self.split:,}  skipped {self.skipped_total:,} ({skipped})\n"
            + (f"ignored columns: {', '.join(self.ignored_fields)}\n"
               if self.ignored_fields else "") +
            f"{len(self.shards)} shard(s), {self.bytes / 1e6:.1f} MB in {self.output}  "
            f"[{self.seconds:.1f} s, {rate / 1e6:.2f} M tokens/s, "
            f"{self.input_bytes / 1e6 / max(self.seconds, 1e-9):.1f} MB/s of input]"
        )


def convert(
    inputs: list[str | os.PathLike],
    output: str | os.PathLike,
    *,
    tokenizer: str,
    options: ConvertOptions = ConvertOptions(),
) -> ConvertSummary:
    """Convert ``inputs`` (JSONL, Parquet, text files or directories) into shards in ``output``.

    ``tokenizer`` is a local Hugging Face tokenizer directory or a cached name. Raises
    ``RecordError`` on the first bad record when ``options.strict``; otherwise bad records are
    logged (``ndp.convert`` logger) and counted in ``summary.skipped``.
    """
    opts = options
    if opts.overflow not in OVERFLOW_RULES:
        raise ConfigError(f"overflow must be one of {OVERFLOW_RULES}, got {opts.overflow!r}")
    if opts.batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {opts.batch_size}")
    if not 0.0 <= opts.max_skipped <= 1.0:
        raise ConfigError(f"max_skipped is a share of the records, 0..1; got {opts.max_skipped}")
    for name in opts.fields:
        if name not in SCHEMA_FIELDS:
            raise ConfigError(f"fields name {name!r}, which no record schema has; schema fields "
                              f"are {sorted(SCHEMA_FIELDS)}")
    files = expand_inputs(list(inputs))
    tok = load_tokenizer(tokenizer)
    info = tokenizer_info(tok, tokenizer, eos_token_id=opts.eos_token_id)
    width = opts.token_width or (2 if info.vocab_size <= 1 << 16 else 4)
    if width not in (2, 4):
        raise ConfigError(f"token width must be 0 (auto), 2 or 4 bytes, got {opts.token_width}")
    if width == 2 and info.vocab_size > 1 << 16:
        raise ConfigError(f"vocabulary of {info.vocab_size} ids does not fit 2-byte tokens; use 4")
    capacity = max_tokens_per_packet(token_typ(width=width, masked=False))
    masked_capacity = max_tokens_per_packet(token_typ(width=width, masked=True))
    if not 1 <= opts.max_tokens <= capacity:
        raise ConfigError(
            f"--max-tokens must be 1..{capacity} for {width}-byte tokens (one packet's LEN is "
            f"16 bits; {masked_capacity} for examples with a loss mask, such as chat); with "
            f"--overflow split, longer documents continue in further packets"
        )
    # an example with a loss mask (chat, prompt/completion) also carries its mask bits
    limits = {False: opts.max_tokens, True: min(opts.max_tokens, masked_capacity)}
    out_name = str(output).rstrip("/") if is_url(output) else str(Path(output))
    render = chat_renderer(tok)
    summary = ConvertSummary(output=out_name, tokenizer=tokenizer, token_width=width)
    started = time.perf_counter()
    total_bytes = sum(input_size(f) for f in files)
    known = KNOWN_FIELDS | set(opts.fields.values())
    ignored: set[str] = set()
    records = 0
    bar = progress_bar(total=total_bytes, unit="B", unit_scale=True, desc="convert",
                       enabled=opts.progress)

    def skip(err: RecordError) -> None:
        if opts.strict:
            raise err
        summary.skipped[err.kind] = summary.skipped.get(err.kind, 0) + 1
        if summary.skipped_total <= 20:
            log.warning("skipped %s", err)
        elif summary.skipped_total == 21:
            log.warning("more records skipped; the summary counts them all")

    def flush(batch: list[Example], writer: ShardWriter) -> None:
        for example, (ids, mask) in zip(batch, tokenize_examples(tok, batch, info.eos_token_id)):
            if int(ids.max()) >= 1 << (8 * width):
                skip(RecordError(example.where, f"token id {int(ids.max())} does not fit "
                                 f"{width}-byte tokens", kind="token_range"))
                continue
            n = ids.shape[0]
            most = limits[mask is not None]
            summary.examples += 1
            if n > most and opts.overflow == "truncate":
                summary.truncated += 1
                summary.truncated_tokens += n - most
                n = most
            elif n > most:
                summary.split += 1
            for lo in range(0, n, most):
                hi = min(n, lo + most)
                part = None if mask is None else mask[lo:hi]
                writer.write(encode_tokens(ids[lo:hi], width=width, mask=part,
                                           src=opts.src, dst=opts.dst))
                summary.packets += 1
                summary.tokens += hi - lo
        batch.clear()

    with dataset_output(output, overwrite=opts.overwrite,
                        storage_options=opts.storage_options) as (stage, on_finish, publish):
        writer = ShardWriter(stage, max_shard_bytes=opts.max_shard_bytes, on_finish=on_finish)
        with writer, bar:
            batch: list[Example] = []
            for where, record, nbytes in read_inputs(files, text_unit=opts.text_unit,
                                                     split=opts.hf_split):
                summary.input_bytes += nbytes
                bar.update(nbytes)
                if record is None:  # the end of a file: bytes only
                    continue
                records += 1
                if isinstance(record, dict) and not record.keys() <= known:
                    ignored.update(k for k in record.keys() - known if isinstance(k, str))
                try:
                    if isinstance(record, RecordError):
                        raise record
                    batch.append(to_example(record, where, render_chat=render,
                                            fields=opts.fields, strict=opts.strict))
                except RecordError as err:
                    skip(err)
                    if records == EARLY_CHECK and summary.skipped_total == records:
                        _check_skipped(summary, records, opts, early=True)
                    continue
                if len(batch) >= opts.batch_size:
                    flush(batch, writer)
            flush(batch, writer)
            summary.ignored_fields = sorted(ignored)
            _check_skipped(summary, records, opts, early=False)
            _warn_truncation(summary, opts)
            writer.finish()
            summary.shards = [f"{out_name}/{s.path.name}" for s in writer.finished]
            summary.bytes = sum(s.size for s in writer.finished)
            summary.seconds = time.perf_counter() - started
            publish(writer.commit(_manifest(summary, info, opts)))
    return summary


def _check_skipped(summary: ConvertSummary, records: int, opts: ConvertOptions, *,
                   early: bool) -> None:
    """``ConvertError`` when no example was written (or, ``early``, none of the first
    ``EARLY_CHECK`` records could be), or when more than ``max_skipped`` of the records were
    skipped."""
    skipped = summary.skipped_total
    top = max(summary.skipped.items(), key=lambda kv: kv[1])[0] if skipped else None
    hint = {
        "unknown_field": "a field no schema has (--strict refuses them; without it they are "
                         "ignored)",
        "no_schema": "records whose fields match no schema: name the columns that hold the "
                     "text or the chat with --text-field / --messages-field / --prompt-field / "
                     "--completion-field",
        "missing_field": "a column named with --*-field is missing",
        "bad_json": "lines that are not JSON",
    }.get(top, f"{top} (the log names the first records)")
    if early or summary.examples == 0:
        what = "none of the first" if early else "none of the"
        raise ConvertError(
            f"{what} {records:,} records could be converted (skipped: "
            f"{dict(sorted(summary.skipped.items()))}; mostly {hint}); nothing was written"
            if records else "the inputs hold no records; nothing was written")
    if skipped > opts.max_skipped * records:
        raise ConvertError(
            f"{skipped:,} of {records:,} records were skipped ({skipped / records:.1%}, more "
            f"than the {opts.max_skipped:.1%} allowed; mostly {hint}); nothing was written. "
            f"Fix the inputs or the options, or allow more with --max-skipped")


def _warn_truncation(summary: ConvertSummary, opts: ConvertOptions) -> None:
    """Say loudly when truncation cut a real share of the tokens, and what keeps them."""
    cut = summary.truncated_tokens
    share = cut / max(cut + summary.tokens, 1)
    if share > TRUNCATION_WARN:
        log.warning(
            "truncation cut %.1f%% of the tokens (%s tokens of %s examples longer than "
            "--max-tokens %d): --overflow split keeps them (documents continue in further "
            "packets, for pretraining), or raise --max-tokens",
            100 * share, f"{cut:,}", f"{summary.truncated:,}", opts.max_tokens)


def _manifest(summary: ConvertSummary, info, opts: ConvertOptions) -> dict:
    """What the manifest records besides the shards (``ShardWriter.commit`` adds them)."""
    return {
        "tokenizer": asdict(info),
        "token_width": summary.token_width,
        "max_tokens": opts.max_tokens,
        "overflow": opts.overflow,
        "src": opts.src.name,
        "dst": opts.dst.name,
        "fields": dict(opts.fields),
        "summary": {k: v for k, v in asdict(summary).items() if k not in ("shards",)},
    }
