"""CRC-16/CCITT-FALSE and per-packet validation: the CPU reference.

The CRC runs slice-by-N: table ``k`` holds the CRC of a byte followed by ``k`` zero bytes, so
for a 16-bit non-reflected CRC the two state bytes fold into the first two input bytes and the
other N - 2 bytes of a step are looked up independently: N lookups with no chain between them
instead of N dependent ones. The device runs the slice-by-8 loop (``crc16_update``, compiled for
it by ``crc16_cuda``; its tables are the first 8 rows of the same array, copied to shared
memory). The host (``crc16_update_host``) folds ranges of ``CLMUL_FROM_BYTES`` or more by
carry-less multiplication where the CPU has it (``clmul.py``) and steps 16 bytes at a time by
table otherwise. On one thread of the 2-core CI machine the host loop runs 4.2-4.8x the
slice-by-16 loop alone over ranges of 2-8 KB (8.3 against 1.8 GB/s at 4 KB) and 1.5x at 128
bytes; on both threads packets of 1,024 tokens validate at 8.6 GB/s (uint16) and 12.4 GB/s
(int32), against 0.3 GB/s byte at a time (``python benchmarks/cpu/bench_cpu.py``,
``benchmarks/results/cpu-20261124-191252.json``; this VM's speed varies by up to 2x between
runs, so compare within one file). All give the same CRC (tested against ``binascii.crc_hqx``).

Host loops index with unsigned integers: a signed index makes Numba test it for a negative value
(Python's wrap-around) on every access, which keeps LLVM from unrolling and vectorizing them.
Every byte is widened (``np.uint32``) before shifting so that Numba's CUDA simulator, where a
``uint8 << 8`` wraps, and a real device agree.
"""

from __future__ import annotations

import numpy as np

from ndp.wire.format import (
    CRC16_INIT,
    CRC16_POLY,
    HEADER_BYTES,
    FRAME_BYTES,
    MASK_COUNT_BYTES,
    SYNC,
    TYP_MASKED_TABLE,
    TYP_SKIP_TABLE,
    TYP_WIDTH_TABLE,
    DropReason,
)
from ndp.kernels._jit import cpu_kernel
from ndp.kernels.clmul import CLMUL_MIN_BYTES, HAS_CLMUL, crc16_update_clmul
from ndp.engine.threads import parallel_for

_OK = np.uint8(DropReason.OK)
_BAD_SYNC = np.uint8(DropReason.BAD_SYNC)
_TRUNCATED = np.uint8(DropReason.TRUNCATED)
_BAD_CRC = np.uint8(DropReason.BAD_CRC)
_BAD_LENGTH = np.uint8(DropReason.BAD_LENGTH)
#: packets per thread at least (a packet of 1,024 int32 tokens validates in about 1.3 us)
VALIDATE_GRAIN = 256


#: how many bytes one step of the host's CRC loop consumes (rows of ``CRC16_TABLES``)
SLICES = 16
#: ranges this long or longer take the carry-less multiplication loop where the host has one
CLMUL_FROM_BYTES = max(CLMUL_MIN_BYTES, 128)


def make_crc16_tables() -> np.ndarray:
    """(16, 256) uint32 slice-by-16 tables for CRC-16/CCITT-FALSE (poly 0x1021); the first 8
    rows are the slice-by-8 tables."""
    tables = np.zeros((SLICES, 256), dtype=np.uint32)
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ CRC16_POLY) if crc & 0x8000 else (crc << 1)
            crc &= 0xFFFF
        tables[0, byte] = crc
    for k in range(1, SLICES):
        prev = tables[k - 1]
        tables[k] = ((prev << 8) & 0xFFFF) ^ tables[0, prev >> 8]
    return tables


CRC16_TABLES = make_crc16_tables()


