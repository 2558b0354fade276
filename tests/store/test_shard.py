"""Shard header, the atomic rolling ShardWriter and the memory-mapping Shard reader."""

from __future__ import annotations

import binascii
import subprocess
import sys
import zlib

import numpy as np
import pytest

from ndp.errors import ConfigError, ShardFormatError, UnsupportedVersionError
from ndp.wire.format import SHARD_HEADER_BYTES, SHARD_MAGIC
from ndp.store.index import read_index, scan_shard
from ndp.store.manifest import ManifestError, listed_shards, read_manifest
from ndp.wire.packet import decode_packet, encode_packet, encode_tokens
from ndp.store.shard import Shard, encode_shard_header, index_path_for, parse_shard_header
from ndp.store.writer import ShardWriter

from ndp_test_helpers import build_stream, ramp, ramp_specs, ramp_stream, write_shards


# --- header ------------------------------------------------------------------------------------
def test_header_layout_by_hand():
    head = encode_shard_header()
    assert len(head) == 32
    assert head[:8] == b"\x89NDP\r\n\x1a\n" == SHARD_MAGIC
    assert head[8:10] == b"\x00\x01"  # VERSION 1, big-endian
    assert head[10:12] == b"\x00\x20"  # HEADER_LEN 32, big-endian
    assert head[12:30] == bytes(18)  # reserved
    assert head[30:32] == binascii.crc_hqx(head[:30], 0xFFFF).to_bytes(2, "big")


def test_header_version_field():
    head = encode_shard_header(version=2)
    assert head[8:10] == b"\x00\x02"
    assert head[30:32] == binascii.crc_hqx(head[:30], 0xFFFF).to_bytes(2, "big")


def _u8(data: bytes) -> np.ndarray:
    return np.frombuffer(data, np.uint8)


def test_parse_header_cases():
    packet = encode_tokens([1, 2])
    h = parse_shard_header(_u8(encode_shard_header() + packet))
    assert (h.version, h.data_offset, h.problem) == (1, 32, None)
    h = parse_shard_header(_u8(encode_shard_header()))  # header only, no packets
    assert (h.version, h.data_offset, h.problem) == (1, 32, None)
    h = parse_shard_header(_u8(packet))
    assert (h.version, h.data_offset, h.problem) == (None, 0, None)
    h = parse_shard_header(_u8(b""))
    assert (h.version, h.data_offset, h.problem) == (None, 0, None)
    h = parse_shard_header(_u8(b"garbage" + packet))  # neither sync nor magic: headerless
    assert (h.version, h.data_offset, h.problem) == (None, 0, None)
    h = parse_shard_header(_u8(encode_shard_header()[:20]))
    assert h.version is None and h.data_offset == 20 and "truncated" in h.problem
    h = parse_shard_header(_u8(SHARD_MAGIC[:5]))  # too short to hold the magic
    assert (h.version, h.data_offset) == (None, 0)


def test_parse_header_newer_version():
    with pytest.raises(UnsupportedVersionError, match="version 2"):
        parse_shard_header(_u8(encode_shard_header(version=2)))
    assert issubclass(UnsupportedVersionError, ShardFormatError)


def test_parse_header_version_zero_or_bad_length():
    with pytest.raises(ShardFormatError):
        parse_shard_header(_u8(encode_shard_header(version=0)))
    head = bytearray(encode_shard_header())
    head[10:12] = (16).to_bytes(2, "big")  # HEADER_LEN below 32
    head[30:32] = binascii.crc_hqx(bytes(head[:30]), 0xFFFF).to_bytes(2, "big")
    with pytest.raises(ShardFormatError):
        parse_shard_header(_u8(bytes(head)))
    head[10:12] = (4000).to_bytes(2, "big")  # HEADER_LEN past the end of the file
    head[30:32] = binascii.crc_hqx(bytes(head[:30]), 0xFFFF).to_bytes(2, "big")
    with pytest.raises(ShardFormatError):
        parse_shard_header(_u8(bytes(head)))


def test_header_len_larger_than_32_is_honoured():
    head = bytearray(encode_shard_header())
    head[10:12] = (40).to_bytes(2, "big")
    head[30:32] = binascii.crc_hqx(bytes(head[:30]), 0xFFFF).to_bytes(2, "big")
    data = bytes(head) + bytes(8) + encode_tokens([5])
    h = parse_shard_header(_u8(data))
    assert (h.version, h.data_offset) == (1, 40)


# --- ShardWriter -------------------------------------------------------------------------------
def _listing(directory):
    return sorted(p.name for p in directory.iterdir())


