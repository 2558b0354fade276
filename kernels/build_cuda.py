"""Decode and build, fused, on the device, beside its CPU reference (``build.py``), which it
must equal bit for bit: big-endian tokens go straight from the packet bytes into the int64
training arrays, one thread per output token.

* ``build_padded_cuda``: a block per row (grid-stride over rows), its threads across the row's
  positions, so neighbouring threads write neighbouring int64s;
* ``build_packed_cuda``: a thread per stream position of the windows; each finds its packet by
  binary search over the cumulative token counts (made on the host from the verdicts) and writes
  the token into ``x`` and its label into ``y`` (the same position one window slot earlier);
* ``build_packing_cuda``: a block per row, a thread per column; each finds the document that
  covers its column by binary search over the row's documents, or writes padding.

The host lays the rows out from the verdicts (``ndp.loader.layouts.layout``) before it launches
these, so
one launch builds every batch of a chunk. Reads trust only what validation proved: rows are packets
whose frame and payload layout fit inside their shard; writes are bounded by the output shapes.
"""

from __future__ import annotations

from numba import cuda, int64

from ndp.engine.backend import simulated
from ndp.wire.format import IGNORE_INDEX
from ndp.kernels.build import in_loss, token_at, token_layout

#: threads per block of the build kernels. Under the simulator one: its threads are Python
#: threads that take a lock around every device-function call, and contended they convoy on the
#: GIL (seconds per chunk); the kernel tests launch several threads per block explicitly.
BUILD_BLOCK = 1 if simulated() else 256


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
    shard, offsets, row_packet, pad_id, input_ids, labels, attention_mask, w_t, m_t
):  # pragma: no cover - compiled
    """Rows ``[0, row_packet.shape[0])`` of the (R, L) outputs, as ``build_padded_cpu``."""
    n_rows = min(row_packet.shape[0], input_ids.shape[0])
    max_len = input_ids.shape[1]
    for r in range(cuda.blockIdx.x, n_rows, cuda.gridDim.x):
        off = int64(offsets[row_packet[r]])
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


@cuda.jit(device=True)
def last_at_or_before_dev(keys, lo, hi, p):  # pragma: no cover - compiled
    """The last ``i`` in ``[lo, hi)`` with ``keys[i] <= p`` (``keys`` ascending), or ``lo - 1``."""
    a = int64(lo) - 1  # keys[a] <= p (or a == lo - 1)
    b = int64(hi)  # keys[b] > p (or b == hi)
    while b - a > 1:
        mid = (a + b) // 2
        if keys[mid] <= p:
            a = mid
        else:
            b = mid
    return a


