"""CRC-16 and single-packet encode/decode (ndp.wire.packet)."""

from __future__ import annotations

import binascii
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ndp
from ndp.errors import PacketError
from ndp.wire.format import IGNORE_INDEX, Dst, Src, Typ
from ndp.wire.packet import Packet, crc16_ccitt, decode_packet, encode_packet, encode_tokens

from ndp_test_helpers import ramp, ramp_mask


# --- CRC-16 ------------------------------------------------------------------------------------
def test_crc_check_value():
    assert ndp.crc16_ccitt(b"123456789") == 0x29B1
    assert crc16_ccitt(b"123456789") == binascii.crc_hqx(b"123456789", 0xFFFF)


def test_crc_empty_is_init():
    assert crc16_ccitt(b"") == 0xFFFF
    assert crc16_ccitt(b"", 0x1234) == 0x1234


@pytest.mark.parametrize(
    "data",
    [b"123456789", bytearray(b"123456789"), memoryview(b"123456789"),
     np.frombuffer(b"123456789", np.uint8)],
    ids=["bytes", "bytearray", "memoryview", "ndarray"],
)
def test_crc_accepts_buffers(data):
    assert crc16_ccitt(data) == 0x29B1


def test_crc_of_non_uint8_array_uses_its_bytes():
    arr = np.array([0x0102, 0xA0B0, 0xFFFF], dtype=">u2")
    assert crc16_ccitt(arr) == binascii.crc_hqx(arr.tobytes(), 0xFFFF)
    strided = np.frombuffer(bytes(range(40)), np.uint8)[::3]
    assert crc16_ccitt(strided) == binascii.crc_hqx(strided.tobytes(), 0xFFFF)


def test_crc_every_length_up_to_40():
    data = bytes((i * 37 + 11) & 0xFF for i in range(40))
    for n in range(41):
        for start in range(0, 9):
            chunk = data[start:n]
            assert crc16_ccitt(chunk) == binascii.crc_hqx(chunk, 0xFFFF), (start, n)


@given(st.binary(min_size=0, max_size=300))
def test_crc_equals_crc_hqx(data):
    assert crc16_ccitt(data) == binascii.crc_hqx(data, 0xFFFF)


@given(st.binary(max_size=300), st.integers(0, 0xFFFF))
def test_crc_with_any_initial_state(data, init):
    assert crc16_ccitt(data, init) == binascii.crc_hqx(data, init)


@given(st.binary(max_size=150), st.binary(max_size=150))
def test_crc_incremental(a, b):
    assert crc16_ccitt(a + b) == crc16_ccitt(b, crc16_ccitt(a))


# --- encode / decode round trips ---------------------------------------------------------------
@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("n", [0, 1, 2, 7, 8, 9, 31, 256])
@pytest.mark.parametrize("masked", [False, True])
def test_token_round_trip(width, n, masked):
    tokens = ramp(3, n)
    mask = ramp_mask(n, 1) if masked else None
    packet = encode_tokens(tokens, width=width, mask=mask, src=Src.CODE_REPO, dst=Dst.LORA)
    p = decode_packet(packet)
    assert isinstance(p, Packet)
    assert (p.src, p.dst) == (Src.CODE_REPO, Dst.LORA)
    expected_typ = {(4, False): Typ.TOKEN_IDS, (2, False): Typ.TOKEN_IDS_U16,
                    (4, True): Typ.TOKEN_IDS_MASKED, (2, True): Typ.TOKEN_IDS_U16_MASKED}
    assert p.typ == expected_typ[(width, masked)]
    assert p.tokens.dtype == np.int64
    np.testing.assert_array_equal(p.tokens, tokens)
    assert p.values is None
    assert p.size == len(packet)
    assert p.payload == packet[6:-2]
    if masked:
        assert p.mask.dtype == bool
        np.testing.assert_array_equal(p.mask, mask)
        np.testing.assert_array_equal(p.labels(), np.where(mask, tokens, -100))
    else:
        assert p.mask is None
        np.testing.assert_array_equal(p.labels(), tokens)


