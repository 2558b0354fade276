"""The sidecar index: the framing scan that builds it, and reading it back without trusting it.

The scan walks a shard packet by packet. Where the bytes at the current position do not form a
packet (not a sync byte, a frame past the end of the file, or a CRC mismatch, which is how a
corrupted LEN shows), it records a corrupt region and resynchronises at the next sync byte whose
packet validates. Resynchronisation only accepts packets with a defined TYP, so a run of
garbage costs about one CRC per 10,000 bytes rather than one per 0xAA byte; a CRC-16 collision
inside garbage can still fake a packet with odds of 1 in 65,536 per candidate.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ndp.store.atomic import atomic_file
from ndp.errors import IndexMismatchError, NDPError, UnsupportedVersionError
from ndp.wire.format import (
    FRAME_BYTES,
    HEADER_BYTES,
    INDEX_ENTRY_DTYPE,
    INDEX_HEADER_BYTES,
    INDEX_HEADER_DTYPE,
    INDEX_MAGIC,
    INDEX_SUFFIX,
    INDEX_VERSION,
    DropReason,
)
from ndp.kernels.crc16 import CRC16_TABLES, headers_differ, scan_frames
from ndp.store.framing import KNOWN_TYP, scan_blocks
from ndp.store.index_walk import INTO_HEADER, OVERLAP, PAST_END, walk
from ndp.store.pieces import count_continued
from ndp.store.shard import Shard

# resync candidates must carry a TYP this format defines (token or value types)
_KNOWN_TYP = KNOWN_TYP
_SCAN_CHUNK = 1 << 20  # packets (and corrupt regions) per scan call: 8 MB of int64 each


@dataclass(frozen=True)
class Corruption:
    """A byte range of a shard that holds no valid packet, and why its first byte failed."""

    offset: int
    length: int
    reason: DropReason

    def describe(self) -> str:
        return f"byte {self.offset}: {self.length} bytes skipped ({self.reason.name})"


@dataclass
class ScanResult:
    """Every packet a framing scan found (index entries) and every corrupt region between."""

    entries: np.ndarray  # INDEX_ENTRY_DTYPE
    corrupt: list[Corruption]

    @property
    def corrupt_bytes(self) -> int:
        return sum(c.length for c in self.corrupt)


def entries_from_offsets(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Index entries for packets at ``offsets`` (already validated) of ``data``."""
    entries = np.zeros(offsets.shape[0], dtype=INDEX_ENTRY_DTYPE)
    entries["offset"] = offsets
    entries["length"] = (data[offsets + 4].astype(np.uint16) << 8) | data[offsets + 5]
    entries["src"] = data[offsets + 1]
    entries["dst"] = data[offsets + 2]
    entries["typ"] = data[offsets + 3]
    return entries


def scan(data: np.ndarray, start: int = 0) -> ScanResult:
    """Framing scan of ``data`` (uint8) from byte ``start``; never raises on bad bytes."""
    offs, bad_off, bad_len = (np.empty(_SCAN_CHUNK, np.int64) for _ in range(3))
    bad_reason = np.empty(_SCAN_CHUNK, np.uint8)
    found: list[np.ndarray] = []
    corrupt: list[Corruption] = []
    pos = start
    while pos < data.shape[0]:
        n_ok, n_bad, pos = scan_frames(
            data, pos, CRC16_TABLES, _KNOWN_TYP, offs, bad_off, bad_len, bad_reason
        )
        found.append(offs[:n_ok].copy())
        corrupt.extend(
            Corruption(int(o), int(n), DropReason(int(r)))
            for o, n, r in zip(bad_off[:n_bad], bad_len[:n_bad], bad_reason[:n_bad])
        )
    offsets = np.concatenate(found) if found else np.zeros(0, np.int64)
    return ScanResult(entries_from_offsets(data, offsets), corrupt)


