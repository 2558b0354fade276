"""The framing scan (resynchronisation after corruption) and the sidecar index files."""

from __future__ import annotations

import struct
import warnings
import zlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ndp.engine.reference import validate
from ndp.errors import IndexMismatchError, UnsupportedVersionError
from ndp.wire.format import INDEX_ENTRY_DTYPE, DropReason, Typ
from ndp.store.index import (
    Corruption,
    Index,
    build_index,
    check_index,
    entries_from_offsets,
    load_index,
    read_index,
    scan,
    scan_shard,
    write_index,
)
from ndp.wire.packet import decode_packet, encode_packet, encode_tokens
from ndp.store.shard import Shard, parse_shard_header

from ndp_test_helpers import (
    build_gappy_stream,
    build_stream,
    flip_bit,
    ramp,
    ramp_specs,
    ramp_stream,
    write_shards,
)

FRAMING_OK = {DropReason.OK, DropReason.NOT_TOKENS, DropReason.UNKNOWN_TYPE, DropReason.BAD_LENGTH}
# statuses of a position where resynchronisation must stop: framing OK and a defined TYP
RESYNC_TARGET = {DropReason.OK, DropReason.NOT_TOKENS, DropReason.BAD_LENGTH}


def u8(data: bytes) -> np.ndarray:
    return np.frombuffer(data, np.uint8)


def scan_bytes(data: bytes, start: int = 0):
    return scan(u8(data), start)


def offsets_of(result) -> list[int]:
    return result.entries["offset"].astype(np.int64).tolist()


def regions_of(result) -> list[tuple[int, int, DropReason]]:
    return [(c.offset, c.length, c.reason) for c in result.corrupt]


def _no_0xaa(data: bytes) -> bytes:
    return bytes(b if b != 0xAA else 0x55 for b in data)


# --- clean shards ------------------------------------------------------------------------------
def test_scan_clean_shard_matches_writer_index(ramp_shard):
    info, stream = ramp_shard
    shard = Shard(info.path)
    result = scan_shard(shard)
    assert result.corrupt == [] and result.corrupt_bytes == 0
    written = read_index(shard.index_path)
    assert offsets_of(result) == written.offsets.tolist() == stream.offsets
    assert result.entries.dtype == INDEX_ENTRY_DTYPE
    for name in ("offset", "length", "src", "dst", "typ"):
        assert result.entries[name].tolist() == written.entries[name].tolist(), name


def test_scan_entries_fields():
    packets = [
        encode_tokens([1, 2], width=2, src=2, dst=5),
        encode_packet(b"\x3c\x00" * 3, typ=Typ.FLOAT16, src=5, dst=3),
        encode_packet(b"abc", typ=0x7E, src=0x42, dst=0x43),  # reserved TYP: kept, reported raw
        encode_tokens(list(range(300)), mask=[1] * 300),
    ]
    stream = build_stream(packets)
    result = scan_bytes(stream.data)
    assert result.corrupt == []
    e = result.entries
    assert e["offset"].tolist() == stream.offsets
    assert e["length"].tolist() == [4, 6, 3, 2 + 1200 + 38]
    assert e["src"].tolist() == [2, 5, 0x42, 1]
    assert e["dst"].tolist() == [5, 3, 0x43, 1]
    assert e["typ"].tolist() == [0x02, 0x03, 0x7E, 0x11]
    np.testing.assert_array_equal(entries_from_offsets(u8(stream.data), e["offset"].astype(np.int64)), e)


def test_scan_start_offset():
    stream = ramp_stream([2, 3, 4])
    result = scan_bytes(stream.data, stream.offsets[1])
    assert offsets_of(result) == stream.offsets[1:] and result.corrupt == []


def test_scan_empty():
    result = scan(np.zeros(0, np.uint8))
    assert len(result.entries) == 0 and result.corrupt == []
    assert result.entries.dtype == INDEX_ENTRY_DTYPE
    stream = ramp_stream([3])
    result = scan_bytes(stream.data, len(stream.data))  # start at the end
    assert len(result.entries) == 0 and result.corrupt == []


