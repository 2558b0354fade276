"""The place-by-place permutation of a shuffle window (ndp.loader.ordering.shuffle): a bijection of
[0, n) for every n, its inverse, a pure function of its keys, and as scattered as a drawn
permutation by the measures a data loader cares about."""

from __future__ import annotations

import numpy as np
import pytest

from ndp.loader.ordering.shuffle import (
    ROUNDS,
    invert,
    permute,
    permute_step,
    round_keys,
    side,
)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 15, 16, 17, 99, 1000, 4097, 65_537])
def test_it_is_a_permutation_of_0_to_n_and_invert_undoes_it(n):
    keys = round_keys(1, 2, 3, n)
    p = permute(np.arange(n), n, keys)
    assert p.dtype == np.int64 and np.array_equal(np.sort(p), np.arange(n))
    assert np.array_equal(invert(p, n, keys), np.arange(n))
    assert np.array_equal(permute(invert(np.arange(n), n, keys), n, keys), np.arange(n))
    picked = np.array([n - 1, 0, n // 2, n - 1])  # any places, any order, repeated
    assert np.array_equal(permute(picked, n, keys), p[picked])


def test_the_side_is_the_smallest_square_root_that_holds_n():
    for n in [1, 2, 3, 4, 5, 8, 9, 10, 99, 100, 101, 10**12, 2**62 + 1]:
        m = side(n)
        assert m * m >= n and (m == 1 or (m - 1) * (m - 1) < n), n


def test_keys_name_the_permutation():
    n = 5000
    a, b = (permute(np.arange(n), n, round_keys(7, e, 0, 0)) for e in (0, 1))
    assert np.array_equal(a, permute(np.arange(n), n, round_keys(7, 0, 0, 0)))
    assert (a == b).mean() < 0.01  # another epoch: another permutation
    assert round_keys(1).shape == (ROUNDS,) and round_keys(1).dtype == np.uint64


def test_places_outside_the_domain_are_refused():
    keys = round_keys(0)
    for bad in ([-1], [10]):
        with pytest.raises(ValueError, match=r"\[0, 10\)"):
            permute(np.array(bad), 10, keys)
    assert permute(np.zeros(0, np.int64), 0, keys).shape == (0,)


def test_it_scatters_like_a_drawn_permutation():
    """Displacement, neighbours kept and where the first places land, against what a uniform
    permutation gives (fixed keys: no flakiness)."""
    n = 200_000
    p = permute(np.arange(n), n, round_keys(3, 1, 4, 1))
    u = np.random.default_rng(5).permutation(n)
    disp, disp_u = np.abs(p - np.arange(n)).mean() / n, np.abs(u - np.arange(n)).mean() / n
    assert abs(disp - 1 / 3) < 0.01 and abs(disp - disp_u) < 0.01  # E|U - V| = 1/3
    assert (np.abs(np.diff(p)) == 1).mean() < 1e-3  # neighbours do not stay neighbours
    assert abs(np.corrcoef(np.arange(n), p)[0, 1]) < 0.01
    deciles = np.bincount(p[: n // 10] * 10 // n, minlength=10)  # the first tenth spreads out
    assert deciles.min() > 0.9 * n / 100 and deciles.max() < 1.1 * n / 100


def _one_place(x: int, n: int, keys: np.ndarray) -> int:
    """The permutation of one place in plain Python integers, as the module's docstring
    defines it: the rounds on ``(x // m, x % m)``, walked on until the value falls below n."""
    m, mask = side(n), (1 << 64) - 1

    def mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    while True:
        left, right = divmod(x, m)
        for key in keys.tolist():
            left, right = right, (left + ((mix(right ^ key) >> 32) * m >> 32)) % m
        x = left * m + right
        if x < n:
            return x


@pytest.mark.parametrize("n", [1, 2, 3, 17, 4095, 4096, 4097, 10_007])
def test_the_rounds_run_lane_by_lane_give_each_place_its_own_walk(n):
    """``permute`` and ``permute_step`` take ``LANES`` places through each round together and
    walk on the few that fall out of [0, n): every place must get the value its own walk
    gives, at the lanes' edges and where walks are long."""
    keys = round_keys(11, n)
    whole = permute(np.arange(n), n, keys)
    some = sorted({0, n - 1, n // 2, *range(0, n, max(1, n // 97))})
    assert [int(whole[x]) for x in some] == [_one_place(x, n, keys) for x in some]
    for first, step in [(0, 1), (n // 3, 1), (1, 3), (n - 1, 1), (2, 8)]:
        if first >= n:
            continue
        count = (n - 1 - first) // step + 1
        out = np.empty(count, np.int64)
        permute_step(first, step, np.uint64(n), np.uint64(side(n)), keys, out)
        np.testing.assert_array_equal(out, whole[first::step])
