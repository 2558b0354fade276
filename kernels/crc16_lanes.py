"""CRC-16/CCITT-FALSE split across the lanes of a group: the CPU reference of the device's
long-packet verdicts (``verdict_cuda.verdicts_lanes_cuda``), which must give ``crc16_update``'s
state bit for bit.

One thread per packet runs a 4 KB packet's CRC as 513 dependent slice-by-8 steps while the other
lanes of its warp idle (Nsight Compute on the H100: 0.9% of DRAM bandwidth, 6% occupancy,
``benchmarks/results/kernel-profile-20261127-065339.json``). Here ``lanes`` threads share one
packet, and neighbouring lanes read neighbouring bytes:

* The range is cut into 8-byte chunks; lane ``l`` takes chunks ``l``, ``l + lanes``, ... A lane
  runs the slice-by-8 step over its chunks as if the chunks between them were zero bytes: its
  state, moved across ``lanes - 1`` zero chunks, is one lookup in each of two tables (``zhi``,
  ``zlo``: a CRC state times ``x^(64 (lanes - 1)) mod P`` is linear in its two bytes), then the
  step folds it into the next chunk as the table loop does.
* A CRC over zero bytes from state 0 stays 0, and the CRC is linear: the XOR of the lanes'
  states, each moved across the zero chunks after its last one (``mulmod16`` by ``xpow8``), is
  the state after every chunk. The starting state rides in lane 0's first chunk, where the table
  loop puts it; the last ``< 8`` bytes go through the table loop from the joined state.

States are polynomials over GF(2) below ``P = x^16 + CRC16_POLY``; a zero byte multiplies a
state by ``x^8``. Every value is a ``uint32`` below 2**16, widened before shifts, as in
``crc16.py`` (so the simulator and a device agree).
"""

from __future__ import annotations

import numpy as np

from ndp.wire.format import CRC16_POLY
from ndp.kernels._jit import cpu_kernel
from ndp.kernels.crc16 import crc16_update

#: bytes a lane's step reads (the slice-by-8 step's)
CHUNK = 8


@cpu_kernel
def mulmod16(a, b):  # pragma: no cover - compiled
    """``a * b mod P`` over GF(2), for states ``a``, ``b`` below 2**16."""
    a = np.uint32(a)
    b = np.uint32(b)
    r = np.uint32(0)
    for i in range(15, -1, -1):
        top = r & np.uint32(0x8000)
        r = (r << np.uint32(1)) & np.uint32(0xFFFF)
        if top != 0:
            r ^= np.uint32(CRC16_POLY)
        if (b >> np.uint32(i)) & np.uint32(1) != 0:
            r ^= a
    return r


@cpu_kernel
def xpow8(n):  # pragma: no cover - compiled
    """``x^(8 n) mod P``: a state times this is the state after ``n`` zero bytes."""
    result = np.uint32(1)
    base = np.uint32(0x100)  # x^8
    n = np.int64(n)
    while n > 0:
        if n & 1:
            result = mulmod16(result, base)
        base = mulmod16(base, base)
        n >>= 1
    return result


@cpu_kernel
def gap_tables(lanes, zhi, zlo):  # pragma: no cover - compiled
    """``zhi[v] ^ zlo[w]`` = the state ``v << 8 | w`` after the ``lanes - 1`` zero chunks
    between two chunks of one lane."""
    k = xpow8(CHUNK * (lanes - 1))
    for v in range(256):
        zhi[v] = mulmod16(np.uint32(v) << np.uint32(8), k)
        zlo[v] = mulmod16(np.uint32(v), k)


@cpu_kernel
def crc16_lane(init, buf, start, nchunks, lane, lanes, tables, zhi, zlo):  # pragma: no cover
    """Lane ``lane``'s state over its chunks of ``buf[start:start + 8 nchunks]`` (chunks
    ``lane``, ``lane + lanes``, ...; the others as zero bytes), up to its last chunk; lane 0
    starts from ``init``, the others from 0."""
    acc = np.uint32(0)
    s = np.uint32(init) if lane == 0 else np.uint32(0)
    c = np.int64(lane)
    while c < nchunks:
        i = start + CHUNK * c
        x0 = (np.uint32(buf[i]) ^ (s >> np.uint32(8))) & np.uint32(0xFF)
        x1 = (np.uint32(buf[i + 1]) ^ s) & np.uint32(0xFF)
        acc = (
            tables[7, x0]
            ^ tables[6, x1]
            ^ tables[5, buf[i + 2]]
            ^ tables[4, buf[i + 3]]
            ^ tables[3, buf[i + 4]]
            ^ tables[2, buf[i + 5]]
            ^ tables[1, buf[i + 6]]
            ^ tables[0, buf[i + 7]]
        )
        s = zhi[acc >> np.uint32(8)] ^ zlo[acc & np.uint32(0xFF)]
        c += lanes
    return acc


@cpu_kernel
def zero_chunks_after(nchunks, lane, lanes):  # pragma: no cover - compiled
    """Chunks after lane ``lane``'s last one (its state is moved across them before the XOR);
    0 for a lane with no chunk (its state is 0)."""
    if lane >= nchunks:
        return np.int64(0)
    last = lane + ((nchunks - 1 - lane) // lanes) * lanes
    return np.int64(nchunks - 1 - last)


@cpu_kernel
def crc16_by_lanes(init, buf, start, stop, tables, lanes):  # pragma: no cover - compiled
    """``crc16_update(init, buf, start, stop, tables)``, computed as ``lanes`` lanes do: the
    reference the device's lanes must equal."""
    zhi = np.empty(256, np.uint32)
    zlo = np.empty(256, np.uint32)
    gap_tables(lanes, zhi, zlo)
    nchunks = (stop - start) // CHUNK
    state = np.uint32(init)
    if nchunks > 0:
        state = np.uint32(0)
        for lane in range(lanes):
            part = crc16_lane(init, buf, start, nchunks, lane, lanes, tables, zhi, zlo)
            state ^= mulmod16(part, xpow8(CHUNK * zero_chunks_after(nchunks, lane, lanes)))
    return crc16_update(state, buf, start + CHUNK * nchunks, stop, tables)
