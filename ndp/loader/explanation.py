"""What ``loader.explain(step)`` returns (``ndp.loader.explain`` works it out): an
``Explanation`` of a step, its rows' ``Piece``s of packets and the packets it ``Dropped``; plain
data (``to_dict``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

from ndp.wire.packet import decode_packet


@dataclass(frozen=True)
class Piece:
    """Tokens ``[start, stop)`` of one packet, in row ``row`` of the batch from column ``col``
    on. ``position``: its place in the rank's share of the epoch (``length`` on: the share
    again, a rank left short); ``packet``: its number in the dataset (shards in order);
    ``shard``/``offset``: the file and the byte offset of its frame's sync byte."""

    row: int
    col: int
    position: int
    packet: int
    shard: str
    offset: int
    src: int
    dst: int
    typ: int
    start: int
    stop: int


@dataclass(frozen=True)
class Dropped:
    """A packet the batch reached and dropped, and why (a ``DropReason`` name)."""

    position: int
    packet: int
    shard: str
    offset: int
    reason: str


@dataclass
class Explanation:
    """What made run step ``step`` (batch ``batch`` of epoch ``epoch``) of rank ``rank``:
    ``rows`` rows (windows in packed mode) of ``seq_len`` columns, made of ``pieces``; the
    packets it ``dropped``; whether the run ``skipped`` it."""

    step: int
    epoch: int
    batch: int
    rank: int
    world_size: int
    mode: str
    rows: int
    seq_len: int
    pieces: list[Piece] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    #: the step lies in a skip range (``ndp.loader.planning.skips``): the batch the order has there,
    #: which the Loader does not hand out
    skipped: bool = False

    def row(self, r: int) -> list[Piece]:
        """The pieces of row ``r``, in column order."""
        return [p for p in self.pieces if p.row == r]

    def packets(self) -> list[tuple[str, int]]:
        """Every packet the step holds, ``(shard, packet)``, once each, in order."""
        return list(dict.fromkeys((p.shard, p.packet) for p in self.pieces))

    def tokens(self, piece: Piece) -> np.ndarray:
        """The token ids of ``piece``, read from its shard."""
        with open(piece.shard, "rb") as f:
            f.seek(piece.offset)
            head = f.read(6)
            length = (head[4] << 8) | head[5]
            data = head + f.read(length + 2)
        return decode_packet(data).tokens[piece.start:piece.stop]

    def to_dict(self) -> dict:
        """Plain data (``json.dumps`` takes it)."""
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)
