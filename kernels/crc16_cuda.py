"""CRC-16/CCITT-FALSE and per-packet validation on the device, beside its CPU reference
(``crc16.py``), which it must equal bit for bit: the same verdict, in the same order of checks.

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
from ndp.format import FRAME_BYTES, HEADER_BYTES, MASK_COUNT_BYTES, SYNC, DropReason

OK = int(DropReason.OK)
BAD_SYNC = int(DropReason.BAD_SYNC)
TRUNCATED = int(DropReason.TRUNCATED)
BAD_CRC = int(DropReason.BAD_CRC)
BAD_LENGTH = int(DropReason.BAD_LENGTH)

#: threads per block of ``validate_packets_cuda`` (fewer under the simulator, where each
#: simulated thread costs about half a millisecond)
VALIDATE_BLOCK = 16 if simulated() else 128


@cuda.jit(device=True, inline=True)
def crc16_update_dev(crc, buf, start, stop, tables):  # pragma: no cover - compiled
    """CRC-16 state ``crc`` advanced over ``buf[start:stop]`` (slice-by-8, tables (8, 256))."""
    crc = uint32(crc)
    i = start
    stop8 = start + ((stop - start) // 8) * 8
    while i < stop8:
        x0 = (uint32(buf[i]) ^ (crc >> uint32(8))) & uint32(0xFF)
        x1 = (uint32(buf[i + 1]) ^ crc) & uint32(0xFF)
        crc = (
            tables[7, x0]
            ^ tables[6, x1]
            ^ tables[5, buf[i + 2]]
            ^ tables[4, buf[i + 3]]
            ^ tables[3, buf[i + 4]]
            ^ tables[2, buf[i + 5]]
            ^ tables[1, buf[i + 6]]
            ^ tables[0, buf[i + 7]]
        )
        i += 8
    while i < stop:
        idx = ((crc >> uint32(8)) ^ uint32(buf[i])) & uint32(0xFF)
        crc = ((crc << uint32(8)) & uint32(0xFFFF)) ^ tables[0, idx]
        i += 1
    return crc


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


@cuda.jit(device=True)
def payload_status_dev(shard, off, width_table, masked_table, skip_table):  # pragma: no cover
    """Payload verdict for a well-framed packet: OK, BAD_LENGTH, NOT_TOKENS or UNKNOWN_TYPE."""
    typ = shard[off + 3]
    skip = skip_table[typ]
    if skip != 0:
        return uint8(skip)
    length = (int64(shard[off + 4]) << 8) | int64(shard[off + 5])
    width = int64(width_table[typ])
    if masked_table[typ] != 0:
        if length < MASK_COUNT_BYTES:
            return uint8(BAD_LENGTH)
        p = off + HEADER_BYTES
        n = (int64(shard[p]) << 8) | int64(shard[p + 1])
        if length != MASK_COUNT_BYTES + n * width + (n + 7) // 8:
            return uint8(BAD_LENGTH)
    elif length % width != 0:
        return uint8(BAD_LENGTH)
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
