"""A share read place by place (ndp.loader.ordering.share.RankOrder): any slice, index or gather is the
rank's share of the epoch's whole order, across window boundaries, twice over in packed mode,
and making it holds nothing the size of the share."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from ndp.loader.ordering.order import epoch_order, epoch_windows
from ndp.loader.ordering.share import RankOrder


@pytest.fixture(scope="module")
def epoch():
    sizes = np.random.default_rng(2).integers(1, 90, 60)
    base = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    kw = dict(seed=4, epoch=3, shard_bytes=sizes * 100, window_bytes=1500)
    windows = list(epoch_windows(base, **kw))
    assert len(windows) > 20
    return windows, epoch_order(base, **kw)


@pytest.mark.parametrize("world_size", [1, 3, 8])
def test_every_read_of_a_rank_order_is_the_whole_orders_share(epoch, world_size):
    windows, order = epoch
    n = order.shape[0]
    length = n // world_size
    rng = np.random.default_rng(world_size)
    for rank in range(world_size):
        want = order[rank::world_size][:length]
        share = RankOrder(windows, rank=rank, world_size=world_size, length=length)
        assert len(share) == share.shape[0] == length and share.dtype == np.int64
        assert np.array_equal(np.asarray(share), want)
        for _ in range(20):
            a, b = np.sort(rng.integers(0, length + 1, 2))
            assert np.array_equal(share[a:b], want[a:b])
        picked = rng.integers(0, length, 50)
        assert np.array_equal(share[picked], want[picked])
        assert share[0] == want[0] and share[-1] == want[-1] and share[length - 1] == want[-1]
        with pytest.raises(IndexError):
            share[length]
        twice = RankOrder(windows, rank=rank, world_size=world_size, length=length,
                          repeat=True)
        assert np.array_equal(np.asarray(twice), np.concatenate([want, want]))
        assert np.array_equal(twice[length - 5: length + 5],
                              np.concatenate([want[-5:], want[:5]]))


@pytest.mark.parametrize("world_size", [1, 3])
def test_a_chunks_shards_come_with_its_packets(epoch, world_size):
    """``with_shards`` (what a chunk's stage takes): the slice, and each packet's shard as the
    corpus' shard starts give it, across window boundaries and across the repeat; windows that
    do not know their shards (unshuffled ones) say so, and the slice is still right."""
    windows, order = epoch
    sizes = np.random.default_rng(2).integers(1, 90, 60)
    base = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    length = order.shape[0] // world_size
    rng = np.random.default_rng(7)
    for rank in range(world_size):
        want = order[rank::world_size][:length]
        twice = RankOrder(windows, rank=rank, world_size=world_size, length=length, repeat=True)
        spans = [(0, length), (length - 7, length + 9), (2 * length - 3, 2 * length)]
        spans += [tuple(np.sort(rng.integers(0, 2 * length + 1, 2))) for _ in range(30)]
        for a, b in spans:
            packets, shards = twice.with_shards(a, b)
            assert np.array_equal(packets, np.concatenate([want, want])[a:b])
            assert np.array_equal(shards, np.searchsorted(base, packets, side="right") - 1)
    plain = list(epoch_windows(base, seed=4, epoch=3, shuffle=False, block=100))
    share = RankOrder(plain, rank=0, world_size=1, length=int(base[-1]))
    packets, shards = share.with_shards(50, 250)
    assert shards is None and np.array_equal(packets, np.arange(50, 250))


def test_a_rank_order_of_a_large_epoch_holds_its_windows_only():
    """4e6 packets in 400 shards (the share of rank 0 of 2 alone would be 16 MB): making the
    share and reading a chunk of it allocates a small fraction of that."""
    sizes = np.full(400, 10_000)
    base = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    tracemalloc.start()
    try:
        windows = list(epoch_windows(base, seed=1, epoch=0, shard_bytes=sizes * 600,
                                     window_bytes=1 << 26))
        share = RankOrder(windows, rank=0, world_size=2, length=2_000_000)
        chunk = share[1_500_000: 1_504_096]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert chunk.shape == (4096,) and len(set(chunk.tolist())) == 4096
    assert peak < 1_000_000, peak  # bytes: the share would be 16,000,000
