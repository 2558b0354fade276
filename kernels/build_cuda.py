"""Decode and build, fused, on the device, beside its CPU reference (``build.py``), which it
must equal bit for bit: big-endian tokens go straight from the packet bytes into the int64
training arrays, one thread per output token.

* ``build_padded_cuda``: a block per row (grid-stride over rows), its threads across the row's
  positions, so neighbouring threads write neighbouring int64s;
* ``build_packed_cuda``: a thread per stream position of the batch's windows; each finds its
  packet by binary search over the cumulative token counts (``token_cum_cuda``) and writes the
  token into ``x`` and its label into ``y`` (the same position one window slot earlier).

The number of valid rows is read on the device from ``counts[OK]`` (written by
``compact_cuda``), so the host launches build right after compaction without waiting. Reads
trust only what validation proved: rows are packets whose frame and payload layout fit inside
the shard; writes are bounded by the output shapes.
"""

from __future__ import annotations

from numba import cuda, int64

from ndp.backend import simulated
from ndp.format import IGNORE_INDEX, DropReason
from ndp.kernels.build import in_loss, token_at, token_layout

OK = int(DropReason.OK)
#: threads per block of the build kernels (fewer under the simulator, where threads are slow)
BUILD_BLOCK = 16 if simulated() else 256

# The ``counts`` array (int64, COUNT_SLOTS long) that one decode's kernels fill and the host
# reads back in one small copy: slots 0..len(DropReason)-1 count packets per DropReason
# (``compact_cuda``; slot OK is the number of valid rows), then:
#: tokens written into padded rows (``build_padded_cuda``)
TOKENS_SLOT = 8
#: tokens cut from padded rows longer than ``max_seq_length`` (``build_padded_cuda``)
TRUNCATED_SLOT = 9
#: tokens in the stream of valid packets (``token_cum_cuda``)
STREAM_TOTAL_SLOT = 10
COUNT_SLOTS = 16


# The CPU reference's own Python source, compiled for the device: one definition, two targets.
#: (n_tokens, first token byte, first mask byte or -1, width) of a valid token packet
token_layout_dev = cuda.jit(device=True)(token_layout.py_func)
#: token ``t`` of a payload whose tokens start at byte ``tok`` (big-endian)
token_at_dev = cuda.jit(device=True, inline=True)(token_at.py_func)
#: whether token ``t`` is a training target (mask bit 1, or no mask at ``mask == -1``)
in_loss_dev = cuda.jit(device=True, inline=True)(in_loss.py_func)


@cuda.jit(device=True, inline=True)
def label_of_dev(shard, mask, t, value):  # pragma: no cover - compiled
    """``value`` if token ``t`` is a training target (mask bit 1, or no mask), else -100."""
    if in_loss_dev(shard, mask, t):
        return value
    return int64(IGNORE_INDEX)


@cuda.jit(cache=True)
def build_padded_cuda(
    shard, offsets, rows, counts, pad_id, input_ids, labels, attention_mask, lengths, w_t, m_t
):  # pragma: no cover - compiled
    """Rows ``[0, counts[OK])`` of the (R, L) outputs, as ``build_padded_cpu``; adds the
    delivered and truncated token totals into ``counts[TOKENS_SLOT]`` / ``[TRUNCATED_SLOT]``
    (integer atomics: the sums do not depend on the order blocks run in)."""
    n_rows = min(counts[OK], input_ids.shape[0])
    max_len = input_ids.shape[1]
    for r in range(cuda.blockIdx.x, n_rows, cuda.gridDim.x):
        off = int64(offsets[rows[r]])
        n, tok, mask, width = token_layout_dev(shard, off, w_t, m_t)
        m = min(n, max_len)
        for t in range(cuda.threadIdx.x, max_len, cuda.blockDim.x):
            if t < m:
                value = token_at_dev(shard, tok, t, width)
                input_ids[r, t] = value
                labels[r, t] = label_of_dev(shard, mask, t, value)
                attention_mask[r, t] = 1
            else:
                input_ids[r, t] = pad_id
                labels[r, t] = IGNORE_INDEX
                attention_mask[r, t] = 0
        if cuda.threadIdx.x == 0:
            lengths[r] = n
            cuda.atomic.add(counts, TOKENS_SLOT, m)
            cuda.atomic.add(counts, TRUNCATED_SLOT, n - m)


@cuda.jit(device=True)
def row_of_position_dev(cum, n_rows, p):  # pragma: no cover - compiled
    """The row ``r`` with ``cum[r] <= p < cum[r + 1]`` (the last such, skipping empty rows)."""
    lo = int64(0)
    hi = int64(n_rows)  # cum[lo] <= p < cum[hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if cum[mid] <= p:
            lo = mid
        else:
            hi = mid
    return lo


@cuda.jit(cache=True)
def build_packed_cuda(shard, offsets, rows, cum, counts, start, x, y, w_t, m_t):  # pragma: no cover
    """(B, T) ``x``/``y`` windows of T+1 tokens from stream position ``start``, as
    ``build_packed_cpu``: flat ``x[i] = stream[start + i]``, flat ``y[i]`` = label of
    ``stream[start + i + 1]``. Positions past the stream's end are not written (the host checks
    ``start + B*T + 1 <= cum[n]`` first)."""
    n_rows = counts[OK]
    n_batch, seq = x.shape
    n_x = n_batch * seq
    total = cum[n_rows]
    for i in range(cuda.grid(1), n_x + 1, cuda.gridsize(1)):
        p = start + i
        if p < 0 or p >= total:
            continue
        r = row_of_position_dev(cum, n_rows, p)
        n, tok, mask, width = token_layout_dev(shard, int64(offsets[rows[r]]), w_t, m_t)
        t = p - cum[r]
        value = token_at_dev(shard, tok, t, width)
        if i < n_x:
            x[i // seq, i % seq] = value
        if i > 0:
            y[(i - 1) // seq, (i - 1) % seq] = label_of_dev(shard, mask, t, value)


SIGNATURES = {
    "build_padded_cuda": (
        build_padded_cuda,
        [
            "void(uint8[::1], int64[::1], int64[::1], int64[::1], int64, int64[:, ::1], "
            "int64[:, ::1], int64[:, ::1], int64[::1], uint8[::1], uint8[::1])"
        ],
    ),
    "build_packed_cuda": (
        build_packed_cuda,
        [
            "void(uint8[::1], int64[::1], int64[::1], int64[::1], int64[::1], int64, "
            "int64[:, ::1], int64[:, ::1], uint8[::1], uint8[::1])"
        ],
    ),
}
