"""CPU decode (ndp.engine.reference) against a plain-Python reference, bit for bit, on ramp data."""

from __future__ import annotations

import binascii

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ndp.engine.reference import (
    DecodeStats,
    PaddedBuffers,
    StreamExhausted,
    decode_packed,
    decode_padded,
    validate,
)
from ndp.errors import ConfigError
from ndp.wire.format import IGNORE_INDEX, DropReason, Typ
from ndp.store.index import scan
from ndp.wire.packet import decode_packet, encode_packet, encode_tokens
from ndp.store.shard import Shard

from ndp_test_helpers import (
    base_stream,
    build_stream,
    corrupt,
    corruption,
    drop_case,
    ramp,
    ramp_specs,
    ramp_stream,
)

TOKEN_TYPS = {Typ.TOKEN_IDS: 4, Typ.TOKEN_IDS_U16: 2, Typ.TOKEN_IDS_MASKED: 4,
              Typ.TOKEN_IDS_U16_MASKED: 2}


# --- the plain-Python reference ----------------------------------------------------------------
def ref_status(data: bytes, off: int) -> DropReason:
    """The spec's verdict for a packet claimed at byte ``off``, written out longhand."""
    if off < 0 or off + 8 > len(data):
        return DropReason.TRUNCATED
    if data[off] != 0xAA:
        return DropReason.BAD_SYNC
    length = int.from_bytes(data[off + 4: off + 6], "big")
    end = off + 6 + length
    if end + 2 > len(data):
        return DropReason.TRUNCATED
    if binascii.crc_hqx(data[off:end], 0xFFFF) != int.from_bytes(data[end: end + 2], "big"):
        return DropReason.BAD_CRC
    typ = data[off + 3]
    if typ in (Typ.FLOAT16, Typ.BFLOAT16):
        return DropReason.NOT_TOKENS
    if typ not in TOKEN_TYPS:
        return DropReason.UNKNOWN_TYPE
    width = TOKEN_TYPS[typ]
    if typ in (Typ.TOKEN_IDS_MASKED, Typ.TOKEN_IDS_U16_MASKED):
        if length < 2:
            return DropReason.BAD_LENGTH
        n = int.from_bytes(data[off + 6: off + 8], "big")
        return DropReason.OK if length == 2 + n * width + (n + 7) // 8 else DropReason.BAD_LENGTH
    return DropReason.OK if length % width == 0 else DropReason.BAD_LENGTH


def reference(data: bytes, offsets):
    """Status of every packet; tokens and labels of each valid one, in packet order."""
    status, rows, tokens, labels = [], [], [], []
    for k, off in enumerate(offsets):
        s = ref_status(data, int(off))
        status.append(int(s))
        if s == DropReason.OK:
            p = decode_packet(data, int(off))
            rows.append(k)
            tokens.append(p.tokens)
            labels.append(p.labels())
    return status, rows, tokens, labels


def ref_padded(data: bytes, offsets, max_len: int, pad: int):
    status, rows, tokens, labels = reference(data, offsets)
    n = len(rows)
    ids = np.full((n, max_len), pad, np.int64)
    lab = np.full((n, max_len), IGNORE_INDEX, np.int64)
    att = np.zeros((n, max_len), np.int64)
    for r, (t, lb) in enumerate(zip(tokens, labels)):
        m = min(len(t), max_len)
        ids[r, :m] = t[:m]
        lab[r, :m] = lb[:m]
        att[r, :m] = 1
    lengths = np.array([len(t) for t in tokens], np.int64)
    dropped = {}
    for s in status:
        if s != DropReason.OK:
            name = DropReason(s).name
            dropped[name] = dropped.get(name, 0) + 1
    stats = DecodeStats(
        packets=len(offsets),
        valid=n,
        tokens=int(np.minimum(lengths, max_len).sum()) if n else 0,
        truncated_tokens=int(np.maximum(lengths - max_len, 0).sum()) if n else 0,
        dropped=dropped,
    )
    return dict(input_ids=ids, labels=lab, attention_mask=att, lengths=lengths,
                status=np.array(status, np.uint8), rows=np.array(rows, np.int64), stats=stats)


