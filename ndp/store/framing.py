"""The framing scan of a whole shard, a block at a time: the packets and corrupt regions that
``ndp.store.index.scan`` finds in the file as one array, found from blocks read with pread
(``Shard.read_into``) instead of a mapping, so that a shard cut meanwhile is a
``ShardChangedError`` naming it, never a SIGBUS, and memory stays one block (8 MiB) for a
shard of any size.

Why the blocks give the whole-file answer. The scan is a walk: at a packet start it checks the
frame and steps over it; where the bytes do not frame, it opens a corrupt region and looks for
the next sync byte whose packet validates and carries a defined TYP (a resync point). What it
decides at byte ``p`` depends on bytes ``[p, p + MAX_PACKET_BYTES)`` only (8 + 65,535), so
inside a window ``[base, end)`` every decision at ``p < end - MAX_PACKET_BYTES`` (the window's
``limit``; the file's end in the last window) is the whole file's. Each window keeps the events
(packets, regions) that lie below its limit and hands the rest to the next window, which starts
at the limit (blocks overlap by one largest packet: 0.8% of an 8 MiB block read twice):

* a packet that starts below the limit lies wholly inside the window, and is kept;
* a region that ends below the limit is kept; one that runs past it stays open (its first byte
  and its reason), and the next window goes on looking for a resync point from the limit;
* looking for a resync point at ``q`` is ``scan_frames``' own resync test: a frame that
  validates there with a defined TYP closes the region; one with an undefined TYP does not
  (the walk goes on from ``q + 1``); a frame that fails there opens the region that
  ``scan_frames`` then reports from ``q``, which is the open one continued.

``tests/store/test_framing.py`` checks this against the one-array scan on damaged shards, with
blocks small enough that every packet and region straddles a boundary somewhere.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from ndp.errors import ConfigError
from ndp.kernels.crc16 import CRC16_TABLES, frame_status, scan_frames
from ndp.store.shard import BLOCK_BYTES, Shard
from ndp.wire.format import (
    INDEX_ENTRY_DTYPE,
    MAX_PACKET_BYTES,
    TYP_SKIP_TABLE,
    DropReason,
)

#: resync points must carry a TYP this format defines (token or value types): the same test
#: as ``ndp.store.index``'s scan
KNOWN_TYP = (TYP_SKIP_TABLE != DropReason.UNKNOWN_TYPE).astype(np.uint8)
#: events (packets, regions) one ``scan_frames`` call may return: 512 KiB per output array
_EVENTS = 1 << 16


@dataclass
class Piece:
    """What one window of the scan found. ``data`` is the window's bytes (file offset
    ``base``), overwritten by the next window: use it before asking for the next piece."""

    base: int
    data: np.ndarray
    #: packets found (int64, offsets in ``data``; each packet lies wholly inside ``data``)
    offsets: np.ndarray
    #: corrupt regions closed in this window: (file offset, length, ``DropReason`` code)
    corrupt: list[tuple[int, int, int]]
    #: the bytes of ``data`` no earlier window held: a crc32 folded over them piece by piece
    #: is the whole file's
    new: np.ndarray


class _Events:
    """``scan_frames``' output arrays, reused for every call."""

    def __init__(self) -> None:
        self.ok = np.empty(_EVENTS, np.int64)
        self.bad_off = np.empty(_EVENTS, np.int64)
        self.bad_len = np.empty(_EVENTS, np.int64)
        self.bad_reason = np.empty(_EVENTS, np.uint8)

    def scan(self, data: np.ndarray, pos: int) -> tuple[int, int, int]:
        n_ok, n_bad, nxt = scan_frames(data, pos, CRC16_TABLES, KNOWN_TYP, self.ok,
                                       self.bad_off, self.bad_len, self.bad_reason)
        return int(n_ok), int(n_bad), int(nxt)