def scan_shard(shard: Shard) -> ScanResult:
    """Framing scan of a shard's packets (after its header, if any)."""
    return scan_shard_crc(shard)[0]


def scan_shard_crc(shard: Shard) -> tuple[ScanResult, int]:
    """``scan_shard``, and the file's crc32, from one read of it a block at a time
    (``ndp.store.framing``: a shard cut meanwhile is a ``ShardChangedError``, never a SIGBUS,
    and what is held is one block whatever the shard's size)."""
    entries, corrupt, crc = scan_blocks(shard)
    return ScanResult(entries, [Corruption(int(o), int(n), DropReason(int(r)))
                                for o, n, r in corrupt]), crc


# --- the sidecar file ---------------------------------------------------------------------------
@dataclass
class Index:
    """A sidecar index: packet entries plus the shard size and crc32 it was made for."""

    entries: np.ndarray
    shard_size: int
    shard_crc32: int
    data_offset: int

    @property
    def offsets(self) -> np.ndarray:
        return self.entries["offset"].astype(np.int64)

    def __len__(self) -> int:
        return int(self.entries.shape[0])


def write_index(
    path: str | os.PathLike,
    entries: np.ndarray,
    shard_size: int,
    shard_crc32: int,
    data_offset: int,
) -> None:
    """Write an index atomically (``ndp.store.atomic``)."""
    head = np.zeros(1, dtype=INDEX_HEADER_DTYPE)
    head["magic"] = INDEX_MAGIC
    head["version"] = INDEX_VERSION
    head["entry_size"] = INDEX_ENTRY_DTYPE.itemsize
    head["n_packets"] = entries.shape[0]
    head["shard_size"] = shard_size
    head["shard_crc32"] = shard_crc32
    head["data_offset"] = data_offset
    head["continued"] = count_continued(entries)  # split documents' later pieces
    with atomic_file(path) as f:
        f.write(head.tobytes())
        f.write(np.ascontiguousarray(entries, dtype=INDEX_ENTRY_DTYPE).tobytes())


def read_index(path: str | os.PathLike) -> Index:
    """Read an index file; raise ``IndexMismatchError`` if it is damaged."""
    path = Path(path)
    return parse_index(path.read_bytes(), path)


def parse_index(raw: bytes, path: str | os.PathLike) -> Index:
    """The index in ``raw`` (read from ``path``); ``IndexMismatchError`` if it is damaged."""
    n, shard_size, shard_crc32, data_offset = parse_header(raw[:INDEX_HEADER_BYTES], len(raw),
                                                           path)
    entries = np.frombuffer(raw, dtype=INDEX_ENTRY_DTYPE, offset=INDEX_HEADER_BYTES, count=n)
    return Index(entries, shard_size, shard_crc32, data_offset)


def parse_header(head: bytes, file_bytes: int, path: str | os.PathLike
                 ) -> tuple[int, int, int, int]:
    """An index file's header ``head`` (its first ``INDEX_HEADER_BYTES``; the file holds
    ``file_bytes``): its packet count, the shard size and crc32 it was made for and the shard's
    data offset. ``IndexMismatchError`` if the header is damaged or the file's length is not
    what its packet count says (cut short, or extended)."""
    shard_name = str(path)[: -len(INDEX_SUFFIX)]
    hint = f"Rebuild it with 'ndp index {shard_name}'."
    if len(head) < INDEX_HEADER_BYTES or head[:8] != INDEX_MAGIC:
        raise IndexMismatchError(f"{path}: not an ndp index (bad magic or too short). {hint}")
    fields = np.frombuffer(head[:INDEX_HEADER_BYTES], dtype=INDEX_HEADER_DTYPE)[0]
    if int(fields["version"]) > INDEX_VERSION:
        raise UnsupportedVersionError(
            f"{path}: index version {int(fields['version'])}, this ndp reads up to "
            f"{INDEX_VERSION}. Upgrade ndp, or rebuild it with 'ndp index {shard_name}'."
        )
    n = int(fields["n_packets"])
    expected = INDEX_HEADER_BYTES + n * INDEX_ENTRY_DTYPE.itemsize
    if int(fields["entry_size"]) != INDEX_ENTRY_DTYPE.itemsize or file_bytes != expected:
        raise IndexMismatchError(
            f"{path}: {file_bytes} bytes, expected {expected} for {n} entries (truncated?). "
            f"{hint}"
        )
    return n, int(fields["shard_size"]), int(fields["shard_crc32"]), int(fields["data_offset"])