def ref_packed(data: bytes, offsets, batch_size: int, seq_len: int, start: int):
    status, rows, tokens, labels = reference(data, offsets)
    stream = np.concatenate([np.zeros(0, np.int64)] + tokens)
    stream_labels = np.concatenate([np.zeros(0, np.int64)] + labels)
    x = np.empty((batch_size, seq_len), np.int64)
    y = np.empty((batch_size, seq_len), np.int64)
    for b in range(batch_size):
        s = start + b * seq_len
        x[b] = stream[s: s + seq_len]
        y[b] = stream_labels[s + 1: s + seq_len + 1]
    return x, y, len(stream), np.array(status, np.uint8)


def assert_padded_equal(batch, ref):
    for name in ("input_ids", "labels", "attention_mask", "lengths", "rows"):
        got = getattr(batch, name)
        assert got.dtype == np.int64, name
        np.testing.assert_array_equal(got, ref[name], err_msg=name)
    np.testing.assert_array_equal(batch.status, ref["status"])
    assert batch.status.dtype == np.uint8
    assert batch.stats == ref["stats"]


# --- padded ------------------------------------------------------------------------------------
@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("max_len", [1, 7, 16, 33, 200])
def test_padded_matches_reference(width, masked, max_len):
    lengths = [5, 0, 16, 1, 64, 33, 8, 9, 17]
    stream = ramp_stream(lengths, width=width, masked=masked, header=True)
    batch = decode_padded(stream.array, stream.offsets, seq_len=max_len, pad_token_id=7)
    ref = ref_padded(stream.data, stream.offsets, max_len, 7)
    assert_padded_equal(batch, ref)
    assert batch.input_ids.shape == (len(lengths), max_len)
    # against the ramp itself, not only the reference
    for r, spec in enumerate(stream.specs):
        m = min(len(spec.tokens), max_len)
        np.testing.assert_array_equal(batch.input_ids[r, :m], spec.tokens[:m])
        np.testing.assert_array_equal(batch.labels[r, :m], spec.labels()[:m])
        assert (batch.input_ids[r, m:] == 7).all()
        assert (batch.labels[r, m:] == IGNORE_INDEX).all()
        assert batch.attention_mask[r].tolist() == [1] * m + [0] * (max_len - m)
    truncated = sum(max(0, n - max_len) for n in lengths)
    assert batch.stats.truncated_tokens == truncated
    assert batch.stats.tokens == sum(lengths) - truncated
    assert batch.stats.valid == batch.stats.packets == len(lengths)
    assert batch.stats.dropped == {}
    assert batch.lengths.tolist() == lengths


def test_padded_mixed_shard_file(ramp_shard):
    info, stream = ramp_shard
    shard = Shard(info.path)
    for max_len in (4, 50, 128):
        batch = decode_padded(shard.data, stream.offsets, seq_len=max_len, pad_token_id=0)
        assert_padded_equal(batch, ref_padded(stream.data, stream.offsets, max_len, 0))
        # bytes input gives the same answer as the memory map
        again = decode_padded(stream.data, stream.offsets, seq_len=max_len)
        assert_padded_equal(again, ref_padded(stream.data, stream.offsets, max_len, 0))


def test_padded_masked_labels_by_hand():
    data = encode_tokens([10, 11, 12, 13, 14], width=2, mask=[0, 0, 1, 1, 0])
    batch = decode_padded(data, [0], seq_len=7, pad_token_id=99)
    assert batch.input_ids.tolist() == [[10, 11, 12, 13, 14, 99, 99]]
    assert batch.labels.tolist() == [[-100, -100, 12, 13, -100, -100, -100]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0, 0]]
    batch = decode_padded(data, [0], seq_len=3)
    assert batch.input_ids.tolist() == [[10, 11, 12]]
    assert batch.labels.tolist() == [[-100, -100, 12]]
    assert batch.stats.truncated_tokens == 2 and batch.stats.tokens == 3
    assert batch.lengths.tolist() == [5]


def test_padded_large_token_ids():
    tokens = [0, 2**31 - 1, 65535, 65536, 0x01020304]
    batch = decode_padded(encode_tokens(tokens), [0], seq_len=5)
    assert batch.input_ids.tolist() == [tokens]
    batch = decode_padded(encode_tokens([65535, 0, 0x8000], width=2), [0], seq_len=3)
    assert batch.input_ids.tolist() == [[65535, 0, 0x8000]]


