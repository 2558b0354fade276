"""``ndp.store.columns.tokens_of`` (compiled) gives, for every TYP and payload length, the
token count the wire format's layouts define: the numpy formula it replaced, on index fields
as they come (uint16 lengths and uint8 TYPs read through a structured array's strides)."""

from __future__ import annotations

import numpy as np

from ndp.store.columns import tokens_of
from ndp.wire.format import (
    INDEX_ENTRY_DTYPE,
    MASK_COUNT_BYTES,
    TYP_MASKED_TABLE,
    TYP_WIDTH_TABLE,
    token_payload_len,
)


def numpy_tokens(length, typ):
    length = length.astype(np.int64)
    width = TYP_WIDTH_TABLE[typ].astype(np.int64)
    masked = TYP_MASKED_TABLE[typ] != 0
    plain = np.where(width > 0, length // np.maximum(width, 1), 0)
    body = np.maximum(length - MASK_COUNT_BYTES, 0)
    n0 = (8 * body) // np.maximum(8 * width + 1, 1)
    fits = MASK_COUNT_BYTES + (n0 + 1) * width + (n0 + 8) // 8 <= length
    return np.where(masked, n0 + fits, plain)


def test_every_typ_and_length_counts_as_the_formula_says():
    lengths = np.concatenate([np.arange(0, 3000), [65533, 65534, 65535]])
    entries = np.zeros(lengths.shape[0] * 256, INDEX_ENTRY_DTYPE)
    entries["length"] = np.tile(lengths, 256)
    entries["typ"] = np.repeat(np.arange(256), lengths.shape[0])
    got = tokens_of(entries["length"], entries["typ"])  # strided views, as callers pass them
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, numpy_tokens(entries["length"], entries["typ"]))
    one = entries[entries["typ"] == entries["typ"][lengths.shape[0] * 3]]  # one TYP only
    np.testing.assert_array_equal(tokens_of(one["length"], one["typ"]),
                                  numpy_tokens(one["length"], one["typ"]))
    assert tokens_of(np.zeros(0, np.uint16), np.zeros(0, np.uint8)).shape == (0,)


def test_a_masked_payload_holds_the_tokens_it_was_made_for():
    for typ in np.flatnonzero(TYP_MASKED_TABLE).tolist():
        width = int(TYP_WIDTH_TABLE[typ])
        n = np.arange(0, 2000)
        length = np.array([token_payload_len(k, width=width, masked=True) for k in n.tolist()])
        np.testing.assert_array_equal(tokens_of(length, np.full(n.shape[0], typ, np.uint8)), n)


def test_counts_written_into_an_int32_buffer_are_the_int64_ones():
    """The plan's pass writes each index's counts straight into its window's int32 column."""
    lengths = np.arange(0, 65536, 7, dtype=np.uint16)
    typs = (np.arange(lengths.shape[0]) % 256).astype(np.uint8)
    out = np.full(lengths.shape[0] + 2, -1, np.int32)
    got = tokens_of(lengths, typs, out[1:-1])
    assert got.dtype == np.int32 and out[0] == -1 and out[-1] == -1
    np.testing.assert_array_equal(got, tokens_of(lengths, typs))


def test_entries_read_one_by_one_on_every_thread_are_the_held_ones(tmp_path):
    """``entries_one_by_one``: packets of many shards, in any order and repeated, each shard's
    read on its own (its index checked first, on its first use), equal the held entries."""
    from ndp.store.columns import entries_at, entries_one_by_one
    from ndp.store.corpus import Corpus
    from ndp.wire.packet import encode_tokens

    from ndp_test_helpers import ramp, write_shards

    for i in range(6):
        write_shards(tmp_path, [encode_tokens(ramp(50 * (9 * i + k), 1 + k % 7))
                                for k in range(9)], prefix=f"s{i:02d}")
    packets = np.random.default_rng(3).integers(0, 54, 200)
    got = entries_one_by_one(Corpus(tmp_path), packets)  # not read yet: checked, then read
    held = Corpus(tmp_path)
    for index in held.indexes:
        index.entries  # noqa: B018 - read and held whole
    np.testing.assert_array_equal(got, entries_at(held, packets))
    np.testing.assert_array_equal(entries_one_by_one(held, packets), got)
    assert entries_one_by_one(held, packets[:0]).shape == (0,)
