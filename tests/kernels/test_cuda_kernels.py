"""Every CUDA kernel against its CPU reference, bit for bit, one kernel at a time.

Without a GPU this runs under Numba's CUDA simulator (see ``tests/conftest.py``): tiny grids,
grid-stride loops and inputs of a few KB keep it to seconds. With a GPU the same comparisons
run on the device. The grids here are deliberately smaller than the work, so every kernel's
grid-stride loop runs more than one round.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda

from ndp.wire.format import TYP_MASKED_TABLE, TYP_SKIP_TABLE, TYP_WIDTH_TABLE, DropReason
from ndp.wire.packet import encode_tokens
from ndp.loader.layouts import packing
from ndp.kernels import build_cuda, verdict_cuda
from ndp.kernels.build import build_packed_cpu, build_packing_cpu, build_padded_cpu
from ndp.kernels.crc16 import CRC16_TABLES, validate_packets_cpu
from ndp.kernels.stage import gather_packets, staged_size
from ndp.kernels.verdict import NO_VOCAB, status_of, tokens_of, verdicts_cpu

from ndp_test_helpers import base_stream, corrupt, corruption, drop_case

W, M, S = (cuda.to_device(t) for t in (TYP_WIDTH_TABLE, TYP_MASKED_TABLE, TYP_SKIP_TABLE))
#: threads per block here: several, whatever the engine uses, so threads share the work (and
#: under the simulator few, which keeps it fast)
BLOCK = 4
TABLES = cuda.to_device(CRC16_TABLES)
NO_LIMITS = cuda.device_array(0, np.int64)


def gpu_verdicts(data: np.ndarray, offsets: np.ndarray, limits=None, grid: int = 2,
                 vocab: int = NO_VOCAB, lanes: int = 1) -> np.ndarray:
    """The device's verdicts: one thread a packet, or ``lanes`` threads a packet (blocks of two
    packets' lanes, so a block's groups share its barriers)."""
    out = cuda.device_array(offsets.shape[0], np.int64)
    out.copy_to_device(np.full(offsets.shape[0], 999, np.int64))  # poisoned: all written?
    lim = NO_LIMITS if limits is None else cuda.to_device(limits)
    args = (cuda.to_device(data), cuda.to_device(offsets), lim, out, TABLES, W, M, S,
            np.int64(vocab))
    if lanes == 1:
        verdict_cuda.verdicts_cuda[grid, BLOCK](*args)
    else:
        verdict_cuda.verdicts_lanes_cuda[grid, 2 * lanes](*args, np.int64(lanes))
    return out.copy_to_host()


def cpu_verdicts(data: np.ndarray, offsets: np.ndarray, limits=None,
                 vocab: int = NO_VOCAB) -> np.ndarray:
    out = np.empty(offsets.shape[0], np.int64)
    verdicts_cpu(data, offsets, np.zeros(0, np.int64) if limits is None else limits, out, vocab)
    return out


def cpu_status(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    status = np.empty(offsets.shape[0], np.uint8)
    validate_packets_cpu(data, offsets, status)
    return status


@pytest.mark.parametrize("lanes", [1, 3, 4])
def test_verdicts_for_every_drop_reason(lanes):
    data, offsets, expected = drop_case()
    data = np.frombuffer(data, np.uint8)
    offs = np.array(offsets, np.int64)
    got = gpu_verdicts(data, offs, lanes=lanes)
    np.testing.assert_array_equal(got, cpu_verdicts(data, offs))
    np.testing.assert_array_equal(status_of(got), cpu_status(data, offs))  # validation's codes
    names = ["ok" if v >= 0 else DropReason(-v).name for v in got]
    assert names == expected


def test_verdicts_of_staged_packets_are_the_verdicts_they_get_in_the_shard():
    """Gathering packets out of a shard (host staging) changes no verdict, hostile offsets and
    a LEN running past the shard's end included."""
    data, offsets, _ = drop_case()
    data = np.frombuffer(data, np.uint8)
    offs = np.array(offsets[::-1] + offsets[:3], np.int64)  # another order, repeats
    sizes = np.empty(offs.shape[0], np.int64)
    total = staged_size(data, offs, sizes)
    staged = np.zeros(total + 5, np.uint8)  # slack past the end must not change anything
    new_offs = np.empty_like(offs)
    limits = np.empty_like(offs)
    gather_packets(data, offs, sizes, staged, new_offs, limits)
    want = cpu_verdicts(data, offs)
    np.testing.assert_array_equal(gpu_verdicts(staged, new_offs, limits), want)
    np.testing.assert_array_equal(cpu_verdicts(staged, new_offs, limits), want)


