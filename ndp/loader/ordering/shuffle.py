"""A permutation of ``[0, n)`` computed place by place: the shuffle of one window of an
epoch's order (``ndp.loader.ordering.order``) without drawing or holding the window's permutation.

``permute(places, n, keys)`` is a keyed pseudorandom permutation: a numerical Feistel network
of ``ROUNDS`` rounds on pairs ``(x // m, x % m)`` with ``m * m >= n`` (a round maps ``(a, b)``
to ``(b, (a + F(b)) mod m)``), made a permutation of ``[0, n)`` by cycle walking: a value
outside it is permuted again until it falls inside (Black and Rogaway, "Ciphers with
arbitrary finite domains", 2002). ``F`` is taken to ``[0, m)`` by the high bits of a
product (Lemire's multiply-shift), so ``m`` is at most 2**32: ``n`` at most 2**64. Grain's
``index_shuffle`` and TensorFlow's ``random_index_shuffle`` shuffle the same way. What it buys
a loader: the packet at any place of a window is one call, so a rank reads its share of a
window of 1e8 packets with no array the size of the window, starts its first batch without
drawing the window's permutation, and resumes mid-window in O(1); ``invert`` maps the other
way, so a pass over a window's packets in file order (reading its index sequentially) finds
each packet's place.

The round function ``F`` mixes its input with the round's key through the splitmix64
finaliser (a bijective 64-bit mixer with full avalanche); the keys come from
``numpy.random.SeedSequence`` over the caller's entropy, so the permutation is a pure function
of the seed, the epoch and the window. ``m * m`` is within ``2 * sqrt(n) + 1`` of ``n``: a
place takes one walk but for a vanishing share of them.
"""

from __future__ import annotations

import numpy as np

from ndp.kernels._jit import cpu_kernel

#: Feistel rounds: 4 make a strong pseudorandom permutation of a pseudorandom round function
#: (Luby and Rackoff); 6 for margin
ROUNDS = 6


def round_keys(*entropy: int) -> np.ndarray:
    """``ROUNDS`` round keys (uint64) drawn from ``entropy`` (seed, epoch, stream, window)."""
    return np.random.SeedSequence(list(entropy)).generate_state(ROUNDS, np.uint64)


def side(n: int) -> int:
    """The Feistel block's side ``m`` for a domain of ``n``: the smallest with ``m * m >= n``."""
    m = max(int(np.sqrt(max(n, 1))), 1)
    while m * m < n:
        m += 1
    while m > 1 and (m - 1) * (m - 1) >= n:
        m -= 1
    return m


@cpu_kernel
def _mix(x):  # pragma: no cover - compiled
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


@cpu_kernel
def permute_one(place, nn, mm, keys):  # pragma: no cover - compiled
    """``permute`` of one place (uint64 ``place < nn``, ``mm = side(nn)``): for compiled
    callers that walk a window's order themselves (``ndp.loader.ordering.share_entries``)."""
    s32 = np.uint64(32)
    x = place
    while True:
        left = x // mm
        right = x % mm
        for k in range(keys.shape[0]):
            f = left + (((_mix(right ^ keys[k]) >> s32) * mm) >> s32)  # < 2m
            left, right = right, f - mm if f >= mm else f
        x = left * mm + right
        if x < nn:
            return x


@cpu_kernel
def _feistel(places, n, m, keys, forward, out):  # pragma: no cover - compiled
    mm = np.uint64(m)
    nn = np.uint64(n)
    rounds = keys.shape[0]
    s32 = np.uint64(32)
    for i in range(places.shape[0]):
        x = np.uint64(places[i])
        if forward:
            out[i] = np.int64(permute_one(x, nn, mm, keys))
            continue
        while True:  # the inverse: the rounds backwards, walking out of range the same way
            left = x // mm
            right = x % mm
            for k in range(rounds - 1, -1, -1):
                f = right + mm - (((_mix(left ^ keys[k]) >> s32) * mm) >> s32)  # in (0, 2m]
                left, right = f - mm if f >= mm else f, left
            x = left * mm + right
            if x < nn:
                break
        out[i] = np.int64(x)
    return 0


def _run(places: np.ndarray, n: int, keys: np.ndarray, forward: bool) -> np.ndarray:
    places = np.ascontiguousarray(places, np.int64)
    out = np.empty(places.shape[0], np.int64)
    if places.shape[0]:
        if n < 1 or int(places.min()) < 0 or int(places.max()) >= n:
            raise ValueError(f"places must lie in [0, {n})")
        _feistel(places, n, side(n), np.ascontiguousarray(keys, np.uint64), forward, out)
    return out


def permute(places: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """What sits at each of ``places`` (ints in ``[0, n)``) of the permutation of ``[0, n)``
    keyed by ``keys``: ``permute(arange(n), n, keys)`` is the whole permutation (int64)."""
    return _run(places, n, keys, True)


def invert(values: np.ndarray, n: int, keys: np.ndarray) -> np.ndarray:
    """The places of ``values`` in the permutation ``permute`` makes (its inverse)."""
    return _run(values, n, keys, False)