@cpu_kernel
def crc16_update(crc, buf, start, stop, tables):  # pragma: no cover - compiled
    """CRC-16 state ``crc`` advanced over ``buf[start:stop]`` (slice-by-8; the device's loop,
    ``crc16_update_host`` is the host's)."""
    crc = np.uint32(crc)
    i = start
    stop8 = start + ((stop - start) // 8) * 8
    while i < stop8:
        x0 = (np.uint32(buf[i]) ^ (crc >> np.uint32(8))) & np.uint32(0xFF)
        x1 = (np.uint32(buf[i + 1]) ^ crc) & np.uint32(0xFF)
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
        idx = ((crc >> np.uint32(8)) ^ np.uint32(buf[i])) & np.uint32(0xFF)
        crc = ((crc << np.uint32(8)) & np.uint32(0xFFFF)) ^ tables[0, idx]
        i += 1
    return crc


@cpu_kernel
def crc16_update_tables(crc, buf, start, stop, tables):  # pragma: no cover - compiled
    """CRC-16 state ``crc`` advanced over ``buf[start:stop]`` (``0 <= start <= stop <=
    buf.shape[0]``), slice-by-16 with unsigned indices: the host's table loop."""
    crc = np.uint32(crc)
    one = np.uint64(1)
    i = np.uint64(start)
    stop = np.uint64(stop)
    stop16 = i + ((stop - i) // np.uint64(16)) * np.uint64(16)
    while i < stop16:
        x0 = (np.uint32(buf[i]) ^ (crc >> np.uint32(8))) & np.uint32(0xFF)
        x1 = (np.uint32(buf[i + one]) ^ crc) & np.uint32(0xFF)
        crc = (
            tables[15, x0]
            ^ tables[14, x1]
            ^ tables[13, buf[i + np.uint64(2)]]
            ^ tables[12, buf[i + np.uint64(3)]]
            ^ tables[11, buf[i + np.uint64(4)]]
            ^ tables[10, buf[i + np.uint64(5)]]
            ^ tables[9, buf[i + np.uint64(6)]]
            ^ tables[8, buf[i + np.uint64(7)]]
            ^ tables[7, buf[i + np.uint64(8)]]
            ^ tables[6, buf[i + np.uint64(9)]]
            ^ tables[5, buf[i + np.uint64(10)]]
            ^ tables[4, buf[i + np.uint64(11)]]
            ^ tables[3, buf[i + np.uint64(12)]]
            ^ tables[2, buf[i + np.uint64(13)]]
            ^ tables[1, buf[i + np.uint64(14)]]
            ^ tables[0, buf[i + np.uint64(15)]]
        )
        i += np.uint64(16)
    while i < stop:
        idx = ((crc >> np.uint32(8)) ^ np.uint32(buf[i])) & np.uint32(0xFF)
        crc = ((crc << np.uint32(8)) & np.uint32(0xFFFF)) ^ tables[0, idx]
        i += one
    return crc


if HAS_CLMUL:

    @cpu_kernel
    def crc16_update_host(crc, buf, start, stop, tables):  # pragma: no cover - compiled
        """CRC-16 state ``crc`` advanced over ``buf[start:stop]`` (``0 <= start <= stop <=
        buf.shape[0]``): the host's loop. Ranges of ``CLMUL_FROM_BYTES``
        or more fold by carry-less multiplication (``clmul.py``), the rest by table."""
        if stop - start < CLMUL_FROM_BYTES:
            return crc16_update_tables(crc, buf, start, stop, tables)
        folded, pos = crc16_update_clmul(np.uint32(crc), buf, np.uint64(start), stop, tables)
        return crc16_update_tables(folded, buf, pos, stop, tables)

else:  # no PCLMULQDQ here (or no JIT): the table loop serves every range
    crc16_update_host = crc16_update_tables


@cpu_kernel
def frame_status(shard, off, tables):  # pragma: no cover - compiled
    """Framing verdict for a packet claimed at byte ``off``: OK, BAD_SYNC, TRUNCATED or BAD_CRC.

    Bounds are checked before every read, so a hostile offset or LEN cannot read outside
    ``shard``.
    """
    size = shard.shape[0]
    if off < 0 or off > size - FRAME_BYTES:  # not off + FRAME_BYTES: it overflows near 2**63
        return _TRUNCATED
    if shard[off] != SYNC:
        return _BAD_SYNC
    length = (np.int64(shard[off + 4]) << 8) | np.int64(shard[off + 5])
    end = off + HEADER_BYTES + length
    if end + 2 > size:
        return _TRUNCATED
    stored = (np.uint32(shard[end]) << np.uint32(8)) | np.uint32(shard[end + 1])
    if crc16_update_host(np.uint32(0xFFFF), shard, off, end, tables) != stored:
        return _BAD_CRC
    return _OK


@cpu_kernel
def payload_status(shard, off, width_table, masked_table, skip_table):  # pragma: no cover
    """Payload verdict for a well-framed packet: OK, BAD_LENGTH, NOT_TOKENS or UNKNOWN_TYPE."""
    typ = shard[off + 3]
    skip = skip_table[typ]
    if skip != 0:
        return skip
    length = (np.int64(shard[off + 4]) << 8) | np.int64(shard[off + 5])
    width = np.int64(width_table[typ])
    if masked_table[typ] != 0:
        if length < MASK_COUNT_BYTES:
            return _BAD_LENGTH
        p = off + HEADER_BYTES
        n = (np.int64(shard[p]) << 8) | np.int64(shard[p + 1])
        if length != MASK_COUNT_BYTES + n * width + (n + 7) // 8:
            return _BAD_LENGTH
    elif length % width != 0:
        return _BAD_LENGTH
    return _OK


@cpu_kernel
def packet_status(shard, off, tables, width_table, masked_table, skip_table):  # pragma: no cover
    """Full verdict for one packet: framing first, then payload layout."""
    status = frame_status(shard, off, tables)
    if status != _OK:
        return status
    return payload_status(shard, off, width_table, masked_table, skip_table)


@cpu_kernel
def _validate_packets(shard, offsets, status, tables, width_t, masked_t, skip_t, lo, hi):  # pragma: no cover
    for k in range(lo, hi):
        status[k] = packet_status(shard, np.int64(offsets[k]), tables, width_t, masked_t, skip_t)


def validate_packets_cpu(shard: np.ndarray, offsets: np.ndarray, status: np.ndarray) -> None:
    """Write a ``DropReason`` code per packet into ``status`` (uint8, same length as offsets).

    ``shard`` is the whole shard as uint8; ``offsets`` (int64) point at packet starts. Packets
    are checked in parallel on ndp's host threads (``ndp.engine.threads``). Synchronous; allocates
    nothing.
    """
    parallel_for(_validate_packets, offsets.shape[0], shard, offsets, status, CRC16_TABLES,
                 TYP_WIDTH_TABLE, TYP_MASKED_TABLE, TYP_SKIP_TABLE, grain=VALIDATE_GRAIN)


def crc16_cpu(data: np.ndarray, crc: int = CRC16_INIT) -> int:
    """CRC-16/CCITT-FALSE of a uint8 array, continuing from state ``crc``."""
    return int(crc16_update_host(np.uint32(crc), data, 0, data.shape[0], CRC16_TABLES))


@cpu_kernel
def scan_frames(data, pos, tables, known_typ, offsets, bad_off, bad_len, bad_reason):  # pragma: no cover
    """Framing scan from byte ``pos``: offsets of packets that frame and pass their CRC, and
    corrupt regions (offset, length, first failure) between them. Stops when the output
    arrays are full; returns (packets, regions, next position). See ``ndp.store.index``."""
    size = data.shape[0]
    n_ok = 0
    n_bad = 0
    cap = offsets.shape[0]
    while pos < size and n_ok < cap and n_bad < cap:
        status = frame_status(data, pos, tables)
        if status == DropReason.OK:
            offsets[n_ok] = pos
            n_ok += 1
            pos += FRAME_BYTES + ((np.int64(data[pos + 4]) << 8) | np.int64(data[pos + 5]))
            continue
        q = pos + 1
        while q < size:
            if (
                data[q] == SYNC
                and q + FRAME_BYTES <= size
                and known_typ[data[q + 3]] != 0
                and frame_status(data, q, tables) == DropReason.OK
            ):
                break
            q += 1
        bad_off[n_bad] = pos
        bad_len[n_bad] = q - pos
        bad_reason[n_bad] = status
        n_bad += 1
        pos = q
    return n_ok, n_bad, pos


@cpu_kernel
def _headers_differ(data, offsets, lengths, src, dst, typ, out, lo, hi):  # pragma: no cover
    for k in range(lo, hi):
        off = np.int64(offsets[k])
        length = (np.int64(data[off + 4]) << 8) | np.int64(data[off + 5])
        out[k] = (data[off] != SYNC or data[off + 1] != src[k] or data[off + 2] != dst[k]
                  or data[off + 3] != typ[k] or length != np.int64(lengths[k]))


def headers_differ(data: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, src: np.ndarray,
                   dst: np.ndarray, typ: np.ndarray, out: np.ndarray) -> None:
    """``out[k]``: whether the header at ``offsets[k]`` (sync, SRC, DST, TYP, LEN) differs from
    the claimed ``src[k]``, ``dst[k]``, ``typ[k]``, ``lengths[k]``. Every frame must lie inside
    ``data`` (the caller checks). Reads 6 bytes per packet, on ndp's threads: touching each
    packet's page is most of the cost, and page faults run in parallel."""
    parallel_for(_headers_differ, offsets.shape[0], data, offsets, lengths, src, dst, typ, out,
                 grain=1 << 16)
