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
from ndp.loader import packing
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
                 vocab: int = NO_VOCAB) -> np.ndarray:
    out = cuda.device_array(offsets.shape[0], np.int64)
    lim = NO_LIMITS if limits is None else cuda.to_device(limits)
    verdict_cuda.verdicts_cuda[grid, BLOCK](
        cuda.to_device(data), cuda.to_device(offsets), lim, out, TABLES, W, M, S,
        np.int64(vocab)
    )
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


def test_verdicts_for_every_drop_reason():
    data, offsets, expected = drop_case()
    data = np.frombuffer(data, np.uint8)
    offs = np.array(offsets, np.int64)
    got = gpu_verdicts(data, offs)
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
@given(st.lists(corruption, min_size=1, max_size=3), st.lists(st.integers(-50, 2000), max_size=5))
def test_verdicts_property_corrupted(ops, hostile):
    base = base_stream()
    data = np.frombuffer(corrupt(base.data, ops), np.uint8)
    offs = np.array(list(base.offsets) + hostile, np.int64)
    np.testing.assert_array_equal(gpu_verdicts(data, offs, grid=1), cpu_verdicts(data, offs))


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


@pytest.mark.parametrize("windows,seq_len,start", [(1, 1, 0), (3, 5, 0), (2, 17, 9), (4, 8, 3)])
def test_build_packed_matches_reference(windows, seq_len, start):
    data, offs = _stream_case()
    rows, tokens = _rows(data, offs)
    cum = np.concatenate([[0], np.cumsum(tokens)]).astype(np.int64)
    x = cuda.to_device(np.full((windows, seq_len), -1, np.int64))
    y = cuda.to_device(np.full((windows, seq_len), -1, np.int64))
    build_cuda.build_packed_cuda[2, BLOCK](
        cuda.to_device(data), cuda.to_device(offs), cuda.to_device(rows), cuda.to_device(cum),
        np.int64(start), x, y, W, M
    )
    rx = np.empty((windows, seq_len), np.int64)
    ry = np.empty((windows, seq_len), np.int64)
    build_packed_cpu(data, offs, rows, cum, start, rx, ry)
    np.testing.assert_array_equal(x.copy_to_host(), rx)
    np.testing.assert_array_equal(y.copy_to_host(), ry)


@pytest.mark.parametrize("rows_per_batch,row_len", [(2, 9), (3, 16)])
def test_build_packing_matches_reference(rows_per_batch, row_len):
    """Documents (some masked, some longer than a row, some empty) placed by ``ndp.loader.packing``
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