INDEX_CHECKS = ("full", "size")


def check_index(index: Index, shard: Shard, *, index_path: Path | None = None,
                verify: str = "full") -> None:
    """Raise ``IndexMismatchError`` unless ``index`` was made for exactly this shard's bytes.

    Checks the size, that every entry lies inside the file, and with ``verify="full"`` the
    crc32 of the whole file (a full read). ``"size"`` skips the read: a reader that validates
    every packet it decodes (the decoders do) still cannot return wrong tokens from a shard
    changed in place, it counts the damage as corrupt packets instead.
    """
    if verify not in INDEX_CHECKS:
        raise ValueError(f"verify must be one of {INDEX_CHECKS}, got {verify!r}")
    where = index_path or shard.index_path
    hint = f"Rebuild it with 'ndp index {shard.path}'."
    check_size(index.shard_size, shard, where)
    crc = shard.crc32() if verify == "full" else index.shard_crc32
    if index.shard_crc32 != crc:
        raise IndexMismatchError(
            f"{where}: shard crc32 0x{index.shard_crc32:08x} recorded, 0x{crc:08x} found: "
            f"{shard.path} changed since it was indexed (stale index). {hint}"
        )
    check_structure(index, shard, where=where, headers=verify == "full")


def check_size(shard_size: int, shard: Shard, where: Path | str) -> None:
    """``IndexMismatchError`` unless an index (at ``where``) made for a ``shard_size``-byte
    shard sits beside a shard of that size."""
    if shard_size != shard.size:
        raise IndexMismatchError(
            f"{where}: made for a {shard_size}-byte shard, {shard.path} has {shard.size} bytes "
            f"(stale index). Rebuild it with 'ndp index {shard.path}'.")


#: index entries ``check_structure`` checks at once
CHECK_BLOCK = 1 << 18


