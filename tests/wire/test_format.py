"""The constants and enums of ndp.wire.format against the wire-format spec in its docstring."""

from __future__ import annotations

import numpy as np
import pytest

import ndp
from ndp.wire import format as fmt
from ndp.errors import PacketError
from ndp.wire.format import (
    MASKED_TYPES,
    TOKEN_WIDTH,
    DropReason,
    Dst,
    Src,
    Typ,
    max_tokens_per_packet,
    token_payload_len,
    token_typ,
)
from ndp.wire.packet import decode_packet, encode_tokens


def test_src_values():
    assert {m.name: int(m) for m in Src} == {"TEXT_CORPUS": 0x01, "CODE_REPO": 0x02, "GRADIENT": 0x05}


def test_dst_values():
    assert {m.name: int(m) for m in Dst} == {
        "EMBEDDING": 0x01, "ATTENTION": 0x02, "FFN": 0x03, "LORA": 0x05,
    }


def test_typ_values():
    assert {m.name: int(m) for m in Typ} == {
        "TOKEN_IDS": 0x01,
        "TOKEN_IDS_U16": 0x02,
        "FLOAT16": 0x03,
        "BFLOAT16": 0x06,
        "TOKEN_IDS_MASKED": 0x11,
        "TOKEN_IDS_U16_MASKED": 0x12,
    }


def test_package_reexports():
    assert ndp.Src is Src and ndp.Dst is Dst and ndp.Typ is Typ and ndp.DropReason is DropReason


def test_drop_reason_codes():
    assert [(m.name, int(m)) for m in DropReason] == [
        ("OK", 0), ("BAD_SYNC", 1), ("TRUNCATED", 2), ("BAD_CRC", 3),
        ("BAD_LENGTH", 4), ("NOT_TOKENS", 5), ("UNKNOWN_TYPE", 6), ("EMPTY", 7), ("TOKEN_RANGE", 8),
        ("SKIPPED", 9),
    ]


def test_frame_constants():
    assert fmt.SYNC == 0xAA
    assert fmt.HEADER_BYTES == 6
    assert fmt.CRC_BYTES == 2
    assert fmt.FRAME_BYTES == 8
    assert fmt.MAX_PAYLOAD == 65535
    assert fmt.MAX_PACKET_BYTES == 65543
    assert fmt.CRC16_POLY == 0x1021
    assert fmt.CRC16_INIT == 0xFFFF
    assert fmt.CRC16_CHECK == 0x29B1
    assert fmt.IGNORE_INDEX == -100


def test_shard_and_index_constants():
    assert fmt.SHARD_MAGIC == b"\x89NDP\r\n\x1a\n"
    assert len(fmt.SHARD_MAGIC) == 8 and fmt.SHARD_MAGIC[0] != fmt.SYNC
    assert fmt.SHARD_VERSION == 1
    assert fmt.SHARD_HEADER_BYTES == 32
    assert fmt.SHARD_HEADER_CRC_AT == 30
    assert fmt.INDEX_MAGIC == b"NDPINDEX"
    assert fmt.INDEX_HEADER_BYTES == 64
    assert fmt.INDEX_HEADER_DTYPE.itemsize == 64
    assert fmt.INDEX_ENTRY_DTYPE.itemsize == 16
    # every field little-endian (or single byte), at the offsets the spec lists
    h = fmt.INDEX_HEADER_DTYPE
    assert [(n, h.fields[n][1]) for n in h.names] == [
        ("magic", 0), ("version", 8), ("entry_size", 12), ("n_packets", 16),
        ("shard_size", 24), ("shard_crc32", 32), ("data_offset", 36), ("continued", 40),
        ("pad", 48),
    ]
    e = fmt.INDEX_ENTRY_DTYPE
    assert [(n, e.fields[n][1]) for n in e.names] == [
        ("offset", 0), ("length", 8), ("src", 10), ("dst", 11), ("typ", 12), ("pad", 13),
    ]
    for dt in (h, e):
        for name in dt.names:
            assert dt.fields[name][0].byteorder in ("<", "|", "=")