def pieces(shard: Shard, *, block: int = BLOCK_BYTES) -> Iterator[Piece]:
    """The framing scan of ``shard`` (after its header), one window of ``block`` bytes at a
    time (module docstring). Reads every byte of the file, the header included (``Piece.new``);
    ``ShardChangedError`` if the file is cut or replaced while read, or after the last read."""
    if block <= MAX_PACKET_BYTES:
        raise ConfigError(f"a scan block must hold more than one largest packet "
                          f"({MAX_PACKET_BYTES:,} bytes), got {block:,}")
    size = shard.size
    events = _Events()
    buf = np.empty(min(block, size), np.uint8)
    cursor = shard.header.data_offset  # next byte to decide: a packet start, or a resync try
    open_region: tuple[int, int] | None = None  # (first byte, reason) of a region not closed
    read_to = 0  # bytes [0, read_to) were read by earlier windows
    while read_to < size:
        base = min(cursor, read_to)
        end = min(size, base + block)
        data = buf[: end - base]
        shard.read_into(base, data)
        limit = (end if end == size else end - MAX_PACKET_BYTES) - base
        found: list[np.ndarray] = []
        corrupt: list[tuple[int, int, int]] = []
        pos, open_region = _window(data, base, cursor - base, limit, open_region, events,
                                   found, corrupt)
        if end == size and open_region is not None:  # (a region running to the file's end
            # closes in _window, whose limit is then the end; kept should that ever change)
            corrupt.append((open_region[0], size - open_region[0], open_region[1]))
            open_region = None
        offsets = np.concatenate(found) if found else np.zeros(0, np.int64)
        yield Piece(base, data, offsets, corrupt, data[read_to - base:])
        cursor, read_to = base + pos, end
    shard.check_unchanged()


def _window(data: np.ndarray, base: int, pos: int, limit: int, open_region, events: _Events,
            found: list, corrupt: list) -> tuple[int, tuple[int, int] | None]:
    """Decide every byte of ``data`` below ``limit`` from ``pos`` on (positions in ``data``):
    packets into ``found``, closed regions into ``corrupt``. Returns where the next window
    goes on, and the region still open there (or None)."""
    while pos < limit:
        continued = open_region is not None
        if continued:  # a resync try at pos, as scan_frames' resync loop makes it
            if frame_status(data, pos, CRC16_TABLES) == DropReason.OK:
                if not KNOWN_TYP[data[pos + 3]]:
                    pos += 1  # frames, but with an undefined TYP: not a resync point
                    continue
                start, reason = open_region
                corrupt.append((start, base + pos - start, reason))
                open_region, continued = None, False
        n_ok, n_bad, nxt = events.scan(data, pos)
        ok = events.ok[:n_ok]
        starts, lengths = events.bad_off[:n_bad], events.bad_len[:n_bad]
        keep_ok = int(np.searchsorted(ok, limit))  # packets that start below the limit
        keep_bad = int(np.searchsorted(starts + lengths, limit, side="right"))  # end by it
        regions = [(base + int(s), int(n), int(r)) for s, n, r in
                   zip(starts[:n_bad].tolist(), lengths.tolist(), events.bad_reason[:n_bad])]
        if continued:  # scan_frames reports the open region from pos on: it is that one
            first, reason = open_region
            regions[0] = (first, regions[0][0] + regions[0][1] - first, reason)
            open_region = None
        found.append(ok[:keep_ok] + 0)  # a copy: the arrays are reused
        corrupt.extend(regions[:keep_bad])
        if keep_ok == n_ok and keep_bad == n_bad:  # all kept: the arrays were full, or the end
            pos = nxt
            continue
        first_ok = int(ok[keep_ok]) if keep_ok < n_ok else len(data)
        first_bad = int(starts[keep_bad]) if keep_bad < n_bad else len(data)
        if first_bad < first_ok and first_bad < limit:  # a region across the limit stays open
            start, _, reason = regions[keep_bad]
            return limit, (start, reason)
        return min(first_ok, first_bad), None
    return pos, open_region


def scan_blocks(shard: Shard, *, block: int = BLOCK_BYTES
                ) -> tuple[np.ndarray, list[tuple[int, int, int]], int]:
    """The whole framing scan of ``shard`` from ``pieces``: its index entries
    (``INDEX_ENTRY_DTYPE``), its corrupt regions (file offset, length, ``DropReason``) and the
    file's crc32, in one read of the file."""
    entries: list[np.ndarray] = []
    corrupt: list[tuple[int, int, int]] = []
    crc = 0
    for piece in pieces(shard, block=block):
        crc = zlib.crc32(piece.new, crc)
        entries.append(piece_entries(piece))
        corrupt += piece.corrupt
    out = np.concatenate(entries) if entries else np.zeros(0, INDEX_ENTRY_DTYPE)
    return out, corrupt, crc


def piece_entries(piece: Piece) -> np.ndarray:
    """Index entries of a piece's packets (file offsets; LEN, SRC, DST, TYP from their
    headers)."""
    at, data = piece.offsets, piece.data
    entries = np.zeros(at.shape[0], dtype=INDEX_ENTRY_DTYPE)
    entries["offset"] = at + piece.base
    entries["length"] = (data[at + 4].astype(np.uint16) << 8) | data[at + 5]
    entries["src"] = data[at + 1]
    entries["dst"] = data[at + 2]
    entries["typ"] = data[at + 3]
    return entries