# --- garbage and corruption --------------------------------------------------------------------
def test_garbage_between_packets():
    specs = ramp_specs([5, 9, 0, 3, 12], width=[4, 2, 4, 2, 4], masked=[False, True, False, False, True])
    packets = [s.encode() for s in specs]
    gaps = [b"\x01\x02\x03\x04\x05", b"", b"G" * 13, b"", b"\x00", b"xyz"]
    g = build_gappy_stream(packets, gaps, header=True)
    result = scan_bytes(g.data, g.start)
    assert offsets_of(result) == g.offsets
    assert [(c.offset, c.length) for c in result.corrupt] == g.gap_regions
    reasons = [c.reason for c in result.corrupt]
    # between packets the first garbage byte is not SYNC; the 3 trailing bytes cannot hold a frame
    assert reasons == [DropReason.BAD_SYNC] * 3 + [DropReason.TRUNCATED]
    assert result.corrupt_bytes == sum(len(x) for x in gaps)
    assert result.corrupt[0].describe() == f"byte {g.gap_regions[0][0]}: 5 bytes skipped (BAD_SYNC)"
    for off, spec in zip(offsets_of(result), specs):
        np.testing.assert_array_equal(decode_packet(g.data, off).tokens, spec.tokens)


def test_long_trailing_garbage_is_bad_sync():
    stream = ramp_stream([4, 4])
    data = stream.data + b"\x00" * 20
    result = scan_bytes(data)
    assert offsets_of(result) == stream.offsets
    assert regions_of(result) == [(len(stream.data), 20, DropReason.BAD_SYNC)]


def test_garbage_with_false_sync_bytes():
    # 0xAA bytes in garbage that do not start a valid packet are skipped
    stream = ramp_stream([4, 5])
    junk = b"\xaa\x01\x01\x01\x00\x04\x00\x00" + b"\xaa" * 9 + b"\xaa\x01"
    data = stream.packets[0] + junk + stream.packets[1]
    result = scan_bytes(data)
    assert offsets_of(result) == [0, len(stream.packets[0]) + len(junk)]
    assert regions_of(result) == [(len(stream.packets[0]), len(junk), DropReason.BAD_CRC)]


def _ramp_corruption_stream():
    specs = ramp_specs([6, 0, 11, 3, 20, 1, 7], width=[4, 2, 4, 4, 2, 2, 4],
                       masked=[False, False, True, False, True, False, False])
    return build_stream([s.encode() for s in specs], header=True, specs=specs)


@pytest.mark.parametrize("k", range(7))
@pytest.mark.parametrize("where", ["sync", "src", "typ", "len_hi", "len_lo", "payload", "crc"])
def test_corrupt_packet_k(k, where):
    stream = _ramp_corruption_stream()
    start, end = stream.span(k)
    byte = {"sync": 0, "src": 1, "typ": 3, "len_hi": 4, "len_lo": 5,
            "payload": 6, "crc": end - start - 1}[where]
    if where == "payload" and end - start == 8:
        byte = 5  # empty payload: flip in LEN instead
    data = bytearray(stream.data)
    data[start + byte] ^= 0x01 if where != "len_hi" else 0x80
    data = bytes(data)
    result = scan_bytes(data, 32)
    expected = [o for i, o in enumerate(stream.offsets) if i != k]
    assert offsets_of(result) == expected
    (region,) = result.corrupt
    assert region.offset == start and region.length == end - start
    new_len = (data[start + 4] << 8) | data[start + 5]
    if byte == 0:
        assert region.reason == DropReason.BAD_SYNC
    elif start + 8 + new_len > len(data):
        assert region.reason == DropReason.TRUNCATED
    else:
        assert region.reason == DropReason.BAD_CRC


def test_len_past_end_of_file():
    stream = _ramp_corruption_stream()
    for k in (2, 6):
        start, end = stream.span(k)
        data = bytearray(stream.data)
        data[start + 4: start + 6] = b"\xff\xff"
        result = scan_bytes(bytes(data), 32)
        assert offsets_of(result) == [o for i, o in enumerate(stream.offsets) if i != k]
        assert regions_of(result) == [(start, end - start, DropReason.TRUNCATED)]


@pytest.mark.parametrize("cut_into", [1, 3, 7, 8, 10, -1])
def test_truncated_shard(cut_into):
    stream = _ramp_corruption_stream()
    k = 4
    start, end = stream.span(k)
    cut = start + cut_into if cut_into > 0 else end - 1
    data = stream.data[:cut]
    result = scan_bytes(data, 32)
    assert offsets_of(result) == stream.offsets[:k]
    assert regions_of(result) == [(start, cut - start, DropReason.TRUNCATED)]


def test_truncated_at_boundary_is_clean():
    stream = _ramp_corruption_stream()
    cut = stream.offsets[3]
    result = scan_bytes(stream.data[:cut], 32)
    assert offsets_of(result) == stream.offsets[:3] and result.corrupt == []