def test_padded_subset_and_repeated_offsets():
    stream = ramp_stream([3, 4, 5, 6])
    offsets = [stream.offsets[2], stream.offsets[0], stream.offsets[2]]
    batch = decode_padded(stream.data, offsets, seq_len=6)
    assert_padded_equal(batch, ref_padded(stream.data, offsets, 6, 0))
    assert batch.input_ids[0, :5].tolist() == ramp(2, 5).tolist()
    assert batch.input_ids[1, :3].tolist() == ramp(0, 3).tolist()


def test_padded_empty_offsets():
    stream = ramp_stream([3])
    batch = decode_padded(stream.data, [], seq_len=4)
    assert batch.input_ids.shape == (0, 4) and batch.rows.shape == (0,)
    assert batch.stats == DecodeStats()


def test_padded_offsets_from_index_entries(ramp_shard):
    # uint64 offsets straight from an index work
    info, stream = ramp_shard
    shard = Shard(info.path)
    result = scan(shard.data, shard.header.data_offset)
    batch = decode_padded(shard.data, result.entries["offset"], seq_len=32)
    assert_padded_equal(batch, ref_padded(stream.data, stream.offsets, 32, 0))


def test_padded_out_buffers_reused():
    stream = ramp_stream([5, 40, 2, 9, 13], masked=True)
    out = PaddedBuffers.allocate(8, 16)
    first = decode_padded(stream.data, stream.offsets, seq_len=16, out=out)
    assert np.shares_memory(first.input_ids, out.input_ids)
    assert np.shares_memory(first.labels, out.labels)
    assert np.shares_memory(first.attention_mask, out.attention_mask)
    assert_padded_equal(first, ref_padded(stream.data, stream.offsets, 16, 0))
    offsets = stream.offsets[3:] + stream.offsets[:1]
    second = decode_padded(stream.data, offsets, seq_len=16, pad_token_id=5, out=out)
    assert np.shares_memory(second.input_ids, out.input_ids)
    assert_padded_equal(second, ref_padded(stream.data, offsets, 16, 5))
    with pytest.raises(ConfigError):
        decode_padded(stream.data, stream.offsets, seq_len=8, out=out)
    with pytest.raises(ConfigError):
        decode_padded(stream.data, stream.offsets * 2, seq_len=16, out=out)


def test_padded_bad_arguments():
    data = encode_tokens([1])
    with pytest.raises(ConfigError):
        decode_padded(data, [0], seq_len=0)
    with pytest.raises(ConfigError):
        decode_padded(np.frombuffer(data, np.int8), [0], seq_len=4)
    with pytest.raises(ConfigError):
        decode_padded(np.frombuffer(data, np.uint8).reshape(1, -1), [0], seq_len=4)


# --- drop reasons ------------------------------------------------------------------------------
def test_drop_reasons_counted():
    data, offsets, expected = drop_case()
    codes = [DropReason.OK if e == "ok" else DropReason[e] for e in expected]
    assert [ref_status(data, o) for o in offsets] == codes  # the reference agrees with the test
    np.testing.assert_array_equal(validate(data, offsets), np.array(codes, np.uint8))
    batch = decode_padded(data, offsets, seq_len=12)
    assert batch.status.tolist() == [int(c) for c in codes]
    counts = {}
    for e in expected:
        if e != "ok":
            counts[e] = counts.get(e, 0) + 1
    assert batch.stats.dropped == counts
    assert counts == {"BAD_CRC": 1, "BAD_LENGTH": 4, "NOT_TOKENS": 2, "UNKNOWN_TYPE": 2,
                      "BAD_SYNC": 2, "TRUNCATED": 8}
    assert batch.stats.valid == expected.count("ok") == 5
    assert batch.stats.packets == len(offsets)
    assert batch.rows.tolist() == [k for k, e in enumerate(expected) if e == "ok"]
    assert_padded_equal(batch, ref_padded(data, offsets, 12, 0))

    packed = decode_packed(data, offsets, batch_size=2, seq_len=5, start=3)
    assert packed.stats.dropped == counts
    assert packed.status.tolist() == [int(c) for c in codes]
    x, y, total, _ = ref_packed(data, offsets, 2, 5, 3)
    np.testing.assert_array_equal(packed.x, x)
    np.testing.assert_array_equal(packed.y, y)
    assert packed.stream_tokens == total