def check_structure(index: Index, shard: Shard, *, where: Path | str | None = None,
                    headers: bool = True) -> None:
    """Raise ``IndexMismatchError`` unless ``index`` is what a framing scan of ``shard`` would
    write, as far as can be told without reading the packets' payloads:

    * every entry lies inside the file, after the shard header, offsets strictly increasing
      and no packet overlapping the next (a repeated offset would deliver a packet twice);
    * the gaps between entries hold no packet a scan would find (they are the corrupt regions
      a scan records; an index listing a subset of the packets, or none, leaves packets there);
    * an entry a gap follows has its own header's LEN (and SRC, DST, TYP), even without
      ``headers``: a LEN cut short (all of them zeroed) turns the packet's payload into a gap
      with no packet in it, and claims fewer tokens than the shard holds (none at all). A sound
      index has a gap only where the shard is damaged, so this reads 6 bytes a gap, beside the
      gap's own bytes read above;
    * with ``headers``, every entry's LEN, SRC, DST and TYP are the packet's own header bytes
      (a flipped length would misplace packed windows). This reads 6 bytes of every packet:
      linear in the index, but one page of the shard per packet, so on a cold page cache it
      reads the whole shard from disk. Without it (``verify="size"``), the Loader checks each
      packet's header when it decodes it (``Corpus.check_headers``) and refuses a mismatch.

    Payloads (CRC) are not read: the decoders check every packet they decode. The order and the
    gaps are one compiled pass (``ndp.store.index_walk``), the headers ``CHECK_BLOCK`` entries at
    a time: what the check allocates does not grow with the shard."""
    where = where or shard.index_path
    hint = f"Rebuild it with 'ndp index {shard.path}'."
    size, start = shard.size, shard.header.data_offset
    entries = index.entries
    n = len(index)
    problem, at, gapped = walk(entries, start, size)  # one compiled pass (index_walk)
    if problem == PAST_END:
        raise IndexMismatchError(f"{where}: entries point past the end of the shard. {hint}")
    if problem == INTO_HEADER:
        raise IndexMismatchError(f"{where}: an entry points into the shard header. {hint}")
    if problem == OVERLAP:
        raise IndexMismatchError(
            f"{where}: entry {at} (byte {int(entries['offset'][at])}) repeats or overlaps the "
            f"packet before it; offsets must increase packet by packet. {hint}")
    offsets = entries["offset"]
    if gapped is None:  # more gaps than one pass records (a much damaged shard): NumPy's
        offsets = offsets.astype(np.int64)
        ends = offsets + FRAME_BYTES + entries["length"].astype(np.int64)
        gapped = np.flatnonzero(offsets > np.concatenate([[start], ends[:-1]]))
    if headers:
        for i in range(0, n, CHECK_BLOCK):
            check_headers(entries, np.arange(i, min(i + CHECK_BLOCK, n)), shard, where=where)
    else:  # an entry a gap follows: its own header's fields (see above)
        check_headers(entries, gapped[gapped > 0] - 1, shard, where=where)
    after = gapped - 1  # the entry before each gap (-1: the shard header)
    ends_before = np.where(after >= 0, offsets[np.maximum(after, 0)].astype(np.int64)
                           + FRAME_BYTES
                           + entries["length"][np.maximum(after, 0)].astype(np.int64), start)
    gaps = list(zip(ends_before.tolist(), offsets[gapped].astype(np.int64).tolist()))
    end = int(offsets[-1]) + FRAME_BYTES + int(entries["length"][-1]) if n else start
    if size > end:
        if n and not headers:
            check_headers(entries, np.array([n - 1]), shard, where=where)
        gaps.append((end, size))
    for a, b in gaps:
        found = _first_packet(shard.read(a, b - a), 0)
        if found >= 0:
            found += a
            raise IndexMismatchError(
                f"{where}: the index leaves out the packet at byte {found} (between bytes {a} "
                f"and {b}, where it lists none). {hint}")


def check_headers(entries: np.ndarray, which: np.ndarray, shard: Shard, *,
                  where: Path | str | None = None, data: np.ndarray | None = None,
                  at: np.ndarray | None = None, numbers: np.ndarray | None = None) -> None:
    """``IndexMismatchError`` unless the index ``entries[which]`` (all inside the shard) are
    the packets' own header bytes: sync, SRC, DST, TYP and LEN. ``data``/``at``: the packets'
    bytes already read (packet ``k`` at ``data[at[k]:]``), else the headers are read from the
    file (6 bytes each). ``numbers``: the entries' numbers in the index, for the error (else
    ``which``)."""
    if which.shape[0] == 0:
        return
    e = entries[which]
    offsets = e["offset"].astype(np.int64)
    if data is None:
        at = np.arange(which.shape[0], dtype=np.int64) * HEADER_BYTES
        data = np.empty(which.shape[0] * HEADER_BYTES, np.uint8)
        shard.read_ranges(offsets, np.full(which.shape[0], HEADER_BYTES, np.int64), data, at)
    wrong = np.empty(which.shape[0], np.bool_)
    headers_differ(data, np.ascontiguousarray(at, np.int64), np.ascontiguousarray(e["length"]),
                   np.ascontiguousarray(e["src"]), np.ascontiguousarray(e["dst"]),
                   np.ascontiguousarray(e["typ"]), wrong)
    if wrong.any():
        bad = int(np.flatnonzero(wrong)[0])
        number = int((which if numbers is None else numbers)[bad])
        raise IndexMismatchError(
            f"{where or shard.index_path}: entry {number} (byte {int(offsets[bad])}) "
            f"disagrees with the packet header there ({int(wrong.sum())} of {which.shape[0]} "
            f"entries checked do). Rebuild it with 'ndp index {shard.path}'.")


