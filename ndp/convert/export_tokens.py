"""What ``ndp export`` reads: a dataset's token packets, validated, and their tokens, a block of
packets at a time (``Shard.packet_blocks``: pread into ndp's own buffer, so a shard cut while it
is exported is a ``ShardChangedError`` naming it, never a SIGBUS, and memory stays one block),
with what the first pass learns of them (``Measure``: the count, the largest id, and where a
file may end)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ndp.errors import PacketError
from ndp.wire.format import (
    FRAME_BYTES,
    HEADER_BYTES,
    MASK_COUNT_BYTES,
    TYP_MASKED_TABLE,
    TYP_WIDTH_TABLE,
    DropReason,
)


class Measure:
    """What the first pass learns of the tokens: their count, the largest id, the masked
    packets, and where files may be cut (``bounds``): at each document's start where the
    documents are cut at an EOS id (``eos``, ``split``), else between packets."""

    def __init__(self, eos: int | None, split: str | None) -> None:
        self.eos, self.shift = eos, 1 if split == "after" else 0
        self.total, self.max_id, self.masked = 0, -1, 0
        self._bounds: list[np.ndarray] = [np.zeros(1, np.int64)]

    def add(self, tokens: np.ndarray, per_packet: np.ndarray, masked: int) -> None:
        if tokens.shape[0]:
            self.max_id = max(self.max_id, int(tokens.max()))
        if self.eos is not None:  # documents start at (before) or after each EOS
            self._bounds.append(np.flatnonzero(tokens == self.eos) + (self.total + self.shift))
        else:
            self._bounds.append(np.cumsum(per_packet) + self.total)
        self.total += int(tokens.shape[0])
        self.masked += masked

    def bounds(self) -> np.ndarray:
        """Where a file may end (sorted, 0 and the total included)."""
        return np.unique(np.concatenate([*self._bounds, [self.total]]))


_BIG_ENDIAN = {2: ">u2", 4: ">u4"}


def checked_packets(shard, index, measure: Measure) -> tuple[np.ndarray, int]:
    """Index entries of ``shard``'s token packets, after validating every packet, and the
    count of valid packets that carry no tokens; the tokens are measured (``measure``) from
    the same read. A corrupt packet raises ``PacketError`` naming the shard and byte offset.
    Read a block of packets at a time (``Shard.packet_blocks``: pread, so a shard cut
    meanwhile is a ``ShardChangedError`` naming it, never a SIGBUS)."""
    from ndp.engine.reference import validate

    offsets = index.offsets
    ends = offsets + FRAME_BYTES + index.entries["length"].astype(np.int64)
    starts = np.concatenate([[index.data_offset], ends]).astype(np.int64)
    gaps = np.flatnonzero(np.append(offsets, shard.size) != starts)
    if gaps.size:  # bytes no packet covers: damage a rebuilt index steps over
        k = int(gaps[0])
        end = int(offsets[k]) if k < offsets.shape[0] else shard.size
        raise PacketError(
            f"{shard.path}: bytes {int(starts[k])}..{end} hold no valid packet (the index steps "
            "over them); an export would lose their tokens. Run 'ndp verify "
            f"{shard.path}' and re-convert the shard from its source."
        )
    status = np.empty(offsets.shape[0], np.uint8)
    for i, j, data, at in shard.packet_blocks(offsets, ends):
        ok = validate(data, at, out=status[i:j]) == DropReason.OK
        measure.add(*_packet_tokens(data, at[ok], index.entries[i:j][ok]))
    bad = np.flatnonzero(~np.isin(status, (DropReason.OK, DropReason.NOT_TOKENS,
                                           DropReason.UNKNOWN_TYPE)))
    if bad.size:
        k = int(bad[0])
        raise PacketError(
            f"{shard.path}: packet at byte {int(offsets[k])} is corrupt "
            f"({DropReason(int(status[k])).name}); {bad.size} corrupt packet(s) in this shard. "
            f"An export would silently lose their tokens: run 'ndp verify {shard.path}' and "
            "re-convert the shard from its source."
        )
    ok = status == DropReason.OK
    return index.entries[ok], int(status.shape[0] - ok.sum())


def token_blocks(shard, entries: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """The tokens of the token packets ``entries`` (validated), a block of packets at a time:
    ``(tokens, per_packet, masked)``: the block's tokens in packet order (uint16 or uint32,
    as the packets store them), each packet's token count, and how many are masked."""
    offsets = entries["offset"].astype(np.int64)
    ends = offsets + FRAME_BYTES + entries["length"].astype(np.int64)
    for i, j, data, at in shard.packet_blocks(offsets, ends):
        yield _packet_tokens(data, at, entries[i:j])


def _packet_tokens(data: np.ndarray, at: np.ndarray, entries: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, int]:
    """``token_blocks``' answer for the packets at ``at`` in ``data``: the bytes of every
    payload's tokens picked at once, runs of packets of one token width at a time (a loop over
    packets in Python cost ~40 us a packet: 100 s for a shard of 2.4 M short packets)."""
    typ = entries["typ"]
    width = TYP_WIDTH_TABLE[typ].astype(np.int64)
    masked = TYP_MASKED_TABLE[typ].astype(bool)
    count_at = at + HEADER_BYTES  # a masked payload starts with its token count (2 bytes BE)
    n = np.where(masked, (data[count_at].astype(np.int64) << 8) | data[count_at + 1],
                 entries["length"].astype(np.int64) // width)
    first, size = count_at + masked * MASK_COUNT_BYTES, n * width  # each payload's token bytes
    cuts = np.flatnonzero(np.diff(width)) + 1
    parts = [_pick(data, first[lo:hi], size[lo:hi]).view(_BIG_ENDIAN[int(width[lo])])
             for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), width.shape[0]]) if hi > lo]
    if not parts:
        return np.zeros(0, np.uint16), n, 0
    if len(parts) == 1:
        tokens = parts[0].astype(parts[0].dtype.newbyteorder("="))
    else:  # token widths change within the block (rare: convert picks one for a dataset)
        tokens = np.concatenate([p.astype(np.uint32) for p in parts])
    return tokens, n, int(masked.sum())


def _pick(data: np.ndarray, first: np.ndarray, size: np.ndarray) -> np.ndarray:
    """``data[first[k]: first[k] + size[k]]`` for every k, concatenated (ranges in order, not
    overlapping). Long ranges are copied one by one (~0.5 us each); short ones through a mask
    of the bytes kept (~0.7 ns a byte: 8 MB of 100-byte packets in 6 ms where a loop over
    80,000 slices takes 40 ms)."""
    stop = int(first[-1] + size[-1])
    if stop - int(first[0]) >= 1024 * first.shape[0]:  # packets of 1 KB and more
        return np.concatenate([data[a: a + b] for a, b in zip(first.tolist(), size.tolist())])
    runs = np.empty(2 * first.shape[0], np.int64)  # bytes dropped, then kept, packet by packet
    runs[0::2] = first - np.concatenate([[0], first[:-1] + size[:-1]])
    runs[1::2] = size
    keep = np.zeros(runs.shape[0], bool)
    keep[1::2] = True
    return data[:stop][np.repeat(keep, runs)]
