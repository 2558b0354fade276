"""Verdicts on the device, beside their CPU reference (``verdict.py``), which they must equal bit
for bit: per packet its token count if valid, else minus its DropReason.

One thread per packet (grid-stride, so a small grid covers any number of packets and the
simulator stays fast). Each block first copies the eight slice-by-8 CRC tables (8 KB) into
shared memory, where the lookups of every thread hit on-chip memory. The checks are the CPU
reference's own functions compiled for the device (``crc16_cuda``, ``build_cuda``).
"""

from __future__ import annotations

from numba import cuda, int64, uint32

from ndp.engine.backend import simulated
from ndp.wire.format import DropReason
from ndp.kernels.build_cuda import token_at_dev, token_layout_dev
from ndp.kernels.crc16_cuda import packet_status_dev
from ndp.kernels.verdict import EMPTY, TOKEN_RANGE, verdict_of

OK = int(DropReason.OK)
#: threads per block (one under the simulator, as ``build_cuda.BUILD_BLOCK`` says why)
VERDICT_BLOCK = 1 if simulated() else 128

#: the verdict for a status and a token count (the reference's own function)
verdict_of_dev = cuda.jit(device=True, inline=True)(verdict_of.py_func)


@cuda.jit(device=True)
def usable_dev(n, tok, width, shard, vocab):  # pragma: no cover - compiled
    """OK, EMPTY or TOKEN_RANGE, as the reference's ``usable`` (whose calls are host
    functions, so it is written out again with their device twins)."""
    if n == 0:
        return EMPTY
    if vocab < (int64(1) << (8 * width)):
        for t in range(n):
            if token_at_dev(shard, tok, t, width) >= vocab:
                return TOKEN_RANGE
    return OK


@cuda.jit(cache=True)
def verdicts_cuda(shard, offsets, limits, out, tables, width_t, masked_t, skip_t,
                  vocab):  # pragma: no cover - compiled
    """``out[k]`` = the verdict of the packet at ``offsets[k]``, as ``verdicts_cpu``; packet
    ``k``'s shard ends at ``limits[k]`` (an empty ``limits``: at the end of ``shard``); ids
    must be below ``vocab``."""
    table = cuda.shared.array((8, 256), dtype=uint32)
    for i in range(cuda.threadIdx.x, 8 * 256, cuda.blockDim.x):
        table[i // 256, i % 256] = tables[i // 256, i % 256]
    cuda.syncthreads()
    for k in range(cuda.grid(1), offsets.shape[0], cuda.gridsize(1)):
        off = int64(offsets[k])
        limit = int64(shard.shape[0])
        if limits.shape[0] > 0:
            limit = max(int64(0), min(int64(limits[k]), limit))
        status = packet_status_dev(shard, off, limit, table, width_t, masked_t, skip_t)
        n = int64(0)
        if status == OK:
            n, tok, _, width = token_layout_dev(shard, off, width_t, masked_t)
            status = usable_dev(n, tok, width, shard, vocab)
        out[k] = verdict_of_dev(status, n)


#: every signature the host launches, compiled to PTX by the tests for each target
SIGNATURES = {
    "verdicts_cuda": (
        verdicts_cuda,
        [
            "void(uint8[::1], int64[::1], int64[::1], int64[::1], uint32[:, ::1], "
            "uint8[::1], uint8[::1], uint8[::1], int64)"
        ],
    ),
}
