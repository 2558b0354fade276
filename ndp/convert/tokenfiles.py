"""Token files of other trainers: llm.c, llm.q and raw uint16 in (``ndp convert``), llm.c out
(``ndp export``), so a dataset can come to ndp and leave it without re-tokenizing.

Formats (every multi-byte field little-endian)
==============================================

llm.c token shard (``fineweb_train_000001.bin``, written by llm.c's ``dev/data``)::

    offset  size        field
    0       1024        header: 256 int32 words, those not named here are 0
                          word 0    MAGIC    20240520
                          word 1    VERSION  1: tokens are uint16; 2: tokens are uint32
                          word 2    N        number of tokens
                          word 253  NDP      0x3150444E (b"NDP1"): words 254-255 are ndp's
                          word 254  EOS      the id documents are cut at; -1: not cut
                          word 255  SPLIT    0 none, 1 before (a document starts at each EOS),
                                             2 after (a document ends with each EOS)
    1024    N * width   tokens: uint16 (version 1) or uint32 (version 2)

The file is exactly ``1024 + N * width`` bytes. llm.c's Llama-3 variant (MAGIC 20240801, VERSION
7, uint32 tokens) is read as well, and never written. GPT-2 data puts the EOT token (50256) at the
START of every document.

llm.c's readers check words 0-2 only. ndp's export fills words 253-255 with the dataset's
document rule (so that ``ndp convert`` of the file gives its documents back) where that rule is
not the format's default (Documents, below), so a plain llm.c file that went through ndp comes
back byte for byte. A file without the NDP word is read with the defaults.

llm.q token file::

    offset    size          field
    0         8             b"BIN.TOK\\n"
    8         4 (int32)     VERSION           2
    12        4 (int32)     BYTES_PER_TOKEN   4
    16        4 (int32)     N                 number of tokens
    20        4 (int32)     VOCAB_SIZE        every id is below it (0: not stated)
    24        4 (int32)     HAS_MASKS         0 or 1
    28        996           reserved: the header is 1024 bytes
    1024      N * 4         tokens, int32
    1024+4N   ceil(N / 8)   only if HAS_MASKS: loss mask, bit i % 8 of byte i // 8 is token i's
                            (little bit order; 1 = in the loss), as NDP's masked TYPs store it

The file is exactly ``1024 + 4N`` bytes, plus ``ceil(N / 8)`` with a mask. The EOS token ENDS
every document. A mask becomes the packets' loss mask (``TOKEN_IDS[_U16]_MASKED``).

Raw uint16 (nanoGPT's ``train.bin``): no header, just uint16 tokens, so the size is even. It has
no header to recognise, so it is read only when asked for (``fmt="raw-u16"``). nanoGPT appends
EOT at the END of every document.

Documents
=========
A token file is one stream; it is cut into documents at an EOS/EOT id: ``before`` (a document
starts at each id: llm.c) or ``after`` (a document ends with each id: llm.q, raw), ``auto`` taking
the format's rule, ``none`` not cutting. Tokens before the first (after the last) id form a
document too, and a file boundary is a document boundary. Without ``eos_token_id`` the id is
50256 for llm.c version 1 (GPT-2's EOT) and 128000 for llm.c Llama-3 (``<|begin_of_text|>``);
other files are not cut. Documents are never reordered or dropped, so the packets' tokens,
concatenated, are the input files' tokens, concatenated. A document longer than one packet
continues in consecutive packets (the *split* rule of ``ndp.wire.format``).

An llm.c file whose header records a document rule (ndp's export, above) is cut by it instead of
the defaults; ``eos_token_id`` and ``split`` passed to the converter win over both.

Packets are uint16 (``TOKEN_IDS_U16``) when every id of every input is below 65,536, else int32.

Export writes llm.c files: version 1 when every id is below 65,536 (``version="auto"``) else 2,
in corpus order, every packet validated first (a corrupt one is an error that names its shard
and byte offset). llm.c files have no loss mask: masked packets are exported whole, counted, and
a warning says so once. The dataset's document rule is taken from its manifest: a converted text
dataset's documents each end with the tokenizer's EOS (``after``); a dataset of token files keeps
the rule its files were cut by.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ndp.errors import ConfigError, TokenFileError

log = logging.getLogger("ndp.convert")

LLMC_MAGIC = 20240520
LLMC_LLAMA3_MAGIC = 20240801  # read only
LLMC_HEADER_WORDS = 256
LLMC_HEADER_BYTES = 4 * LLMC_HEADER_WORDS
#: header words 253, 254, 255: ndp's mark, the EOS id (-1: none), the split code
LLMC_NDP_WORD = LLMC_HEADER_WORDS - 3
LLMC_NDP_MARK = int.from_bytes(b"NDP1", "little")
LLMC_SPLIT_CODES = {"none": 0, "before": 1, "after": 2}
#: (magic, version) -> token dtype
LLMC_DTYPES = {(LLMC_MAGIC, 1): "<u2", (LLMC_MAGIC, 2): "<u4", (LLMC_LLAMA3_MAGIC, 7): "<u4"}
LLMQ_MAGIC = b"BIN.TOK\n"
LLMQ_HEADER_BYTES = 1024
LLMQ_VERSION = 2
LLMQ_BYTES_PER_TOKEN = 4
DEFAULT_EOS = {(LLMC_MAGIC, 1): 50256, (LLMC_LLAMA3_MAGIC, 7): 128000}
DEFAULT_SPLIT = {"llmc": "before", "llmq": "after", "raw-u16": "after"}
FORMATS = ("llmc", "llmq", "raw-u16")
SPLIT_RULES = ("auto", "before", "after", "none")
_CHUNK = 1 << 24  # tokens per vectorised step over a file (bounded temporaries)


# --- reading ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenFile:
    """A validated token file: ``tokens`` (memory-mapped, read-only) and an optional ``mask``
    (bool per token, True = in the loss)."""

    path: Path
    format: str  # one of FORMATS
    version: int | None
    tokens: np.ndarray
    mask: np.ndarray | None = None
    magic: int | None = None
    vocab_size: int | None = None
    #: the document rule an ndp export recorded in the header (None: the format's defaults)
    eos_token_id: int | None = None
    split: str | None = None

    @property
    def default_eos(self) -> int | None:
        return DEFAULT_EOS.get((self.magic, self.version))


def llmc_document_words(eos_token_id: int | None, split: str) -> np.ndarray:
    """Header words 253-255 recording a document rule (``split`` one of before, after, none)."""
    eos = -1 if eos_token_id is None or split == "none" else eos_token_id
    return np.array([LLMC_NDP_MARK, eos, LLMC_SPLIT_CODES[split if eos >= 0 else "none"]],
                    "<i4")


def llmc_default_documents(version: int) -> tuple[int | None, str]:
    """The document rule a plain llm.c file of ``version`` is read with: (EOS id, split)."""
    eos = DEFAULT_EOS.get((LLMC_MAGIC, version))
    return eos, DEFAULT_SPLIT["llmc"] if eos is not None else "none"


def _llmc_documents(path: Path, words: np.ndarray) -> tuple[int | None, str | None]:
    """The document rule of header words 253-255, (None, None) without ndp's mark."""
    mark, eos, code = (int(w) for w in words[LLMC_NDP_WORD:])
    if mark != LLMC_NDP_MARK:
        return None, None
    rules = {c: rule for rule, c in LLMC_SPLIT_CODES.items()}
    if code not in rules or eos < -1 or (eos == -1) != (code == 0):
        raise TokenFileError(
            path, "header words 254-255 (ndp's document rule): an EOS id >= 0 with split code "
            "1 (before) or 2 (after), or -1 with split code 0 (none)", f"EOS {eos}, split code "
            f"{code}", "The header is damaged; pass --eos-id and --split to say where the "
            "documents are cut, or re-export the file.")
    return (None if eos < 0 else eos), rules[code]