@pytest.mark.parametrize("width, top", [(2, 65535), (4, 2**31 - 1)])
def test_token_extremes_round_trip(width, top):
    tokens = [0, 1, top - 1, top, 0x80, 0xFF00 & top]
    p = decode_packet(encode_tokens(tokens, width=width))
    assert p.tokens.tolist() == tokens


@given(
    st.sampled_from([2, 4]).flatmap(
        lambda w: st.tuples(
            st.just(w),
            st.lists(st.integers(0, 65535 if w == 2 else 2**31 - 1), max_size=60),
            st.booleans(),
            st.data(),
        )
    )
)
def test_token_round_trip_property(args):
    width, tokens, masked, data = args
    mask = data.draw(st.lists(st.booleans(), min_size=len(tokens), max_size=len(tokens))) \
        if masked else None
    p = decode_packet(encode_tokens(tokens, width=width, mask=mask))
    assert p.tokens.tolist() == tokens
    if masked:
        assert p.mask.tolist() == mask
        assert p.labels().tolist() == [t if m else -100 for t, m in zip(tokens, mask)]
    else:
        assert p.mask is None


def test_labels_minus_100_where_mask_false():
    p = decode_packet(encode_tokens([10, 11, 12, 13], mask=[0, 1, 0, 1]))
    assert p.labels().tolist() == [IGNORE_INDEX, 11, IGNORE_INDEX, 13]
    # labels() must not alias tokens
    labels = p.labels()
    labels[:] = 0
    assert p.tokens.tolist() == [10, 11, 12, 13]
    q = decode_packet(encode_tokens([10, 11]))
    lq = q.labels()
    lq[:] = 0
    assert q.tokens.tolist() == [10, 11]


def test_mask_bits_little_order_and_zero_padding():
    # 9 tokens: mask byte 0 bit i is token i, byte 1 bit 0 is token 8; unused bits are zero
    mask = [1, 0, 0, 0, 0, 0, 0, 1, 1]
    packet = encode_tokens(list(range(9)), width=2, mask=mask)
    payload = packet[6:-2]
    assert payload[:2] == b"\x00\x09"
    assert payload[2:20] == struct.pack(">9H", *range(9))
    assert payload[20:] == bytes([0b1000_0001, 0b0000_0001])


def test_decode_at_offset():
    a = encode_tokens([1, 2, 3])
    b = encode_tokens([4, 5], width=2, mask=[1, 0])
    data = b"\x00\x11" + a + b + b"\x99"
    assert decode_packet(data, 2).tokens.tolist() == [1, 2, 3]
    p = decode_packet(np.frombuffer(data, np.uint8), 2 + len(a))
    assert p.tokens.tolist() == [4, 5] and p.mask.tolist() == [True, False]


# --- encode errors -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "tokens, width",
    [([-1], 4), ([2**31], 4), ([0, 65536], 2), ([-1], 2), ([1, 2, 2**40], 4)],
)
def test_token_out_of_range(tokens, width):
    with pytest.raises(PacketError, match="does not fit"):
        encode_tokens(tokens, width=width)


def test_bad_width():
    with pytest.raises(PacketError):
        encode_tokens([1], width=3)


def test_payload_too_long():
    encode_packet(b"\x00" * 65535, typ=Typ.FLOAT16)  # the largest payload is fine
    with pytest.raises(PacketError, match="65535"):
        encode_packet(b"\x00" * 65536, typ=Typ.FLOAT16)
    with pytest.raises(PacketError):
        encode_tokens(np.zeros(16384, np.int64), width=4)
    with pytest.raises(PacketError):
        encode_tokens(np.zeros(32768, np.int64), width=2)


def test_mask_length_mismatch():
    with pytest.raises(PacketError, match="mask"):
        encode_tokens([1, 2, 3], mask=[1, 0])
    with pytest.raises(PacketError, match="mask"):
        encode_tokens([], mask=[1])


