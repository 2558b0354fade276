"""The NDP wire format, specified once. Every other module imports its constants from here.

Packet
======

A shard is a stream of packets, optionally preceded by a shard header (below)::

    offset  size      field    meaning
    0       1         SYNC     always 0xAA
    1       1         SRC      source of the data            (enum Src)
    2       1         DST      target layer                  (enum Dst)
    3       1         TYP      payload encoding              (enum Typ)
    4       2 (BE)    LEN      payload length in bytes, 0..65535
    6       LEN       PAYLOAD  LEN bytes, encoded as TYP says
    6+LEN   2 (BE)    CRC      CRC-16 over bytes [0, 6+LEN): SYNC through the last payload byte

Fixed overhead is ``FRAME_BYTES`` = 8 bytes per packet (6 header + 2 trailer), so a packet
occupies ``8 + LEN`` bytes and the next packet starts right after its CRC. All multi-byte
fields on the wire are big-endian.

CRC-16
------
CRC-16/CCITT-FALSE: polynomial 0x1021, initial value 0xFFFF, input and output not reflected,
no final xor. Check value: ``crc16_ccitt(b"123456789") == 0x29B1``; it equals
``binascii.crc_hqx(data, 0xFFFF)``. It covers the 6 header bytes and the payload, not itself.
A packet whose CRC does not match is dropped and counted (``DropReason.BAD_CRC``).

SRC, DST (enums ``Src``, ``Dst``)
----------------------------------
SRC: TEXT_CORPUS=0x01, CODE_REPO=0x02, GRADIENT=0x05. DST: EMBEDDING=0x01, ATTENTION=0x02,
FFN=0x03, LORA=0x05. Other values are reserved: readers keep such packets and report the raw
value; writers only emit the named ones.

DST bit 7 (``DST_CONTINUES`` = 0x80, an extension) is a flag, not a layer: set, the packet
continues the document of the packet just before it in the same shard (the second and later
pieces of a document split over packets, see *Examples longer than one packet*); the layer is
``DST & DST_LAYER`` (0x7F). A packet without it starts a document. Readers that predate the flag
keep such packets and report the raw DST, as for any reserved value, so a shard with split
documents still loads there (as a stream of packets).

TYP and payload encodings (enum ``Typ``)
----------------------------------------
Original encodings:

* ``TOKEN_IDS`` = 0x01: token ids as int32 big-endian, ``LEN = 4 * n``. Ids are >= 0: writers
  never set the top bit, and readers decode the 4 bytes as unsigned.
* ``FLOAT16`` = 0x03: IEEE half floats, big-endian, ``LEN = 2 * n``.
* ``BFLOAT16`` = 0x06: bfloat16, big-endian, ``LEN = 2 * n``.

Extensions (backward compatible: the original values keep their meaning, so a stream written
with only the original TYPs reads exactly as before):

* ``TOKEN_IDS_U16`` = 0x02: token ids as uint16 big-endian, ``LEN = 2 * n``; for vocabularies
  of at most 65,536 ids it halves the bytes per token.
* ``TOKEN_IDS_MASKED`` = 0x11 and ``TOKEN_IDS_U16_MASKED`` = 0x12: tokens with a loss mask,
  for SFT. Payload::

      N       2 (BE)                 number of tokens
      TOKENS  N * width              int32 BE (0x11) or uint16 BE (0x12)
      MASK    ceil(N / 8)            bit i % 8 of byte i // 8 is token i's mask bit
                                     (little bit order, as in llm.q token files)

  ``LEN`` must equal ``2 + N * width + ceil(N / 8)``. Mask bit 1 means the token is a training
  target; 0 means it is excluded from the loss (prompt tokens), so its label is -100. Unused
  high bits of the last mask byte are 0. Packets without a mask have every token in the loss.

A token packet whose LEN does not fit its TYP's layout (for example 7 bytes of int32 tokens) is
dropped as ``DropReason.BAD_LENGTH``; a valid packet of a non-token TYP is skipped by the token
decoder as ``NOT_TOKENS``, and one of a reserved TYP as ``UNKNOWN_TYPE``.

Examples longer than one packet
-------------------------------
LEN is 16 bits, so one packet carries at most ``max_tokens_per_packet(typ)`` tokens: 16,383
int32, 32,767 uint16, 15,886 masked int32, 30,839 masked uint16. One packet is one example.
The converter applies one of two documented rules to a longer example: *truncate* (keep the
first tokens, counted as truncated; right for SFT) or *split* (cut it into consecutive packets
of at most the capacity, all in one shard, every piece after the first marked with DST bit 7;
right for pretraining: packed mode reads a document's pieces together and in order wherever the
shuffle puts the document, so its token stream is the document's). By default
(``overflow="auto"``) a plain-text document is split and an SFT example (chat,
prompt/completion, alpaca) truncated. Padded and packing rows take one packet each, so there a
piece is an example of its own.

Shard header (extension)
========================
A shard may start with a 32-byte header; a shard whose first byte is 0xAA has none and its
packets start at offset 0 (the original headerless stream)::

    offset  size      field       meaning
    0       8         MAGIC       b"\\x89NDP\\r\\n\\x1a\\n" (never starts with 0xAA)
    8       2 (BE)    VERSION     format version, currently 1; a reader refuses newer versions
    10      2 (BE)    HEADER_LEN  bytes before the first packet (32 in version 1)
    12      18        reserved    zero
    30      2 (BE)    CRC         CRC-16 (as above) over bytes [0, 30)

Sidecar index
=============
``<shard>.idx`` lets any packet be found in O(1). It is a local file in little-endian
(numpy-native) layout, a 64-byte header then one 16-byte entry per packet::

    header: MAGIC b"NDPINDEX" | version <u4 | entry_size <u4 (16) | n_packets <u8 |
            shard_size <u8 | shard_crc32 <u4 (zlib.crc32 of the whole shard) |
            data_offset <u4 (first packet's offset) | continued <u8 (the packets whose DST
            has bit 7, the later pieces of split documents; an extension in former padding,
            so 0 in indexes written before it, whose shards have none) | zero padding to 64
    entry:  offset <u8 | LEN <u2 | SRC u1 | DST u1 | TYP u1 | 3 zero bytes

An index whose shard size or crc32 does not match its shard is stale: it is refused or rebuilt
by a framing scan, never trusted. Readers that validate every packet they decode may match by
size alone (``verify="size"``, the loader's default: no full read of the data before the first
batch); a shard changed in place then shows up as corrupt packets, never as wrong tokens.
"""

