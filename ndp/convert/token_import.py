"""Token files in: llm.c, llm.q and raw uint16 files become NDP shards (``ndp convert``).

The formats and the document rules are specified in ``ndp.convert.tokenfiles``.
"""


from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ndp.store.remote import is_url
from ndp.store.upload import dataset_output
from ndp.convert.sources import expand_inputs
from ndp.convert.tokenfiles import (
    DEFAULT_SPLIT,
    FORMATS,
    SPLIT_RULES,
    TokenFile,
    document_bounds,
    id_range,
    read_token_file,
)
from ndp.errors import ConfigError, TokenFileError
from ndp.wire.format import (
    SHARD_VERSION,
    Dst,
    Src,
    max_tokens_per_packet,
    token_typ,
)
from ndp.wire.packet import encode_tokens
from ndp.progress import progress_bar
from ndp.store.writer import ShardWriter

log = logging.getLogger("ndp.convert")


@dataclass
class TokenConvertSummary:
    """What a token-file conversion did."""

    output: str
    token_width: int
    files: list[dict] = field(default_factory=list)  # per input: path, format, tokens, split...
    documents: int = 0
    packets: int = 0
    tokens: int = 0
    continued: int = 0  # documents longer than one packet, written as consecutive packets
    masked_packets: int = 0
    shards: list[str] = field(default_factory=list)
    bytes: int = 0
    input_bytes: int = 0
    seconds: float = 0.0

    def describe(self) -> str:
        formats = ", ".join(sorted({f["format"] for f in self.files})) or "-"
        rate = self.tokens / self.seconds if self.seconds else 0.0
        return (
            f"{len(self.files)} {formats} file(s): documents {self.documents:,}  "
            f"packets {self.packets:,}  tokens {self.tokens:,}\n"
            f"continued over several packets {self.continued:,}  masked packets "
            f"{self.masked_packets:,}  {self.token_width}-byte tokens\n"
            f"{self._rules()}\n"
            f"{len(self.shards)} shard(s), {self.bytes / 1e6:.1f} MB in {self.output}  "
            f"[{self.seconds:.1f} s, {rate / 1e6:.2f} M tokens/s]"
        )

    def _rules(self) -> str:
        """Where the documents were cut, and who said so."""
        why = {"option": "as --eos-id / --split say", "header": "as the ndp export recorded "
               "in the file's header", "default": "the format's default"}
        rules = {(f["split"], f["eos_token_id"], f["rule_from"]) for f in self.files}
        if len(rules) != 1:
            return "documents cut by several rules (the manifest lists each file's)"
        split, eos, source = rules.pop()
        if split == "none":
            return f"documents not cut: one per file ({why[source]})"
        return f"documents cut {split} each EOS id {eos} ({why[source]})"


def _source_plan(tf: TokenFile, eos_token_id: int | None, split: str) -> dict:
    """Validate ``tf``'s ids and decide how it is cut into documents."""
    lo, hi = id_range(tf)
    if lo < 0 or hi >= 1 << 31:
        bad = lo if lo < 0 else hi
        raise TokenFileError(tf.path, "token ids in 0..2,147,483,647", f"id {bad}",
                             "The tokens are damaged or not token ids.")
    if tf.vocab_size and hi >= tf.vocab_size:
        raise TokenFileError(tf.path, f"ids below the header's vocab_size {tf.vocab_size}",
                             f"id {hi}", "The tokens or the header are damaged.")
    recorded = tf.split is not None  # an ndp export wrote the dataset's rule in the header
    eos = eos_token_id if eos_token_id is not None else (
        tf.eos_token_id if recorded else tf.default_eos)
    rule = split if split != "auto" else (tf.split if recorded else DEFAULT_SPLIT[tf.format])
    if recorded and rule == "none" and eos_token_id is not None:
        rule = DEFAULT_SPLIT[tf.format]  # an EOS named for a file recorded as not cut
    explicit = eos_token_id is not None or split != "auto"
    return {"path": str(tf.path), "format": tf.format, "version": tf.version,
            "tokens": int(tf.tokens.shape[0]), "masked": tf.mask is not None,
            "eos_token_id": eos, "split": rule if eos is not None else "none",
            "rule_from": "option" if explicit else "header" if recorded else "default",
            "max_id": hi, "vocab_size": tf.vocab_size}


