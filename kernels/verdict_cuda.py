"""Verdicts on the device, beside their CPU reference (``verdict.py``), which they must equal bit
for bit: per packet its token count if valid, else minus its DropReason.

* ``verdicts_cuda``: one thread per packet (grid-stride, so a small grid covers any number of
  packets and the simulator stays fast), for short packets;
* ``verdicts_lanes_cuda``: ``lanes`` threads per packet, for long ones: the CRC split across
  them (``crc16_lanes.py``, whose reference gives ``crc16_update``'s state) and the token-range
  check too, their parts joined in shared memory by the group's first lane. A 4 KB packet's
  513 dependent table steps become 16 a lane, and neighbouring lanes read neighbouring bytes.
  ``lanes_for`` picks the lanes from a chunk's mean packet size.

Each block first copies the eight slice-by-8 CRC tables (8 KB) into shared memory, where the
lookups of every thread hit on-chip memory. The checks are the CPU reference's own functions
compiled for the device (``crc16_cuda``, ``build_cuda``, ``crc16_lanes``).
"""

from __future__ import annotations

from numba import cuda, int64, uint8, uint32

from ndp.engine.backend import simulated
from ndp.wire.format import DropReason
from ndp.kernels.build_cuda import token_at_dev, token_layout_dev
from ndp.kernels.crc16_cuda import (
    crc16_update_dev, framing_dev, packet_status_dev, payload_status_dev)
from ndp.kernels.crc16_lanes import CHUNK, crc16_lane, mulmod16, xpow8, zero_chunks_after
from ndp.kernels.verdict import EMPTY, TOKEN_RANGE, verdict_of

OK = int(DropReason.OK)
TRUNCATED = int(DropReason.TRUNCATED)
BAD_CRC = int(DropReason.BAD_CRC)
#: threads per block (one under the simulator, as ``build_cuda.BUILD_BLOCK`` says why)
VERDICT_BLOCK = 1 if simulated() else 128
#: threads per block of ``verdicts_lanes_cuda`` at most (the size of its shared arrays)
LANES_BLOCK = 128
#: lanes per packet at most (a warp)
MAX_LANES = 32
#: mean packet bytes from which a packet gets 2 lanes; each doubling of it doubles the lanes
LANES_FROM_BYTES = 256


def lanes_for(mean_packet_bytes: float) -> int:
    """Threads per packet for a chunk whose packets average ``mean_packet_bytes``: 1 (the
    thread-per-packet kernel) below ``LANES_FROM_BYTES``, then about one lane per 128 bytes,
    a power of two up to a warp (a 4 KB packet: 32 lanes of 16 chunks each)."""
    lanes = 1
    while lanes < MAX_LANES and mean_packet_bytes >= LANES_FROM_BYTES * lanes:
        lanes *= 2
    return lanes


#: device twins of the lane reference (``crc16_lanes.py``)
mulmod16_dev = cuda.jit(device=True)(mulmod16.py_func)
xpow8_dev = cuda.jit(device=True)(xpow8.py_func)
crc16_lane_dev = cuda.jit(device=True)(crc16_lane.py_func)
zero_chunks_after_dev = cuda.jit(device=True, inline=True)(zero_chunks_after.py_func)

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


@cuda.jit(cache=True)
def verdicts_lanes_cuda(shard, offsets, limits, out, tables, width_t, masked_t, skip_t, vocab,
                        lanes):  # pragma: no cover - compiled
    """``verdicts_cuda``'s verdicts with ``lanes`` threads a packet (``blockDim.x``, at most
    ``LANES_BLOCK``, a multiple of ``lanes``); every thread of a block takes the same number of
    rounds, so the block's barriers are met by all of them."""
    table = cuda.shared.array((8, 256), dtype=uint32)
    gap = cuda.shared.array((2, 256), dtype=uint32)
    align = cuda.shared.array(MAX_LANES, dtype=uint32)
    part = cuda.shared.array(LANES_BLOCK, dtype=uint32)
    over = cuda.shared.array(LANES_BLOCK, dtype=uint8)
    tid = cuda.threadIdx.x
    for i in range(tid, 8 * 256, cuda.blockDim.x):
        table[i // 256, i % 256] = tables[i // 256, i % 256]
    k_gap = xpow8_dev(CHUNK * (lanes - 1))
    for v in range(tid, 256, cuda.blockDim.x):
        gap[0, v] = mulmod16_dev(uint32(v) << uint32(8), k_gap)
        gap[1, v] = mulmod16_dev(uint32(v), k_gap)
    for m in range(tid, lanes, cuda.blockDim.x):
        align[m] = xpow8_dev(CHUNK * m)
    cuda.syncthreads()
    per_block = cuda.blockDim.x // lanes
    group = tid // lanes
    lane = tid % lanes
    n_packets = offsets.shape[0]
    for base in range(cuda.blockIdx.x * per_block, n_packets, cuda.gridDim.x * per_block):
        k = base + group
        off = int64(0)
        status = uint8(TRUNCATED)
        end = int64(0)
        nch = int64(0)
        payload = uint8(OK)
        n = int64(0)
        part[tid] = uint32(0)
        over[tid] = uint8(0)
        if k < n_packets and group < per_block:
            off = int64(offsets[k])
            limit = int64(shard.shape[0])
            if limits.shape[0] > 0:
                limit = max(int64(0), min(int64(limits[k]), limit))
            status, end = framing_dev(shard, off, limit)
            if status == OK:
                nch = (end - off) // CHUNK
                p = crc16_lane_dev(uint32(0xFFFF), shard, off, nch, lane, lanes, table,
                                   gap[0], gap[1])
                part[tid] = mulmod16_dev(p, align[zero_chunks_after_dev(nch, lane, lanes)])
                payload = payload_status_dev(shard, off, width_t, masked_t, skip_t)
                if payload == OK:
                    n, tok, _, width = token_layout_dev(shard, off, width_t, masked_t)
                    if vocab < (int64(1) << (8 * width)):
                        for t in range(lane, n, lanes):
                            if token_at_dev(shard, tok, t, width) >= vocab:
                                over[tid] = uint8(1)
                                break
        cuda.syncthreads()
        if k < n_packets and group < per_block and lane == 0:
            verdict = status
            if status == OK:
                state = uint32(0xFFFF)
                found = uint8(0)
                if nch > 0:
                    state = uint32(0)
                    for j in range(lanes):
                        state ^= part[tid + j]
                for j in range(lanes):
                    found |= over[tid + j]
                state = crc16_update_dev(state, shard, off + CHUNK * nch, end, table)
                stored = (uint32(shard[end]) << uint32(8)) | uint32(shard[end + 1])
                if state != stored:
                    verdict = uint8(BAD_CRC)
                elif payload != OK:
                    verdict = payload
                elif n == 0:
                    verdict = uint8(EMPTY)
                elif found != 0:
                    verdict = uint8(TOKEN_RANGE)
            out[k] = verdict_of_dev(verdict, n)
        cuda.syncthreads()


#: every signature the host launches, compiled to PTX by the tests for each target
SIGNATURES = {
    "verdicts_cuda": (
        verdicts_cuda,
        [
            "void(uint8[::1], int64[::1], int64[::1], int64[::1], uint32[:, ::1], "
            "uint8[::1], uint8[::1], uint8[::1], int64)"
        ],
    ),
    "verdicts_lanes_cuda": (
        verdicts_lanes_cuda,
        [
            "void(uint8[::1], int64[::1], int64[::1], int64[::1], uint32[:, ::1], "
            "uint8[::1], uint8[::1], uint8[::1], int64, int64)"
        ],
    ),
}
