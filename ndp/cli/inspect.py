"""What a shard holds (``ndp inspect``) and whether it is intact (``ndp verify``).

Both scan the shard itself rather than trusting its index, then compare the index with the scan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ndp.engine.reference import validate
from ndp.errors import IndexMismatchError, NDPError
from ndp.wire.format import DropReason, Dst, Src, Typ
from ndp.store.index import check_index, read_index, scan_shard
from ndp.kernels.build import token_counts_cpu
from ndp.store.shard import Shard


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
    length_histogram: dict[str, int] = field(default_factory=dict)  # "lo-hi" tokens -> packets
    dropped: dict[str, int] = field(default_factory=dict)  # framed packets the decoder drops
    corrupt_regions: int = 0
    corrupt_bytes: int = 0
    index: str = "missing"  # ok | missing | stale: <why>
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
    damaged bytes; a newer format version, an unreadable file or one that holds no valid
    packet (such as a JSONL file) is a problem in the report.

    A stale index is a problem. A missing one is not damage (a headerless stream of packets is
    a valid shard, and the framing scan has checked every packet anyway): it is reported in
    ``index`` only, and is a problem only with ``require_index``."""
    try:
        shard = Shard(path)
    except (NDPError, OSError) as err:
        report = ShardReport(str(path), 0, None)
        report.problems.append(str(err))
        return report
    report = ShardReport(str(path), shard.size, shard.header.version)
    if shard.header.problem:
        report.problems.append(f"byte 0: {shard.header.problem}")
    result = scan_shard(shard)
    entries = result.entries
    report.packets = int(entries.shape[0])
    report.corrupt_regions = len(result.corrupt)
    report.corrupt_bytes = result.corrupt_bytes
    report.problems += [c.describe() for c in result.corrupt]
    for key, enum_type, column in (("by_src", Src, "src"), ("by_dst", Dst, "dst"),
                                   ("by_typ", Typ, "typ")):
        values, counts = np.unique(entries[column], return_counts=True)
        setattr(report, key, {_name(enum_type, int(v)): int(n) for v, n in zip(values, counts)})
    offsets = entries["offset"].astype(np.int64)
    status = validate(shard.data, offsets)
    token_rows = np.flatnonzero(status == DropReason.OK)
    counts = np.empty(token_rows.shape[0], np.int64)
    token_counts_cpu(shard.data, offsets, token_rows, token_rows.shape[0], counts)
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
    report.index = _index_state(shard, entries)
    if report.index != "ok" and (report.index != "missing" or require_index):
        report.problems.append(f"index: {report.index}")
    return report


def _index_state(shard: Shard, scanned: np.ndarray) -> str:
    """"ok", "missing" or "stale: <why>": the sidecar against a framing scan's entries, field by
    field (offset, LEN, SRC, DST, TYP), after the checks every reader makes."""
    try:
        index = read_index(shard.index_path)
        check_index(index, shard)
    except FileNotFoundError:
        return "missing"
    except IndexMismatchError as err:
        return f"stale: {err}"
    except OSError as err:
        return f"unreadable: {shard.index_path}: {err.strerror or err}"
    fields = ["offset", "length", "src", "dst", "typ"]
    if len(index) != scanned.shape[0] or any(
            not np.array_equal(index.entries[f], scanned[f]) for f in fields):
        return "stale: its entries differ from a framing scan of the shard"
    return "ok"

