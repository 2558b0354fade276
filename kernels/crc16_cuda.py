"""CRC-16/CCITT-FALSE and per-packet validation on the device, beside its CPU reference
(``crc16.py``), which it must equal bit for bit: the same verdict, in the same order of checks.
The CRC loop and the payload checks are the reference's own functions compiled for the device;
only the framing check is written again here, because on the device a packet's shard may end
before the buffer does (``limits``, for staged packets).

One thread validates one packet (grid-stride, so a small grid covers any number of packets and
the simulator stays fast). Each block first copies the eight slice-by-8 tables (8 KB) into
shared memory, where the lookups of every thread hit on-chip memory.

Every read of the shard is bounds-checked the way the CPU reference checks it: an offset
outside the shard or a LEN past its end gives TRUNCATED, never a read outside the buffer.
Bytes are widened (``uint32``/``int64``) before any shift, so a device and the simulator agree.
"""

from __future__ import annotations

from numba import cuda, int64, uint8, uint32

from ndp.backend import simulated
from ndp.format import FRAME_BYTES, HEADER_BYTES, SYNC, DropReason
from ndp.kernels.crc16 import crc16_update, payload_status

OK = int(DropReason.OK)
BAD_SYNC = int(DropReason.BAD_SYNC)
TRUNCATED = int(DropReason.TRUNCATED)
BAD_CRC = int(DropReason.BAD_CRC)

#: threads per block of ``validate_packets_cuda`` (fewer under the simulator, where each
#: simulated thread costs about half a millisecond)
VALIDATE_BLOCK = 16 if simulated() else 128


# The CPU reference's own Python source, compiled for the device: one definition, two targets.
#: CRC-16 state ``crc`` advanced over ``buf[start:stop]`` (slice-by-8, tables (8, 256))
crc16_update_dev = cuda.jit(device=True, inline=True)(crc16_update.py_func)
#: payload verdict for a well-framed packet: OK, BAD_LENGTH, NOT_TOKENS or UNKNOWN_TYPE
payload_status_dev = cuda.jit(device=True)(payload_status.py_func)


@cuda.jit(device=True)
def frame_status_dev(shard, off, limit, tables):  # pragma: no cover - compiled
    """Framing verdict at byte ``off``: OK, BAD_SYNC, TRUNCATED or BAD_CRC, as ``frame_status``
    on a shard that ends at byte ``limit`` (at most ``shard.shape[0]``)."""
    size = min(int64(limit), int64(shard.shape[0]))
    if off < 0 or off > size - FRAME_BYTES:
        return uint8(TRUNCATED)
    if shard[off] != SYNC:
        return uint8(BAD_SYNC)
    length = (int64(shard[off + 4]) << 8) | int64(shard[off + 5])
    end = off + HEADER_BYTES + length
    if end + 2 > size:
        return uint8(TRUNCATED)
    stored = (uint32(shard[end]) << uint32(8)) | uint32(shard[end + 1])
    if crc16_update_dev(uint32(0xFFFF), shard, off, end, tables) != stored:
        return uint8(BAD_CRC)
    return uint8(OK)


@cuda.jit(cache=True)
def validate_packets_cuda(
    shard, offsets, limits, status, tables, width_t, masked_t, skip_t
):  # pragma: no cover - compiled
    """``status[k]`` = DropReason of the packet at ``offsets[k]``, as ``validate_packets_cpu``.

    ``limits[k]`` is where packet ``k``'s shard ends: with packets gathered from a shard into a
    staging buffer (``ndp.kernels.stage``), each packet's copied bytes end where the shard ended
    for it, so the verdicts equal those on the shard itself. An empty ``limits`` means every
    packet's shard is the whole buffer.
    """
    table = cuda.shared.array((8, 256), dtype=uint32)
    tid = cuda.threadIdx.x
    for i in range(tid, 8 * 256, cuda.blockDim.x):
        table[i // 256, i % 256] = tables[i // 256, i % 256]
    cuda.syncthreads()
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for k in range(start, offsets.shape[0], stride):
        off = int64(offsets[k])
        limit = int64(shard.shape[0])
        if limits.shape[0] > 0:
            limit = int64(limits[k])
        verdict = frame_status_dev(shard, off, limit, table)
        if verdict == OK:
            verdict = payload_status_dev(shard, off, width_t, masked_t, skip_t)
        status[k] = verdict


#: every signature the host launches, compiled to PTX by the tests for each target
SIGNATURES = {
    "validate_packets_cuda": (
        validate_packets_cuda,
        [
            "void(uint8[::1], int64[::1], int64[::1], uint8[::1], uint32[:, ::1], "
            "uint8[::1], uint8[::1], uint8[::1])"
        ],
    ),
}
