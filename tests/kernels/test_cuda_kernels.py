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

from ndp.format import TYP_MASKED_TABLE, TYP_SKIP_TABLE, TYP_WIDTH_TABLE, DropReason
from ndp.kernels import build_cuda, compact_cuda, crc16_cuda
from ndp.kernels.build import build_packed_cpu, build_padded_cpu, token_counts_cpu
from ndp.kernels.compact import compact_cpu
from ndp.kernels.crc16 import CRC16_TABLES, validate_packets_cpu
from ndp.kernels.stage import gather_packets, staged_size

from ndp_test_helpers import base_stream, corrupt, corruption, drop_case

W, M, S = (cuda.to_device(t) for t in (TYP_WIDTH_TABLE, TYP_MASKED_TABLE, TYP_SKIP_TABLE))
TABLES = cuda.to_device(CRC16_TABLES)
NO_LIMITS = cuda.device_array(0, np.int64)


def gpu_status(data: np.ndarray, offsets: np.ndarray, limits=None, grid: int = 2) -> np.ndarray:
    status = cuda.device_array(offsets.shape[0], np.uint8)
    lim = NO_LIMITS if limits is None else cuda.to_device(limits)
    crc16_cuda.validate_packets_cuda[grid, crc16_cuda.VALIDATE_BLOCK](
        cuda.to_device(data), cuda.to_device(offsets), lim, status, TABLES, W, M, S
    )
    return status.copy_to_host()