from __future__ import annotations

import enum

import numpy as np

# --- packet frame -------------------------------------------------------------------------
SYNC = 0xAA
HEADER_BYTES = 6  # SYNC SRC DST TYP LEN(2)
CRC_BYTES = 2
FRAME_BYTES = HEADER_BYTES + CRC_BYTES  # 8: fixed per-packet overhead
MAX_PAYLOAD = 0xFFFF  # LEN is 16 bits
MAX_PACKET_BYTES = FRAME_BYTES + MAX_PAYLOAD

# --- CRC-16/CCITT-FALSE ----------------------------------------------------------------------
CRC16_POLY = 0x1021
CRC16_INIT = 0xFFFF
CRC16_CHECK = 0x29B1  # crc16_ccitt(b"123456789")

# --- loss mask -------------------------------------------------------------------------------
IGNORE_INDEX = -100  # label of padding and masked tokens (torch cross_entropy's default)
MASK_COUNT_BYTES = 2  # the N field in front of masked token payloads


class Src(enum.IntEnum):
    """SRC byte: where the data came from."""

    TEXT_CORPUS = 0x01
    CODE_REPO = 0x02
    GRADIENT = 0x05


#: DST bit 7: the packet continues the document of the packet before it (see the docstring)
DST_CONTINUES = 0x80
#: the bits of DST that name the layer
DST_LAYER = 0x7F


class Dst(enum.IntEnum):
    """DST byte: the layer the data is meant for (its low 7 bits, ``DST_LAYER``)."""

    EMBEDDING = 0x01
    ATTENTION = 0x02
    FFN = 0x03
    LORA = 0x05


class Typ(enum.IntEnum):
    """TYP byte: how the payload is encoded."""

    TOKEN_IDS = 0x01
    TOKEN_IDS_U16 = 0x02
    FLOAT16 = 0x03
    BFLOAT16 = 0x06
    TOKEN_IDS_MASKED = 0x11
    TOKEN_IDS_U16_MASKED = 0x12