@pytest.mark.parametrize("field", ["src", "dst", "typ"])
@pytest.mark.parametrize("value", [-1, 256])
def test_header_field_out_of_range(field, value):
    with pytest.raises(PacketError, match=field):
        encode_packet(b"", **{field: value})


def test_packet_error_is_value_error():
    assert issubclass(PacketError, ValueError)


# --- float payloads ----------------------------------------------------------------------------
def test_float16_round_trip():
    values = np.array([0.0, 1.0, -2.5, 65504.0, 2.0**-24], dtype=np.float32)
    packet = encode_packet(values.astype(">f2").tobytes(), typ=Typ.FLOAT16, src=Src.GRADIENT,
                           dst=Dst.FFN)
    assert packet[:6] == bytes([0xAA, 0x05, 0x03, 0x03, 0x00, 0x0A])
    assert packet[6:8] == b"\x00\x00" and packet[8:10] == b"\x3c\x00"  # big-endian halves
    p = decode_packet(packet)
    assert p.typ == Typ.FLOAT16 and p.tokens is None and p.mask is None
    assert p.values.dtype == np.float32
    np.testing.assert_array_equal(p.values, values)
    with pytest.raises(PacketError):
        p.labels()


def test_bfloat16_round_trip():
    values = np.array([0.0, 1.0, -3.0, 0.15625, 2.0**100, -np.inf], dtype=np.float32)
    high = (values.view(np.uint32) >> 16).astype(">u2")
    packet = encode_packet(high.tobytes(), typ=Typ.BFLOAT16)
    assert packet[3] == 0x06 and packet[8:10] == b"\x3f\x80"  # 1.0 as bfloat16, big-endian
    p = decode_packet(packet)
    assert p.typ == Typ.BFLOAT16 and p.tokens is None
    # these values are exact in bfloat16
    np.testing.assert_array_equal(p.values, values)


@pytest.mark.parametrize("typ", [Typ.FLOAT16, Typ.BFLOAT16])
def test_float_odd_length(typ):
    with pytest.raises(PacketError, match="BAD_LENGTH"):
        decode_packet(encode_packet(b"\x00\x01\x02", typ=typ))


def test_unknown_type_decodes_raw():
    p = decode_packet(encode_packet(b"xyz", typ=0x7E, src=0x99, dst=0xFE))
    assert (p.src, p.dst, p.typ, p.payload) == (0x99, 0xFE, 0x7E, b"xyz")
    assert p.tokens is None and p.values is None and p.mask is None
    with pytest.raises(PacketError):
        p.labels()


# --- decode errors -----------------------------------------------------------------------------
def _flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


@pytest.mark.parametrize("masked", [False, True])
def test_every_single_bit_flip_is_caught(masked):
    packet = encode_tokens(ramp(2, 6), width=4, mask=ramp_mask(6) if masked else None)
    true_len = len(packet) - 8
    for bit in range(8 * len(packet)):
        bad = _flip(packet, bit)
        byte = bit // 8
        if byte == 0:
            reason = "BAD_SYNC"
        elif byte in (4, 5) and ((bad[4] << 8) | bad[5]) > true_len:
            reason = "TRUNCATED"
        else:
            reason = "BAD_CRC"
        with pytest.raises(PacketError, match=reason) as info:
            decode_packet(bad)
        assert "byte 0" in str(info.value)


def test_error_names_offset():
    packet = encode_tokens([1, 2, 3])
    bad = b"\x00" * 5 + _flip(packet, 8 * 7)
    with pytest.raises(PacketError, match=r"byte 5: BAD_CRC"):
        decode_packet(bad, 5)