def _first_packet(data: np.ndarray, pos: int) -> int:
    """Offset of the first packet a framing scan of ``data`` from ``pos`` finds, or -1."""
    offs, bad_off, bad_len = (np.empty(16, np.int64) for _ in range(3))
    bad_reason = np.empty(16, np.uint8)
    while pos < data.shape[0]:
        n_ok, _, pos = scan_frames(data, pos, CRC16_TABLES, _KNOWN_TYP, offs, bad_off, bad_len,
                                   bad_reason)
        if n_ok:
            return int(offs[0])
    return -1


def load_index(shard: Shard, *, on_stale: str = "rebuild", verify: str = "full") -> Index:
    """The index of ``shard``: its sidecar if present and matching, else a fresh framing scan.

    ``on_stale="rebuild"`` (default) scans the shard when the sidecar is missing, unreadable
    (``OSError``: no permission, a directory in its place) or does not match (a warning says
    so; nothing is written); ``"error"`` raises ``IndexMismatchError``.
    """
    return load_index_and_scan(shard, on_stale=on_stale, verify=verify)[0]


def load_index_and_scan(shard: Shard, *, on_stale: str = "rebuild",
                        verify: str = "full") -> tuple[Index, ScanResult | None]:
    """As ``load_index``, and the framing scan's result when one was needed (its corrupt
    regions are the packets the index no longer lists), else ``None``."""
    path = shard.index_path

    def read() -> Index:
        index = read_index(path)
        check_index(index, shard, index_path=path, verify=verify)
        return index

    return index_or_scan(shard, read, on_stale=on_stale)


def index_or_scan(shard: Shard, read, *, on_stale: str = "rebuild", stacklevel: int = 4
                  ) -> tuple:
    """``read()`` (an index of ``shard`` it has checked), or where it fails because the sidecar
    is missing, unreadable or does not match, a framing scan of the shard (a warning says why;
    ``on_stale="error"``: ``IndexMismatchError``). Returns the index and the scan (or None)."""
    if on_stale not in ("rebuild", "error"):
        raise ValueError(f"on_stale must be 'rebuild' or 'error', got {on_stale!r}")
    path = shard.index_path
    try:
        return read(), None
    except FileNotFoundError:
        if on_stale == "error":
            raise IndexMismatchError(
                f"{path}: missing. Build it with 'ndp index {shard.path}'."
            ) from None
        problem = f"{path} is missing"
    except OSError as err:  # no permission, a directory in its place: as good as missing
        if isinstance(err, NDPError):  # the shard cut or unfetchable while checked: not this
            raise
        why = err.strerror or type(err).__name__
        if on_stale == "error":
            raise IndexMismatchError(
                f"{path}: unreadable ({why}). Make it readable, or rebuild it with "
                f"'ndp index {shard.path}'."
            ) from None
        problem = f"{path} is unreadable ({why})"
    except (IndexMismatchError, UnsupportedVersionError) as err:
        if on_stale == "error":
            raise
        problem = str(err)
    warnings.warn(f"{problem}; scanning the shard instead", stacklevel=stacklevel)
    result, crc = scan_shard_crc(shard)
    return Index(result.entries, shard.size, crc, shard.header.data_offset), result


def build_index(shard: Shard) -> tuple[Index, ScanResult]:
    """Scan ``shard`` and write its sidecar index; return the index and what the scan found."""
    result, crc = scan_shard_crc(shard)
    index = Index(result.entries, shard.size, crc, shard.header.data_offset)
    write_index(shard.index_path, index.entries, index.shard_size, index.shard_crc32,
                index.data_offset)
    return index, result
