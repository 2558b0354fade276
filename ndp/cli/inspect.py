"""What a shard holds (``ndp inspect``) and whether it is intact (``ndp verify``).

Both scan the shard itself rather than trusting its index, then compare the index with the scan.
The shard is read once, a block at a time, with pread (``ndp.store.framing``): a shard cut while
it is read is a problem in the report naming it, not a SIGBUS.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ndp.engine.reference import validate
from ndp.errors import IndexMismatchError, NDPError
from ndp.kernels.build import token_counts_cpu
from ndp.store.framing import piece_entries, pieces
from ndp.store.index import Corruption, check_index, read_index
from ndp.store.shard import Shard
from ndp.store.pieces import count_continued
from ndp.wire.format import DST_LAYER, INDEX_ENTRY_DTYPE, DropReason, Dst, Src, Typ


def _name(enum_type, value: int) -> str:
    try:
        return enum_type(value).name
    except ValueError:
        return f"reserved_0x{value:02X}"


@dataclass
class ShardReport:
    """The result of inspecting one shard. ``problems`` lists every finding with its offset."""

    path: str
    size: int
    version: int | None
    packets: int = 0
    tokens: int = 0
    by_src: dict[str, int] = field(default_factory=dict)
    by_dst: dict[str, int] = field(default_factory=dict)
    by_typ: dict[str, int] = field(default_factory=dict)
    #: packets that continue a split document (DST bit 7; ``by_dst`` counts their layer)
    continued: int = 0
    length_histogram: dict[str, int] = field(default_factory=dict)  # "lo-hi" tokens -> packets
    dropped: dict[str, int] = field(default_factory=dict)  # framed packets the decoder drops
    corrupt_regions: int = 0
    corrupt_bytes: int = 0
    index: str = "missing"  # ok | missing | stale: <why>
    crc32: int | None = None  # zlib.crc32 of the file as scanned (None: it could not be read)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _histogram(counts: np.ndarray) -> dict[str, int]:
    if counts.size == 0:
        return {}
    edges = [0, 1]
    while edges[-1] <= counts.max():
        edges.append(edges[-1] * 2)
    hist, _ = np.histogram(counts, bins=edges)
    return {f"{lo}-{hi - 1}": int(n) for lo, hi, n in zip(edges[:-1], edges[1:], hist) if n}


def inspect_shard(path: str | Path, *, require_index: bool = False) -> ShardReport:
    """Scan ``path`` and report its packets, corrupt regions and index state. Never raises for
    damaged bytes; a newer format version, an unreadable file, one cut or replaced while it is
    read, or one that holds no valid packet (such as a JSONL file) is a problem in the report.

    A stale index is a problem. A missing one is not damage (a headerless stream of packets is
    a valid shard, and the framing scan has checked every packet anyway): it is reported in
    ``index`` only, and is a problem only with ``require_index``.

    One read of the file, a block at a time (``ndp.store.framing``): the framing scan, each
    packet's verdict and token count, and the file's crc32 (``crc32``, for the index's and the
    manifest's checks) come from the same bytes, and memory stays one block."""
    try:
        shard = Shard(path)
    except (NDPError, OSError) as err:
        return ShardReport(str(path), 0, None, problems=[str(err)])
    report = ShardReport(str(path), shard.size, shard.header.version)
    try:
        _scan_into(report, shard)
    except (NDPError, OSError) as err:  # a ShardChangedError (cut while read) among them
        return ShardReport(str(path), shard.size, shard.header.version, problems=[str(err)])
    finally:
        shard.close()
    if report.index != "ok" and (report.index != "missing" or require_index):
        report.problems.append(f"index: {report.index}")
    return report


def _scan_into(report: ShardReport, shard: Shard) -> None:
    """Fill ``report`` from one blocked read of ``shard`` (``inspect_shard``)."""
    if shard.header.problem:
        report.problems.append(f"byte 0: {shard.header.problem}")
    found, statuses, token_counts, corrupt, crc = [], [], [], [], 0
    for piece in pieces(shard):
        crc = zlib.crc32(piece.new, crc)
        found.append(piece_entries(piece))
        status = validate(piece.data, piece.offsets)
        rows = np.flatnonzero(status == DropReason.OK)
        counts = np.empty(rows.shape[0], np.int64)
        token_counts_cpu(piece.data, piece.offsets, rows, rows.shape[0], counts)
        statuses.append(status)
        token_counts.append(counts)
        corrupt += [Corruption(o, n, DropReason(r)) for o, n, r in piece.corrupt]
    entries = np.concatenate(found) if found else np.zeros(0, INDEX_ENTRY_DTYPE)
    status = np.concatenate(statuses) if statuses else np.zeros(0, np.uint8)
    counts = np.concatenate(token_counts) if token_counts else np.zeros(0, np.int64)
    report.crc32 = crc
    report.packets = int(entries.shape[0])
    report.corrupt_regions = len(corrupt)
    report.corrupt_bytes = sum(c.length for c in corrupt)
    report.problems += [c.describe() for c in corrupt]
    report.continued = count_continued(entries)
    for key, enum_type, column in (("by_src", Src, "src"), ("by_dst", Dst, "dst"),
                                   ("by_typ", Typ, "typ")):
        raw = entries[column] & DST_LAYER if column == "dst" else entries[column]
        values, n = np.unique(raw, return_counts=True)
        setattr(report, key, {_name(enum_type, int(v)): int(k) for v, k in zip(values, n)})
    offsets = entries["offset"].astype(np.int64)
    report.tokens = int(counts.sum())
    report.length_histogram = _histogram(counts)
    body = shard.size - shard.header.data_offset
    if body and not np.isin(status, (DropReason.OK, DropReason.NOT_TOKENS)).any():
        after = " after its header" if shard.header.data_offset else ""
        report.problems.insert(0, f"holds no valid packet: none of its {body:,} bytes{after} "
                                  "frame an NDP packet with a good CRC (not an NDP shard, or "
                                  "damaged throughout; convert the data with 'ndp convert')")
    for code in np.flatnonzero(np.bincount(status, minlength=len(DropReason))):
        if code != DropReason.OK:
            bad = offsets[status == code]
            report.dropped[DropReason(code).name] = int(bad.size)
            if code in (DropReason.BAD_LENGTH, DropReason.UNKNOWN_TYPE):
                report.problems += [f"byte {o}: packet {DropReason(code).name}" for o in bad[:100]]
    report.index = _index_state(shard, entries, crc)


def _index_state(shard: Shard, scanned: np.ndarray, crc: int) -> str:
    """"ok", "missing" or "stale: <why>": the sidecar against a framing scan's entries, field by
    field (offset, LEN, SRC, DST, TYP), after the checks every reader makes. ``crc``: the
    file's crc32, from the scan's read (``verify="size"`` below skips a second read for it;
    the field-by-field comparison covers what its header checks would)."""
    try:
        index = read_index(shard.index_path)
        check_index(index, shard, verify="size")
    except FileNotFoundError:
        return "missing"
    except IndexMismatchError as err:
        return f"stale: {err}"
    except OSError as err:
        if isinstance(err, NDPError):  # the shard cut while its gaps were read: not the index
            raise
        return f"unreadable: {shard.index_path}: {err.strerror or err}"
    if index.shard_crc32 != crc:
        return (f"stale: {shard.index_path}: shard crc32 0x{index.shard_crc32:08x} recorded, "
                f"0x{crc:08x} found: {shard.path} changed since it was indexed. Rebuild it "
                f"with 'ndp index {shard.path}'.")
    fields = ["offset", "length", "src", "dst", "typ"]
    if len(index) != scanned.shape[0] or any(
            not np.array_equal(index.entries[f], scanned[f]) for f in fields):
        return "stale: its entries differ from a framing scan of the shard"
    return "ok"
