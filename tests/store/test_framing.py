"""The framing scan a block at a time (``ndp.store.framing``) finds exactly what the scan of the
whole file as one array finds (``ndp.store.index.scan``), with blocks small enough that packets
and corrupt regions straddle block boundaries everywhere, and a shard cut while it is scanned is
a ``ShardChangedError`` naming it."""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

from ndp.errors import ConfigError, ShardChangedError
from ndp.store.framing import pieces, scan_blocks
from ndp.store.index import scan
from ndp.store.shard import Shard, encode_shard_header
from ndp.wire.format import MAX_PACKET_BYTES
from ndp.wire.packet import encode_packet, encode_tokens

from ndp_test_helpers import ramp

#: a window decides this many bytes before handing on (the rest overlaps the next window)
STEP = 3000
BLOCKS = (MAX_PACKET_BYTES + STEP, MAX_PACKET_BYTES + 4099, 200_000, 1 << 23)


def damaged_stream(seed: int) -> bytes:
    """Ramp packets of both widths, some long (up to 64 KB, longer than a window's step), with
    garbage runs, flipped bits, cut packets and valid frames of an undefined TYP between."""
    rng = np.random.default_rng(seed)
    parts = [encode_shard_header()] if seed % 2 else []
    for k in range(int(rng.integers(40, 160))):
        r = rng.random()
        if r < 0.1:
            parts.append(rng.integers(0, 256, int(rng.integers(1, 9000)), np.uint8).tobytes())
        elif r < 0.15:
            parts.append(encode_packet(bytes(int(rng.integers(0, 300))), typ=0x7E))
        else:
            n = int(rng.integers(0, 16000 if rng.random() < 0.2 else 400))
            packet = bytearray(encode_tokens(ramp(k, n) % 65000, width=int(rng.choice([2, 4]))))
            if rng.random() < 0.1:
                packet[int(rng.integers(0, len(packet)))] ^= 0x10
            if rng.random() < 0.05:
                packet = packet[: int(rng.integers(1, len(packet)))]
            parts.append(bytes(packet))
    return b"".join(parts)


def as_tuples(result) -> list[tuple[int, int, int]]:
    return [(c.offset, c.length, int(c.reason)) for c in result.corrupt]


def check_same_as_one_array(path, raw: bytes, blocks=BLOCKS) -> None:
    shard = Shard(path)
    whole = scan(np.frombuffer(raw, np.uint8), shard.header.data_offset)
    for block in blocks:
        entries, corrupt, crc = scan_blocks(shard, block=block)
        assert np.array_equal(entries, whole.entries), block
        assert corrupt == as_tuples(whole), block
        assert crc == zlib.crc32(raw)


@pytest.mark.parametrize("seed", range(12))
def test_blocks_find_what_the_whole_file_scan_finds(tmp_path, seed):
    raw = damaged_stream(seed)
    assert len(raw) > 3 * (MAX_PACKET_BYTES + STEP)  # many windows, every kind of straddle
    path = tmp_path / "s.ndp"
    path.write_bytes(raw)
    check_same_as_one_array(path, raw)


