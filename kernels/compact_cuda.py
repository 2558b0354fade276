"""Compaction on the device, beside its CPU reference (``compact.py``): an exclusive scan over
the per-packet valid flags gives each valid packet its row, in packet order, so rows come out in
the same deterministic order as on the CPU.

One block of ``SCAN_BLOCK`` threads walks the flags in tiles of ``SCAN_BLOCK``; within a tile a
shared-memory (Hillis-Steele) scan ranks the flags, and a running carry joins the tiles. A batch
holds thousands of packets, not millions, so one block keeps the whole job in one launch with no
grid-wide synchronisation. The same kernel counts every drop reason (integer atomics in shared
memory: the totals do not depend on the order threads run in) and writes the number of valid
packets where the build kernels read it, so the host never has to wait for it.

``token_cum_cuda`` runs the same scan over the token counts of the valid rows: the stream
positions of the packed (pretraining) layout.
"""

from __future__ import annotations

from numba import cuda, int64

from ndp.backend import simulated
from ndp.format import DropReason
from ndp.kernels.build_cuda import COUNT_SLOTS, STREAM_TOTAL_SLOT, token_layout_dev

OK = int(DropReason.OK)
#: threads of the one scan block; a power of two (smaller under the simulator, where every
#: simulated thread and barrier is slow)
SCAN_BLOCK = 32 if simulated() else 256
N_REASONS = len(DropReason)


@cuda.jit(device=True)
def block_scan_dev(value, scratch):  # pragma: no cover - compiled
    """Exclusive prefix sum of ``value`` over the block's threads, and the block total.

    Every thread of the block must call it (it synchronises); ``scratch`` is a shared int64
    array of ``blockDim.x`` entries.
    """
    tid = cuda.threadIdx.x
    n = cuda.blockDim.x
    scratch[tid] = value
    cuda.syncthreads()
    step = 1
    while step < n:
        add = int64(0)
        if tid >= step:
            add = scratch[tid - step]
        cuda.syncthreads()
        scratch[tid] += add
        cuda.syncthreads()
        step *= 2
    inclusive = scratch[tid]
    total = scratch[n - 1]
    cuda.syncthreads()  # scratch is free again for the next tile
    return inclusive - value, total


@cuda.jit(cache=True)
def compact_cuda(status, row_of_packet, rows, counts):  # pragma: no cover - compiled
    """As ``compact_cpu``: ``row_of_packet`` (exclusive scan of ``status == OK``), ``rows[:n]``
    (packet of each row) and ``counts[reason]`` (packets per DropReason; ``counts[OK] == n``);
    the other slots of ``counts`` (``COUNT_SLOTS`` long) are zeroed for the kernels after it.
    Launch with one block of ``SCAN_BLOCK`` threads."""
    scratch = cuda.shared.array(SCAN_BLOCK, dtype=int64)
    hist = cuda.shared.array(N_REASONS, dtype=int64)
    tid = cuda.threadIdx.x
    if tid < N_REASONS:
        hist[tid] = 0
    cuda.syncthreads()
    n = status.shape[0]
    carry = int64(0)
    for base in range(0, n, SCAN_BLOCK):
        k = base + tid
        flag = int64(0)
        if k < n:
            reason = status[k]
            if reason == OK:
                flag = 1
            if reason < N_REASONS:
                cuda.atomic.add(hist, reason, 1)
        excl, total = block_scan_dev(flag, scratch)
        if k < n:
            row_of_packet[k] = carry + excl
            if flag == 1:
                rows[carry + excl] = k
        carry += total
    cuda.syncthreads()
    for slot in range(tid, COUNT_SLOTS, cuda.blockDim.x):
        counts[slot] = hist[slot] if slot < N_REASONS else 0


@cuda.jit(cache=True)
def token_cum_cuda(shard, offsets, rows, counts, cum, width_t, masked_t):  # pragma: no cover
    """``cum[r]`` = tokens in valid rows before row ``r``, for ``r <= n`` where
    ``n = counts[OK]``; ``cum[n]`` and ``counts[STREAM_TOTAL_SLOT]`` get the stream's total.
    Rows must be valid packets (from ``compact_cuda``). Launch with one block of
    ``SCAN_BLOCK`` threads."""
    scratch = cuda.shared.array(SCAN_BLOCK, dtype=int64)
    tid = cuda.threadIdx.x
    n = counts[OK]
    carry = int64(0)
    for base in range(0, n, SCAN_BLOCK):
        r = base + tid
        c = int64(0)
        if r < n:
            c = token_layout_dev(shard, int64(offsets[rows[r]]), width_t, masked_t)[0]
        excl, total = block_scan_dev(c, scratch)
        if r < n:
            cum[r] = carry + excl
        carry += total
    if tid == 0:
        cum[n] = carry
        counts[STREAM_TOTAL_SLOT] = carry


SIGNATURES = {
    "compact_cuda": (
        compact_cuda,
        ["void(uint8[::1], int64[::1], int64[::1], int64[::1])"],
    ),
    "token_cum_cuda": (
        token_cum_cuda,
        ["void(uint8[::1], int64[::1], int64[::1], int64[::1], int64[::1], uint8[::1], uint8[::1])"],
    ),
}
