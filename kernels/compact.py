"""Compaction: valid packets become consecutive output rows, in packet order.

An exclusive scan over the per-packet valid flags gives each valid packet its row; the row
order is therefore deterministic (stream order), which the CUDA version must reproduce.
"""

from __future__ import annotations

import numpy as np

from ndp.wire.format import DropReason
from ndp.kernels._jit import cpu_kernel


@cpu_kernel
def _compact(status, row_of_packet, rows):  # pragma: no cover - compiled
    total = 0
    for k in range(status.shape[0]):
        row_of_packet[k] = total  # exclusive scan of (status == OK)
        if status[k] == DropReason.OK:
            rows[total] = k
            total += 1
    return total


def compact_cpu(status: np.ndarray, row_of_packet: np.ndarray, rows: np.ndarray) -> int:
    """Exclusive scan of ``status == OK`` into ``row_of_packet``; packet index of each row into
    ``rows[:n]``. Returns ``n``, the number of valid packets. Synchronous; allocates nothing."""
    return int(_compact(status, row_of_packet, rows))
