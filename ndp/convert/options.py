"""The converter's options and summary, and the checks on a finished run (``ndp.convert``)."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

from ndp.convert.records import SCHEMAS
from ndp.errors import ConvertError
from ndp.wire.format import Dst, Src

log = logging.getLogger("ndp.convert")
#: what happens to an example longer than ``max_tokens``: ``truncate`` keeps its first tokens,
#: ``split`` continues it in further packets (``ndp.wire.format``), ``auto`` (the default) splits
#: pretraining documents (the ``text`` schema: cutting them loses data, e.g. 10% of a
#: FineWeb-like Parquet at 2,048 tokens) and truncates SFT examples (chat, prompt/completion,
#: alpaca: a continuation packet would train on an answer without its prompt)
OVERFLOW_RULES = ("auto", "truncate", "split")
#: the schemas ``auto`` splits; it truncates the others
AUTO_SPLIT = frozenset({"text"})
#: share of the tokens that truncation may cut before the converter warns loudly
TRUNCATION_WARN = 0.01
#: records read before a run that has skipped nearly all of them is stopped early
EARLY_CHECK = 1000
SCHEMA_FIELDS = frozenset().union(*(req | opt for req, opt in SCHEMAS.values()))


def overflow_rule(overflow: str, schema: str) -> str:
    """``truncate`` or ``split``: what ``overflow`` (one of ``OVERFLOW_RULES``) does to a long
    example of ``schema`` (a key of ``ndp.convert.records.SCHEMAS``)."""
    if overflow != "auto":
        return overflow
    return "split" if schema in AUTO_SPLIT else "truncate"


def overflow_by_schema(overflow: str) -> dict[str, str]:
    """Each schema's rule under ``overflow``, as the manifest records it."""
    return {schema: overflow_rule(overflow, schema) for schema in SCHEMAS}


def describe_overflow(overflow: str) -> str:
    """``overflow`` in words: ``auto: text split, chat/prompt/alpaca truncated``."""
    by_rule: dict[str, list[str]] = {}
    for schema, rule in overflow_by_schema(overflow).items():
        by_rule.setdefault(rule, []).append(schema)
    if len(by_rule) == 1:
        return overflow
    done = {"split": "split", "truncate": "truncated"}
    return f"{overflow}: " + ", ".join(f"{'/'.join(s)} {done[r]}" for r, s in by_rule.items())


@dataclass(frozen=True)
class ConvertOptions:
    """How to convert. ``token_width`` 0 picks 2 bytes when the vocabulary fits, else 4."""

    max_tokens: int = 2048
    #: one of ``OVERFLOW_RULES``: auto splits plain-text documents, truncates SFT examples
    overflow: str = "auto"
    src: Src = Src.TEXT_CORPUS
    dst: Dst = Dst.EMBEDDING
    token_width: int = 0
    strict: bool = False
    batch_size: int = 512
    max_shard_bytes: int = 256 << 20
    text_unit: str = "file"
    eos_token_id: int | None = None
    overwrite: bool = False
    #: add the shards to the committed dataset at the output (``ndp.convert.append``)
    append: bool = False
    progress: bool = True
    #: columns read as schema fields, e.g. {"text": "content"} (``ndp.convert.records``)
    fields: dict[str, str] = field(default_factory=dict)
    #: the share of records that may be skipped as bad before the run fails (0.01: 1%)
    max_skipped: float = 0.01
    #: a token that straddles a prompt/answer boundary is the "prompt"'s (masked) or the
    #: "answer"'s (a target) (``ndp.convert.tokenizer.tokenize_examples``)
    straddle: str = "prompt"
    #: the split of a save_to_disk DatasetDict or of an ``hf:`` dataset
    hf_split: str = "train"
    #: fsspec's options for an output URL (``ndp.store.upload``)
    storage_options: dict | None = None


@dataclass
class ConvertSummary:
    """What a conversion did."""

    output: str
    tokenizer: str
    token_width: int
    overflow: str = "auto"  # the option; each schema's rule: overflow_by_schema(overflow)
    examples: int = 0
    packets: int = 0
    tokens: int = 0
    truncated: int = 0  # examples cut to max_tokens
    truncated_tokens: int = 0
    split: int = 0  # examples written as several packets
    #: tokens that straddle a prompt/answer boundary (``ConvertOptions.straddle`` owns them)
    straddled: int = 0
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
            f"split {self.split:,} [overflow {describe_overflow(self.overflow)}]  "
            f"skipped {self.skipped_total:,} ({skipped})\n"
            + (f"{self.straddled:,} tokens straddle a prompt/answer boundary (see --straddle)\n"
               if self.straddled else "")
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
            f"Fix the inputs or the options, or allow more with `max_skipped`")


def warn_truncation(summary: ConvertSummary, opts: ConvertOptions) -> None:
    """Say loudly when truncation cut a real share of the tokens, and what keeps them."""
    cut = summary.truncated_tokens
    share = cut / max(cut + summary.tokens, 1)
    if share <= TRUNCATION_WARN:
        return
    if opts.overflow == "auto":  # only SFT examples are cut: their start is what they need
        keep = ("these are SFT examples (chat, prompt/completion, alpaca), which --overflow "
                "auto truncates: raise --max-tokens, or --overflow split keeps them (the rest "
                "continues in further packets, without its prompt)")
    else:
        keep = ("--overflow split keeps them (examples continue in further packets; "
                "--overflow auto, the default, does that for plain-text documents only), or "
                "raise --max-tokens")
    log.warning("truncation cut %.1f%% of the tokens (%s tokens of %s examples longer than "
                "--max-tokens %d): %s", 100 * share, f"{cut:,}", f"{summary.truncated:,}",
                opts.max_tokens, keep)


def manifest_extra(summary: ConvertSummary, info, opts: ConvertOptions) -> dict:
    """What the manifest records besides the shards (``ShardWriter.commit`` adds them)."""
    return {
        "tokenizer": asdict(info),
        "token_width": summary.token_width,
        "max_tokens": opts.max_tokens,
        "overflow": opts.overflow,
        "overflow_by_schema": overflow_by_schema(opts.overflow),
        "straddle": opts.straddle,
        "src": opts.src.name,
        "dst": opts.dst.name,
        "fields": dict(opts.fields),
        "summary": {k: v for k, v in asdict(summary).items() if k not in ("shards",)},
    }