def convert_token_files(
    inputs: Sequence[str | os.PathLike],
    output: str | os.PathLike,
    *,
    fmt: str = "auto",
    eos_token_id: int | None = None,
    split: str = "auto",
    src: Src = Src.TEXT_CORPUS,
    dst: Dst = Dst.EMBEDDING,
    max_shard_bytes: int = 256 << 20,
    overwrite: bool = False,
    progress: bool = True,
    storage_options: dict | None = None,
) -> TokenConvertSummary:
    """Convert llm.c / llm.q / raw uint16 token files (directories walked, sorted) into NDP
    shards and an ``ndp.json`` manifest in ``output``.

    Every input is read and checked (``TokenFileError``) before anything is written. ``fmt``
    ``"auto"`` recognises llm.c and llm.q by their headers; ``eos_token_id`` and ``split``
    (``auto``, ``before``, ``after``, ``none``) say where documents are cut (module docstring).
    """
    if split not in SPLIT_RULES:
        raise ConfigError(f"`split` must be one of {SPLIT_RULES}, got {split!r}")
    if fmt != "auto" and fmt not in FORMATS:
        raise ConfigError(f"`fmt` must be auto or one of {FORMATS}, got {fmt!r}")
    files = expand_inputs(list(inputs))
    if not files:
        raise ConfigError("no input files given")
    plans = [_source_plan(read_token_file(p, fmt), eos_token_id, split) for p in files]
    width = 2 if max(p["max_id"] for p in plans) < 1 << 16 else 4
    out_name = str(output).rstrip("/") if is_url(output) else str(Path(output))
    summary = TokenConvertSummary(output=out_name, token_width=width, files=plans)
    started = time.perf_counter()
    with dataset_output(output, overwrite=overwrite, storage_options=storage_options
                        ) as (stage, on_finish, publish):
        writer = ShardWriter(stage, max_shard_bytes=max_shard_bytes, on_finish=on_finish)
        with writer, progress_bar(total=sum(p["tokens"] for p in plans), unit="tok",
                                  unit_scale=True, desc="convert", enabled=progress) as bar:
            for path, plan in zip(files, plans):
                tf = read_token_file(path, plan["format"])
                summary.input_bytes += path.stat().st_size
                cap = max_tokens_per_packet(token_typ(width=width, masked=tf.mask is not None))
                bounds = document_bounds(tf.tokens, plan["eos_token_id"], plan["split"])
                plan["documents"] = len(bounds) - 1
                for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
                    summary.continued += b - a > cap
                    for lo in range(a, b, cap):
                        hi = min(b, lo + cap)
                        mask = None if tf.mask is None else tf.mask[lo:hi]
                        writer.write(encode_tokens(tf.tokens[lo:hi], width=width, mask=mask,
                                                   src=src, dst=dst, continues=lo > a))
                        summary.packets += 1
                        summary.masked_packets += mask is not None
                    bar.update(b - a)
                summary.documents += plan["documents"]
                summary.tokens += plan["tokens"]
                del tf
            writer.finish()
            summary.shards = [f"{out_name}/{s.path.name}" for s in writer.finished]
            summary.bytes = sum(s.size for s in writer.finished)
            summary.seconds = time.perf_counter() - started
            publish(writer.commit(_manifest(summary, src, dst)))
    return summary


def _manifest(summary: TokenConvertSummary, src: Src, dst: Dst) -> dict:
    """What the manifest records besides the shards (``ShardWriter.commit`` adds them)."""
    eos = {p["eos_token_id"] for p in summary.files}
    vocab = {p["vocab_size"] for p in summary.files}
    masked = any(p["masked"] for p in summary.files)
    return {
        "format_version": SHARD_VERSION,
        "source": {"kind": "token_files",
                   "formats": sorted({p["format"] for p in summary.files}),
                   "files": summary.files},
        "tokenizer": {"name": None, "vocab_size": vocab.pop() if len(vocab) == 1 else None,
                      "eos_token_id": eos.pop() if len(eos) == 1 else None,
                      "pad_token_id": None, "has_chat_template": False},
        "token_width": summary.token_width,
        "max_tokens": max_tokens_per_packet(token_typ(width=summary.token_width, masked=masked)),
        "overflow": "split",
        "src": src.name,
        "dst": dst.name,
        "summary": {k: v for k, v in asdict(summary).items() if k not in ("shards", "files")},
    }
