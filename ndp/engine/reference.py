"""CPU decode: the reference every other backend must equal bit for bit.

Given a shard's bytes and the offsets of the packets to decode (from its index), validate every
packet (framing, CRC-16, payload layout), drop the bad ones with a counted reason, and build
training arrays from the rest in packet order:

* ``decode_padded``: one example per row, ``input_ids`` / ``labels`` / ``attention_mask``
  (int64, as HF models and ``torch.nn.functional.cross_entropy`` take them);
* ``decode_packed``: (x, y) windows of ``seq_len + 1`` tokens over the concatenated stream.

They are the Loader's ``padded`` rows and ``packed`` windows: which of them shift labels, and
why, is said once, in ``ndp.loader.loader`` ("Modes").

Both run the Numba kernels of ``ndp.kernels`` on ndp's host threads (``ndp.engine.threads``),
synchronously, and take ``out=``
buffers for their outputs so a training loop allocates those once (``decode_packed`` still
allocates its per-packet scratch arrays on each call).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ndp.errors import ConfigError, renamed
from ndp.wire.format import DropReason
from ndp.kernels.build import build_packed_cpu, build_padded_cpu, token_counts_cpu
from ndp.kernels.compact import compact_cpu
from ndp.kernels.crc16 import validate_packets_cpu
from ndp.wire.packet import as_u8


def _as_u8(data: np.ndarray | bytes | bytearray | memoryview) -> np.ndarray:
    if isinstance(data, np.ndarray) and (data.dtype != np.uint8 or data.ndim != 1):
        raise ConfigError(f"shard bytes must be a 1-D uint8 array, got {data.dtype}{data.shape}")
    return as_u8(data)


def _as_offsets(offsets: np.ndarray | list[int]) -> np.ndarray:
    return np.ascontiguousarray(offsets, dtype=np.int64).reshape(-1)


@dataclass
class DecodeStats:
    """What became of the packets of one decode call."""

    packets: int = 0
    valid: int = 0
    tokens: int = 0  # tokens delivered (after truncation)
    truncated_tokens: int = 0
    dropped: dict[str, int] = field(default_factory=dict)  # DropReason name -> count

    @classmethod
    def from_status(cls, status: np.ndarray) -> DecodeStats:
        counts = np.bincount(status, minlength=len(DropReason))
        dropped = {
            DropReason(code).name: int(n)
            for code, n in enumerate(counts)
            if code != DropReason.OK and n
        }
        return cls(packets=int(status.shape[0]), valid=int(counts[DropReason.OK]), dropped=dropped)


def validate(
    shard: np.ndarray | bytes, offsets: np.ndarray | list[int], *, out: np.ndarray | None = None
) -> np.ndarray:
    """``DropReason`` code (uint8) of each packet at ``offsets`` in ``shard``."""
    data, offs = _as_u8(shard), _as_offsets(offsets)
    status = np.empty(offs.shape[0], np.uint8) if out is None else out[: offs.shape[0]]
    validate_packets_cpu(data, offs, status)
    return status


@dataclass
class PaddedBatch:
    """Padded SFT rows (int64, shape (rows, seq_len)); one row per valid packet (labels: the
    row's own tokens, not shifted; ``ndp.loader.loader``, "Modes")."""

    input_ids: np.ndarray
    labels: np.ndarray
    attention_mask: np.ndarray
    lengths: np.ndarray  # each row's token count before truncation
    status: np.ndarray  # DropReason per input packet
    rows: np.ndarray  # input packet index of each row
    stats: DecodeStats


@dataclass
class PaddedBuffers:
    """Reusable output buffers for ``decode_padded`` (allocate once, pass as ``out=``)."""

    input_ids: np.ndarray
    labels: np.ndarray
    attention_mask: np.ndarray
    lengths: np.ndarray
    status: np.ndarray
    row_of_packet: np.ndarray
    rows: np.ndarray

    @renamed(max_seq_length="seq_len")
    def check(self, n_packets: int, seq_len: int) -> None:
        """``ConfigError`` unless every buffer has the dtype and room for this call (the
        kernels do not bounds-check their outputs)."""
        want = {
            "input_ids": (np.int64, (n_packets, seq_len)),
            "labels": (np.int64, (n_packets, seq_len)),
            "attention_mask": (np.int64, (n_packets, seq_len)),
            "lengths": (np.int64, (n_packets,)),
            "status": (np.uint8, (n_packets,)),
            "row_of_packet": (np.int64, (n_packets,)),
            "rows": (np.int64, (n_packets,)),
        }
        for name, (dtype, shape) in want.items():
            arr = getattr(self, name)
            rows_ok = arr.ndim == len(shape) and arr.shape[0] >= shape[0]
            if arr.dtype != dtype or not rows_ok or arr.shape[1:] != shape[1:]:
                raise ConfigError(
                    f"out.{name} is {arr.dtype}{arr.shape}; need {np.dtype(dtype)} with at least "
                    f"{shape[0]} rows and shape {shape[1:]} after them"
                )

    @classmethod
    @renamed(max_seq_length="seq_len")
    def allocate(cls, max_packets: int, seq_len: int) -> PaddedBuffers:
        shape = (max_packets, seq_len)
        return cls(
            input_ids=np.empty(shape, np.int64),
            labels=np.empty(shape, np.int64),
            attention_mask=np.empty(shape, np.int64),
            lengths=np.empty(max_packets, np.int64),
            status=np.empty(max_packets, np.uint8),
            row_of_packet=np.empty(max_packets, np.int64),
            rows=np.empty(max_packets, np.int64),
        )


@renamed(max_seq_length="seq_len")
def decode_padded(
    shard: np.ndarray | bytes,
    offsets: np.ndarray | list[int],
    *,
    seq_len: int,
    pad_token_id: int = 0,
    out: PaddedBuffers | None = None,
) -> PaddedBatch:
    """Validate the packets at ``offsets`` and build one padded row per valid token packet.

    Rows keep packet order. Tokens past ``seq_len`` (``max_seq_length``: its deprecated name)
    are cut (counted in ``stats.truncated_tokens``); labels are not shifted
    (``ndp.loader.loader``, "Modes") and are -100 at padding and at masked (prompt) tokens.
    With ``out`` the returned arrays are views of its buffers, valid until the next call that
    reuses them. Synchronous.
    """
    if seq_len < 1:
        raise ConfigError(f"seq_len must be >= 1, got {seq_len}")
    data, offs = _as_u8(shard), _as_offsets(offsets)
    n = offs.shape[0]
    if out is None:
        out = PaddedBuffers.allocate(n, seq_len)
    else:
        out.check(n, seq_len)
    status = out.status[:n]
    validate_packets_cpu(data, offs, status)
    n_rows = compact_cpu(status, out.row_of_packet[:n], out.rows[:n])
    rows = out.rows[:n_rows]
    lengths = out.lengths[:n_rows]
    token_counts_cpu(data, offs, rows, n_rows, lengths)
    build_padded_cpu(data, offs, rows, pad_token_id, out.input_ids, out.labels,
                     out.attention_mask)
    stats = DecodeStats.from_status(status)
    delivered = int(np.minimum(lengths, seq_len).sum())
    stats.tokens = delivered
    stats.truncated_tokens = int(lengths.sum()) - delivered
    return PaddedBatch(
        input_ids=out.input_ids[:n_rows],
        labels=out.labels[:n_rows],
        attention_mask=out.attention_mask[:n_rows],
        lengths=lengths,
        status=status,
        rows=rows,
        stats=stats,
    )


@dataclass
class PackedBatch:
    """Pretraining windows: ``x`` and ``y`` (int64, shape (batch_size, seq_len))."""

    x: np.ndarray
    y: np.ndarray
    start: int  # stream position of x[0, 0]
    next_start: int  # stream position the next batch starts at (start + batch_size * seq_len)
    stream_tokens: int  # tokens in the stream of valid packets
    status: np.ndarray
    stats: DecodeStats


class StreamExhausted(ConfigError):
    """The packets hold fewer tokens than the requested windows need.

    ``stream_tokens`` is how many they hold; ``status`` the DropReason of each packet (host
    array), so a caller can account for them."""

    def __init__(self, message: str, *, stream_tokens: int = 0,
                 status: np.ndarray | None = None) -> None:
        super().__init__(message)
        self.stream_tokens = stream_tokens
        self.status = np.zeros(0, np.uint8) if status is None else status


def decode_packed(
    shard: np.ndarray | bytes,
    offsets: np.ndarray | list[int],
    *,
    batch_size: int | None,
    seq_len: int,
    start: int = 0,
    out: tuple[np.ndarray, np.ndarray] | None = None,
) -> PackedBatch:
    """Validate the packets, concatenate the valid token packets' tokens into one stream, and cut
    ``batch_size`` windows of ``seq_len + 1`` tokens starting at stream position ``start``:
    ``x[b] = stream[start + b*T : ... + T]``, ``y[b]`` the same shifted by one (llm.c layout).

    ``batch_size=None`` cuts as many whole windows as the stream holds from ``start``. With
    ``out`` (two int64 arrays of at least that many rows and exactly ``seq_len`` columns) the
    returned ``x``/``y`` are views of it. Raises ``StreamExhausted`` if the stream has fewer
    than ``start + B*T + 1`` tokens. Synchronous.
    """
    if (batch_size is not None and batch_size < 1) or seq_len < 1:
        raise ConfigError(f"batch_size and seq_len must be >= 1, got {batch_size}, {seq_len}")
    data, offs = _as_u8(shard), _as_offsets(offsets)
    n = offs.shape[0]
    status = np.empty(n, np.uint8)
    validate_packets_cpu(data, offs, status)
    rows = np.empty(n, np.int64)
    n_rows = compact_cpu(status, np.empty(n, np.int64), rows)
    counts = np.empty(n_rows, np.int64)
    token_counts_cpu(data, offs, rows, n_rows, counts)
    cum = np.zeros(n_rows + 1, np.int64)
    np.cumsum(counts, out=cum[1:])
    total = int(cum[-1])
    if batch_size is None:
        batch_size = max(0, (total - start - 1) // seq_len)
    need = start + batch_size * seq_len + 1
    if start < 0 or batch_size < 1 or need > total:
        raise StreamExhausted(
            f"windows from token {start} need {max(need, start + seq_len + 1)} tokens, "
            f"the valid packets hold {total}", stream_tokens=total, status=status.copy(),
        )
    if out is None:
        x = np.empty((batch_size, seq_len), np.int64)
        y = np.empty((batch_size, seq_len), np.int64)
    else:
        if (out[0].dtype != np.int64 or out[1].dtype != np.int64 or out[0].ndim != 2
                or out[0].shape[0] < batch_size or out[0].shape[1:] != (seq_len,)
                or out[1].shape != out[0].shape):
            raise ConfigError(
                f"out buffers must be int64 with room for ({batch_size}, {seq_len}), got "
                f"{out[0].dtype}{out[0].shape}, {out[1].dtype}{out[1].shape}"
            )
        x, y = out[0][:batch_size], out[1][:batch_size]
    build_packed_cpu(data, offs, rows[:n_rows], cum, start, np.zeros(0, np.int64), x, y)
    stats = DecodeStats.from_status(status)
    stats.tokens = batch_size * seq_len
    return PackedBatch(x, y, start, start + batch_size * seq_len, total, status, stats)
