"""The compiled passes of a packed chunk's layout (``ndp.loader.layouts.layout``: ``_stream``,
``_reach``) give what the numpy formulas they replaced give, on chunks with drops, with none
valid, empty, and batch ends on packet edges, inside packets and past the stream."""

from __future__ import annotations

import numpy as np
import pytest

from ndp.loader.layouts.layout import _reach, _stream


def numpy_stream(verdicts):
    tokens = np.maximum(verdicts, 0)
    run = np.cumsum(tokens)
    rows = np.flatnonzero(verdicts >= 0).astype(np.int64)
    cum = np.concatenate([[0], np.cumsum(tokens[rows])]).astype(np.int64)
    return run, rows, cum


def numpy_reach(verdicts, ends, counted_from):
    tokens = np.maximum(verdicts, 0)
    run = np.cumsum(tokens)
    starts = run - tokens
    reached = np.maximum.accumulate(np.maximum(
        np.searchsorted(starts, ends + 1, side="left"), counted_from))
    skips = np.searchsorted(run, ends, side="right")
    before = np.where(skips > 0, run[np.maximum(skips - 1, 0)], 0)
    return reached, skips, before


def chunks():
    rng = np.random.default_rng(11)
    yield np.zeros(0, np.int32)
    yield -np.ones(7, np.int32)  # every packet dropped
    yield np.array([0, 5, 0, -3, 5, 0], np.int32)  # empty packets and a drop
    for n in (1, 2, 50, 400):
        v = rng.integers(0, 40, n).astype(np.int32)
        v[rng.random(n) < 0.2] = -rng.integers(1, 6)  # drops of several reasons
        yield v


@pytest.mark.parametrize("verdicts", list(chunks()), ids=lambda v: f"n{v.shape[0]}")
def test_the_compiled_passes_are_the_numpy_formulas(verdicts):
    n = verdicts.shape[0]
    run, rows, cum = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n + 1, np.int64)
    k = int(_stream(verdicts, run, rows, cum))
    want_run, want_rows, want_cum = numpy_stream(verdicts)
    np.testing.assert_array_equal(run, want_run)
    np.testing.assert_array_equal(rows[:k], want_rows)
    np.testing.assert_array_equal(cum[:k + 1], want_cum)
    total = int(want_run[-1]) if n else 0
    edges = np.unique(np.concatenate([[0, 1], want_run, want_run + 1]))
    ends = np.sort(np.concatenate([edges[edges <= total + 3], [total + 7]])).astype(np.int64)
    if not n:  # a chunk of no packets has no batch (the layout asks for none)
        ends = ends[:0]
    for counted_from in sorted({0, n // 2, n}):
        got = [np.empty(ends.shape[0], np.int64) for _ in range(3)]
        _reach(verdicts, run, ends, np.int64(counted_from), *got)
        for g, w in zip(got, numpy_reach(verdicts, ends, counted_from)):
            np.testing.assert_array_equal(g, w)