def test_hostile_offsets_from_an_index():
    # offsets as an index stores them (uint64): values past 2**63 wrap to negative int64
    data = encode_tokens([1, 2, 3]) * 4
    offsets = np.array([0, 2**63 - 1, 2**63, 2**64 - 1, 2**63 - 8, 20], np.uint64)
    batch = decode_padded(data, offsets, seq_len=3)
    assert batch.status.tolist() == [0, 2, 2, 2, 2, 0]
    assert batch.input_ids.tolist() == [[1, 2, 3], [1, 2, 3]]


def test_top_bit_int32_tokens_agree_between_decoders():
    # writers never set the top bit (ids are >= 0); readers all decode the 4 bytes as unsigned
    packet = encode_packet(b"\x80\x00\x00\x00\xff\xff\xff\xff", typ=Typ.TOKEN_IDS)
    host = decode_packet(packet).tokens.tolist()
    kernel = decode_padded(packet, [0], seq_len=2).input_ids[0].tolist()
    assert host == kernel == [2**31, 2**32 - 1]


def test_validate_out_buffer():
    data, offsets, expected = drop_case()
    out = np.full(len(offsets) + 5, 255, np.uint8)
    status = validate(data, offsets, out=out)
    assert np.shares_memory(status, out) and status.shape == (len(offsets),)
    assert (out[len(offsets):] == 255).all()
    assert status.tolist() == [int(ref_status(data, o)) for o in offsets]


def test_decode_stats_from_status():
    stats = DecodeStats.from_status(np.array([0, 3, 3, 5, 0, 1], np.uint8))
    assert (stats.packets, stats.valid) == (6, 2)
    assert stats.dropped == {"BAD_CRC": 2, "NOT_TOKENS": 1, "BAD_SYNC": 1}


# --- packed ------------------------------------------------------------------------------------
def _packed_stream():
    lengths = [7, 0, 12, 1, 30, 0, 0, 5, 19, 3, 26, 2]
    widths = [4, 2, 2, 4, 4, 2, 4, 2, 4, 2, 4, 2]
    masked = [False, False, True, False, True, True, False, False, True, False, False, True]
    specs = ramp_specs(lengths, width=widths, masked=masked)
    packets = [s.encode() for s in specs]
    bad = bytearray(encode_tokens(ramp(99, 8)))  # a dropped packet in the middle
    bad[-1] ^= 1
    packets.insert(5, bytes(bad))
    stream = build_stream(packets, header=True)
    return stream, specs


def test_packed_reference_stream_is_the_ramp():
    stream, specs = _packed_stream()
    _, _, total, status = ref_packed(stream.data, stream.offsets, 1, 1, 0)
    assert total == sum(len(s.tokens) for s in specs)
    assert status.tolist().count(DropReason.BAD_CRC) == 1


@pytest.mark.parametrize(
    "batch_size, seq_len, start",
    [(1, 1, 0), (1, 104, 0), (2, 8, 0), (3, 7, 1), (4, 5, 6), (1, 3, 19), (5, 20, 0),
     (2, 9, 37), (8, 1, 90), (1, 20, 84), (7, 14, 0), (13, 8, 0), (1, 1, 103)],
)
def test_packed_matches_reference(batch_size, seq_len, start):
    stream, specs = _packed_stream()
    total = sum(len(s.tokens) for s in specs)
    assert total == 105
    batch = decode_packed(stream.array, stream.offsets, batch_size=batch_size, seq_len=seq_len,
                          start=start)
    x, y, ref_total, status = ref_packed(stream.data, stream.offsets, batch_size, seq_len, start)
    assert batch.x.dtype == np.int64 and batch.y.dtype == np.int64
    np.testing.assert_array_equal(batch.x, x)
    np.testing.assert_array_equal(batch.y, y)
    np.testing.assert_array_equal(batch.status, status)
    assert batch.stream_tokens == ref_total == total
    assert batch.start == start
    assert batch.next_start == start + batch_size * seq_len
    assert batch.stats.tokens == batch_size * seq_len
    assert batch.stats.valid == len(specs)
    assert batch.stats.dropped == {"BAD_CRC": 1}


def test_packed_y_is_x_shifted():
    stream = ramp_stream([10, 10, 10], stride=10)  # one continuous ramp 0..29
    batch = decode_packed(stream.data, stream.offsets, batch_size=3, seq_len=9)
    assert batch.x.tolist() == [list(range(0, 9)), list(range(9, 18)), list(range(18, 27))]
    assert batch.y.tolist() == [list(range(1, 10)), list(range(10, 19)), list(range(19, 28))]