def test_a_packet_running_past_its_limit_is_truncated_whatever_follows():
    """Two shards back to back in one buffer (the device arena): the first one's last packet
    claims more bytes than its shard has; the second shard's bytes must not complete it."""
    data, offsets, _ = drop_case()
    first = np.frombuffer(data, np.uint8)
    buffer = np.concatenate([first[:-3], first])
    offs = np.array(offsets, np.int64)
    limits = np.full(offs.shape[0], first.shape[0] - 3, np.int64)
    want = cpu_verdicts(first[:-3], offs)
    assert (want == -int(DropReason.TRUNCATED)).any()
    np.testing.assert_array_equal(gpu_verdicts(buffer, offs, limits), want)
    np.testing.assert_array_equal(cpu_verdicts(buffer, offs, limits), want)


@settings(max_examples=12)
@given(st.lists(corruption, min_size=1, max_size=3), st.lists(st.integers(-50, 2000), max_size=5),
       st.sampled_from([1, 2, 4]))
def test_verdicts_property_corrupted(ops, hostile, lanes):
    base = base_stream()
    data = np.frombuffer(corrupt(base.data, ops), np.uint8)
    offs = np.array(list(base.offsets) + hostile, np.int64)
    np.testing.assert_array_equal(gpu_verdicts(data, offs, grid=1, lanes=lanes),
                                  cpu_verdicts(data, offs))


def test_lanes_share_long_packets_and_their_token_range_checks():
    """Packets long enough that every lane has chunks (and some lanes a chunk more than
    others), one id past the vocabulary in a late lane's share, a flipped byte in another lane's
    share, limits from two shards: the verdicts of 1, 2, 4 and 8 lanes a packet are the CPU's."""
    rng = np.random.default_rng(5)
    packets = [encode_tokens(rng.integers(0, 900, n), width=w, mask=m)
               for n, w, m in [(61, 4, None), (130, 2, [1, 0] * 65), (1, 4, None), (97, 4, None),
                               (200, 2, None), (33, 4, [1] * 33)]]
    bad = bytearray(packets[4])
    bad[300] ^= 0x10  # BAD_CRC, in a late chunk
    packets[4] = bytes(bad)
    high = bytearray(packets[3])
    high[6 + 4 * 90: 6 + 4 * 91] = (5000).to_bytes(4, "big")  # id 5000 >= vocab, CRC redone
    import binascii
    high[-2:] = binascii.crc_hqx(bytes(high[:-2]), 0xFFFF).to_bytes(2, "big")
    packets[3] = bytes(high)
    data = np.frombuffer(b"".join(packets), np.uint8)
    offs = np.concatenate([[0], np.cumsum([len(p) for p in packets])[:-1]]).astype(np.int64)
    limits = np.full(offs.shape[0], data.shape[0], np.int64)
    limits[:2] = offs[2] - 1  # the second packet runs past its shard's end
    want = cpu_verdicts(data, offs, limits, vocab=1000)
    assert {-int(DropReason.BAD_CRC), -int(DropReason.TOKEN_RANGE),
            -int(DropReason.TRUNCATED)} <= set(want.tolist())
    for lanes in (1, 2, 4, 8):
        got = gpu_verdicts(data, offs, limits, grid=2, vocab=1000, lanes=lanes)
        np.testing.assert_array_equal(got, want, err_msg=f"{lanes} lanes")


@pytest.mark.parametrize("mean, lanes", [(40, 1), (255, 1), (256, 2), (1024, 8), (4106, 32),
                                          (1 << 20, 32)])
def test_lanes_grow_with_the_packets(mean, lanes):
    assert verdict_cuda.lanes_for(mean) == lanes


def _rows(data, offs):
    v = cpu_verdicts(data, offs)
    rows = np.flatnonzero(v >= 0).astype(np.int64)
    return rows, tokens_of(v)[rows]


@pytest.mark.parametrize("max_len", [1, 7, 16, 40])
def test_build_padded_matches_reference(max_len):
    data, offsets, _ = drop_case()
    data = np.frombuffer(data, np.uint8)
    offs = np.array(offsets, np.int64)
    rows, _ = _rows(data, offs)
    r = rows.shape[0]
    out = [cuda.device_array((r + 2, max_len), np.int64) for _ in range(3)]
    build_cuda.build_padded_cuda[2, BLOCK](
        cuda.to_device(data), cuda.to_device(offs), cuda.to_device(rows), np.int64(-7), *out, W, M
    )
    ref = [np.empty((r + 2, max_len), np.int64) for _ in range(3)]
    build_padded_cpu(data, offs, rows, -7, *ref)
    for got, want in zip(out, ref):
        np.testing.assert_array_equal(got.copy_to_host()[:r], want[:r])


