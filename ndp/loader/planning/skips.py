"""Skip ranges: the batches of run steps ``a .. b-1`` left out, the rest of the order as it
was (``Loader(skip=[(a, b), ...])``, ``load_state_dict(state, skip=...)``).

PaLM's answer to a loss spike is to restart from a checkpoint before it and skip the data of a
few hundred batches. Here a step names a batch of the order (``ndp.loader.planning.steps``: the
run's
steps as an uninterrupted run numbers them, the numbers ``loader.explain`` and ``ndp explain``
take), so a skip range is unambiguous however many resumes and skips came before: the batch of
step ``a - 1`` is followed by the batch of step ``b``, every other batch is the one it was, and
``loader.step`` goes from ``a`` to ``b`` at the range. Every rank skips the same steps, so each
takes as many (each epoch ``len(loader)`` is shorter by the steps it skips). The skipped
batches are decoded and not handed out (the producer is not told; a range costs its batches'
decode), and counted: ``stats.skipped_batches``, ``skipped_packets``, ``skipped_tokens`` (a
corrupt packet among them is still counted in ``stats.corrupt``). A state records the ranges
(``"skip"``), so every later resume keeps them.

Packets found bad after the fact (a source's, from ``ndp explain``) are left out by number
wherever they come (``skip_packets=[...]``, the ``Piece.packet`` numbers): each is dropped as
it is laid out, as a corrupt packet is (``DropReason.SKIPPED``: a padded batch one row shorter,
the packed stream without its tokens, a packing row without it), on both backends, and counted
in ``stats.skipped_packets``, not in ``stats.corrupt``; the order and every other packet's
place in it are unchanged, and a state keeps them (``"skip_packets"``).
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


def record(ranges: Ranges, packets: np.ndarray) -> dict:
    """What a state records of the ranges and packets left out (nothing when none are)."""
    return ({"skip": [list(r) for r in ranges]} if ranges else {}) | (
        {"skip_packets": packets.tolist()} if packets.shape[0] else {})


def check_packets(value: Any, n_packets: int, *, name: str = "skip_packets") -> np.ndarray:
    """``value`` (packet numbers of the dataset, as ``Piece.packet`` gives them, or None) as a
    sorted array without repeats; ``ConfigError`` naming one that is not an int in
    ``[0, n_packets)``."""
    if value is None:
        return np.zeros(0, np.int64)
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        raise ConfigError(f"`{name}` must be a list of packet numbers (Piece.packet, as "
                          f"loader.explain gives them), got {type(value).__name__}")
    items = list(value)
    for v in items:
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise ConfigError(f"`{name}` holds {v!r}: packet numbers are ints")
        if not 0 <= int(v) < n_packets:
            raise ConfigError(f"`{name}` holds packet {int(v)}, outside this dataset's "
                              f"{n_packets:,} packets (0 to {n_packets - 1:,})")
    return np.unique(np.asarray(items, np.int64))


def joined_packets(kept: np.ndarray, more: Any, n_packets: int) -> np.ndarray:
    """The packets ``kept`` (a state's) and ``more``, once each."""
    more = check_packets(more, n_packets)
    return kept if not more.shape[0] else np.union1d(kept, more).astype(np.int64)