def test_writer_single_shard(tmp_path):
    stream = ramp_stream([3, 0, 10, 1], header=True)
    infos = write_shards(tmp_path, stream.packets)
    assert _listing(tmp_path) == ["ndp.json", "shard-00000.ndp", "shard-00000.ndp.idx"]
    (info,) = infos
    data = info.path.read_bytes()
    assert data == stream.data  # header + packets, byte for byte
    assert info.size == len(data)
    assert info.packets == 4
    assert info.crc32 == zlib.crc32(data)
    index = read_index(index_path_for(info.path))
    assert index.offsets.tolist() == stream.offsets
    assert index.entries["length"].tolist() == [len(p) - 8 for p in stream.packets]
    assert index.entries["typ"].tolist() == [1, 1, 1, 1]
    assert (index.shard_size, index.shard_crc32, index.data_offset) == (len(data),
                                                                       zlib.crc32(data), 32)


def test_writer_prefix_and_headerless(tmp_path):
    stream = ramp_stream([2, 5], width=2)
    (info,) = write_shards(tmp_path / "sub" / "dir", stream.packets, prefix="train",
                           header=False)
    assert info.path == tmp_path / "sub" / "dir" / "train-00000.ndp"
    data = info.path.read_bytes()
    assert data == stream.data and data[0] == 0xAA
    index = read_index(info.path.with_name("train-00000.ndp.idx"))
    assert index.data_offset == 0 and index.offsets.tolist() == [0, len(stream.packets[0])]


def test_writer_records_src_dst_typ(tmp_path):
    packets = [
        encode_tokens([1], width=2, src=2, dst=5),
        encode_tokens([1, 2], mask=[1, 0], src=5, dst=3),
    ]
    (info,) = write_shards(tmp_path, packets)
    e = read_index(index_path_for(info.path)).entries
    assert e["src"].tolist() == [2, 5]
    assert e["dst"].tolist() == [5, 3]
    assert e["typ"].tolist() == [0x02, 0x11]
    assert bytes(e["pad"][0]) == bytes(3)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview,
                                  lambda b: np.frombuffer(b, np.uint8)],
                         ids=["bytes", "bytearray", "memoryview", "ndarray"])
def test_writer_accepts_buffers(tmp_path, kind):
    # LEN > 255 so its high byte matters (a uint8 array's packet[4] << 8 would wrap)
    stream = ramp_stream([100, 3, 700], width=[4, 2, 4], masked=[False, True, False])
    (info,) = write_shards(tmp_path, [kind(p) for p in stream.packets])
    assert info.path.read_bytes() == ramp_stream([100, 3, 700], width=[4, 2, 4],
                                                 masked=[False, True, False], header=True).data
    e = read_index(index_path_for(info.path)).entries
    assert e["length"].tolist() == [400, 2 + 6 + 1, 2800]
    assert e["typ"].tolist() == [0x01, 0x12, 0x01]
    assert e["offset"].tolist() == [32 + o for o in stream.offsets]


def test_writer_no_tmp_left_after_close(tmp_path):
    stream = ramp_stream([4, 4])
    writer = ShardWriter(tmp_path)
    for p in stream.packets:
        writer.write(p)
    assert _listing(tmp_path) == ["shard-00000.ndp.tmp"]  # nothing under a final name yet
    infos = writer.close()
    assert _listing(tmp_path) == ["ndp.json", "shard-00000.ndp", "shard-00000.ndp.idx"]
    assert [i.path.name for i in infos] == ["shard-00000.ndp"]
    assert writer.close() == infos  # closing twice is harmless
    (entry,) = read_manifest(tmp_path)["shards"]  # the commit record, written last
    assert entry == {"name": "shard-00000.ndp", "bytes": infos[0].size, "packets": 2,
                     "crc32": infos[0].crc32}


def test_a_second_writer_adds_to_the_manifest_and_an_interrupted_one_commits_nothing(tmp_path):
    write_shards(tmp_path, ramp_stream([4, 4]).packets, prefix="a")
    write_shards(tmp_path, ramp_stream([5]).packets, prefix="b")
    names = [e["name"] for e in read_manifest(tmp_path)["shards"]]
    assert names == ["a-00000.ndp", "b-00000.ndp"]
    with pytest.raises(KeyboardInterrupt):
        with ShardWriter(tmp_path, prefix="c", max_shard_bytes=65575) as writer:
            for p in [s.encode() for s in ramp_specs([500] * 60)]:
                writer.write(p)
            raise KeyboardInterrupt
    assert (tmp_path / "c-00000.ndp").exists()  # finished, but never committed:
    assert [e["name"] for e in read_manifest(tmp_path)["shards"]] == names
    with pytest.raises(ManifestError, match="does not list.*c-00000.ndp.*interrupted"):
        listed_shards(tmp_path)


