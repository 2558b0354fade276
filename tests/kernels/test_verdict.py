"""kernels/verdict.py's host side: per-segment counts of verdicts (what each batch counted)."""

from __future__ import annotations

import numpy as np
import pytest

from ndp.kernels.verdict import count_segments
from ndp.wire.format import DropReason


def _naive(verdicts: np.ndarray, bounds: np.ndarray) -> list[dict]:
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        part = verdicts[a:b]
        corrupt: dict[str, int] = {}
        for v in part[part < 0].tolist():
            corrupt[DropReason(-v).name] = corrupt.get(DropReason(-v).name, 0) + 1
        out.append({"packets": int(b - a), "valid": int((part >= 0).sum()), "corrupt": corrupt})
    return out


@pytest.mark.parametrize("drops", [0.0, 0.2])
@pytest.mark.parametrize("seed", range(5))
def test_each_segment_counts_its_packets_valid_ones_and_drops_by_reason(drops, seed):
    """With nothing dropped (the fast path) and with drops of every reason, empty segments
    included."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 300))
    verdicts = rng.integers(0, 2000, n).astype(np.int64)
    bad = rng.random(n) < drops
    verdicts[bad] = -rng.integers(1, len(DropReason), int(bad.sum()))
    cuts = np.sort(rng.integers(0, n + 1, int(rng.integers(0, 12))))
    bounds = np.concatenate([[0], cuts, [n]]).astype(np.int64)
    assert count_segments(verdicts, bounds) == _naive(verdicts, bounds)
