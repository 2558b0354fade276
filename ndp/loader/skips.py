"""Skip ranges: the batches of run steps ``a .. b-1`` left out, the rest of the order as it
was (``Loader(skip=[(a, b), ...])``, ``load_state_dict(state, skip=...)``).

PaLM's answer to a loss spike is to restart from a checkpoint before it and skip the data of a
few hundred batches. Here a step names a batch of the order (``ndp.loader.steps``: the run's
steps as an uninterrupted run numbers them, the numbers ``loader.explain`` and ``ndp explain``
take), so a skip range is unambiguous however many resumes and skips came before: the batch of
step ``a - 1`` is followed by the batch of step ``b``, every other batch is the one it was, and
``loader.step`` goes from ``a`` to ``b`` at the range. Every rank skips the same steps, so each
takes as many (each epoch ``len(loader)`` is shorter by the steps it skips). The skipped
batches are decoded and not handed out (the producer is not told; a range costs its batches'
decode), and counted: ``stats.skipped_batches``, ``skipped_packets``, ``skipped_tokens`` (a
corrupt packet among them is still counted in ``stats.corrupt``). A state records the ranges
(``"skip"``), so every later resume keeps them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ndp.errors import ConfigError

Ranges = tuple[tuple[int, int], ...]


def check_skip(value: Any, *, name: str = "skip") -> Ranges:
    """``value`` (``[(a, b), ...]``, or None) as sorted ranges of run steps; ``ConfigError``
    naming a range that is not two ints ``0 <= a < b``, or two that overlap."""
    if value is None:
        return ()
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise ConfigError(f"`{name}` must be a list of (first, end) run steps, e.g. "
                          f"[(4900, 5100)], got {type(value).__name__}")
    out = []
    for item in value:
        pair = list(item) if isinstance(item, (list, tuple)) else None
        if (pair is None or len(pair) != 2 or not all(
                isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in pair)):
            raise ConfigError(f"`{name}` range {item!r} is not (first, end): two int run "
                              f"steps, the end excluded")
        a, b = int(pair[0]), int(pair[1])
        if a < 0 or b <= a:
            why = "negative" if a < 0 else ("reversed" if b < a else "empty")
            raise ConfigError(f"`{name}` range ({a}, {b}) is {why}: a range is (first, end) "
                              f"with 0 <= first < end (steps first .. end-1 are skipped)")
        out.append((a, b))
    out = sorted(set(out))
    for (a, b), (c, d) in zip(out, out[1:]):
        if c < b:
            raise ConfigError(f"`{name}` ranges ({a}, {b}) and ({c}, {d}) overlap: give "
                              f"each step once (one range ({a}, {max(b, d)}) for both)")
    return tuple(out)


def joined(kept: Ranges, more: Any) -> Ranges:
    """``kept`` (a state's) and ``more`` (given again at a resume): a range given twice is
    one; ranges that overlap otherwise are refused (``check_skip``)."""
    return check_skip(list(kept) + list(check_skip(more)))


def skipped(ranges: Ranges, lo: int, hi: int) -> int:
    """How many run steps of ``[lo, hi)`` the ranges skip."""
    return sum(max(0, min(b, hi) - max(a, lo)) for a, b in ranges)


def mask(ranges: Ranges, lo: int, n: int) -> np.ndarray | None:
    """Which of the ``n`` steps from ``lo`` are skipped (bool), or None if none is."""
    hit = [(a, b) for a, b in ranges if a < lo + n and b > lo]
    if not hit:
        return None
    out = np.zeros(n, bool)
    for a, b in hit:
        out[max(a - lo, 0):min(b - lo, n)] = True
    return out


def record(ranges: Ranges) -> dict:
    """What a state records of the ranges (nothing when there are none)."""
    return {"skip": [list(r) for r in ranges]} if ranges else {}