def _map(path: Path, dtype: str, offset: int, count: int) -> np.ndarray:
    if count == 0:  # np.memmap cannot map zero bytes
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=(count,))


def _check_size(path: Path, size: int, want: int, what: str) -> None:
    if size != want:
        raise TokenFileError(
            path, f"{want:,} bytes ({what}, as the header says)", f"{size:,} bytes",
            "The file is truncated or has trailing bytes; re-create or re-download it.",
        )


def read_llmc(path: str | os.PathLike) -> TokenFile:
    """An llm.c token shard (see the module docstring), header and size checked."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(LLMC_HEADER_BYTES)
    magic = int.from_bytes(head[:4], "little", signed=True) if len(head) >= 4 else None
    if magic not in (LLMC_MAGIC, LLMC_LLAMA3_MAGIC):
        raise TokenFileError(
            path, f"an llm.c token file (int32 magic {LLMC_MAGIC} in its first 4 bytes)",
            f"{magic}" if magic is not None else f"a {size}-byte file",
            "This is not an llm.c shard; name its format with --format (llmq, raw-u16), or "
            "convert text with --tokenizer.",
        )
    if len(head) < LLMC_HEADER_BYTES:
        raise TokenFileError(path, f"a {LLMC_HEADER_BYTES}-byte llm.c header",
                             f"{size} bytes in all", "The file is truncated; re-create it.")
    words = np.frombuffer(head, "<i4")
    version, n = int(words[1]), int(words[2])
    dtype = LLMC_DTYPES.get((magic, version))
    if dtype is None:
        known = ", ".join(f"{v} ({LLMC_DTYPES[m, v][1:]})" for m, v in LLMC_DTYPES if m == magic)
        raise TokenFileError(path, f"llm.c version {known}", f"version {version}",
                             "Re-export the file as llm.c version 1 (uint16) or 2 (uint32).")
    if n < 0:
        raise TokenFileError(path, "a token count >= 0 in header word 2", str(n),
                             "The header is damaged; re-create the file.")
    width = np.dtype(dtype).itemsize
    _check_size(path, size, LLMC_HEADER_BYTES + n * width,
                f"{LLMC_HEADER_BYTES}-byte header + {n:,} tokens x {width} bytes")
    eos, split = _llmc_documents(path, words)
    return TokenFile(path, "llmc", version, _map(path, dtype, LLMC_HEADER_BYTES, n), magic=magic,
                     eos_token_id=eos, split=split)


def read_llmq(path: str | os.PathLike) -> TokenFile:
    """An llm.q token file (see the module docstring), header and size checked; its mask, if
    any, unpacked to one bool per token."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(LLMQ_HEADER_BYTES)
    if head[: len(LLMQ_MAGIC)] != LLMQ_MAGIC:
        raise TokenFileError(path, f"an llm.q token file starting with {LLMQ_MAGIC!r}",
                             repr(head[: len(LLMQ_MAGIC)]),
                             "This is not an llm.q file; name its format with --format.")
    if len(head) < LLMQ_HEADER_BYTES:
        raise TokenFileError(path, f"a {LLMQ_HEADER_BYTES}-byte llm.q header",
                             f"{size} bytes in all", "The file is truncated; re-create it.")
    version, width, n, vocab, has_masks = (int(v) for v in np.frombuffer(head[8:28], "<i4"))
    if version != LLMQ_VERSION:
        raise TokenFileError(path, f"llm.q version {LLMQ_VERSION}", f"version {version}",
                             "Re-write the file with an llm.q that writes version 2.")
    if width != LLMQ_BYTES_PER_TOKEN:
        raise TokenFileError(path, f"bytes_per_token {LLMQ_BYTES_PER_TOKEN} (int32 tokens)",
                             str(width), "Re-write the file with 4-byte tokens.")
    if n < 0 or vocab < 0 or has_masks not in (0, 1):
        raise TokenFileError(path, "n_tokens >= 0, vocab_size >= 0, has_masks 0 or 1",
                             f"{n}, {vocab}, {has_masks}", "The header is damaged; re-create it.")
    mask_bytes = (n + 7) // 8 if has_masks else 0
    _check_size(path, size, LLMQ_HEADER_BYTES + 4 * n + mask_bytes,
                f"{LLMQ_HEADER_BYTES}-byte header + {n:,} int32 tokens"
                + (f" + {mask_bytes:,} mask bytes" if has_masks else ""))
    tokens = _map(path, "<i4", LLMQ_HEADER_BYTES, n)
    mask = None
    if has_masks:
        bits = _map(path, "u1", LLMQ_HEADER_BYTES + 4 * n, mask_bytes)
        mask = np.unpackbits(bits, count=n, bitorder="little").view(bool)
    return TokenFile(path, "llmq", version, tokens, mask, vocab_size=vocab or None)


