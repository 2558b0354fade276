"""Verdicts: what becomes of each packet, in one int64 per packet (CPU reference).

``verdict >= 0``: a valid token packet holding that many tokens (it becomes training data);
``verdict < 0``: a dropped packet, ``-verdict`` being its ``DropReason`` (OK is 0, every drop
reason is >= 1, so the two never meet). One array says everything the host needs to lay out
batches (which rows, how many tokens, which windows) and to count every drop by reason, so a
decode needs one device-to-host copy of it and no other.

Besides the packet checks (``crc16.packet_status``), a valid token packet a model cannot take is
dropped: one with no tokens (``EMPTY``) and one holding an id at or past ``vocab`` (``TOKEN_RANGE``;
the Loader passes the vocabulary size of the dataset's manifest, else ``2**31``, which an int32
id with its top bit set is past). The scan of the ids is skipped when every id of the packet's
width is below ``vocab``.

``limits[k]`` is where packet ``k``'s shard ends inside ``shard`` (packets staged from several
shards into one buffer: each one's verdict must be the one it gets in its own shard, so a LEN
running past its shard's end is TRUNCATED even if other bytes follow in the buffer); an empty
``limits`` means the whole buffer is the shard.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ndp.wire.format import TYP_MASKED_TABLE, TYP_SKIP_TABLE, TYP_WIDTH_TABLE, DropReason
from ndp.kernels._jit import cpu_kernel
from ndp.kernels.build import token_layout
from ndp.kernels.crc16 import CRC16_TABLES, VALIDATE_GRAIN, packet_status
from ndp.engine.threads import parallel_for

OK = int(DropReason.OK)
EMPTY = int(DropReason.EMPTY)
TOKEN_RANGE = int(DropReason.TOKEN_RANGE)
#: the id limit when no vocabulary size is known: ids must fit int32
NO_VOCAB = 1 << 31


@cpu_kernel
def verdict_of(status, n_tokens):  # pragma: no cover - compiled
    """The verdict for a packet with validation ``status`` holding ``n_tokens`` if valid."""
    if status != OK:
        return -np.int64(status)
    return np.int64(n_tokens)


@cpu_kernel
def largest_id(shard, tok, n, width):  # pragma: no cover - compiled
    """The largest of the ``n`` big-endian ids of ``width`` bytes from byte ``tok``: a max over
    all of them with unsigned indices and no early exit, which LLVM vectorizes (a loop that
    stops at the first id out of range does not)."""
    most = np.uint64(0)
    base = np.uint64(tok)
    if width == 2:
        for k in range(np.uint64(0), np.uint64(n)):
            p = base + np.uint64(2) * k
            most = max(most, (np.uint64(shard[p]) << np.uint64(8))
                       | np.uint64(shard[p + np.uint64(1)]))
    else:
        for k in range(np.uint64(0), np.uint64(n)):
            p = base + np.uint64(4) * k
            most = max(most, (np.uint64(shard[p]) << np.uint64(24))
                       | (np.uint64(shard[p + np.uint64(1)]) << np.uint64(16))
                       | (np.uint64(shard[p + np.uint64(2)]) << np.uint64(8))
                       | np.uint64(shard[p + np.uint64(3)]))
    return np.int64(most)


@cpu_kernel
def usable(n, tok, width, shard, vocab):  # pragma: no cover - compiled
    """OK, EMPTY or TOKEN_RANGE for a valid packet of ``n`` tokens from byte ``tok``."""
    if n == 0:
        return EMPTY
    if vocab < (np.int64(1) << (8 * width)) and largest_id(shard, tok, n, width) >= vocab:
        return TOKEN_RANGE
    return OK


@cpu_kernel
def _verdicts(shard, offsets, limits, out, tables, w_t, m_t, s_t, vocab,
              lo, hi):  # pragma: no cover - compiled
    size = shard.shape[0]
    for k in range(lo, hi):
        off = np.int64(offsets[k])
        limit = size
        if limits.shape[0] > 0:
            limit = max(np.int64(0), min(np.int64(limits[k]), size))
        status = packet_status(shard[:limit], off, tables, w_t, m_t, s_t)
        n = np.int64(0)
        if status == OK:
            n, tok, _, width = token_layout(shard, off, w_t, m_t)
            status = usable(n, tok, width, shard, vocab)
        out[k] = verdict_of(status, n)


def verdicts_cpu(shard: np.ndarray, offsets: np.ndarray, limits: np.ndarray,
                 out: np.ndarray, vocab: int = NO_VOCAB) -> None:
    """The verdict of the packet at each of ``offsets`` into ``out`` (int64, same length);
    ids must be below ``vocab``. Synchronous; allocates nothing; runs on ndp's host threads."""
    parallel_for(_verdicts, offsets.shape[0], shard, offsets, limits, out, CRC16_TABLES,
                 TYP_WIDTH_TABLE, TYP_MASKED_TABLE, TYP_SKIP_TABLE, np.int64(vocab),
                 grain=VALIDATE_GRAIN)


def status_of(verdicts: np.ndarray) -> np.ndarray:
    """The ``DropReason`` code (uint8) of each verdict."""
    return np.where(verdicts >= 0, OK, -verdicts).astype(np.uint8)


def tokens_of(verdicts: np.ndarray) -> np.ndarray:
    """Tokens each packet contributes (0 for dropped ones)."""
    return np.maximum(verdicts, 0)


_N_REASONS = len(DropReason)
_NAMES = [DropReason(c).name for c in range(_N_REASONS)]


def count(verdicts: np.ndarray) -> dict[str, Any]:
    """Packets, valid ones and drops by reason, for ``LoaderStats.add``."""
    return count_segments(verdicts, np.array([0, verdicts.shape[0]]))[0]


def count_segments(verdicts: np.ndarray, bounds: np.ndarray) -> list[dict[str, Any]]:
    """``count`` of each segment ``verdicts[bounds[i]:bounds[i + 1]]`` (one pass for all)."""
    n_seg = bounds.shape[0] - 1
    if n_seg <= 0:
        return []
    a, b = int(bounds[0]), int(bounds[-1])
    sizes = np.diff(bounds)
    if b == a or int(verdicts[a:b].min()) >= 0:  # nothing dropped (the usual chunk)
        return [{"packets": k, "valid": k, "corrupt": {}} for k in sizes.tolist()]
    seg = np.repeat(np.arange(n_seg), sizes)
    codes = np.bincount(seg * _N_REASONS + status_of(verdicts[a:b]),
                        minlength=n_seg * _N_REASONS).reshape(n_seg, _N_REASONS).tolist()
    out = []
    for row in codes:
        corrupt = {_NAMES[c]: k for c, k in enumerate(row) if k and c != DropReason.OK}
        out.append({"packets": sum(row), "valid": row[DropReason.OK], "corrupt": corrupt})
    return out
