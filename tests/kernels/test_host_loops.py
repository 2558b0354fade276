"""The host's vectorized loops against the plain per-item loops they replaced.

The CPU kernels index with unsigned integers and avoid early exits so that LLVM vectorizes them
(``kernels/crc16.py``, ``kernels/build.py``, ``kernels/verdict.py``); these tests hold each such
loop to the simple definition at every length around the vector widths (tails included), at
every alignment, and at the edges of what it checks.
"""

from __future__ import annotations

import binascii

import numpy as np
import pytest

from ndp.wire.format import IGNORE_INDEX, TYP_MASKED_TABLE, TYP_WIDTH_TABLE
from ndp.kernels.build import copy_ids, copy_labels, fill, in_loss, token_at, token_layout
from ndp.wire.format import CRC16_POLY
from ndp.kernels import clmul
from ndp.kernels.crc16 import (
    CLMUL_FROM_BYTES,
    CRC16_TABLES,
    crc16_update,
    crc16_update_host,
    crc16_update_tables,
)
from ndp.kernels.verdict import EMPTY, OK, TOKEN_RANGE, largest_id, usable
from ndp.wire.packet import encode_tokens

RNG = np.random.default_rng(20261123)


def test_host_crc_equals_the_device_loop_and_binascii():
    data = RNG.integers(0, 256, 200, dtype=np.uint8)
    for start in range(18):
        for n in range(0, 70):
            stop = start + n
            want = binascii.crc_hqx(data[start:stop].tobytes(), 0xFFFF)
            assert crc16_update_host(np.uint32(0xFFFF), data, start, stop, CRC16_TABLES) == want
            assert crc16_update(np.uint32(0xFFFF), data, start, stop, CRC16_TABLES) == want


def test_host_crc_continues_from_any_state():
    data = RNG.integers(0, 256, 100, dtype=np.uint8)
    for init in (0, 0x1234, 0xFFFF):
        mid = crc16_update_host(np.uint32(init), data, 0, 37, CRC16_TABLES)
        assert crc16_update_host(mid, data, 37, 100, CRC16_TABLES) == binascii.crc_hqx(
            data.tobytes(), init)


# lengths around the switch to carry-less folding, its 64-byte strides and 16-byte blocks
LONG_LENGTHS = [*range(CLMUL_FROM_BYTES - 2, CLMUL_FROM_BYTES + 70), 255, 256, 257, 1023, 2050,
                4096, 8191, 8192, 8193, 65_541]


def test_host_crc_equals_binascii_on_long_ranges_from_any_state():
    data = RNG.integers(0, 256, 70_000, dtype=np.uint8)
    for n in LONG_LENGTHS:
        start = int(RNG.integers(0, 33))
        init = int(RNG.integers(0, 1 << 16))
        want = binascii.crc_hqx(data[start:start + n].tobytes(), init)
        assert crc16_update_host(np.uint32(init), data, start, start + n, CRC16_TABLES) == want
        assert crc16_update_tables(np.uint32(init), data, start, start + n, CRC16_TABLES) == want


def test_host_crc_reads_a_strided_buffer_byte_by_byte():
    every_other = RNG.integers(0, 256, 6000, dtype=np.uint8)[::2]  # not contiguous
    for n in (CLMUL_FROM_BYTES, 1000, 2999):
        want = binascii.crc_hqx(every_other[1:1 + n].tobytes(), 0xFFFF)
        assert crc16_update_host(np.uint32(0xFFFF), every_other, 1, 1 + n, CRC16_TABLES) == want


@pytest.mark.skipif(not clmul.HAS_CLMUL, reason="no PCLMULQDQ here: the table loop serves")
def test_carry_less_folding_stops_at_the_last_whole_block_with_the_table_loops_state():
    data = RNG.integers(0, 256, 9000, dtype=np.uint8)
    for n in (64, 65, 79, 80, 127, 128, 143, 144, 1000, 8192):
        for start in (0, 1, 7, 8, 15):
            crc, pos = clmul.crc16_update_clmul(np.uint32(0x1D0F), data, np.uint64(start),
                                                start + n, CRC16_TABLES)
            assert pos == start + n - n % 16
            assert crc == crc16_update_tables(np.uint32(0x1D0F), data, start, pos, CRC16_TABLES)