class DropReason(enum.IntEnum):
    """Why a packet did not become training data. Codes are shared by every backend."""

    OK = 0
    BAD_SYNC = 1  # the byte at the packet's offset is not SYNC (stale or hostile index)
    TRUNCATED = 2  # the frame runs past the end of the shard
    BAD_CRC = 3  # CRC-16 mismatch
    BAD_LENGTH = 4  # LEN does not fit the TYP's payload layout
    NOT_TOKENS = 5  # a valid packet whose TYP is not a token encoding (FLOAT16, BFLOAT16)
    UNKNOWN_TYPE = 6  # a valid packet with a reserved TYP
    # a valid token packet a model cannot take (the Loader's verdicts; ``ndp.kernels.verdict``):
    EMPTY = 7  # no tokens: its row would be all padding, a loss of 0/0
    TOKEN_RANGE = 8  # a token id at or past the vocabulary size (an embedding would fail)
    # a packet the run was told to leave out (``Loader(skip_packets=...)``,
    # ``ndp.loader.planning.skips``)
    SKIPPED = 9


#: token width in bytes per token TYP; the decoder's lookup table (0 = not a token TYP).
TOKEN_WIDTH = {
    Typ.TOKEN_IDS: 4,
    Typ.TOKEN_IDS_U16: 2,
    Typ.TOKEN_IDS_MASKED: 4,
    Typ.TOKEN_IDS_U16_MASKED: 2,
}
MASKED_TYPES = frozenset({Typ.TOKEN_IDS_MASKED, Typ.TOKEN_IDS_U16_MASKED})
VALUE_TYPES = frozenset({Typ.FLOAT16, Typ.BFLOAT16})


def _typ_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Dense 256-entry tables for kernels: token width, masked flag, drop code for non-tokens."""
    width = np.zeros(256, dtype=np.uint8)
    masked = np.zeros(256, dtype=np.uint8)
    skip = np.full(256, DropReason.UNKNOWN_TYPE, dtype=np.uint8)
    for typ, w in TOKEN_WIDTH.items():
        width[typ] = w
        skip[typ] = DropReason.OK
    for typ in MASKED_TYPES:
        masked[typ] = 1
    for typ in VALUE_TYPES:
        skip[typ] = DropReason.NOT_TOKENS
    return width, masked, skip


TYP_WIDTH_TABLE, TYP_MASKED_TABLE, TYP_SKIP_TABLE = _typ_tables()


def token_typ(*, width: int, masked: bool) -> Typ:
    """The TYP for tokens of ``width`` bytes (2 or 4), with or without a loss mask."""
    if width == 4:
        return Typ.TOKEN_IDS_MASKED if masked else Typ.TOKEN_IDS
    if width == 2:
        return Typ.TOKEN_IDS_U16_MASKED if masked else Typ.TOKEN_IDS_U16
    raise ValueError(f"token width must be 2 or 4 bytes, got {width}")


def token_payload_len(n_tokens: int, *, width: int, masked: bool) -> int:
    """Payload bytes for ``n_tokens`` tokens of ``width`` bytes, with or without a mask."""
    if masked:
        return MASK_COUNT_BYTES + n_tokens * width + (n_tokens + 7) // 8
    return n_tokens * width


def max_tokens_per_packet(typ: int) -> int:
    """The most tokens one packet of token TYP ``typ`` can carry (LEN <= 65,535)."""
    width = TOKEN_WIDTH[Typ(typ)]
    masked = typ in MASKED_TYPES
    n = MAX_PAYLOAD // width
    while token_payload_len(n, width=width, masked=masked) > MAX_PAYLOAD:
        n -= 1
    return n


# --- shard header -----------------------------------------------------------------------------
SHARD_MAGIC = b"\x89NDP\r\n\x1a\n"
SHARD_VERSION = 1
SHARD_HEADER_BYTES = 32
SHARD_HEADER_CRC_AT = 30
SHARD_SUFFIX = ".ndp"

# --- sidecar index ----------------------------------------------------------------------------
INDEX_MAGIC = b"NDPINDEX"
INDEX_VERSION = 1
INDEX_HEADER_BYTES = 64
INDEX_SUFFIX = ".idx"
INDEX_HEADER_DTYPE = np.dtype(
    [
        ("magic", "S8"),
        ("version", "<u4"),
        ("entry_size", "<u4"),
        ("n_packets", "<u8"),
        ("shard_size", "<u8"),
        ("shard_crc32", "<u4"),
        ("data_offset", "<u4"),
        ("continued", "<u8"),
        ("pad", "V16"),
    ]
)
INDEX_ENTRY_DTYPE = np.dtype(
    [
        ("offset", "<u8"),
        ("length", "<u2"),
        ("src", "u1"),
        ("dst", "u1"),
        ("typ", "u1"),
        ("pad", "V3"),
    ]
)
assert INDEX_HEADER_DTYPE.itemsize == INDEX_HEADER_BYTES
assert INDEX_ENTRY_DTYPE.itemsize == 16
