"""A shuffle window (ndp.loader.ordering.window): a column held in file order read at a run of
the window's places."""

from __future__ import annotations

import numpy as np

from ndp.loader.ordering.shuffle import round_keys
from ndp.loader.ordering.window import TAKE_GRAIN, Window


def test_a_window_takes_its_values_in_its_order_on_every_thread():
    """``Window.take``: a column held in file order read at a run of the window's places,
    split across ndp's threads when long, equals the gather of the places' file-order
    indices; in file order (no keys) it is the slice."""
    starts, stops = np.array([0, 500_000]), np.array([150_000, 600_000])
    column = np.arange(250_000, dtype=np.int32) * 7 % 65_521
    for keys in (None, round_keys(5, 0)):
        win = Window(starts, stops, keys)
        for a, b in [(0, win.size), (3, 4), (TAKE_GRAIN - 1, 3 * TAKE_GRAIN + 5), (9, 9)]:
            got = win.take(column, a, b)
            assert got.dtype == column.dtype
            np.testing.assert_array_equal(got, column[win.flat(np.arange(a, b))])