def test_packed_masked_targets():
    first = encode_tokens([1, 2, 3], mask=[1, 0, 1])
    assert len(first) == 8 + 2 + 12 + 1
    data = first + encode_tokens([4, 5], width=2, mask=[0, 1])
    batch = decode_packed(data, [0, len(first)], batch_size=1, seq_len=4)
    assert batch.x.tolist() == [[1, 2, 3, 4]]
    assert batch.y.tolist() == [[-100, 3, -100, 5]]


def test_packed_exhausted():
    stream, specs = _packed_stream()
    total = sum(len(s.tokens) for s in specs)
    decode_packed(stream.data, stream.offsets, batch_size=1, seq_len=total - 1)  # exactly fits
    with pytest.raises(StreamExhausted):
        decode_packed(stream.data, stream.offsets, batch_size=1, seq_len=total)
    with pytest.raises(StreamExhausted):
        decode_packed(stream.data, stream.offsets, batch_size=2, seq_len=10, start=total - 20)
    decode_packed(stream.data, stream.offsets, batch_size=2, seq_len=10, start=total - 21)
    with pytest.raises(StreamExhausted):
        decode_packed(stream.data, stream.offsets, batch_size=1, seq_len=1, start=-1)
    with pytest.raises(StreamExhausted):
        decode_packed(stream.data, [], batch_size=1, seq_len=1)
    with pytest.raises(StreamExhausted):
        decode_packed(encode_tokens([5]), [0], batch_size=1, seq_len=1)
    assert issubclass(StreamExhausted, ConfigError)


def test_packed_bad_arguments():
    stream, _ = _packed_stream()
    for b, t in ((0, 4), (1, 0), (-1, 3)):
        with pytest.raises(ConfigError):
            decode_packed(stream.data, stream.offsets, batch_size=b, seq_len=t)


def test_packed_out_buffers_reused():
    stream, specs = _packed_stream()
    x = np.full((3, 6), -1, np.int64)
    y = np.full((3, 6), -1, np.int64)
    for start in (0, 18, 36, 54, 72):
        batch = decode_packed(stream.data, stream.offsets, batch_size=3, seq_len=6, start=start,
                              out=(x, y))
        assert np.shares_memory(batch.x, x) and np.shares_memory(batch.y, y)
        rx, ry, _, _ = ref_packed(stream.data, stream.offsets, 3, 6, start)
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)
        np.testing.assert_array_equal(batch.x, rx)
        np.testing.assert_array_equal(batch.y, ry)
    # a buffer with more rows than needed: the first rows are used, the rest untouched
    big_x = np.full((5, 6), -7, np.int64)
    big_y = np.full((5, 6), -7, np.int64)
    batch = decode_packed(stream.data, stream.offsets, batch_size=2, seq_len=6, start=5,
                          out=(big_x, big_y))
    rx, ry, _, _ = ref_packed(stream.data, stream.offsets, 2, 6, 5)
    assert batch.x.shape == (2, 6) and np.shares_memory(batch.x, big_x)
    np.testing.assert_array_equal(big_x[:2], rx)
    np.testing.assert_array_equal(big_y[:2], ry)
    assert (big_x[2:] == -7).all() and (big_y[2:] == -7).all()
    with pytest.raises(ConfigError):  # too few rows
        decode_packed(stream.data, stream.offsets, batch_size=4, seq_len=6, out=(x, y))
    with pytest.raises(ConfigError):  # wrong window length
        decode_packed(stream.data, stream.offsets, batch_size=3, seq_len=5, out=(x, y))
    with pytest.raises(ConfigError):  # x and y differ
        decode_packed(stream.data, stream.offsets, batch_size=3, seq_len=6,
                      out=(x, np.empty((3, 5), np.int64)))


