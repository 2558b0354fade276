"""The order packets are read in: seeded, per epoch, split across ranks; and CRC-Drop.

Everything here is a pure function of (seed, epoch, rank, world size) and the shard sizes, so a
resumed run recomputes exactly the order it left and every rank computes its share without
talking to the others. The order is made window by window (``epoch_windows``), each window's
place by place, and CRC-Drop's verdicts range by range (``drop_ranges``), so a rank reads its
share of an epoch without building it (``ndp.loader.ordering.share``) and counts an epoch's batches
holding a block of packets at a time (``ndp.loader.planning.count``, ``ndp.loader.planning.epoch``);
``epoch_order`` and ``drop_mask`` give the same for the whole dataset at once.

* ``shuffle=True``: document-level shuffling in windows (``ORDER``). Each epoch the shards are
  permuted, cut into windows of consecutive shards (up to ``shuffle_window`` bytes, 1 GiB by
  default, and ``WINDOW_SHARDS``; ``"all"``: one window), and the packets of each window are
  permuted together by a keyed permutation computed place by place (``ndp.loader.ordering.shuffle``:
  no
  window's permutation is ever drawn or held whole): every packet (a document, or an SFT
  example) lands at a new place each epoch, among other neighbours, and a dataset of up to a
  window is shuffled whole. Reads stay within two windows at a time (a block shuffle, like
  MosaicML streaming's and litdata's), so the GPU's shard arena and a CPU reader's open files
  stay bounded; ``benchmarks/plan/shuffle_quality.py`` measures it against theirs.
* ranks: rank ``r`` of ``W`` takes every W-th packet of the epoch's order, starting at ``r``;
  every packet is seen exactly once per epoch across the ranks, no two ranks share one, and the
  ranks' counts differ by at most one.
* mixing: a rank's share is split by source (shard group or SRC type, each part keeping its
  order) and the parts are interleaved by a seeded weighted draw per packet. How long the
  epoch is (``mix_size``): ``"shortest"`` (default) ends it when a source runs out, so the
  proportions hold throughout and no packet comes twice (what the other sources had left is
  counted, not silently dropped); ``"longest"`` runs until every source is used whole,
  repeating the smaller ones (Megatron's blended datasets, MosaicML's ``repeat``); a number of
  packets per epoch gives each source its share of them, repeated or cut (MosaicML's
  ``choose``). Repeats and leftovers are counted per source.
* CRC-Drop (``crc_drop_rate``): a seeded fraction of packets is dropped on purpose each epoch,
  decided per packet number (the same packets whatever the rank split), counted apart from
  real corruption.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

from ndp.checks import integer, real
from ndp.errors import ConfigError
from ndp.loader.ordering.shuffle import round_keys
from ndp.loader.ordering.window import Window

_ORDER_STREAM = 0x0D3E
_DROP_STREAM = 0xC4C0
_MIX_STREAM = 0x313C


def rank_and_world(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """Explicit values, else ``RANK`` / ``WORLD_SIZE`` from the environment, else (0, 1)."""
    if rank is None:
        rank = environment_int("RANK", 0)
    if world_size is None:
        world_size = environment_int("WORLD_SIZE", 1)
    rank, world_size = integer("rank", rank), integer("world_size", world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return rank, world_size


def environment_int(name: str, default: int) -> int:
    """The integer environment variable ``name`` (a launcher's ``RANK``, ``WORLD_SIZE``), or
    ``default`` if unset; ``ConfigError`` naming it if it is not an integer."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer (a launcher "
                          f"sets it to this process' {name.lower()}); unset it, or pass "
                          f"`{name.lower()}=` explicitly") from None


#: the shuffle's name, recorded in loader states: a state is only valid for the order it was
#: made in, so a change to ``epoch_order`` must change this
ORDER = "windows-v2"
#: orders of earlier ndp versions: a state made in one is taken at an epoch's start only
OLD_ORDERS = ("windows-v1",)
#: a shuffle window: consecutive shards of the epoch's shard permutation, up to this many bytes
#: by default (the Loader's ``shuffle_window``) and at most ``WINDOW_SHARDS`` shards (a chunk
#: reads from at most two windows: the GPU's shard arena holds them, and a CPU reader opens
#: each of their files once per chunk)
WINDOW_BYTES = 1 << 30
WINDOW_SHARDS = 256


def check_window(window: int | str) -> int | None:
    """A ``shuffle_window`` as bytes, or ``None`` for ``"all"`` (the whole dataset, shuffled
    as one window); ``ConfigError`` otherwise."""
    if window == "all":
        return None
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ConfigError(f"shuffle_window must be a number of bytes >= 1 or 'all', got "
                          f"{window!r}")
    return int(window)


def most_shards_per_window(shard_bytes: np.ndarray, window_bytes: int | None = WINDOW_BYTES) -> int:
    """The most shards one shuffle window can hold, whatever the permutation (the smallest
    shards side by side); all of them for ``None``."""
    n = shard_bytes.shape[0]
    if n == 0 or window_bytes is None:
        return n
    below = int(np.searchsorted(np.cumsum(np.sort(shard_bytes)), window_bytes))
    return min(below + 1, WINDOW_SHARDS, n)