def read_raw_u16(path: str | os.PathLike) -> TokenFile:
    """A headerless file of little-endian uint16 tokens (nanoGPT's ``train.bin``)."""
    path = Path(path)
    size = path.stat().st_size
    if size % 2:
        raise TokenFileError(path, "an even number of bytes (raw uint16 tokens)",
                             f"{size:,} bytes", "The file is truncated or not raw uint16 tokens.")
    return TokenFile(path, "raw-u16", None, _map(path, "<u2", 0, size // 2))


def detect_token_format(path: str | os.PathLike) -> str | None:
    """``"llmc"`` (int32 magic at byte 0), ``"llmq"`` (``BIN.TOK\\n``) or None. Raw uint16 has
    no header and is never detected."""
    with open(path, "rb") as f:
        head = f.read(len(LLMQ_MAGIC))
    if head == LLMQ_MAGIC:
        return "llmq"
    if len(head) >= 4 and int.from_bytes(head[:4], "little") in (LLMC_MAGIC, LLMC_LLAMA3_MAGIC):
        return "llmc"
    return None


_READERS = {"llmc": read_llmc, "llmq": read_llmq, "raw-u16": read_raw_u16}


def read_token_file(path: str | os.PathLike, fmt: str = "auto") -> TokenFile:
    """Read ``path`` as ``fmt`` (one of ``FORMATS``), or as its header says (``"auto"``)."""
    if fmt == "auto":
        fmt = detect_token_format(path) or ""
        if not fmt:
            with open(path, "rb") as f:
                start = f.read(8)
            raise TokenFileError(
                path, f"an llm.c (int32 magic {LLMC_MAGIC}) or llm.q ({LLMQ_MAGIC!r}) header",
                f"first bytes {start.hex(' ') or '(empty file)'}",
                "Raw headerless uint16 tokens need --format raw-u16; text needs --tokenizer.",
            )
    if fmt not in _READERS:
        raise ConfigError(f"token file format `fmt` must be auto or one of {FORMATS}, got "
                          f"{fmt!r}")
    return _READERS[fmt](path)


def document_bounds(tokens: np.ndarray, eos_token_id: int | None, rule: str) -> np.ndarray:
    """Start of every document and the end of the last: document ``i`` is
    ``tokens[b[i]:b[i + 1]]``. ``rule``: ``before`` (a document starts at each EOS),
    ``after`` (one ends with each EOS) or ``none``."""
    n = int(tokens.shape[0])
    cuts = [np.array([0, n], np.int64)]
    if eos_token_id is not None and rule != "none":
        if rule not in ("before", "after"):
            raise ConfigError(f"`split` must be one of {SPLIT_RULES}, got {rule!r}")
        shift = 1 if rule == "after" else 0
        for lo in range(0, n, _CHUNK):
            cuts.append(np.flatnonzero(tokens[lo: lo + _CHUNK] == eos_token_id) + (lo + shift))
    bounds = np.unique(np.concatenate(cuts))
    return bounds if n else bounds[:1]


def id_range(tf: TokenFile) -> tuple[int, int]:
    """(min, max) token id of ``tf`` ((0, -1) when empty)."""
    lo, hi = 0, -1
    for at in range(0, tf.tokens.shape[0], _CHUNK):
        part = tf.tokens[at: at + _CHUNK]
        lo, hi = min(lo, int(part.min())), max(hi, int(part.max()))
    return lo, hi