def test_a_region_open_at_a_window_limit_resyncs_as_the_whole_scan_does(tmp_path):
    """Garbage runs past a window's limit: the next window goes on looking for a resync point,
    where a frame that validates with an undefined TYP is not one (the scan steps past it, as
    inside one array) and a token packet is. Placed at the limit, one byte before and after."""
    good = encode_tokens(ramp(1, 50), width=4)
    odd = encode_packet(bytes(40), typ=0x7E)  # frames, CRC good, TYP undefined
    block = MAX_PACKET_BYTES + STEP
    for shift in (-1, 0, 1, 9):
        head = good * 3
        garbage = b"\x00" * (STEP - len(head) + shift)  # ends at the first window's limit
        tail = good * (2 + (MAX_PACKET_BYTES + STEP) // len(good))  # the file outgrows a block
        raw = head + garbage + odd + b"\x01" * 17 + good + odd + tail
        path = tmp_path / f"s{shift}.ndp"
        path.write_bytes(raw)
        whole = scan(np.frombuffer(raw, np.uint8))
        # the odd frame inside the garbage is garbage; the one at a packet start is a packet
        assert [c.offset for c in whole.corrupt] == [len(head)]
        assert whole.corrupt[0].length == len(garbage) + len(odd) + 17
        assert whole.entries.shape[0] == 3 + 2 + len(tail) // len(good)
        check_same_as_one_array(path, raw, blocks=(block, block + 1, block + 50))


def test_packets_of_the_largest_size_straddle_every_boundary(tmp_path):
    raw = b"".join(encode_tokens(ramp(k, 16383), width=4) for k in range(6))
    path = tmp_path / "big.ndp"
    path.write_bytes(raw)
    check_same_as_one_array(path, raw, blocks=(MAX_PACKET_BYTES + 1 + 7, MAX_PACKET_BYTES + 333))


@pytest.mark.parametrize("raw", [b"", encode_shard_header(), encode_shard_header()[:20],
                                 b"\xaa" * 5], ids=["empty", "header", "cut-header", "sync"])
def test_tiny_files(tmp_path, raw):
    path = tmp_path / "t.ndp"
    path.write_bytes(raw)
    check_same_as_one_array(path, raw, blocks=(MAX_PACKET_BYTES + STEP,))


def test_a_block_must_hold_more_than_one_largest_packet(tmp_path):
    path = tmp_path / "s.ndp"
    path.write_bytes(encode_tokens(ramp(0, 3)))
    with pytest.raises(ConfigError, match="largest packet"):
        list(pieces(Shard(path), block=MAX_PACKET_BYTES))


def test_a_piece_holds_each_packet_it_lists_whole(tmp_path):
    raw = damaged_stream(3)
    path = tmp_path / "s.ndp"
    path.write_bytes(raw)
    seen = 0
    for piece in pieces(Shard(path), block=MAX_PACKET_BYTES + STEP):
        for at in piece.offsets.tolist():
            n = int(piece.data[at + 4]) << 8 | int(piece.data[at + 5])
            assert at + 8 + n <= piece.data.shape[0]
            start = piece.base + at
            assert bytes(piece.data[at: at + 8 + n]) == raw[start: start + 8 + n]
        seen += piece.new.shape[0]
    assert seen == len(raw)  # every byte read once as new, whatever the overlap


def test_a_shard_cut_between_two_block_reads_is_a_shard_changed_error(tmp_path, monkeypatch):
    raw = b"".join(encode_tokens(ramp(k, 500), width=4) for k in range(200))  # 400 KB
    path = tmp_path / "s.ndp"
    path.write_bytes(raw)
    shard = Shard(path)
    real = Shard.read_into

    def read_then_cut(self, offset, out):
        real(self, offset, out)
        os.truncate(path, len(raw) // 2)  # after the first block: the next read comes up short

    monkeypatch.setattr(Shard, "read_into", read_then_cut)
    with pytest.raises(ShardChangedError, match="cut or changed while ndp read it") as err:
        scan_blocks(shard, block=MAX_PACKET_BYTES + STEP)
    assert str(path) in str(err.value)


def test_a_shard_changed_after_its_last_block_is_a_shard_changed_error(tmp_path):
    raw = b"".join(encode_tokens(ramp(k, 50), width=2) for k in range(20))
    path = tmp_path / "s.ndp"
    path.write_bytes(raw)
    shard = Shard(path)
    scan_iter = pieces(shard)
    next(scan_iter)  # the whole file, in one window
    with open(path, "ab") as f:
        f.write(encode_tokens(ramp(99, 5)))  # appended after it was read
    with pytest.raises(ShardChangedError, match="changed while ndp read it") as err:
        next(scan_iter)
    assert str(path) in str(err.value)
