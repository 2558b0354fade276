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
#: no round keys: a window in file order (``take_step`` reads the places themselves)
NO_KEYS = np.zeros(0, np.uint64)


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


#: places a compiled walk takes through the rounds at once: each round runs over all of them,
#: place after place, a loop the compiler turns into SIMD lanes (~5 ns a place here, against
#: ~20 for a place's rounds one after the other)
LANES = 4096


@cpu_kernel
def _rounds(left, right, c, mm, keys, forward):  # pragma: no cover - compiled
    """Every round (``forward``: in order, else backwards) on the first ``c`` pairs
    ``(left[i], right[i])``, in place."""
    s32 = np.uint64(32)
    rounds = keys.shape[0]
    for j in range(rounds):
        key = keys[j] if forward else keys[rounds - 1 - j]
        for i in range(c):
            a = left[i]
            b = right[i]
            if forward:
                x = b ^ key
            else:
                x = a ^ key
            x ^= x >> np.uint64(30)
            x *= np.uint64(0xBF58476D1CE4E5B9)
            x ^= x >> np.uint64(27)
            x *= np.uint64(0x94D049BB133111EB)
            x ^= x >> np.uint64(31)
            g = ((x >> s32) * mm) >> s32
            if forward:
                f = a + g  # < 2m
                left[i] = b
                right[i] = f - mm if f >= mm else f
            else:
                f = b + mm - g  # in (0, 2m]
                left[i] = f - mm if f >= mm else f
                right[i] = a
    return 0


@cpu_kernel
def _invert_one(x, nn, mm, keys):  # pragma: no cover - compiled
    """``invert`` of one value (uint64 ``x < nn``): the rounds backwards, walking out of range
    the same way."""
    s32 = np.uint64(32)
    rounds = keys.shape[0]
    while True:
        left = x // mm
        right = x % mm
        for k in range(rounds - 1, -1, -1):
            f = right + mm - (((_mix(left ^ keys[k]) >> s32) * mm) >> s32)  # in (0, 2m]
            left, right = f - mm if f >= mm else f, left
        x = left * mm + right
        if x < nn:
            return x


@cpu_kernel
def _finish(left, right, c, nn, mm, keys, forward, out, o):  # pragma: no cover - compiled
    """``out[o + i]`` the value of lane ``i < c`` after one pass of the rounds: a value out of
    ``[0, nn)`` walks on (``permute_one``, ``_invert_one``) as one place's walk would."""
    for i in range(c):
        x = left[i] * mm + right[i]
        if x >= nn:
            x = permute_one(x, nn, mm, keys) if forward else _invert_one(x, nn, mm, keys)
        out[o + i] = np.int64(x)
    return 0


@cpu_kernel
def permute_step(first, step, nn, mm, keys, out):  # pragma: no cover - compiled
    """``out[i] = permute_one(first + i * step)`` for every ``i`` of ``out`` (int64; the
    places ints >= 0 below ``nn``, ``mm = side(nn)``): the places of a run, or of one rank's
    share of it, through the rounds ``LANES`` at a time."""
    c = out.shape[0]
    if c == 0:
        return 0
    lanes = min(LANES, c)
    left = np.empty(lanes, np.uint64)
    right = np.empty(lanes, np.uint64)
    x0 = np.uint64(first)
    stride = np.uint64(step)
    step_left = stride // mm
    step_right = stride - step_left * mm
    for o in range(0, c, lanes):
        n = min(lanes, c - o)
        a = (x0 + np.uint64(o) * stride) // mm
        b = (x0 + np.uint64(o) * stride) - a * mm
        for i in range(n):  # (x // mm, x % mm) of each place, without a division
            left[i] = a
            right[i] = b
            b += step_right
            a += step_left
            if b >= mm:
                b -= mm
                a += np.uint64(1)
        _rounds(left, right, n, mm, keys, True)
        _finish(left, right, n, nn, mm, keys, True, out, o)
    return 0


@cpu_kernel
def _feistel(places, n, m, keys, forward, out):  # pragma: no cover - compiled
    mm = np.uint64(m)
    nn = np.uint64(n)
    c = places.shape[0]
    if c == 0:
        return 0
    lanes = min(LANES, c)
    left = np.empty(lanes, np.uint64)
    right = np.empty(lanes, np.uint64)
    for o in range(0, c, lanes):
        k = min(lanes, c - o)
        for i in range(k):
            x = np.uint64(places[o + i])
            a = x // mm
            left[i] = a
            right[i] = x - a * mm
        _rounds(left, right, k, mm, keys, forward)
        _finish(left, right, k, nn, mm, keys, forward, out, o)
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


@cpu_kernel
def take_step(column, first, nn, mm, keys, out):  # pragma: no cover - compiled
    """``out[i] = column[permute_one(first + i)]`` for every ``i`` of ``out``
    (``keys`` empty: ``column[first + i]``): values held in file order, read at a run of a
    window's places. The places are permuted a block at a time and then read, so that the
    reads of a block (cache misses, in a large ``column``) overlap."""
    c = out.shape[0]
    if keys.shape[0] == 0:
        for i in range(c):
            out[i] = column[first + i]
        return 0
    if c == 0:
        return 0
    lanes = min(LANES, c)
    flat = np.empty(lanes, np.int64)
    for o in range(0, c, lanes):
        n = min(lanes, c - o)
        permute_step(first + o, 1, nn, mm, keys, flat[:n])
        for i in range(n):
            out[o + i] = column[flat[i]]
    return 0


@cpu_kernel
def take_range(column, first, nn, mm, keys, out, lo, hi):  # pragma: no cover - compiled
    """``take_step`` of ``out[lo:hi]`` (the places ``first + lo`` to ``first + hi``): a range
    for ``ndp.engine.threads.parallel_for``."""
    return take_step(column, first + lo, nn, mm, keys, out[lo:hi])
