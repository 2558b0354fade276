"""Staging: gather the packets of one batch from a shard into a contiguous (pinned) buffer, so
one bulk copy moves them to the device. Host-side, but no decoding: bytes are copied as they
are, and only the two LEN bytes of each frame are read, to know how many bytes to move.

Each packet is copied from its offset up to where its frame claims to end (6 + LEN + 2 bytes),
cut at the end of the shard. ``limits[k]`` records where packet ``k``'s copy ends, i.e. where
its shard ended as far as that packet can tell; validating packet ``k`` in the staging buffer
against ``limits[k]`` therefore gives the verdict it gets in the shard itself (an offset outside
the shard, or a frame too short to hold its header, is staged as offset -1: TRUNCATED either way).
"""

from __future__ import annotations

import numpy as np

from ndp.wire.format import FRAME_BYTES
from ndp.kernels._jit import cpu_kernel
from ndp.engine.threads import parallel_for

#: packets per thread at least (a packet of 1,024 int32 tokens is a 4 KB copy)
GATHER_GRAIN = 512


@cpu_kernel
def _extents(shard, offsets, sizes):  # pragma: no cover - compiled
    size = shard.shape[0]
    total = 0
    for k in range(offsets.shape[0]):
        off = offsets[k]
        if off < 0 or off > size - FRAME_BYTES:
            sizes[k] = 0
        else:
            length = (np.int64(shard[off + 4]) << 8) | np.int64(shard[off + 5])
            sizes[k] = min(size - off, FRAME_BYTES + length)
        total += sizes[k]
    return total


@cpu_kernel
def _gather(shard, offsets, sizes, starts, dst, new_offsets, limits, lo, hi):  # pragma: no cover
    for k in range(lo, hi):
        s = starts[k]
        m = sizes[k]
        off = offsets[k]
        dst[s : s + m] = shard[off : off + m]
        new_offsets[k] = s if m > 0 else -1
        limits[k] = s + m


def staged_size(shard: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> int:
    """Bytes each packet occupies once staged (into ``sizes``), and their total."""
    return int(_extents(shard, offsets, sizes))


def gather_packets(
    shard: np.ndarray,
    offsets: np.ndarray,
    sizes: np.ndarray,
    dst: np.ndarray,
    new_offsets: np.ndarray,
    limits: np.ndarray,
) -> None:
    """Copy each packet (``sizes`` from ``staged_size``) into ``dst`` back to back, in order;
    its offset there into ``new_offsets`` (-1 if nothing was copied) and the end of its copy
    into ``limits``. ``dst`` must hold ``sum(sizes)`` bytes. Runs on ndp's host threads."""
    starts = np.zeros(sizes.shape[0], np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    parallel_for(_gather, offsets.shape[0], shard, offsets, sizes, starts, dst, new_offsets,
                 limits, grain=GATHER_GRAIN)