def _stream_case():
    base = base_stream()
    data = np.frombuffer(base.data, np.uint8)
    offs = np.array(base.offsets, np.int64)
    return data, offs


@pytest.mark.parametrize("windows,seq_len,start,aligned",
                         [(1, 1, 0, False), (3, 5, 0, False), (2, 17, 9, False),
                          (4, 8, 3, False), (3, 5, 0, True), (2, 7, 0, True)])
def test_build_packed_matches_reference(windows, seq_len, start, aligned):
    """Windows from ``start`` on, or (``aligned``) each at a row's start, some not a window
    after the one before (``wins``: windows aligned to documents, ``ndp.loader.layouts.align``)."""
    data, offs = _stream_case()
    rows, tokens = _rows(data, offs)
    cum = np.concatenate([[0], np.cumsum(tokens)]).astype(np.int64)
    wins = np.zeros(0, np.int64)
    if aligned:  # every other row's start that leaves a whole window before the total
        fit = cum[:-1][cum[:-1] + seq_len + 1 <= cum[-1]]
        wins = np.ascontiguousarray(fit[::2][:windows], np.int64)
        assert wins.shape[0] == windows and (np.diff(wins) != seq_len).any()
    x = cuda.to_device(np.full((windows, seq_len), -1, np.int64))
    y = cuda.to_device(np.full((windows, seq_len), -1, np.int64))
    build_cuda.build_packed_cuda[2, BLOCK](
        cuda.to_device(data), cuda.to_device(offs), cuda.to_device(rows), cuda.to_device(cum),
        np.int64(start), cuda.to_device(wins) if aligned else cuda.to_device(np.zeros(1))[:0],
        x, y, W, M
    )
    rx = np.empty((windows, seq_len), np.int64)
    ry = np.empty((windows, seq_len), np.int64)
    build_packed_cpu(data, offs, rows, cum, start, wins, rx, ry)
    for b in range(windows if aligned else 0):  # each window as one window from its start
        one = [np.empty((1, seq_len), np.int64) for _ in range(2)]
        build_packed_cpu(data, offs, rows, cum, int(wins[b]), np.zeros(0, np.int64), *one)
        np.testing.assert_array_equal(rx[b:b + 1], one[0])
        np.testing.assert_array_equal(ry[b:b + 1], one[1])
    np.testing.assert_array_equal(x.copy_to_host(), rx)
    np.testing.assert_array_equal(y.copy_to_host(), ry)


@pytest.mark.parametrize("rows_per_batch,row_len", [(2, 9), (3, 16)])
def test_build_packing_matches_reference(rows_per_batch, row_len):
    """Documents (some masked, some longer than a row, some empty) placed by ``ndp.loader.layouts.packing``
    over two batches' rows; every row holds padding after its documents."""
    data, offs = _stream_case()
    rows, tokens = _rows(data, offs)
    lengths = np.minimum(tokens, row_len)
    half = rows.shape[0] // 2
    doc_packet, doc_row, doc_col, doc_len = [], [], [], []
    for b, part in enumerate((slice(0, half), slice(half, None))):
        where_row, where_col, placed = packing.plan(lengths[part], rows=rows_per_batch,
                                                    row_len=row_len)
        doc_packet.append(rows[part][:placed])
        doc_row.append(b * rows_per_batch + where_row)
        doc_col.append(where_col)
        doc_len.append(lengths[part][:placed])
    cat = [np.concatenate(p).astype(np.int64) for p in (doc_packet, doc_row, doc_col, doc_len)]
    n_rows = 2 * rows_per_batch
    row_docs = np.searchsorted(cat[1], np.arange(n_rows + 1)).astype(np.int64)
    outs = [cuda.to_device(np.full((n_rows, row_len), 77, np.int64)) for _ in range(4)]
    build_cuda.build_packing_cuda[2, BLOCK](
        cuda.to_device(data), cuda.to_device(offs), cuda.to_device(cat[0]),
        cuda.to_device(cat[2]), cuda.to_device(cat[3]), cuda.to_device(row_docs), np.int64(5),
        *outs, W, M
    )
    ref = [np.full((n_rows, row_len), 77, np.int64) for _ in range(4)]
    build_packing_cpu(data, offs, cat[0], cat[2], cat[3], row_docs, 5, *ref)
    for got, want in zip(outs, ref):
        np.testing.assert_array_equal(got.copy_to_host(), want)
    assert (ref[0] == 5).any() and (ref[2] == 1).any()  # both padding and tokens were written