def test_writer_exception_discards_open_shard(tmp_path):
    stream = ramp_stream([4, 4])
    with pytest.raises(RuntimeError, match="boom"):
        with ShardWriter(tmp_path) as writer:
            for p in stream.packets:
                writer.write(p)
            raise RuntimeError("boom")
    assert _listing(tmp_path) == []
    assert writer.finished == []


def test_writer_exception_keeps_finished_shards(tmp_path):
    specs = ramp_specs([500] * 60)  # 2008 bytes each, about 32 per 65,575-byte shard
    packets = [s.encode() for s in specs]
    with pytest.raises(KeyboardInterrupt):
        with ShardWriter(tmp_path, max_shard_bytes=65575) as writer:
            for p in packets:
                writer.write(p)
            raise KeyboardInterrupt
    assert _listing(tmp_path) == ["shard-00000.ndp", "shard-00000.ndp.idx"]
    assert len(writer.finished) == 1
    assert writer.finished[0].packets < len(packets)


def test_writer_no_packets_writes_nothing(tmp_path):
    with ShardWriter(tmp_path) as writer:
        pass
    assert writer.finished == [] and _listing(tmp_path) == ["ndp.json"]
    assert read_manifest(tmp_path)["shards"] == []  # committed: a dataset of no shards


def test_writer_rejects_non_packets(tmp_path):
    with ShardWriter(tmp_path) as writer:
        with pytest.raises(ShardFormatError):
            writer.write(b"\x00" * 20)
        with pytest.raises(ShardFormatError):
            writer.write(b"\xaa\x01\x01")


def test_writer_min_shard_size(tmp_path):
    with pytest.raises(ConfigError):
        ShardWriter(tmp_path, max_shard_bytes=65574)
    ShardWriter(tmp_path, max_shard_bytes=65575)


@pytest.mark.parametrize("header", [True, False])
def test_writer_rolls_over(tmp_path, header):
    rng = np.random.default_rng(7)
    lengths = rng.integers(0, 2500, size=150).tolist()
    specs = ramp_specs(lengths, width=4)
    packets = [s.encode() for s in specs]
    limit = 70_000
    infos = write_shards(tmp_path, packets, max_shard_bytes=limit, header=header)
    total = sum(len(p) for p in packets) + (32 * len(infos) if header else 0)
    assert len(infos) >= 4
    assert [i.path.name for i in infos] == [f"shard-{k:05d}.ndp" for k in range(len(infos))]
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".tmp") == []
    assert sum(i.size for i in infos) == total
    decoded = []
    for k, info in enumerate(infos):
        data = info.path.read_bytes()
        assert len(data) == info.size <= limit
        assert info.crc32 == zlib.crc32(data)
        assert data.startswith(SHARD_MAGIC) == header
        index = read_index(index_path_for(info.path))
        assert len(index) == info.packets
        assert index.shard_size == info.size and index.shard_crc32 == info.crc32
        scanned = scan_shard(Shard(info.path))
        assert scanned.corrupt == []
        assert scanned.entries["offset"].tolist() == index.offsets.tolist()
        for off in index.offsets:
            decoded.append(decode_packet(data, int(off)).tokens)
        if k + 1 < len(infos):
            # a shard is cut only when the next packet would not fit
            next_packet = packets[sum(i.packets for i in infos[: k + 1])]
            assert info.size + len(next_packet) > limit
    # every packet in exactly one shard, in order
    assert len(decoded) == len(specs)
    for got, spec in zip(decoded, specs):
        np.testing.assert_array_equal(got, spec.tokens)


def test_writer_packet_exactly_filling_shard(tmp_path):
    # header (32) + packets summing to exactly max_shard_bytes stays one shard; one more byte
    # starts the next shard
    a = encode_packet(bytes(30000), typ=0x7E)
    b = encode_packet(bytes(65575 - 32 - len(a) - 8), typ=0x7E)
    assert 32 + len(a) + len(b) == 65575
    infos = write_shards(tmp_path / "exact", [a, b, encode_tokens([1])], max_shard_bytes=65575)
    assert [(i.packets, i.size) for i in infos] == [(2, 65575), (1, 32 + 12)]
    b1 = encode_packet(bytes(65575 - 32 - len(a) - 8 + 1), typ=0x7E)
    infos = write_shards(tmp_path / "over", [a, b1], max_shard_bytes=65575)
    assert [i.packets for i in infos] == [1, 1]