def test_packed_batch_size_none_takes_every_whole_window():
    stream, specs = _packed_stream()
    total = sum(len(s.tokens) for s in specs)
    for seq_len, start in ((7, 0), (10, 4), (104, 0), (1, 100)):
        batch = decode_packed(stream.data, stream.offsets, batch_size=None, seq_len=seq_len,
                              start=start)
        b = (total - start - 1) // seq_len
        assert batch.x.shape == (b, seq_len)
        x, y, _, _ = ref_packed(stream.data, stream.offsets, b, seq_len, start)
        np.testing.assert_array_equal(batch.x, x)
        np.testing.assert_array_equal(batch.y, y)
        assert batch.next_start == start + b * seq_len
    with pytest.raises(StreamExhausted):
        decode_packed(stream.data, stream.offsets, batch_size=None, seq_len=total)
    with pytest.raises(StreamExhausted):
        decode_packed(stream.data, stream.offsets, batch_size=None, seq_len=3, start=total)


def test_packed_consecutive_batches_cover_the_stream():
    stream, specs = _packed_stream()
    ramp_all = np.concatenate([s.tokens for s in specs])
    start, seen = 0, []
    while True:
        try:
            batch = decode_packed(stream.data, stream.offsets, batch_size=2, seq_len=7,
                                  start=start)
        except StreamExhausted:
            break
        seen.append(batch.x.reshape(-1))
        start = batch.next_start
    seen = np.concatenate(seen)
    np.testing.assert_array_equal(seen, ramp_all[: len(seen)])
    assert len(ramp_all) - len(seen) <= 14


# --- property: corrupted shards ----------------------------------------------------------------
@given(st.lists(corruption, min_size=1, max_size=3),
       st.lists(st.integers(-50, 2000), max_size=6), st.integers(1, 48))
def test_property_corrupted_shard(ops, hostile, max_len):
    base = base_stream()
    data = corrupt(base.data, ops)
    offsets = list(base.offsets) + hostile  # a stale index plus hostile offsets
    batch = decode_padded(data, offsets, seq_len=max_len, pad_token_id=3)
    ref = ref_padded(data, offsets, max_len, 3)
    assert_padded_equal(batch, ref)
    ok = [k for k, s in enumerate(batch.status) if s == DropReason.OK]
    assert batch.rows.tolist() == ok
    for k, (off, packet) in enumerate(zip(base.offsets, base.packets)):
        intact = data[off: off + len(packet)] == packet
        assert (batch.status[k] == DropReason.OK) == intact, k  # no intact packet is dropped
    for r, k in enumerate(ok):
        if k >= len(base.offsets):
            continue  # a hostile offset that happened to hit a packet: checked by the reference
        spec = base.specs[k]
        m = min(len(spec.tokens), max_len)
        np.testing.assert_array_equal(batch.input_ids[r, :m], spec.tokens[:m])
        np.testing.assert_array_equal(batch.labels[r, :m], spec.labels()[:m])
    # the offsets a fresh scan finds decode to exactly the original packets that survived
    found = scan(np.frombuffer(data, np.uint8), 32 if len(data) >= 32 else 0)
    offs = found.entries["offset"].astype(np.int64)
    fresh = decode_padded(data, offs, seq_len=max_len)
    for r, k in enumerate(fresh.rows):
        off = int(offs[k])
        assert off in base.offsets
        spec = base.specs[base.offsets.index(off)]
        m = min(len(spec.tokens), max_len)
        np.testing.assert_array_equal(fresh.input_ids[r, :m], spec.tokens[:m])
    # packed mode either has enough tokens or says so
    try:
        packed = decode_packed(data, offsets, batch_size=2, seq_len=max_len)
    except StreamExhausted:
        assert int(batch.lengths.sum()) < 2 * max_len + 1
    else:
        x, y, _, _ = ref_packed(data, offsets, 2, max_len, 0)
        np.testing.assert_array_equal(packed.x, x)
        np.testing.assert_array_equal(packed.y, y)


def test_out_buffers_of_the_wrong_dtype_or_size_are_refused():
    stream = ramp_stream([4, 4])
    small = PaddedBuffers.allocate(1, 4)
    with pytest.raises(ConfigError, match="out.input_ids"):
        decode_padded(stream.data, stream.offsets, seq_len=4, out=small)
    wrong = PaddedBuffers.allocate(2, 4)
    wrong.labels = wrong.labels.astype(np.int32)
    with pytest.raises(ConfigError, match="out.labels"):
        decode_padded(stream.data, stream.offsets, seq_len=4, out=wrong)
    x = np.empty((1, 3), np.int32)
    with pytest.raises(ConfigError, match="int64"):
        decode_packed(stream.data, stream.offsets, batch_size=1, seq_len=3, out=(x, x))
