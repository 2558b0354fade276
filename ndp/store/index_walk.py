"""One compiled pass over an index's entries for ``ndp.store.index.check_structure``: each entry
inside the file, after the shard header, and starting at or after the end of the packet before
it; and where the entries leave gaps (the bytes a scan would call corrupt, or a packet the index
left out, which the caller looks for there).

The pass holds nothing per entry (~2 ms for 1.7 M entries, where the same checks as NumPy
passes over blocks of entries took 17-38 ms: a shard's first-use check stands between a Loader
and its first batch, once per shard of the window it starts in).
"""

from __future__ import annotations

import numba
import numpy as np

from ndp.wire.format import FRAME_BYTES, INDEX_ENTRY_DTYPE

#: problems ``walk`` reports
OK, PAST_END, INTO_HEADER, OVERLAP = 0, 1, 2, 3
#: gaps whose entries one ``walk`` records (a sound index has none; a damaged shard's index a
#: few): more than this, and the caller finds them with NumPy
GAPS = 4096


@numba.njit(nogil=True, cache=True)
def _walk(offsets, lengths, start, size, frame, gap_at):  # pragma: no cover - compiled
    end = start
    gaps = 0
    for i in range(offsets.shape[0]):
        off = offsets[i]
        if off > size:  # first: a hostile offset near 2**64 must not wrap the sum below
            return PAST_END, i, gaps
        stop = off + frame + np.uint64(lengths[i])
        if stop > size:
            return PAST_END, i, gaps
        if i == 0 and off < start:
            return INTO_HEADER, i, gaps
        if off < end:
            return OVERLAP, i, gaps
        if off > end:
            if gaps < gap_at.shape[0]:
                gap_at[gaps] = i
            gaps += 1
        end = stop
    return OK, offsets.shape[0], gaps


def walk(entries: np.ndarray, start: int, size: int) -> tuple[int, int, np.ndarray | None]:
    """``(problem, entry, gapped)``: the first problem (``OK`` if none) and the entry it is at,
    and the entries a gap precedes (their numbers; None when there are more than ``GAPS``)."""
    gap_at = np.empty(GAPS, np.int64)
    problem, at, gaps = _walk(entries["offset"], entries["length"], np.uint64(start),
                              np.uint64(size), np.uint64(FRAME_BYTES), gap_at)
    return int(problem), int(at), gap_at[:gaps].copy() if gaps <= GAPS else None


#: splitmix64's constants (``digest``)
_GOLDEN, _M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), \
    np.uint64(0x94D049BB133111EB)


@numba.njit(inline="always")
def _mix(z):  # pragma: no cover - compiled
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@numba.njit(nogil=True, cache=True)
def _digest(words):  # pragma: no cover - compiled
    h = np.uint64(words.shape[0])
    for i in range(words.shape[0]):
        at = np.uint64(i) * _GOLDEN
        h += _mix(words[i, 0] + at) ^ _mix(words[i, 1] ^ (at + _GOLDEN))
    return h


def digest(entries: np.ndarray) -> int:
    """A 64-bit hash of index ``entries``' bytes (each entry's two 8-byte words, at its place):
    a sum of splitmix64 mixes, which the CPU works out for many entries at once (~1 ms for 1.7
    M entries, where a crc32 of their bytes took ~9 ms). What names the entries a count was
    made from (``ndp.loader.planning.shared_count``): it tells entries that changed from those that
    did
    not, which is all it is for; it is no defence against entries made to collide on
    purpose."""
    words = np.ascontiguousarray(entries, INDEX_ENTRY_DTYPE).view(np.uint64).reshape(-1, 2)
    return int(_digest(words))


@numba.njit(nogil=True, cache=True)
def _marked(dst, flag):  # pragma: no cover - compiled
    n = 0
    for i in range(1, dst.shape[0]):  # a shard's first packet continues nothing
        if dst[i] & flag:
            n += 1
    return n


def marked(entries: np.ndarray, flag: int) -> int:
    """How many entries after the first have ``flag`` set in their DST (split documents'
    later pieces, ``ndp.store.pieces``), in one compiled pass."""
    return int(_marked(entries["dst"], np.uint8(flag)))
