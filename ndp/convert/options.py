"""The converter's options and summary, and the checks on a finished run (``ndp.convert``)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

from ndp.convert.records import SCHEMAS
from ndp.errors import ConvertError
from ndp.format import Dst, Src

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


def check_skipped(summary: ConvertSummary, records: int, opts: ConvertOptions, *,
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


def warn_truncation(summary: ConvertSummary, opts: ConvertOptions) -> None:
    """Say loudly when truncation cut a real share of the tokens, and what keeps them."""
    cut = summary.truncated_tokens
    share = cut / max(cut + summary.tokens, 1)
    if share > TRUNCATION_WARN:
        log.warning(
            "truncation cut %.1f%% of the tokens (%s tokens of %s examples longer than "
            "--max-tokens %d): --overflow split keeps them (documents continue in further "
            "packets, for pretraining), or raise --max-tokens",
            100 * share, f"{cut:,}", f"{summary.truncated:,}", opts.max_tokens)


def manifest_extra(summary: ConvertSummary, info, opts: ConvertOptions) -> dict:
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