def windows(shard_bytes: np.ndarray, perm: np.ndarray,
            window_bytes: int | None = WINDOW_BYTES) -> list[np.ndarray]:
    """``perm`` (shard numbers) cut into shuffle windows by their sizes ``shard_bytes`` (one
    window of all of them for ``None``)."""
    if window_bytes is None:
        return [perm]
    out, start, held = [], 0, 0
    for i, s in enumerate(perm.tolist()):
        held += int(shard_bytes[s])
        if held >= window_bytes or i + 1 - start >= WINDOW_SHARDS:
            out.append(perm[start: i + 1])
            start, held = i + 1, 0
    if start < perm.shape[0]:
        out.append(perm[start:])
    return out


def shards_at_once(sizes: np.ndarray, *, shuffle: bool,
                   window: int | None = WINDOW_BYTES) -> int:
    """Shards a chunk may read at once: two shuffle windows' of ``window`` bytes (``None``:
    all of them), or two without shuffling (the one being read, the next). What a GPU's arena
    (``ndp.loader.pipeline.device_shards``) and a remote dataset's cache (``ndp.store.prefetch``)
    must
    hold."""
    n = sizes.shape[0]
    return min(n, 2 * most_shards_per_window(sizes, window)) if shuffle else min(n, 2)


def packets_at_once(shard_packets: np.ndarray, shard_bytes: np.ndarray, *, shuffle: bool,
                    window: int | None = WINDOW_BYTES) -> int:
    """Packets a chunk may read among at once, at most: those of two shuffle windows (the
    shards with the most packets, as many as a window can hold; ``None``: all of them), or of
    two shards without shuffling. What a reader that gathers index entries by packet must hold
    the entries of (``ndp.store.lazy``)."""
    n = int(shard_packets.sum()) if shard_packets.shape[0] else 0
    if not shard_packets.shape[0]:
        return 0
    most = np.sort(shard_packets)[::-1]
    if not shuffle:
        return min(n, int(most[:2].sum()))
    if window is None:
        return n
    return min(n, 2 * int(most[:most_shards_per_window(shard_bytes, window)].sum()))


#: an unshuffled epoch is walked in pieces of at most this many packets (``epoch_windows``)
BLOCK = 1 << 20


def epoch_windows(
    base: np.ndarray,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    shard_bytes: np.ndarray | None = None,
    window_bytes: int | None = WINDOW_BYTES,
    block: int = BLOCK,
) -> Iterator[Window]:
    """The epoch's order window by window (``epoch_order`` is their packets, concatenated):
    O(shards) to walk, each window's order computed place by place when it is read.
    Unshuffled, the order is cut into pieces of ``block`` packets."""
    if not shuffle:
        n = int(base[-1])
        for a in range(0, n, block):
            yield Window(np.array([a], np.int64), np.array([min(a + block, n)], np.int64))
        return
    n_shards = base.shape[0] - 1
    if shard_bytes is None:
        shard_bytes = np.zeros(n_shards, np.int64)
    rng = np.random.Generator(np.random.PCG64([seed, epoch, _ORDER_STREAM]))
    # the shard permutation, then each window's permutation keyed by its number (a state
    # records ORDER: this must not change under it)
    for k, window in enumerate(windows(shard_bytes, rng.permutation(n_shards), window_bytes)):
        starts = base[window].astype(np.int64)
        stops = base[window + 1].astype(np.int64)
        yield Window(starts, stops, round_keys(seed, epoch, _ORDER_STREAM, k),
                     shards=window.astype(np.int64))