def test_host_crc_catches_every_flipped_bit_and_swapped_bytes_in_a_long_packet():
    data = RNG.integers(0, 256, 4096, dtype=np.uint8)
    good = crc16_update_host(np.uint32(0xFFFF), data, 0, 4096, CRC16_TABLES)
    for at in RNG.choice(4096 * 8, 300, replace=False):
        bad = data.copy()
        bad[at // 8] ^= np.uint8(1 << (at % 8))
        assert crc16_update_host(np.uint32(0xFFFF), bad, 0, 4096, CRC16_TABLES) != good
    swapped = data.copy()
    swapped[[1000, 3000]] = swapped[[3000, 1000]]
    if swapped[1000] != data[1000]:
        assert crc16_update_host(np.uint32(0xFFFF), swapped, 0, 4096, CRC16_TABLES) != good


def test_fold_constants_are_powers_of_x_modulo_the_polynomial():
    assert [clmul.x_pow_mod(n) for n in range(16)] == [1 << n for n in range(16)]
    assert clmul.x_pow_mod(16) == CRC16_POLY  # x^16 = poly (mod x^16 + poly)
    # x^(a+b) = x^a * x^b: the table loop's CRC of one byte then b zero bytes is x^(8+8b+8) ...
    for byte_row in range(1, 16):  # ... so table row k at byte 1 is x^(8k+16) mod P
        assert CRC16_TABLES[byte_row, 1] == clmul.x_pow_mod(8 * byte_row + 16)


def test_carry_less_loop_is_off_where_numba_targets_a_chosen_cpu(monkeypatch):
    monkeypatch.setattr(clmul.numba.config, "CPU_NAME", "generic")
    monkeypatch.setattr(clmul.numba.config, "CPU_FEATURES", "")
    assert not clmul._host_has_pclmul()
    monkeypatch.setattr(clmul.numba.config, "CPU_NAME", None)

    def unreadable():
        raise RuntimeError("failed to get host cpu features")

    monkeypatch.setattr(clmul.llb, "get_host_cpu_features", unreadable)
    assert not clmul._host_has_pclmul()
    monkeypatch.setattr(clmul.numba.config, "DISABLE_JIT", True)
    assert not clmul._host_has_pclmul()


@pytest.mark.parametrize("width", [2, 4])
def test_largest_id_finds_the_largest_at_every_position(width):
    top = (1 << (8 * width)) - 1
    for n in range(1, 41):
        for at in range(n):
            ids = RNG.integers(0, 1000, n)
            ids[at] = top - at  # the largest, anywhere, tails included
            buf = np.frombuffer(b"\x00" * 3 + ids.astype(f">u{width}").tobytes(), np.uint8)
            assert largest_id(buf, 3, n, width) == top - at


@pytest.mark.parametrize("width", [2, 4])
def test_usable_drops_an_id_at_the_vocabulary_size_and_keeps_one_below(width):
    vocab = 50257 if width == 2 else 100_000
    assert usable(0, 0, width, np.zeros(4, np.uint8), vocab) == EMPTY
    for n in (1, 7, 16, 33):
        for at in (0, n // 2, n - 1):
            for value, want in ((vocab - 1, OK), (vocab, TOKEN_RANGE)):
                ids = np.arange(n) % 97
                ids[at] = value
                buf = np.frombuffer(ids.astype(f">u{width}").tobytes(), np.uint8)
                assert usable(n, 0, width, buf, vocab) == want, (n, at, value)


@pytest.mark.parametrize("width,masked", [(2, False), (2, True), (4, False), (4, True)])
def test_copy_ids_and_labels_equal_the_per_token_definition(width, masked):
    n = 45
    ids = (np.arange(n) * 7919 + 3) % (1 << (8 * width - 1))
    mask = RNG.integers(0, 2, n).astype(bool) if masked else None
    shard = np.frombuffer(encode_tokens(ids, width=width, mask=mask), np.uint8)
    count, tok, mask_at, w = token_layout(shard, 0, TYP_WIDTH_TABLE, TYP_MASKED_TABLE)
    assert (count, w) == (n, width)
    for t in (0, 1, 5, 17):
        for m in (0, 1, 8, n - t):
            out = np.full(m + 9, -7, np.int64)
            lab = np.full(m + 9, -7, np.int64)
            copy_ids(shard, tok, t, m, w, out, 4)
            copy_labels(shard, tok, mask_at, t, m, w, lab, 4)
            want = [token_at(shard, tok, t + k, w) for k in range(m)]
            want_lab = [v if in_loss(shard, mask_at, t + k) else IGNORE_INDEX
                        for k, v in enumerate(want)]
            assert out[4:4 + m].tolist() == want
            assert lab[4:4 + m].tolist() == want_lab
            assert (out[:4] == -7).all() and (out[4 + m:] == -7).all()  # nothing else written
            assert (lab[:4] == -7).all() and (lab[4 + m:] == -7).all()


def test_fill_writes_only_its_range():
    out = np.zeros(40, np.int64)
    fill(out, 3, 29, -100)
    assert out.tolist() == [0] * 3 + [-100] * 26 + [0] * 11
    fill(out, 5, 5, 9)  # empty
    fill(out, 7, 2, 9)  # hi below lo: empty
    assert (out == 9).sum() == 0


def _documents_by_token(doc_cum, start, wins, windows, seq):
    """``build_documents_cpu``'s definition, token by token: token ``j`` of window ``b`` counts
    from its document's start, or the window's, and has its document's number in the window."""
    pos = np.zeros((windows, seq), np.int64)
    ids = np.zeros((windows, seq), np.int32)
    for b in range(windows):
        s = int(wins[b]) if wins.shape[0] else start + b * seq
        d0 = int(np.searchsorted(doc_cum, s, side="right")) - 1
        for j in range(seq):
            d = int(np.searchsorted(doc_cum, s + j, side="right")) - 1
            pos[b, j] = s + j - max(int(doc_cum[d]), s)
            ids[b, j] = d - d0
    return pos, ids


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("seq", [1, 7, 16, 33])
def test_documents_are_written_a_document_at_a_time_as_the_per_token_definition(seq, aligned):
    """Documents shorter and longer than a window, empty ones (a start repeated), one starting
    at a window's first or last token, and windows past the last document's start."""
    from ndp.kernels.build import build_documents_cpu

    for trial in range(20):
        lengths = RNG.choice([0, 1, 2, seq - 1, seq, seq + 1, 3 * seq, 50], size=40)
        doc_cum = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        start = int(RNG.integers(0, 5))
        windows = int(RNG.integers(1, 12))
        wins = (np.sort(RNG.integers(start, int(doc_cum[-1]) + seq, windows)).astype(np.int64)
                if aligned else np.zeros(0, np.int64))
        pos = np.full((windows, seq), -7, np.int64)
        ids = np.full((windows, seq), -7, np.int32)
        build_documents_cpu(doc_cum, start, wins, pos, ids)
        want_pos, want_ids = _documents_by_token(doc_cum, start, wins, windows, seq)
        np.testing.assert_array_equal(pos, want_pos, err_msg=f"trial {trial}")
        np.testing.assert_array_equal(ids, want_ids, err_msg=f"trial {trial}")