def test_unknown_typ_after_garbage_is_not_a_resync_target():
    # documented: resynchronisation only accepts defined TYPs, so a reserved-TYP packet right
    # after a corrupt region is counted as part of that region, while one reached by normal
    # framing is kept
    a = encode_tokens([1, 2])
    odd = encode_packet(b"zz", typ=0x7E)
    b = encode_tokens([3])
    clean = scan_bytes(a + odd + b)
    assert offsets_of(clean) == [0, len(a), len(a) + len(odd)] and clean.corrupt == []
    data = a + b"junk" + odd + b
    result = scan_bytes(data)
    assert offsets_of(result) == [0, len(a) + 4 + len(odd)]
    assert regions_of(result) == [(len(a), 4 + len(odd), DropReason.BAD_SYNC)]


# --- properties --------------------------------------------------------------------------------
def _packet_strategy():
    tokens = st.sampled_from([2, 4]).flatmap(
        lambda w: st.tuples(
            st.just(w),
            st.lists(st.integers(0, 65535 if w == 2 else 2**31 - 1), max_size=24),
            st.booleans(),
        )
    )

    def make(args):
        w, toks, masked = args
        mask = [(t * 7) % 3 != 0 for t in toks] if masked else None
        return encode_tokens(toks, width=w, mask=mask)

    floats = st.binary(max_size=20).map(
        lambda b: encode_packet(b[: len(b) // 2 * 2], typ=Typ.FLOAT16))
    return st.one_of(tokens.map(make), floats)


garbage = st.binary(max_size=24).map(_no_0xaa)


@given(st.lists(_packet_strategy(), max_size=10).flatmap(
    lambda ps: st.tuples(st.just(ps), st.lists(garbage, min_size=len(ps) + 1,
                                                  max_size=len(ps) + 1), st.booleans())))
def test_property_garbage_at_boundaries(args):
    packets, gaps, header = args
    g = build_gappy_stream(packets, gaps, header=header)
    result = scan_bytes(g.data, g.start)
    assert offsets_of(result) == g.offsets
    assert [(c.offset, c.length) for c in result.corrupt] == g.gap_regions
    for off, packet in zip(offsets_of(result), packets):
        assert g.data[off: off + len(packet)] == packet


def _check_scan_invariants(data: bytes, start: int):
    arr = u8(data)
    result = scan(arr, start)
    offs = offsets_of(result)
    # every packet's framing is OK
    status = validate(arr, offs)
    assert all(DropReason(s) in FRAMING_OK for s in status)
    # packets and corrupt regions tile [start, len) exactly, in order, without overlap
    spans = [(o, 8 + int(n), "p") for o, n in zip(offs, result.entries["length"])]
    spans += [(c.offset, c.length, "c") for c in result.corrupt]
    spans.sort()
    pos = start
    for off, length, _ in spans:
        assert off == pos and length > 0
        pos += length
    assert pos == max(start, len(data))
    assert sum(8 + int(n) for n in result.entries["length"]) + result.corrupt_bytes == \
        max(0, len(data) - start)
    # a corrupt region's reason is its first byte's framing verdict, and no position inside it
    # (after the first) holds a packet that resynchronisation should have stopped at
    for c in result.corrupt:
        assert c.reason in (DropReason.BAD_SYNC, DropReason.TRUNCATED, DropReason.BAD_CRC)
        assert validate(arr, [c.offset])[0] == c.reason
        inner = validate(arr, np.arange(c.offset + 1, c.offset + c.length))
        assert not any(DropReason(s) in RESYNC_TARGET for s in inner)
    return result


@given(st.binary(max_size=600), st.integers(0, 700))
def test_property_random_bytes(data, start):
    _check_scan_invariants(data, min(start, len(data) + 1) if start < 650 else 0)


@given(st.lists(st.one_of(_packet_strategy(), st.binary(max_size=30),
                          st.just(b"\xaa"), st.just(b"\xaa\x01\x01\x01")), max_size=20))
def test_property_random_bytes_with_packets(blobs):
    data = b"".join(blobs)
    _check_scan_invariants(data, 0)


_FLIP_STREAM = None


def _flip_stream():
    global _FLIP_STREAM
    if _FLIP_STREAM is None:
        specs = ramp_specs([6, 0, 11, 3, 40, 1, 7, 2, 25, 9],
                           width=[4, 2, 4, 4, 2, 2, 4, 4, 2, 4],
                           masked=[False, False, True, False, True, False, False, True, False,
                                   False])
        _FLIP_STREAM = build_stream([s.encode() for s in specs], header=True, specs=specs)
    return _FLIP_STREAM


def _check_single_flip(stream, bit):
    data = flip_bit(stream.data, bit)
    header = parse_shard_header(u8(data))
    result = scan_bytes(data, header.data_offset)
    byte = bit // 8
    hit = [k for k in range(len(stream.packets)) if stream.span(k)[0] <= byte < stream.span(k)[1]]
    expected = [o for k, o in enumerate(stream.offsets) if k not in hit]
    assert offsets_of(result) == expected, bit
    for off in expected:
        k = stream.offsets.index(off)
        np.testing.assert_array_equal(decode_packet(data, off).tokens, stream.specs[k].tokens)
    if hit:
        (region,) = result.corrupt
        start, end = stream.span(hit[0])
        assert (region.offset, region.length) == (start, end - start)
    elif byte < 32:
        # a flip in the shard header: either a damaged-CRC header or (magic hit) leading garbage
        assert header.problem is not None or [(c.offset, c.length) for c in result.corrupt] == \
            [(0, 32)]


@given(st.data())
def test_property_single_bit_flip(data):
    stream = _flip_stream()
    bit = data.draw(st.integers(0, 8 * len(stream.data) - 1))
    _check_single_flip(stream, bit)


def test_every_single_bit_flip_small_shard():
    # exhaustive over a smaller shard: no flip loses a packet it does not touch, none fakes one
    specs = ramp_specs([3, 0, 5, 2], width=[4, 2, 2, 4], masked=[False, True, False, True])
    stream = build_stream([s.encode() for s in specs], header=True, specs=specs)
    for bit in range(8 * len(stream.data)):
        _check_single_flip(stream, bit)


# --- index files -------------------------------------------------------------------------------
def _entries(offsets, lengths, typ=1):
    e = np.zeros(len(offsets), INDEX_ENTRY_DTYPE)
    e["offset"] = offsets
    e["length"] = lengths
    e["src"] = 2
    e["dst"] = 3
    e["typ"] = typ
    return e


def test_write_read_index_round_trip(tmp_path):
    e = _entries([32, 100, 2**40], [60, 0, 65535], typ=0x12)
    path = tmp_path / "x.ndp.idx"
    write_index(path, e, shard_size=123456789012, shard_crc32=0xDEADBEEF, data_offset=32)
    assert not (tmp_path / "x.ndp.idx.tmp").exists()
    raw = path.read_bytes()
    assert len(raw) == 64 + 3 * 16
    magic, version, entry_size, n, size, crc, data_offset = struct.unpack_from("<8sIIQQII", raw)
    assert (magic, version, entry_size, n, size, crc, data_offset) == (
        b"NDPINDEX", 1, 16, 3, 123456789012, 0xDEADBEEF, 32)
    assert raw[40:64] == bytes(24)
    assert struct.unpack_from("<QHBBB3x", raw, 64 + 16) == (100, 0, 2, 3, 0x12)
    index = read_index(path)
    assert isinstance(index, Index) and len(index) == 3
    assert (index.shard_size, index.shard_crc32, index.data_offset) == (123456789012,
                                                                       0xDEADBEEF, 32)
    assert index.offsets.dtype == np.int64
    assert index.offsets.tolist() == [32, 100, 2**40]
    for name in ("offset", "length", "src", "dst", "typ"):
        assert index.entries[name].tolist() == e[name].tolist()


def test_write_read_empty_index(tmp_path):
    path = tmp_path / "e.idx"
    write_index(path, np.zeros(0, INDEX_ENTRY_DTYPE), 0, 0, 0)
    index = read_index(path)
    assert len(index) == 0 and index.shard_size == 0


def test_read_index_damaged(tmp_path):
    path = tmp_path / "x.ndp.idx"
    write_index(path, _entries([32, 50], [10, 20]), 100, 7, 32)
    raw = path.read_bytes()
    for bad in (raw[:-1], raw[:-16], raw + b"\x00", raw[:63], b"", b"NOTINDEX" + raw[8:]):
        path.write_bytes(bad)
        with pytest.raises(IndexMismatchError):
            read_index(path)
    wrong_entry_size = bytearray(raw)
    wrong_entry_size[12] = 24
    path.write_bytes(bytes(wrong_entry_size))
    with pytest.raises(IndexMismatchError):
        read_index(path)
    newer = bytearray(raw)
    newer[8] = 2
    path.write_bytes(bytes(newer))
    with pytest.raises(UnsupportedVersionError):
        read_index(path)


@pytest.fixture
def indexed(tmp_path):
    specs = ramp_specs([5, 17, 0, 30, 2], width=[4, 2, 4, 2, 4], masked=[False, True, False,
                                                                      False, True])
    stream = build_stream([s.encode() for s in specs], header=True, specs=specs)
    (info,) = write_shards(tmp_path, stream.packets)
    return info.path, stream


def _assert_index_is(index, stream, data: bytes):
    assert index.offsets.tolist() == stream.offsets
    assert index.shard_size == len(data)
    assert index.shard_crc32 == zlib.crc32(data)


def test_load_index_clean(indexed):
    path, stream = indexed
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for mode in ("error", "rebuild"):
            index = load_index(Shard(path), on_stale=mode)
            _assert_index_is(index, stream, stream.data)
            assert index.data_offset == 32


def test_load_index_bad_mode(indexed):
    path, _ = indexed
    with pytest.raises(ValueError):
        load_index(Shard(path), on_stale="ignore")


def _stale(case, path, stream):
    """Make the sidecar of ``path`` stale in one way; return the shard bytes now on disk."""
    idx = path.with_name(path.name + ".idx")
    data = stream.data
    if case == "missing":
        idx.unlink()
    elif case == "size":
        data = data + encode_tokens(ramp(9, 3))
        path.write_bytes(data)
    elif case == "crc32":
        # same size, one payload byte changed (and its packet's CRC fixed, so a scan keeps it)
        off = stream.offsets[3]
        packet = bytearray(stream.packets[3])
        packet[9] ^= 0x01
        body = bytes(packet[:-2])
        packet = encode_packet(body[6:], typ=body[3], src=body[1], dst=body[2])
        data = data[:off] + packet + data[off + len(packet):]
        assert len(data) == len(stream.data)
        path.write_bytes(data)
    elif case == "truncated_idx":
        idx.write_bytes(idx.read_bytes()[:-5])
    elif case == "past_end":
        index = read_index(idx)
        e = index.entries.copy()
        e["offset"][-1] = len(data) - 4
        write_index(idx, e, index.shard_size, index.shard_crc32, index.data_offset)
    else:
        raise AssertionError(case)
    return data


STALE_CASES = ["missing", "size", "crc32", "truncated_idx", "past_end"]


@pytest.mark.parametrize("case", STALE_CASES)
def test_load_index_stale_error(indexed, case):
    path, stream = indexed
    _stale(case, path, stream)
    idx = path.with_name(path.name + ".idx")
    before = idx.read_bytes() if idx.exists() else None
    with pytest.raises(IndexMismatchError):
        load_index(Shard(path), on_stale="error")
    assert (idx.read_bytes() if idx.exists() else None) == before  # nothing written


@pytest.mark.parametrize("case", STALE_CASES)
def test_load_index_stale_rebuild(indexed, case):
    path, stream = indexed
    data = _stale(case, path, stream)
    idx = path.with_name(path.name + ".idx")
    before = idx.read_bytes() if idx.exists() else None
    with pytest.warns(UserWarning, match="scanning the shard"):
        index = load_index(Shard(path), on_stale="rebuild")
    expected = list(stream.offsets) + ([len(stream.data)] if case == "size" else [])
    assert index.offsets.tolist() == expected
    assert index.shard_size == len(data) and index.shard_crc32 == zlib.crc32(data)
    assert index.data_offset == 32
    assert (idx.read_bytes() if idx.exists() else None) == before  # rebuild writes nothing
    for off in index.offsets:
        decode_packet(data, int(off))


def test_check_index_direct(indexed):
    path, stream = indexed
    shard = Shard(path)
    index = read_index(shard.index_path)
    check_index(index, shard)
    bad = Index(index.entries, index.shard_size, index.shard_crc32 ^ 1, index.data_offset)
    with pytest.raises(IndexMismatchError, match="crc32"):
        check_index(bad, shard)
    bad = Index(index.entries, index.shard_size + 1, index.shard_crc32, index.data_offset)
    with pytest.raises(IndexMismatchError, match="stale"):
        check_index(bad, shard)


@pytest.mark.parametrize("hostile", [2**63 - 1, 2**63 - 8, 2**63, 2**64 - 1, 2**64 - 8])
def test_check_index_hostile_offsets(indexed, hostile):
    # offsets whose sum with the frame length wraps around must still be refused
    path, stream = indexed
    shard = Shard(path)
    index = read_index(shard.index_path)
    e = index.entries.copy()
    e["offset"][1] = hostile
    bad = Index(e, index.shard_size, index.shard_crc32, index.data_offset)
    with pytest.raises(IndexMismatchError, match="past the end"):
        check_index(bad, shard)
    write_index(shard.index_path, e, index.shard_size, index.shard_crc32, index.data_offset)
    with pytest.raises(IndexMismatchError):
        load_index(shard, on_stale="error")
    with pytest.warns(UserWarning):
        assert load_index(shard).offsets.tolist() == stream.offsets


def test_build_index_writes_loadable_sidecar(indexed):
    path, stream = indexed
    idx = path.with_name(path.name + ".idx")
    idx.unlink()
    index, result = build_index(Shard(path))
    assert result.corrupt == []
    _assert_index_is(index, stream, stream.data)
    assert idx.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load_index(Shard(path), on_stale="error")
    assert loaded.offsets.tolist() == stream.offsets
    assert (loaded.shard_size, loaded.shard_crc32, loaded.data_offset) == (
        index.shard_size, index.shard_crc32, 32)
    # the sidecar build_index writes equals the one the writer wrote
    assert loaded.entries.tobytes() == index.entries.tobytes()


def test_build_index_of_corrupt_shard(tmp_path):
    stream = ramp_stream([4, 8, 2], header=True)
    data = bytearray(stream.data)
    data[stream.offsets[1] + 7] ^= 0x10
    path = tmp_path / "c.ndp"
    path.write_bytes(bytes(data))
    index, result = build_index(Shard(path))
    assert index.offsets.tolist() == [stream.offsets[0], stream.offsets[2]]
    assert result.corrupt == [Corruption(stream.offsets[1], len(stream.packets[1]),
                                         DropReason.BAD_CRC)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load_index(Shard(path), on_stale="error")
    assert loaded.offsets.tolist() == index.offsets.tolist()


def test_build_index_empty_and_headerless(tmp_path):
    empty = tmp_path / "empty.ndp"
    empty.write_bytes(b"")
    index, result = build_index(Shard(empty))
    assert len(index) == 0 and result.corrupt == [] and index.shard_size == 0
    assert len(load_index(Shard(empty), on_stale="error")) == 0
    raw = tmp_path / "raw.ndp"
    stream = ramp_stream([1, 2])
    raw.write_bytes(stream.data)
    index, _ = build_index(Shard(raw))
    assert index.data_offset == 0 and index.offsets.tolist() == stream.offsets
    assert load_index(Shard(raw), on_stale="error").offsets.tolist() == stream.offsets


def test_load_index_rescans_when_the_index_is_from_a_newer_version(tmp_path):
    path = tmp_path / "s.ndp"
    path.write_bytes(encode_tokens([1, 2, 3]) + encode_tokens([4, 5]))
    index, _ = build_index(Shard(path))
    raw = bytearray((tmp_path / "s.ndp.idx").read_bytes())
    raw[8] = 9  # index version 9
    (tmp_path / "s.ndp.idx").write_bytes(bytes(raw))
    with pytest.raises(UnsupportedVersionError):
        load_index(Shard(path), on_stale="error")
    with pytest.warns(UserWarning, match="version 9"):
        again = load_index(Shard(path))
    assert again.offsets.tolist() == index.offsets.tolist() == [0, 20]


# --- an index is a claim, checked when it is loaded (size-only match included) --------------------
def _lie(case: str, entries: np.ndarray, stream) -> np.ndarray:
    """``entries`` of a sound index, made to lie in one way (the file size and crc32 stay)."""
    e = entries.copy()
    if case == "length_bit":
        e["length"][3] ^= 0x0004
    elif case == "repeated_offset":
        e = np.concatenate([e[:2], np.repeat(e[2:3], 5), e[2:]])
    elif case == "subset":
        e = e[[0, 1, 3]]
    elif case == "empty":
        e = e[:0]
    elif case == "offset_off_by_one":
        e["offset"][2] += 1
    elif case == "typ":
        e["typ"][1] = int(Typ.TOKEN_IDS) if e["typ"][1] != Typ.TOKEN_IDS else int(Typ.FLOAT16)
    elif case == "into_header":
        e["offset"][0] = 4
    elif case == "swapped":
        e[[1, 2]] = e[[2, 1]]
    else:
        raise AssertionError(case)
    return e


LIES = ["length_bit", "repeated_offset", "subset", "empty", "offset_off_by_one", "typ",
        "into_header", "swapped"]


#: lies only the packets' own header bytes show: with verify="size" they are checked when the
#: packets are read (Corpus.check_headers), not when the index is loaded. A LEN cut short
#: ("length_bit" clears a bit) is not among them: it leaves a gap after its entry, and an entry
#: a gap follows has its header checked at load
HEADER_LIES = {"typ"}


@pytest.mark.parametrize("block", [None, 2])  # check_structure's blocks: one, or many
@pytest.mark.parametrize("verify", ["size", "full"])
@pytest.mark.parametrize("case", LIES)
def test_an_index_that_lies_is_refused_or_rebuilt_never_trusted(indexed, case, verify, block,
                                                                 monkeypatch):
    from ndp.store.index import check_headers

    if block:  # and gaps found by NumPy past the walk's record of one
        monkeypatch.setattr("ndp.store.index.CHECK_BLOCK", block)
        monkeypatch.setattr("ndp.store.index_walk.GAPS", 1)

    path, stream = indexed
    shard = Shard(path)
    index = read_index(shard.index_path)
    lie = _lie(case, index.entries, stream)
    write_index(shard.index_path, lie, index.shard_size, index.shard_crc32, index.data_offset)
    if verify == "size" and case in HEADER_LIES:
        loaded = load_index(shard, on_stale="error", verify=verify)  # no read of the packets
        with pytest.raises(IndexMismatchError, match="disagrees with the packet header"):
            check_headers(loaded.entries, np.arange(len(loaded)), shard)
        return
    with pytest.raises(IndexMismatchError, match=f"ndp index {path}"):
        load_index(shard, on_stale="error", verify=verify)
    with pytest.warns(UserWarning, match="scanning the shard"):
        rebuilt = load_index(shard, verify=verify)
    assert rebuilt.entries.tobytes() == index.entries.tobytes()  # what a scan says, exactly


@pytest.mark.parametrize("gaps", [None, 2])  # the compiled walk's gap record, or NumPy's
@pytest.mark.parametrize("block", [None, 1, 2])  # check_structure's blocks
def test_a_sound_index_of_a_damaged_shard_is_accepted_as_it_is(tmp_path, block, gaps,
                                                               monkeypatch):
    """Gaps between entries are fine where they are the corrupt regions a scan records."""
    if block:
        monkeypatch.setattr("ndp.store.index.CHECK_BLOCK", block)
    if gaps:
        monkeypatch.setattr("ndp.store.index_walk.GAPS", gaps)
    packets = [s.encode() for s in ramp_specs([4, 9, 3, 6, 5])]
    garbage = bytes(range(1, 40))  # no sync byte, no packet
    stream = build_gappy_stream(packets, [b"", garbage, b"", garbage, b"", garbage], header=True)
    path = tmp_path / "g.ndp"
    path.write_bytes(stream.data)
    index, result = build_index(Shard(path))
    assert len(result.corrupt) == 3 and index.offsets.tolist() == stream.offsets
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_index(Shard(path), on_stale="error").entries.tobytes() == \
            index.entries.tobytes()


def test_a_stale_index_beside_a_rewritten_shard_of_the_same_size_is_refused(tmp_path):
    """The size-only match lets such an index through; its packets are not where it says, which
    the full check sees at load and the size check when the packets are read."""
    first = [s.encode() for s in ramp_specs([6, 6, 6, 6])]
    (info,) = write_shards(tmp_path, first)
    idx = info.path.with_name(info.path.name + ".idx").read_bytes()
    second = [s.encode() for s in ramp_specs([2, 10, 6, 6], stride=7)]  # same total size
    assert sum(map(len, second)) == sum(map(len, first))
    info.path.unlink()
    write_shards(tmp_path, second)
    info.path.with_name(info.path.name + ".idx").write_bytes(idx)
    with pytest.raises(IndexMismatchError, match="crc32"):  # the full check reads the shard
        load_index(Shard(info.path), on_stale="error", verify="full")
    from ndp.store.corpus import Corpus

    corpus = Corpus(tmp_path, on_stale="error", verify="size", manifest="ignore")  # no read
    with pytest.raises(IndexMismatchError, match="disagrees with the packet header"):
        corpus.check_headers(np.arange(corpus.n_packets))
    # with its manifest, the index's crc32 is not the shard's: the shard (read once) is the
    # manifest's, so the index is stale, rescanned at open
    with pytest.warns(UserWarning, match="a stale index; scanning the shard instead"):
        corpus = Corpus(tmp_path, verify="size")
    corpus.check_headers(np.arange(corpus.n_packets))  # the scan's entries: the shard's own


# --- an index that accounts for none of the shard's bytes -------------------------------------
def _zero_lengths(path, which=slice(None)) -> None:
    index = read_index(Shard(path).index_path)
    e = index.entries.copy()
    e["length"][which] = 0
    write_index(Shard(path).index_path, e, index.shard_size, index.shard_crc32,
                index.data_offset)


@pytest.mark.parametrize("which", [slice(None), slice(1, 2)], ids=["all", "one"])
@pytest.mark.parametrize("verify", ["size", "full"])
def test_an_index_whose_lengths_are_zeroed_is_stale(indexed, verify, which):
    """All LEN fields zero: every packet's payload is a gap the index does not explain, and the
    packed epoch of such an index held no token at all, silently."""
    path, stream = indexed
    sound = read_index(Shard(path).index_path).entries.tobytes()
    _zero_lengths(path, which)
    with pytest.raises(IndexMismatchError, match=f"ndp index {path}"):
        load_index(Shard(path), on_stale="error", verify=verify)
    with pytest.warns(UserWarning, match="scanning the shard"):
        rebuilt = load_index(Shard(path), verify=verify)
    assert rebuilt.entries.tobytes() == sound


def test_a_corpus_with_a_zeroed_index_rescans_and_counts_its_tokens(indexed):
    """The entries are checked when first used, not at open (``ndp.store.lazy``): the error, or
    the warning and the scan, come with the first read of the shard's packets."""
    from ndp.store.corpus import Corpus

    path, stream = indexed
    want = int(np.asarray(Corpus(path.parent, on_stale="error").tokens).sum())
    assert want > 0
    _zero_lengths(path)
    strict = Corpus(path.parent, on_stale="error")
    with pytest.raises(IndexMismatchError, match=f"ndp index {path}"):
        strict.tokens[0:1]
    corpus = Corpus(path.parent)
    with pytest.warns(UserWarning, match="scanning the shard"):
        assert int(np.asarray(corpus.tokens).sum()) == want


# --- an index that cannot be read is rescanned, as a missing one is ------------------------------
@pytest.mark.parametrize("how", ["directory", "permission"])
def test_an_unreadable_index_is_rescanned_with_a_warning(indexed, how, monkeypatch):
    """As root, chmod 000 does not stop a read: a directory named like the index (its read
    fails with IsADirectoryError) and a read_bytes that raises PermissionError stand in."""
    from pathlib import Path

    from ndp.store.corpus import Corpus

    path, stream = indexed
    shard = Shard(path)
    sound = read_index(shard.index_path).entries.tobytes()
    if how == "directory":
        shard.index_path.unlink()
        shard.index_path.mkdir()
    else:
        read_bytes, open_ = Path.read_bytes, Path.open

        def refuse(self):
            if self.suffix == ".idx":
                raise PermissionError(13, "Permission denied", str(self))
            return read_bytes(self)

        def refuse_open(self, *args, **kwargs):  # a corpus reads the header alone
            if self.suffix == ".idx":
                raise PermissionError(13, "Permission denied", str(self))
            return open_(self, *args, **kwargs)

        monkeypatch.setattr(Path, "read_bytes", refuse)
        monkeypatch.setattr(Path, "open", refuse_open)
    with pytest.raises(IndexMismatchError, match=f"{shard.index_path}.*unreadable"):
        load_index(shard, on_stale="error")
    with pytest.warns(UserWarning, match="unreadable.*scanning the shard"):
        assert load_index(shard).entries.tobytes() == sound
    with pytest.warns(UserWarning, match="unreadable.*scanning the shard"):
        assert len(Corpus(path.parent)) == len(stream.offsets)


def test_a_shard_changed_while_its_index_is_checked_is_not_called_an_unreadable_index(
        indexed, monkeypatch):
    """ShardChangedError is an OSError: it must reach the caller, not become a rescan."""
    from ndp.errors import ShardChangedError

    path, _ = indexed

    def cut(self):
        raise ShardChangedError(f"{self.path}: cut")

    monkeypatch.setattr(Shard, "crc32", cut)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "unreadable ...; scanning the shard instead"
        with pytest.raises(ShardChangedError, match="cut"):
            load_index(Shard(path), verify="full")
