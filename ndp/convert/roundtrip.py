"""Round-trip check: the decoded shards hold exactly the tokenizer's output for every record.

The reference side is independent of the converter's batching: each record is tokenized on its
own (``tok(text, add_special_tokens=False)`` + EOS) and cut by the rule the manifest records for
its schema (``overflow``, ``ndp.convert.options.overflow_rule``); the shard side is
the CPU decode (``decode_padded``) of every packet the index lists, in order.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import numpy as np

from ndp.convert.options import overflow_rule
from ndp.store.manifest import MANIFEST
from ndp.convert.records import to_example
from ndp.convert.sources import read_inputs
from ndp.convert.tokenizer import chat_renderer, load_tokenizer
from ndp.engine.reference import PaddedBuffers, decode_padded
from ndp.errors import NDPError, RecordError
from ndp.wire.format import IGNORE_INDEX
from ndp.store.index import load_index
from ndp.store.shard import Shard


class RoundTripError(NDPError):
    """Decoded shards differ from the tokenizer's output."""


def _expected(inputs, tokenizer: str, manifest: dict, text_unit: str) -> Iterator[tuple[str, np.ndarray]]:
    tok = load_tokenizer(tokenizer)
    render = chat_renderer(tok)
    eos = manifest["tokenizer"]["eos_token_id"]
    n_max, overflow = manifest["max_tokens"], manifest["overflow"]
    fields = manifest.get("fields") or {}
    for where, record, _ in read_inputs(inputs, text_unit=text_unit):
        if record is None or isinstance(record, RecordError):
            continue
        try:
            example = to_example(record, where, render_chat=render, fields=fields)
        except RecordError:
            continue
        enc = tok(example.text, add_special_tokens=False, return_offsets_mapping=True)
        ids = np.array(enc["input_ids"] + [eos], dtype=np.int64)
        labels = ids.copy()
        if example.masked:
            starts = [s for s, _ in enc["offset_mapping"]]
            for i, s in enumerate(starts):
                if not any(lo <= s < hi for lo, hi in example.targets):
                    labels[i] = IGNORE_INDEX
        cut = overflow_rule(overflow, example.schema) == "truncate"
        stop = min(len(ids), n_max) if cut else len(ids)
        for lo in range(0, stop, n_max):
            hi = min(stop, lo + n_max)
            yield where, np.stack([ids[lo:hi], labels[lo:hi]])


def _decoded(output: Path, manifest: dict, chunk: int = 1024) -> Iterator[np.ndarray]:
    n_max = manifest["max_tokens"]
    buffers = PaddedBuffers.allocate(chunk, n_max)
    for entry in manifest["shards"]:
        shard = Shard(output / entry["name"])
        offsets = load_index(shard, on_stale="error").offsets
        data = shard.data  # read whole into memory (never mapped: a cut is an error, no SIGBUS)
        shard.close()  # the file; ``data`` goes with this shard's turn
        for i in range(0, len(offsets), chunk):
            batch = decode_padded(data, offsets[i: i + chunk], seq_len=n_max, out=buffers)
            if batch.stats.valid != batch.stats.packets:
                raise RoundTripError(f"{shard.path}: dropped packets {batch.stats.dropped}")
            for r in range(batch.input_ids.shape[0]):
                n = int(batch.lengths[r])
                yield np.stack([batch.input_ids[r, :n], batch.labels[r, :n]])


def check_roundtrip(
    inputs: list, output: str | Path, *, tokenizer: str, text_unit: str = "file"
) -> int:
    """Compare every packet with its record's tokens and labels; return the packets checked.

    Raises ``RoundTripError`` naming the first record that differs.
    """
    output = Path(output)
    manifest = json.loads((output / MANIFEST).read_text())
    checked = 0
    expected = _expected(inputs, tokenizer, manifest, text_unit)
    for got in _decoded(output, manifest):
        where, want = next(expected, (None, None))
        if want is None:
            raise RoundTripError(f"shards hold more packets than the inputs make ({checked}+)")
        if want.shape != got.shape or not np.array_equal(want, got):
            raise RoundTripError(f"{where}: packet {checked} differs from the tokenizer's output")
        checked += 1
    if next(expected, None) is not None:
        raise RoundTripError(f"inputs make more packets than the shards hold ({checked})")
    return checked
