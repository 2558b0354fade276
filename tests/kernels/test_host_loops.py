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

from ndp.format import IGNORE_INDEX, TYP_MASKED_TABLE, TYP_WIDTH_TABLE
from ndp.kernels.build import copy_ids, copy_labels, fill, in_loss, token_at, token_layout
from ndp.kernels.crc16 import CRC16_TABLES, crc16_update, crc16_update_host
from ndp.kernels.verdict import EMPTY, OK, TOKEN_RANGE, largest_id, usable
from ndp.packet import encode_tokens

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