def cpu_status(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    status = np.empty(offsets.shape[0], np.uint8)
    validate_packets_cpu(data, offsets, status)
    return status


def test_validate_every_drop_reason():
    data, offsets, expected = drop_case()
    data = np.frombuffer(data, np.uint8)
    offs = np.array(offsets, np.int64)
    got = gpu_status(data, offs)
    np.testing.assert_array_equal(got, cpu_status(data, offs))
    names = ["ok" if s == DropReason.OK else DropReason(s).name for s in got]
    assert names == expected


def test_validate_staged_packets_get_the_verdicts_they_get_in_the_shard():
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
    got = gpu_status(staged, new_offs, limits)
    np.testing.assert_array_equal(got, cpu_status(data, offs))


@settings(max_examples=12)
@given(st.lists(corruption, min_size=1, max_size=3), st.lists(st.integers(-50, 2000), max_size=5))
def test_validate_property_corrupted(ops, hostile):
    base = base_stream()
    data = np.frombuffer(corrupt(base.data, ops), np.uint8)
    offs = np.array(list(base.offsets) + hostile, np.int64)
    np.testing.assert_array_equal(gpu_status(data, offs, grid=1), cpu_status(data, offs))


def _compact_gpu(status: np.ndarray):
    n = status.shape[0]
    row_of_packet = cuda.device_array(n, np.int64)
    rows = cuda.device_array(max(n, 1), np.int64)
    counts = cuda.to_device(np.full(build_cuda.COUNT_SLOTS, 99, np.int64))
    compact_cuda.compact_cuda[1, compact_cuda.SCAN_BLOCK](
        cuda.to_device(status), row_of_packet, rows, counts
    )
    return row_of_packet.copy_to_host(), rows.copy_to_host(), counts.copy_to_host()


@pytest.mark.parametrize("n", [0, 1, 31, 32, 33, 70])
def test_compact_matches_reference_across_tiles(n):
    rng = np.random.default_rng(n)
    status = rng.choice([0, 0, 0, 1, 2, 3, 4, 5, 6], size=n).astype(np.uint8)
    row_of_packet, rows, counts = _compact_gpu(status)
    ref_rop, ref_rows = np.empty(n, np.int64), np.empty(max(n, 1), np.int64)
    valid = compact_cpu(status, ref_rop, ref_rows)
    np.testing.assert_array_equal(row_of_packet, ref_rop)
    np.testing.assert_array_equal(rows[:valid], ref_rows[:valid])
    np.testing.assert_array_equal(counts[: len(DropReason)],
                                  np.bincount(status, minlength=len(DropReason)))
    assert not counts[len(DropReason):].any()  # the other slots are zeroed for build


def _device_rows(data: np.ndarray, offs: np.ndarray):
    """Validate and compact on the device; returns device (data, offsets, rows, counts)."""
    d_data, d_offs = cuda.to_device(data), cuda.to_device(offs)
    status = cuda.device_array(offs.shape[0], np.uint8)
    crc16_cuda.validate_packets_cuda[1, crc16_cuda.VALIDATE_BLOCK](
        d_data, d_offs, NO_LIMITS, status, TABLES, W, M, S
    )
    rows = cuda.device_array(offs.shape[0], np.int64)
    counts = cuda.device_array(build_cuda.COUNT_SLOTS, np.int64)
    compact_cuda.compact_cuda[1, compact_cuda.SCAN_BLOCK](
        status, cuda.device_array(offs.shape[0], np.int64), rows, counts
    )
    return d_data, d_offs, rows, counts


def _cpu_rows(data, offs):
    status = cpu_status(data, offs)
    rows = np.empty(offs.shape[0], np.int64)
    n = compact_cpu(status, np.empty(offs.shape[0], np.int64), rows)
    return rows[:n]


@pytest.mark.parametrize("max_len", [1, 7, 16, 40])
def test_build_padded_matches_reference(max_len):
    data, offsets, _ = drop_case()
    data = np.frombuffer(data, np.uint8)
    offs = np.array(offsets, np.int64)
    d_data, d_offs, rows, counts = _device_rows(data, offs)
    n = offs.shape[0]
    out = [cuda.device_array((n, max_len), np.int64) for _ in range(3)]
    lengths = cuda.device_array(n, np.int64)
    build_cuda.build_padded_cuda[2, build_cuda.BUILD_BLOCK](
        d_data, d_offs, rows, counts, np.int64(-7), *out, lengths, W, M
    )
    ref_rows = _cpu_rows(data, offs)
    r = ref_rows.shape[0]
    ref = [np.empty((n, max_len), np.int64) for _ in range(3)]
    ref_lengths = np.empty(n, np.int64)
    build_padded_cpu(data, offs, ref_rows, r, -7, *ref, ref_lengths)
    for got, want in zip(out, ref):
        np.testing.assert_array_equal(got.copy_to_host()[:r], want[:r])
    np.testing.assert_array_equal(lengths.copy_to_host()[:r], ref_lengths[:r])
    c = counts.copy_to_host()
    kept = np.minimum(ref_lengths[:r], max_len)
    assert c[build_cuda.TOKENS_SLOT] == kept.sum()
    assert c[build_cuda.TRUNCATED_SLOT] == ref_lengths[:r].sum() - kept.sum()


def _stream_case():
    base = base_stream()
    data = np.frombuffer(base.data, np.uint8)
    offs = np.array(base.offsets, np.int64)
    return data, offs


def test_token_cum_matches_reference():
    data, offs = _stream_case()
    d_data, d_offs, rows, counts = _device_rows(data, offs)
    cum = cuda.device_array(offs.shape[0] + 1, np.int64)
    compact_cuda.token_cum_cuda[1, compact_cuda.SCAN_BLOCK](d_data, d_offs, rows, counts, cum, W, M)
    ref_rows = _cpu_rows(data, offs)
    per_row = np.empty(ref_rows.shape[0], np.int64)
    token_counts_cpu(data, offs, ref_rows, ref_rows.shape[0], per_row)
    want = np.concatenate([[0], np.cumsum(per_row)])
    np.testing.assert_array_equal(cum.copy_to_host()[: want.shape[0]], want)
    assert counts.copy_to_host()[build_cuda.STREAM_TOTAL_SLOT] == want[-1]


@pytest.mark.parametrize("batch_size,seq_len,start", [(1, 1, 0), (3, 5, 0), (2, 17, 9), (4, 8, 3)])
def test_build_packed_matches_reference(batch_size, seq_len, start):
    data, offs = _stream_case()
    d_data, d_offs, rows, counts = _device_rows(data, offs)
    cum = cuda.device_array(offs.shape[0] + 1, np.int64)
    compact_cuda.token_cum_cuda[1, compact_cuda.SCAN_BLOCK](d_data, d_offs, rows, counts, cum, W, M)
    x = cuda.to_device(np.full((batch_size, seq_len), -1, np.int64))
    y = cuda.to_device(np.full((batch_size, seq_len), -1, np.int64))
    build_cuda.build_packed_cuda[2, build_cuda.BUILD_BLOCK](
        d_data, d_offs, rows, cum, counts, np.int64(start), x, y, W, M
    )
    ref_rows = _cpu_rows(data, offs)
    per_row = np.empty(ref_rows.shape[0], np.int64)
    token_counts_cpu(data, offs, ref_rows, ref_rows.shape[0], per_row)
    ref_cum = np.concatenate([[0], np.cumsum(per_row)])
    rx = np.empty((batch_size, seq_len), np.int64)
    ry = np.empty((batch_size, seq_len), np.int64)
    build_packed_cpu(data, offs, ref_rows, ref_cum, start, rx, ry)
    np.testing.assert_array_equal(x.copy_to_host(), rx)
    np.testing.assert_array_equal(y.copy_to_host(), ry)