def epoch_order(
    base: np.ndarray,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    shard_bytes: np.ndarray | None = None,
    window_bytes: int | None = WINDOW_BYTES,
) -> np.ndarray:
    """Global packet numbers of one epoch, all ranks together (``base``: the corpus' shard
    starts with the total appended; ``shard_bytes``: each shard's size, for the windows of
    ``window_bytes``, ``None`` for one window of everything). O(packets): the Loader walks
    ``epoch_windows`` instead."""
    parts = [w.packets() for w in epoch_windows(base, seed=seed, epoch=epoch, shuffle=shuffle,
                                                shard_bytes=shard_bytes,
                                                window_bytes=window_bytes)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def rank_share(order: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s packets of an epoch order."""
    return order[rank::world_size]


def check_drop_rate(rate: float) -> None:
    """``ConfigError`` unless ``rate`` is a number with ``0 <= rate < 1``."""
    real("crc_drop_rate", rate, least=0.0, below=1.0)


def drop_mask(n_packets: int, *, seed: int, epoch: int, rate: float) -> np.ndarray:
    """Which packets CRC-Drop removes this epoch (bool per global packet number)."""
    check_drop_rate(rate)
    if rate == 0.0:
        return np.zeros(n_packets, dtype=bool)
    rng = np.random.Generator(np.random.PCG64([seed, epoch, _DROP_STREAM]))
    return rng.random(n_packets) < rate


def drop_ranges(starts: np.ndarray, stops: np.ndarray, *, seed: int, epoch: int,
                rate: float) -> np.ndarray:
    """``drop_mask``'s verdicts for the packets ``[starts[i], stops[i])``, one range after the
    other, without drawing for the rest of the dataset: each range's draws come from the same
    stream advanced to its first packet (one 64-bit draw per packet, as ``random`` makes)."""
    check_drop_rate(rate)
    lengths = np.maximum(np.asarray(stops, np.int64) - np.asarray(starts, np.int64), 0)
    out = np.zeros(int(lengths.sum()), dtype=bool)
    if rate == 0.0:
        return out
    bits = np.random.PCG64([seed, epoch, _DROP_STREAM])
    first = bits.state
    rng = np.random.Generator(bits)
    drawn, at = 0, 0  # packets the stream has drawn for; where the next range goes in out
    for a, n in zip(np.asarray(starts, np.int64).tolist(), lengths.tolist()):
        if not n:
            continue
        if a < drawn:  # behind the stream: back to its start
            bits.state, drawn = first, 0
        if a > drawn:
            bits.advance(a - drawn)
        out[at: at + n] = rng.random(n) < rate
        drawn, at = a + n, at + n
    return out


MIX_SIZES = ("shortest", "longest")


def mix(parts: list[np.ndarray], weights: np.ndarray, *, seed: int, epoch: int, rank: int,
        size: str | int = "shortest") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Interleave ``parts`` (each in its own order) by a seeded draw with probabilities
    ``weights``. ``size`` says how long: ``"shortest"``, up to the first draw of a part that
    has run out (no packet twice); ``"longest"``, until every part is used whole, the others
    repeated (their packets again, in the same order) to keep the proportions; an int, that
    many packets, each part giving its share (repeated, or only its first packets). Returns
    the merged packets and, per part, how many of its packets the epoch left unused and how
    many it took a second (or further) time."""
    weights = np.asarray(weights, dtype=np.float64)
    if weights.shape[0] != len(parts) or (weights < 0).any() or weights.sum() <= 0:
        raise ConfigError(f"mixing weights must be >= 0 with a positive sum, one per source; "
                          f"got {weights.tolist()} for {len(parts)} sources")
    if not (isinstance(size, (int, np.integer)) and not isinstance(size, bool) and size == 0):
        check_mix_size(size)  # 0: a rank's part of fewer packets than there are ranks
    sizes = np.array([p.shape[0] for p in parts], np.int64)
    # a source with nothing in this share (or weight 0) is not drawn: drawing an empty one
    # would end the epoch before it starts
    active = weights * (sizes > 0)
    total = int(sizes[active > 0].sum())
    none = np.zeros(len(parts), np.int64)
    if total == 0:
        return np.zeros(0, np.int64), sizes, none
    p = active / active.sum()
    rng = np.random.Generator(np.random.PCG64([seed, epoch, rank, _MIX_STREAM]))
    if size == "shortest":
        draws = rng.choice(len(parts), size=total + 1, p=p)
        stop = total + 1
        for g, n in enumerate(sizes):
            occ = np.flatnonzero(draws == g)
            if occ.shape[0] > n:
                stop = min(stop, int(occ[n]))
        draws = draws[:stop]
    else:
        if size == "longest":
            length = int(np.ceil(max(sizes[g] / p[g] for g in range(len(parts)) if p[g] > 0)
                                 - 1e-9))
        else:
            length = int(size)
        counts = _apportion(p, length)
        if size == "longest":  # every packet at least once, whatever the rounding
            counts = np.maximum(counts, np.where(p > 0, sizes, 0))
        draws = rng.permutation(np.repeat(np.arange(len(parts)), counts))
    merged = np.empty(draws.shape[0], np.int64)
    used = np.zeros(len(parts), np.int64)
    for g, part in enumerate(parts):
        at = np.flatnonzero(draws == g)
        if at.shape[0]:
            merged[at] = part[np.arange(at.shape[0]) % part.shape[0]]
        used[g] = at.shape[0]
    return merged, np.maximum(sizes - used, 0), np.maximum(used - sizes, 0)


def _apportion(p: np.ndarray, total: int) -> np.ndarray:
    """``total`` split in proportion to ``p`` in whole numbers (largest remainders)."""
    exact = p * total
    counts = np.floor(exact).astype(np.int64)
    short = total - int(counts.sum())
    if short > 0:
        counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
    return counts


def check_mix_size(size: str | int) -> None:
    """``ConfigError`` unless ``size`` is one of ``MIX_SIZES`` or a positive int."""
    if isinstance(size, bool) or not (size in MIX_SIZES or (
            isinstance(size, (int, np.integer)) and size > 0)):
        raise ConfigError(f"mix_size must be one of {MIX_SIZES} or a positive number of "
                          f"packets per epoch, got {size!r}")
