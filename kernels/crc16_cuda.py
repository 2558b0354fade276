"""CRC-16/CCITT-FALSE and per-packet validation on the device, beside its CPU reference
(``crc16.py``), which it must equal bit for bit: the same verdict, in the same order of checks.
The CRC loop and the payload checks are the reference's own functions compiled for the device;
only the framing check is written again here, because on the device a packet's shard may end
before the buffer does (``limits``: packets of several shards in one buffer). The kernel that
runs them is ``verdict_cuda``'s.

Every read of the shard is bounds-checked the way the CPU reference checks it: an offset
outside the shard or a LEN past its end gives TRUNCATED, never a read outside the buffer.
Bytes are widened (``uint32``/``int64``) before any shift, so a device and the simulator agree.
"""

from __future__ import annotations

from numba import cuda, int64, uint8, uint32

from ndp.wire.format import FRAME_BYTES, HEADER_BYTES, SYNC, DropReason
from ndp.kernels.crc16 import crc16_update, payload_status

OK = int(DropReason.OK)
BAD_SYNC = int(DropReason.BAD_SYNC)
TRUNCATED = int(DropReason.TRUNCATED)
BAD_CRC = int(DropReason.BAD_CRC)

# The CPU reference's own Python source, compiled for the device: one definition, two targets.
#: CRC-16 state ``crc`` advanced over ``buf[start:stop]`` (slice-by-8, tables (8, 256))
crc16_update_dev = cuda.jit(device=True, inline=True)(crc16_update.py_func)
#: payload verdict for a well-framed packet: OK, BAD_LENGTH, NOT_TOKENS or UNKNOWN_TYPE
payload_status_dev = cuda.jit(device=True)(payload_status.py_func)


@cuda.jit(device=True)
def framing_dev(shard, off, limit):  # pragma: no cover - compiled
    """(TRUNCATED, BAD_SYNC or OK; where the CRC'd bytes end) at byte ``off`` of a shard that
    ends at byte ``limit`` (at most ``shard.shape[0]``): ``frame_status``'s checks before its
    CRC, in its order."""
    size = min(int64(limit), int64(shard.shape[0]))
    if off < 0 or off > size - FRAME_BYTES:
        return uint8(TRUNCATED), int64(0)
    if shard[off] != SYNC:
        return uint8(BAD_SYNC), int64(0)
    end = off + HEADER_BYTES + ((int64(shard[off + 4]) << 8) | int64(shard[off + 5]))
    if end + 2 > size:
        return uint8(TRUNCATED), int64(0)
    return uint8(OK), end


@cuda.jit(device=True)
def frame_status_dev(shard, off, limit, tables):  # pragma: no cover - compiled
    """Framing verdict at byte ``off``: OK, BAD_SYNC, TRUNCATED or BAD_CRC, as ``frame_status``
    on a shard that ends at byte ``limit`` (at most ``shard.shape[0]``)."""
    status, end = framing_dev(shard, off, limit)
    if status != OK:
        return status
    stored = (uint32(shard[end]) << uint32(8)) | uint32(shard[end + 1])
    if crc16_update_dev(uint32(0xFFFF), shard, off, end, tables) != stored:
        return uint8(BAD_CRC)
    return uint8(OK)


@cuda.jit(device=True)
def packet_status_dev(shard, off, limit, tables, width_t, masked_t, skip_t):  # pragma: no cover
    """Full verdict for one packet, framing first, then payload layout, as ``packet_status`` on
    a shard that ends at byte ``limit``."""
    status = frame_status_dev(shard, off, limit, tables)
    if status == OK:
        status = payload_status_dev(shard, off, width_t, masked_t, skip_t)
    return status


#: kernels of this family (its device functions are compiled inside ``verdict_cuda``'s kernel)
SIGNATURES: dict = {}