@cuda.jit(cache=True)
def build_packed_cuda(shard, offsets, rows, cum, start, wins, x, y, w_t,
                      m_t):  # pragma: no cover - compiled
    """(W, T) ``x``/``y`` windows of T+1 tokens from stream position ``start``, as
    ``build_packed_cpu``: flat ``x[i] = stream[start + i]``, flat ``y[i]`` = label of
    ``stream[start + i + 1]``; or, where ``wins`` is not empty (windows aligned to documents),
    window ``b`` from ``wins[b]``: ``T + 1`` threads a window. ``cum`` (``rows.shape[0] + 1``
    long) holds each row's first stream position and the total; positions past the total are
    not written (the host checks that every window fits first)."""
    n_rows = rows.shape[0]
    n_windows, seq = x.shape
    n_x = n_windows * seq
    total = cum[n_rows]
    aligned = wins.shape[0] > 0
    n_threads = n_windows * (seq + 1) if aligned else n_x + 1
    for i in range(cuda.grid(1), n_threads, cuda.gridsize(1)):
        if aligned:
            b = i // (seq + 1)
            j = i % (seq + 1)
            p = wins[b] + j
        else:
            b = i // seq
            j = i % seq
            p = start + i
        if p < 0 or p >= total:
            continue
        # the last row starting at or before p (empty rows start where the next one does)
        r = last_at_or_before_dev(cum, 0, n_rows, p)
        n, tok, mask, width = token_layout_dev(shard, int64(offsets[rows[r]]), w_t, m_t)
        t = p - cum[r]
        value = token_at_dev(shard, tok, t, width)
        if aligned:
            if j < seq:
                x[b, j] = value
            if j > 0:
                y[b, j - 1] = label_of_dev(shard, mask, t, value)
        else:
            if i < n_x:
                x[b, j] = value
            if i > 0:
                y[(i - 1) // seq, (i - 1) % seq] = label_of_dev(shard, mask, t, value)


@cuda.jit(cache=True)
def build_packing_cuda(shard, offsets, doc_packet, doc_col, doc_len, row_docs, pad_id, input_ids,
                       labels, attention_mask, position_ids, w_t, m_t):  # pragma: no cover
    """Rows ``[0, row_docs.shape[0] - 1)`` of the (R, L) outputs, as ``build_packing_cpu``."""
    n_rows = min(row_docs.shape[0] - 1, input_ids.shape[0])
    row_len = input_ids.shape[1]
    for r in range(cuda.blockIdx.x, n_rows, cuda.gridDim.x):
        first = row_docs[r]
        stop = row_docs[r + 1]
        for c in range(cuda.threadIdx.x, row_len, cuda.blockDim.x):
            d = last_at_or_before_dev(doc_col, first, stop, c)
            t = int64(-1)
            if d >= first and c < doc_col[d] + doc_len[d]:
                t = c - doc_col[d]
            if t < 0:
                input_ids[r, c] = pad_id
                labels[r, c] = IGNORE_INDEX
                attention_mask[r, c] = 0
                position_ids[r, c] = 0
            else:
                n, tok, mask, width = token_layout_dev(shard, int64(offsets[doc_packet[d]]),
                                                       w_t, m_t)
                value = token_at_dev(shard, tok, t, width)
                input_ids[r, c] = value
                if t == 0:
                    labels[r, c] = IGNORE_INDEX
                else:
                    labels[r, c] = label_of_dev(shard, mask, t, value)
                attention_mask[r, c] = 1
                position_ids[r, c] = t


@cuda.jit(cache=True)
def build_documents_cuda(doc_cum, start, wins, position_ids,
                         document_ids):  # pragma: no cover - compiled
    """(W, T) ``position_ids`` and ``document_ids`` of packed windows from stream position
    ``start`` (or each from ``wins[b]`` where ``wins`` is not empty), as
    ``build_documents_cpu``: one thread per token."""
    n_windows, seq = position_ids.shape
    n = doc_cum.shape[0]
    aligned = wins.shape[0] > 0
    for i in range(cuda.grid(1), n_windows * seq, cuda.gridsize(1)):
        b = i // seq
        s = wins[b] if aligned else start + b * seq
        p = s + i % seq
        d = last_at_or_before_dev(doc_cum, 0, n, p)
        d0 = last_at_or_before_dev(doc_cum, 0, n, s)
        first = doc_cum[d] if doc_cum[d] > s else s
        position_ids[b, i % seq] = p - first
        document_ids[b, i % seq] = d - d0


SIGNATURES = {
    "build_padded_cuda": (
        build_padded_cuda,
        [
            "void(uint8[::1], int64[::1], int64[::1], int64, int64[:, ::1], int64[:, ::1], "
            "int64[:, ::1], uint8[::1], uint8[::1])"
        ],
    ),
    "build_packed_cuda": (
        build_packed_cuda,
        [
            "void(uint8[::1], int64[::1], int64[::1], int64[::1], int64, int64[::1], "
            "int64[:, ::1], int64[:, ::1], uint8[::1], uint8[::1])"
        ],
    ),
    "build_documents_cuda": (
        build_documents_cuda,
        ["void(int64[::1], int64, int64[::1], int64[:, ::1], int32[:, ::1])"],
    ),
    "build_packing_cuda": (
        build_packing_cuda,
        [
            "void(uint8[::1], int64[::1], int64[::1], int64[::1], int64[::1], int64[::1], int64, "
            "int64[:, ::1], int64[:, ::1], int64[:, ::1], int64[:, ::1], uint8[::1], uint8[::1])"
        ],
    ),
}
