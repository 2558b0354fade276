"""Records to packets: the converter's core, shared by the local run (``ndp.convert.pipeline``)
and Ray Data's tasks (``ndp.convert.ray_engine``), so both write the same packets.

Records are read in order (``ndp.convert.sources``), made examples by their schema
(``ndp.convert.records``), tokenized in batches (the fast tokenizer encodes a batch on every
core), cut to ``max_tokens`` (``overflow``: by default a plain-text document is split over
packets and an SFT example truncated, ``ndp.convert.options``) and written as packets to a
``ShardWriter``. A bad record is skipped and counted under its reason (default) or stops the run
(``strict``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ndp.convert.options import (
    EARLY_CHECK,
    OVERFLOW_RULES,
    SCHEMA_FIELDS,
    ConvertOptions,
    ConvertSummary,
    check_skipped,
    log,
    overflow_rule,
)
from ndp.convert.records import KNOWN_FIELDS, Example, to_example
from ndp.convert.sources import read_inputs
from ndp.convert.tokenizer import (STRADDLE, chat_renderer, load_tokenizer, tokenize_examples,
                                   tokenizer_info)
from ndp.errors import ConfigError, RecordError
from ndp.wire.format import max_tokens_per_packet, token_typ
from ndp.wire.packet import encode_tokens
from ndp.store.remote import is_url
from ndp.store.writer import ShardWriter


class PacketMaker:
    """Writes the packets of input files into a ``ShardWriter``, counting into ``summary``
    (``tokenizer``: a local Hugging Face tokenizer directory or a cached name)."""

    def __init__(self, tokenizer: str, opts: ConvertOptions, *, output: str | os.PathLike,
                 tok: Any = None) -> None:
        if opts.overflow not in OVERFLOW_RULES:
            raise ConfigError(f"`overflow` must be one of {OVERFLOW_RULES}, got "
                              f"{opts.overflow!r}")
        if opts.batch_size < 1:
            raise ConfigError(f"`batch_size` must be >= 1 (records per tokenizer call), got "
                              f"{opts.batch_size}")
        if not 0.0 <= opts.max_skipped <= 1.0:
            raise ConfigError(f"`max_skipped` is a share of the records, 0..1 (0.01: 1%); got "
                              f"{opts.max_skipped}")
        if opts.straddle not in STRADDLE:
            raise ConfigError(f"`straddle` must be one of {STRADDLE}, got {opts.straddle!r}")
        for name in opts.fields:
            if name not in SCHEMA_FIELDS:
                raise ConfigError(f"`fields` name {name!r}, which no record schema has; schema "
                                  f"fields are {sorted(SCHEMA_FIELDS)}")
        self.opts = opts
        self.tok = tok if tok is not None else load_tokenizer(tokenizer)
        self.info = tokenizer_info(self.tok, tokenizer, eos_token_id=opts.eos_token_id)
        width = opts.token_width or (2 if self.info.vocab_size <= 1 << 16 else 4)
        if width not in (2, 4):
            raise ConfigError(f"`token_width` must be 0 (auto), 2 or 4 bytes, got "
                              f"{opts.token_width}")
        if width == 2 and self.info.vocab_size > 1 << 16:
            raise ConfigError(f"vocabulary of {self.info.vocab_size} ids does not fit 2-byte "
                              f"tokens; use `token_width=4` (or 0: the width that fits)")
        capacity = max_tokens_per_packet(token_typ(width=width, masked=False))
        masked_capacity = max_tokens_per_packet(token_typ(width=width, masked=True))
        if not 1 <= opts.max_tokens <= capacity:
            raise ConfigError(
                f"`max_tokens` must be 1..{capacity} for {width}-byte tokens (one packet's LEN "
                f"is 16 bits; {masked_capacity} for examples with a loss mask, such as chat), "
                f"got {opts.max_tokens}; a longer document continues in further packets "
                f"(`overflow='split'`, which the default `overflow='auto'` applies to plain "
                f"text)")
        self.width = width
        # an example with a loss mask (chat, prompt/completion) also carries its mask bits
        self.limits = {False: opts.max_tokens, True: min(opts.max_tokens, masked_capacity)}
        self.render = chat_renderer(self.tok)
        out_name = str(output).rstrip("/") if is_url(output) else str(Path(output))
        self.summary = ConvertSummary(output=out_name, tokenizer=tokenizer, token_width=width,
                                      overflow=opts.overflow)
        self.known = KNOWN_FIELDS | set(opts.fields.values())
        self.ignored: set[str] = set()
        #: the first 20 records skipped, as logged (``file:line: why``)
        self.skip_log: list[str] = []

    def skip(self, err: RecordError) -> None:
        summary = self.summary
        if self.opts.strict:
            raise err
        summary.skipped[err.kind] = summary.skipped.get(err.kind, 0) + 1
        if summary.skipped_total <= 20:
            self.skip_log.append(str(err))
            log.warning("skipped %s", err)
        elif summary.skipped_total == 21:
            log.warning("more records skipped; the summary counts them all")

    def flush(self, batch: list[Example], writer: ShardWriter) -> None:
        opts, summary, width = self.opts, self.summary, self.width
        for example, (ids, mask, across) in zip(batch, tokenize_examples(
                self.tok, batch, self.info.eos_token_id, straddle=opts.straddle)):
            if int(ids.max()) >= 1 << (8 * width):
                self.skip(RecordError(example.where, f"token id {int(ids.max())} does not fit "
                                      f"{width}-byte tokens", kind="token_range"))
                continue
            n = ids.shape[0]
            most = self.limits[mask is not None]
            summary.examples += 1
            summary.straddled += across
            if n > most and overflow_rule(opts.overflow, example.schema) == "truncate":
                summary.truncated += 1
                summary.truncated_tokens += n - most
                n = most
            elif n > most:
                summary.split += 1
            for lo in range(0, n, most):  # a split document's later pieces say so
                hi = min(n, lo + most)
                part = None if mask is None else mask[lo:hi]
                writer.write(encode_tokens(ids[lo:hi], width=width, mask=part,
                                           src=opts.src, dst=opts.dst, continues=lo > 0))
                summary.packets += 1
                summary.tokens += hi - lo
        batch.clear()

    def run(self, files: list, writer: ShardWriter, *, bar: Any = None,
            early_check: bool = True) -> int:
        """Write every record of ``files`` in order; returns the records read. With
        ``early_check``, a run whose first ``EARLY_CHECK`` records were all skipped stops
        there (``ConvertError``)."""
        opts, summary = self.opts, self.summary
        records = 0
        batch: list[Example] = []
        for where, record, nbytes in read_inputs(files, text_unit=opts.text_unit,
                                                 split=opts.hf_split):
            summary.input_bytes += nbytes
            if bar is not None:
                bar.update(nbytes)
            if record is None:  # the end of a file: bytes only
                continue
            records += 1
            if isinstance(record, dict) and not record.keys() <= self.known:
                self.ignored.update(k for k in record.keys() - self.known if isinstance(k, str))
            try:
                if isinstance(record, RecordError):
                    raise record
                batch.append(to_example(record, where, render_chat=self.render,
                                        fields=opts.fields, strict=opts.strict))
            except RecordError as err:
                self.skip(err)
                if early_check and records == EARLY_CHECK and summary.skipped_total == records:
                    check_skipped(summary, records, opts, early=True)
                continue
            if len(batch) >= opts.batch_size:
                self.flush(batch, writer)
        self.flush(batch, writer)
        summary.ignored_fields = sorted(self.ignored)
        return records