# --- Shard reader ------------------------------------------------------------------------------
def test_shard_data_is_the_file_read_into_memory_never_a_mapping(ramp_shard):
    info, stream = ramp_shard
    shard = Shard(info.path)
    assert not isinstance(shard.data, np.memmap)  # a mapping cut under it would be a SIGBUS
    assert shard.data.dtype == np.uint8 and shard.data.ndim == 1
    assert shard.size == len(stream.data)
    assert bytes(shard.data) == stream.data
    assert shard.crc32() == zlib.crc32(stream.data)
    assert shard.header.version == 1 and shard.header.data_offset == 32
    assert shard.header.problem is None
    assert shard.index_path == info.path.with_name(info.path.name + ".idx")
    assert str(info.path) in repr(shard)
    with pytest.raises(ValueError):
        shard.data[0] = 0  # read-only, as the shard


def test_headerless_stream(tmp_path):
    stream = ramp_stream([3, 4, 5])
    path = tmp_path / "raw.ndp"
    path.write_bytes(stream.data)
    shard = Shard(path)
    assert stream.data[0] == 0xAA
    assert shard.header.version is None and shard.header.data_offset == 0
    assert shard.header.problem is None
    result = scan_shard(shard)
    assert result.entries["offset"].tolist() == stream.offsets and result.corrupt == []


def test_empty_file(tmp_path):
    path = tmp_path / "empty.ndp"
    path.write_bytes(b"")
    shard = Shard(path)
    assert shard.size == 0
    assert shard.header.version is None and shard.header.data_offset == 0
    assert shard.crc32() == 0
    result = scan_shard(shard)
    assert len(result.entries) == 0 and result.corrupt == []


def test_newer_version_refused(tmp_path):
    path = tmp_path / "v2.ndp"
    path.write_bytes(encode_shard_header(version=2) + encode_tokens([1, 2, 3]))
    with pytest.raises(UnsupportedVersionError, match="version 2"):
        Shard(path)


@pytest.mark.parametrize("damage_at", [9, 12, 20, 29, 30, 31])
def test_damaged_header_crc(tmp_path, damage_at):
    stream = ramp_stream([3, 0, 9], header=True)
    data = bytearray(stream.data)
    data[damage_at] ^= 0x40
    path = tmp_path / "bad.ndp"
    path.write_bytes(bytes(data))
    shard = Shard(path)  # a damaged header is reported, not fatal
    assert shard.header.problem is not None and "CRC" in shard.header.problem
    assert shard.header.version is None and shard.header.data_offset == 32
    result = scan_shard(shard)
    assert result.entries["offset"].tolist() == stream.offsets
    assert result.corrupt == []
    for off, spec in zip(result.entries["offset"], stream.specs):
        np.testing.assert_array_equal(decode_packet(shard.data, int(off)).tokens, spec.tokens)


def test_damaged_newer_version_header_is_not_fatal(tmp_path):
    # version 2 but a damaged CRC: cannot trust the version, so read the packets
    data = bytearray(encode_shard_header(version=2) + encode_tokens(ramp(0, 4)))
    data[20] ^= 1
    path = tmp_path / "x.ndp"
    path.write_bytes(bytes(data))
    shard = Shard(path)
    assert shard.header.problem is not None
    assert scan_shard(shard).entries["offset"].tolist() == [32]


def test_damaged_magic_is_headerless_with_leading_garbage(tmp_path):
    stream = ramp_stream([3, 4], header=True)
    data = bytearray(stream.data)
    data[1] ^= 0x01
    path = tmp_path / "m.ndp"
    path.write_bytes(bytes(data))
    shard = Shard(path)
    assert shard.header.data_offset == 0
    result = scan_shard(shard)
    assert result.entries["offset"].tolist() == stream.offsets
    assert [(c.offset, c.length) for c in result.corrupt] == [(0, 32)]


def test_stream_helper_matches_writer(tmp_path):
    # the conftest helper and the writer agree on the bytes of a shard
    specs = ramp_specs([1, 2, 3], width=[4, 2, 4], masked=[True, False, False])
    stream = build_stream([s.encode() for s in specs], header=True)
    (info,) = write_shards(tmp_path, stream.packets)
    assert info.path.read_bytes() == stream.data
    assert SHARD_HEADER_BYTES == stream.offsets[0]


def test_writer_refuses_a_packet_whose_length_disagrees_with_its_len(tmp_path):
    packet = encode_tokens([1, 2, 3])
    with ShardWriter(tmp_path) as writer:
        with pytest.raises(ShardFormatError, match="LEN says"):
            writer.write(packet + b"\x00")
        with pytest.raises(ShardFormatError, match="LEN says"):
            writer.write(packet[:-1])
        writer.write(packet)
    assert len(read_index(str(writer.finished[0].path) + ".idx")) == 1