def test_decode_truncated_and_bad_offsets():
    packet = encode_tokens([1, 2, 3])
    for cut in range(len(packet)):
        with pytest.raises(PacketError, match="TRUNCATED"):
            decode_packet(packet[:cut])
    for off in (-1, -100, len(packet), 10**9, 2**63 - 1, 2**63 - 8, -(2**63)):
        with pytest.raises(PacketError, match="TRUNCATED"):
            decode_packet(packet, off)
    with pytest.raises(PacketError, match="BAD_SYNC"):
        decode_packet(packet + packet, 1)


def test_decode_bad_token_length():
    with pytest.raises(PacketError, match="BAD_LENGTH"):
        decode_packet(encode_packet(b"\x00" * 7, typ=Typ.TOKEN_IDS))
    with pytest.raises(PacketError, match="BAD_LENGTH"):
        decode_packet(encode_packet(b"\x00" * 3, typ=Typ.TOKEN_IDS_U16))
    # masked payload whose N does not match LEN
    good = encode_tokens([1, 2, 3], width=2, mask=[1, 1, 0])
    payload = bytearray(good[6:-2])
    payload[1] = 4
    with pytest.raises(PacketError, match="BAD_LENGTH"):
        decode_packet(encode_packet(bytes(payload), typ=Typ.TOKEN_IDS_U16_MASKED))
    for short in (b"", b"\x00"):
        with pytest.raises(PacketError, match="BAD_LENGTH"):
            decode_packet(encode_packet(short, typ=Typ.TOKEN_IDS_MASKED))


# --- byte layout against the spec --------------------------------------------------------------
def test_byte_layout_by_hand():
    packet = encode_tokens([1, 0x01020304, 0x7FFFFFFF], width=4, src=Src.CODE_REPO, dst=Dst.FFN)
    body = bytes([
        0xAA,  # SYNC
        0x02,  # SRC CODE_REPO
        0x03,  # DST FFN
        0x01,  # TYP TOKEN_IDS
        0x00, 0x0C,  # LEN = 12, big-endian
        0x00, 0x00, 0x00, 0x01,
        0x01, 0x02, 0x03, 0x04,
        0x7F, 0xFF, 0xFF, 0xFF,
    ])
    crc = binascii.crc_hqx(body, 0xFFFF)
    assert packet == body + bytes([crc >> 8, crc & 0xFF])  # CRC big-endian, after the payload
    assert len(packet) == 8 + 12


def test_byte_layout_u16_masked_by_hand():
    packet = encode_tokens([0x0102, 0xFFFF], width=2, mask=[0, 1], src=Src.TEXT_CORPUS,
                           dst=Dst.ATTENTION)
    body = bytes([0xAA, 0x01, 0x02, 0x12, 0x00, 0x07,  # LEN = 2 + 2*2 + 1
                  0x00, 0x02, 0x01, 0x02, 0xFF, 0xFF, 0b10])
    crc = binascii.crc_hqx(body, 0xFFFF)
    assert packet == body + crc.to_bytes(2, "big")


def test_empty_packets_layout():
    assert encode_tokens([], width=4)[:6] == bytes([0xAA, 1, 1, 0x01, 0, 0])
    assert encode_tokens([], width=2)[:6] == bytes([0xAA, 1, 1, 0x02, 0, 0])
    assert encode_tokens([], width=4, mask=[])[:8] == bytes([0xAA, 1, 1, 0x11, 0, 2, 0, 0])
    assert encode_tokens([], width=2, mask=[])[:8] == bytes([0xAA, 1, 1, 0x12, 0, 2, 0, 0])
    for w in (2, 4):
        for mask in (None, []):
            p = decode_packet(encode_tokens([], width=w, mask=mask))
            assert p.tokens.shape == (0,) and p.labels().shape == (0,)


def test_encode_packet_accepts_arrays():
    arr = np.array([1, 2], dtype=">i4")
    assert encode_packet(arr) == encode_packet(arr.tobytes()) == encode_tokens([1, 2])



def test_encode_tokens_refuses_non_integer_ids():
    with pytest.raises(PacketError, match="integers"):
        encode_tokens([1.5, 2.0])