def test_token_tables():
    assert TOKEN_WIDTH == {Typ.TOKEN_IDS: 4, Typ.TOKEN_IDS_U16: 2,
                           Typ.TOKEN_IDS_MASKED: 4, Typ.TOKEN_IDS_U16_MASKED: 2}
    assert MASKED_TYPES == {Typ.TOKEN_IDS_MASKED, Typ.TOKEN_IDS_U16_MASKED}
    assert fmt.VALUE_TYPES == {Typ.FLOAT16, Typ.BFLOAT16}
    for typ in range(256):
        assert fmt.TYP_WIDTH_TABLE[typ] == TOKEN_WIDTH.get(typ, 0)
        assert fmt.TYP_MASKED_TABLE[typ] == (typ in MASKED_TYPES)
        if typ in TOKEN_WIDTH:
            expected = DropReason.OK
        elif typ in (Typ.FLOAT16, Typ.BFLOAT16):
            expected = DropReason.NOT_TOKENS
        else:
            expected = DropReason.UNKNOWN_TYPE
        assert fmt.TYP_SKIP_TABLE[typ] == expected, typ


def test_token_typ():
    assert token_typ(width=4, masked=False) == Typ.TOKEN_IDS
    assert token_typ(width=2, masked=False) == Typ.TOKEN_IDS_U16
    assert token_typ(width=4, masked=True) == Typ.TOKEN_IDS_MASKED
    assert token_typ(width=2, masked=True) == Typ.TOKEN_IDS_U16_MASKED
    with pytest.raises(ValueError):
        token_typ(width=8, masked=False)


@pytest.mark.parametrize(
    "n, width, masked, expected",
    [
        (0, 4, False, 0),
        (0, 2, False, 0),
        (0, 4, True, 2),
        (0, 2, True, 2),
        (1, 4, False, 4),
        (3, 2, False, 6),
        (1, 4, True, 2 + 4 + 1),
        (8, 4, True, 2 + 32 + 1),
        (9, 4, True, 2 + 36 + 2),
        (8, 2, True, 2 + 16 + 1),
        (9, 2, True, 2 + 18 + 2),
        (16, 2, True, 2 + 32 + 2),
        (17, 2, True, 2 + 34 + 3),
    ],
)
def test_token_payload_len(n, width, masked, expected):
    assert token_payload_len(n, width=width, masked=masked) == expected


@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 100])
def test_token_payload_len_matches_encoder(n, width, masked):
    mask = np.ones(n, bool) if masked else None
    packet = encode_tokens(np.arange(n), width=width, mask=mask)
    assert len(packet) == 8 + token_payload_len(n, width=width, masked=masked)


@pytest.mark.parametrize(
    "typ, expected",
    [
        (Typ.TOKEN_IDS, 16383),
        (Typ.TOKEN_IDS_U16, 32767),
        (Typ.TOKEN_IDS_MASKED, 15886),
        (Typ.TOKEN_IDS_U16_MASKED, 30839),
    ],
)
def test_max_tokens_per_packet(typ, expected):
    assert max_tokens_per_packet(typ) == expected
    assert max_tokens_per_packet(int(typ)) == expected
    width = TOKEN_WIDTH[typ]
    masked = typ in MASKED_TYPES
    assert token_payload_len(expected, width=width, masked=masked) <= 65535
    assert token_payload_len(expected + 1, width=width, masked=masked) > 65535


@pytest.mark.parametrize(
    "typ",
    [Typ.TOKEN_IDS, Typ.TOKEN_IDS_U16, Typ.TOKEN_IDS_MASKED, Typ.TOKEN_IDS_U16_MASKED],
)
def test_max_tokens_packet_encodes_and_one_more_does_not(typ):
    n = max_tokens_per_packet(typ)
    width = TOKEN_WIDTH[typ]
    masked = typ in MASKED_TYPES
    tokens = np.arange(n) % 60000
    mask = (np.arange(n) % 3 != 0) if masked else None
    packet = encode_tokens(tokens, width=width, mask=mask)
    assert packet[3] == typ
    decoded = decode_packet(packet)
    np.testing.assert_array_equal(decoded.tokens, tokens)
    if masked:
        np.testing.assert_array_equal(decoded.mask, mask)
    tokens = np.arange(n + 1) % 60000
    mask = (np.arange(n + 1) % 3 != 0) if masked else None
    with pytest.raises(PacketError):
        encode_tokens(tokens, width=width, mask=mask)


def test_max_tokens_rejects_non_token_typ():
    with pytest.raises((KeyError, ValueError)):
        max_tokens_per_packet(Typ.FLOAT16)
