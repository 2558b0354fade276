"""Encode and decode single packets (host side). The layout is specified in ``ndp.wire.format``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ndp.errors import PacketError
from ndp.wire.format import (
    CRC16_INIT,
    DST_CONTINUES,
    DST_LAYER,
    FRAME_BYTES,
    HEADER_BYTES,
    IGNORE_INDEX,
    MASK_COUNT_BYTES,
    MASKED_TYPES,
    MAX_PAYLOAD,
    SYNC,
    TOKEN_WIDTH,
    TYP_MASKED_TABLE,
    TYP_SKIP_TABLE,
    TYP_WIDTH_TABLE,
    DropReason,
    Typ,
    token_payload_len,
)
from ndp.kernels.crc16 import CRC16_TABLES, crc16_cpu, frame_status, payload_status

_BYTE_ORDER = {2: ">u2", 4: ">u4"}  # ids are >= 0; 4-byte ids read as unsigned everywhere


def as_u8(data: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """``data`` as a flat uint8 array, without copying."""
    if isinstance(data, np.ndarray):
        return data.reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def crc16_ccitt(data: bytes | bytearray | memoryview | np.ndarray, crc: int = CRC16_INIT) -> int:
    """CRC-16/CCITT-FALSE (poly 0x1021, init 0xFFFF, unreflected, no final xor) of ``data``.

    Pass a previous result as ``crc`` to continue over more bytes.
    ``crc16_ccitt(b"123456789") == 0x29B1``.
    """
    return crc16_cpu(as_u8(data), crc)


def encode_packet(
    payload: bytes | np.ndarray,
    *,
    typ: int = Typ.TOKEN_IDS,
    src: int = 0x01,
    dst: int = 0x01,
) -> bytes:
    """Frame ``payload`` (already encoded as ``typ`` says) into a packet with its CRC."""
    body = bytes(as_u8(payload))
    if len(body) > MAX_PAYLOAD:
        raise PacketError(
            f"payload is {len(body)} bytes; LEN is 16 bits so a packet holds at most "
            f"{MAX_PAYLOAD}. Split the example (see ndp.wire.format, 'Examples longer than one packet')."
        )
    for name, value in (("src", src), ("dst", dst), ("typ", typ)):
        if not 0 <= int(value) <= 0xFF:
            raise PacketError(f"{name} must be one byte (0..255), got {value}")
    head = bytes((SYNC, int(src), int(dst), int(typ), len(body) >> 8, len(body) & 0xFF))
    crc = crc16_ccitt(head + body)
    return head + body + bytes((crc >> 8, crc & 0xFF))


def encode_tokens(
    tokens: np.ndarray | list[int],
    *,
    width: int = 4,
    mask: np.ndarray | list[int] | None = None,
    src: int = 0x01,
    dst: int = 0x01,
    continues: bool = False,
) -> bytes:
    """A token packet: ``width`` 4 (int32 BE) or 2 (uint16 BE), with an optional loss mask.

    ``mask[i]`` true means token ``i`` is a training target; false excludes it (prompt).
    ``continues``: the packet is a later piece of the document of the packet written just
    before it (``DST_CONTINUES`` set on ``dst``; see ``ndp.wire.format``).
    """
    if continues:
        dst = int(dst) | DST_CONTINUES
    raw = np.asarray(tokens)
    if raw.size and raw.dtype.kind not in "iu":
        raise PacketError(f"token ids must be integers, got dtype {raw.dtype}")
    ids = raw.astype(np.int64).reshape(-1)
    if width not in _BYTE_ORDER:
        raise PacketError(f"token width must be 2 or 4 bytes, got {width}")
    limit = 1 << (8 * width - (1 if width == 4 else 0))
    if ids.size and (ids.min() < 0 or ids.max() >= limit):
        bad = int(ids[(ids < 0) | (ids >= limit)][0])
        raise PacketError(f"token id {bad} does not fit {width}-byte tokens (0..{limit - 1})")
    body = ids.astype(_BYTE_ORDER[width]).tobytes()
    masked = mask is not None
    typ = {(4, False): Typ.TOKEN_IDS, (2, False): Typ.TOKEN_IDS_U16,
           (4, True): Typ.TOKEN_IDS_MASKED, (2, True): Typ.TOKEN_IDS_U16_MASKED}[(width, masked)]
    if masked:
        bits = np.asarray(mask, dtype=bool).reshape(-1)
        if bits.size != ids.size:
            raise PacketError(f"mask has {bits.size} entries for {ids.size} tokens")
        if ids.size > 0xFFFF:
            raise PacketError(f"{ids.size} tokens do not fit the 16-bit N of a masked payload")
        count = bytes((ids.size >> 8, ids.size & 0xFF))
        body = count + body + np.packbits(bits, bitorder="little").tobytes()
    assert len(body) == token_payload_len(ids.size, width=width, masked=masked)
    return encode_packet(body, typ=typ, src=src, dst=dst)


@dataclass(frozen=True)
class Packet:
    """One decoded packet. ``tokens``/``mask`` are set for token TYPs, ``values`` for floats."""

    src: int
    dst: int
    typ: int
    payload: bytes
    tokens: np.ndarray | None = None
    mask: np.ndarray | None = None
    values: np.ndarray | None = None

    @property
    def size(self) -> int:
        """Bytes the packet occupies in a shard (frame included)."""
        return FRAME_BYTES + len(self.payload)

    @property
    def continues(self) -> bool:
        """Whether the packet continues the document of the packet before it
        (``DST_CONTINUES``)."""
        return bool(self.dst & DST_CONTINUES)

    @property
    def layer(self) -> int:
        """The DST layer, without the continuation flag (``DST_LAYER``)."""
        return self.dst & DST_LAYER

    def labels(self) -> np.ndarray:
        """Tokens as labels: -100 where the mask excludes them from the loss."""
        if self.tokens is None:
            raise PacketError(f"TYP 0x{self.typ:02X} packet carries no tokens")
        if self.mask is None:
            return self.tokens.copy()
        return np.where(self.mask, self.tokens, IGNORE_INDEX)


def decode_packet(data: bytes | np.ndarray, offset: int = 0) -> Packet:
    """Decode the packet starting at ``offset`` of ``data``; raise ``PacketError`` if it is bad.

    The error names the reason (a ``DropReason``) and the byte offset.
    """
    buf = as_u8(data)
    status = int(frame_status(buf, offset, CRC16_TABLES))
    if status == DropReason.OK:
        status = int(payload_status(buf, offset, TYP_WIDTH_TABLE, TYP_MASKED_TABLE, TYP_SKIP_TABLE))
    if status not in (DropReason.OK, DropReason.NOT_TOKENS, DropReason.UNKNOWN_TYPE):
        raise PacketError(f"bad packet at byte {offset}: {DropReason(status).name}")
    src, dst, typ = (int(b) for b in buf[offset + 1: offset + 4])
    length = (int(buf[offset + 4]) << 8) | int(buf[offset + 5])
    payload = bytes(buf[offset + HEADER_BYTES: offset + HEADER_BYTES + length])
    if typ in TOKEN_WIDTH:
        width = TOKEN_WIDTH[Typ(typ)]
        mask = None
        body = payload
        if typ in MASKED_TYPES:
            n = (payload[0] << 8) | payload[1]
            body = payload[MASK_COUNT_BYTES: MASK_COUNT_BYTES + n * width]
            bits = np.frombuffer(payload[MASK_COUNT_BYTES + n * width:], dtype=np.uint8)
            mask = np.unpackbits(bits, bitorder="little")[:n].astype(bool)
        tokens = np.frombuffer(body, dtype=_BYTE_ORDER[width]).astype(np.int64)
        return Packet(src, dst, typ, payload, tokens=tokens, mask=mask)
    if typ in (Typ.FLOAT16, Typ.BFLOAT16) and length % 2:
        raise PacketError(f"bad packet at byte {offset}: BAD_LENGTH ({length} bytes of 2-byte values)")
    if typ == Typ.FLOAT16:
        return Packet(src, dst, typ, payload, values=np.frombuffer(payload, ">f2").astype(np.float32))
    if typ == Typ.BFLOAT16:
        high = np.frombuffer(payload, ">u2").astype(np.uint32) << 16
        return Packet(src, dst, typ, payload, values=high.view(np.float32))
    return Packet(src, dst, typ, payload)