# --- what is not a regular file is refused before it is opened ---------------------------------
def _run_with_timeout(code: str, cwd) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, killed after 120 s: opening a FIFO for reading blocks
    until a writer comes, so a regression must fail this test, never hang the suite."""
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_a_fifo_named_like_a_shard_is_refused_without_opening_it(tmp_path):
    import os

    write_shards(tmp_path, [s.encode() for s in ramp_specs([3, 4])])
    fifo = tmp_path / "zz.ndp"
    os.mkfifo(fifo)
    code = (
        "import sys\n"
        "from ndp.errors import ShardFormatError\n"
        "from ndp.store.shard import Shard\n"
        "from ndp.store.corpus import Corpus\n"
        f"for make in (lambda: Shard({str(fifo)!r}),\n"
        f"             lambda: Corpus({str(tmp_path)!r}, manifest='ignore')):\n"
        "    try:\n"
        "        make()\n"
        "    except ShardFormatError as exc:\n"
        "        print('REFUSED', exc)\n"
    )
    result = _run_with_timeout(code, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("REFUSED")]
    assert len(lines) == 2, result.stdout
    for line in lines:
        assert str(fifo) in line and "a FIFO, not a regular file" in line


def test_a_directory_named_like_a_shard_is_refused(tmp_path):
    (tmp_path / "d.ndp").mkdir()
    with pytest.raises(ShardFormatError, match="a directory, not a regular file"):
        Shard(tmp_path / "d.ndp")


# --- whole-shard reads: pread in blocks, never a mapping -------------------------------------
def test_blocks_cover_the_file_once_in_order(tmp_path):
    stream = ramp_stream(list(range(0, 400, 7)), header=True)
    path = tmp_path / "s.ndp"
    path.write_bytes(stream.data)
    shard = Shard(path)
    got = [(at, bytes(block)) for at, block in shard.blocks(block=1000)]
    assert [at for at, _ in got] == list(range(0, len(stream.data), 1000))
    assert b"".join(b for _, b in got) == stream.data
    assert b"".join(bytes(b) for _, b in shard.blocks(40, 2500, block=700)) == stream.data[40:2500]
    assert shard.crc32() == zlib.crc32(stream.data)


def test_packet_blocks_hold_whole_packets_in_runs_of_at_most_a_block(tmp_path):
    stream = ramp_stream([5, 300, 0, 16383, 2, 40, 16383, 7], header=True)
    path = tmp_path / "s.ndp"
    path.write_bytes(stream.data)
    offsets = np.array(stream.offsets, np.int64)
    ends = np.array([stream.span(k)[1] for k in range(len(stream.offsets))], np.int64)
    seen = []
    for i, j, data, at in Shard(path).packet_blocks(offsets, ends, block=5000):
        assert data.shape[0] <= 5000 or j == i + 1  # a run, or one packet larger than a block
        for k, a in zip(range(i, j), at.tolist()):
            assert bytes(data[a: a + ends[k] - offsets[k]]) == stream.packets[k]
        seen += range(i, j)
    assert seen == list(range(len(stream.offsets)))


CUT_UNDER_DATA = """
import os, sys
from ndp.errors import ShardChangedError
from ndp.store.shard import Shard
path, size = sys.argv[1], int(sys.argv[2])
shard = Shard(path)
os.truncate(path, size // 2)  # cut after it was opened, before its bytes are read
try:
    print("READ", shard.data.shape[0])
except ShardChangedError as exc:
    print("REFUSED", exc)
data = Shard(path).data  # the file as it is now, read whole
os.truncate(path, 0)  # cut while its bytes are held: a mapping would SIGBUS on the next touch
print("SUM", int(data.astype("int64").sum()))
"""


def test_shard_data_of_a_cut_shard_is_an_error_or_its_bytes_never_a_sigbus(tmp_path):
    """``Shard.data`` once memory-mapped the file: a shard cut before it was mapped came back
    short without a word, and one cut while mapped killed the process (SIGBUS, exit -7)."""
    stream = ramp_stream([100] * 50, header=True)
    path = tmp_path / "s.ndp"
    path.write_bytes(stream.data)
    result = subprocess.run([sys.executable, "-c", CUT_UNDER_DATA, str(path),
                             str(len(stream.data))], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    refused, total = result.stdout.splitlines()
    assert refused.startswith(f"REFUSED {path}: ") and "while ndp read it" in refused
    assert total == f"SUM {sum(stream.data[: len(stream.data) // 2])}"
