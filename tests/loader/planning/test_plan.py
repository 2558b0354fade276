"""Planning an epoch window by window (ndp.loader.planning.epoch, ndp.loader.planning.plan): every rank's
``Share`` is the one the whole order and every rank's share give, bit for bit, while the
largest array the plan builds is a window's, not the dataset's; CRC-Drop's verdicts drawn
range by range are ``drop_mask``'s; the per-rank batch count streamed in pieces is
``count_batches``'."""

from __future__ import annotations

import tracemalloc
import types

import numpy as np
import pytest

from ndp.loader.ordering.order import drop_mask, drop_ranges, epoch_order, epoch_windows, windows
from ndp.loader.layouts.packing import count_batches, count_batches_by_rank, new_carry
from ndp.loader.planning.shapes import Shapes
from ndp.loader.planning.plan import Plan
from ndp.loader.ordering.shuffle import permute, round_keys
from ndp.store.corpus import Corpus
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp, write_shards

#: very uneven shards; 768 packets (as many per rank for 1, 3 and 8 ranks), and 5 more
UNEVEN = [1, 150, 3, 60, 2, 90, 7, 1, 33, 120, 5, 12, 48, 4, 200, 32]


def old_order(base, shard_bytes, *, seed, epoch, shuffle, window_bytes):
    """The epoch's order built whole (ORDER "windows-v2"): the shards permuted, cut into
    windows, each window's packets permuted whole by its keyed permutation."""
    if not shuffle:
        return np.arange(base[-1], dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64([seed, epoch, 0x0D3E]))
    parts = []
    for k, window in enumerate(windows(shard_bytes, rng.permutation(base.shape[0] - 1),
                                       window_bytes)):
        packets = np.concatenate([np.arange(base[s], base[s + 1]) for s in window.tolist()])
        n = packets.shape[0]
        parts.append(packets[permute(np.arange(n), n, round_keys(seed, epoch, 0x0D3E, k))])
    return np.concatenate(parts).astype(np.int64)


def old_drop(n, *, seed, epoch, rate):
    rng = np.random.Generator(np.random.PCG64([seed, epoch, 0xC4C0]))
    return rng.random(n) < rate if rate else np.zeros(n, bool)


def oracle(plan: Plan, epoch: int, rank: int) -> tuple:
    """(packets, length, batches, dropped, balanced) of ``rank``, the way the plan was made
    before: the whole order, the whole drop mask, every rank's share."""
    c, W, B, T = plan.corpus, plan.world_size, plan.batch_size, plan.seq_len
    order = old_order(c.base, plan._shard_bytes, seed=plan.seed, epoch=epoch,
                      shuffle=plan.shuffle, window_bytes=plan._window_bytes)
    drop = old_drop(c.n_packets, seed=plan.seed, epoch=epoch, rate=plan.crc_drop_rate)
    kept = [order[r::W][~drop[order[r::W]]] for r in range(W)]
    m = min(k.shape[0] for k in kept)

    def batches(k):
        if plan.mode == "padded":
            return -(-k.shape[0] // B)
        tokens = np.asarray(c.tokens[k])
        if plan.mode == "packed":
            return max(0, (int(tokens.sum()) - 1) // (B * T))
        return count_batches(tokens, Shapes.of(B, T))

    own = kept[rank][:m]
    packets = np.concatenate([own, own]) if plan.mode == "packed" else own
    return (packets, m, min(batches(k[:m]) for k in kept), int(drop[order[rank::W]].sum()),
            kept[rank].shape[0] - m)


@pytest.fixture(scope="module", params=["equal", "unequal"])
def uneven(request, tmp_path_factory):
    """A corpus of ramp packets (lengths 0..40) in very uneven shards, one per directory;
    "equal": 768 packets, "unequal": 773."""
    d = tmp_path_factory.mktemp("uneven")
    sizes = UNEVEN + ([5] if request.param == "unequal" else [])
    rng = np.random.default_rng(7)
    dirs, k = [], 0
    for i, n in enumerate(sizes):
        dirs.append(d / f"s{i:02d}")
        write_shards(dirs[-1], [encode_tokens(ramp(k + j, int(rng.integers(0, 41))))
                                for j in range(n)])
        k += n
    corpus = Corpus(dirs)
    assert corpus.n_packets == sum(sizes)
    return corpus


def plan_of(corpus, *, mode, rank=0, world_size=1, rate=0.0, shuffle=True, window=2000,
            batch_size=3, seq_len=24, seed=5):
    return Plan(corpus, mode=mode, batch_size=batch_size, seq_len=seq_len, shuffle=shuffle,
                seed=seed, rank=rank, world_size=world_size, crc_drop_rate=rate, mix=None,
                mix_by="group", shuffle_window=window)


def largest_window(plan: Plan, epoch: int) -> int:
    return max(w.size for w in epoch_windows(
        plan.corpus.base, seed=plan.seed, epoch=epoch, shuffle=plan.shuffle,
        shard_bytes=plan._shard_bytes, window_bytes=plan._window_bytes))


@pytest.mark.parametrize("world_size", [1, 3, 8])
@pytest.mark.parametrize("mode", ["padded", "packed", "packing"])
def test_every_ranks_share_is_the_one_the_whole_order_gives(uneven, mode, world_size):
    n_windows = len(list(epoch_windows(uneven.base, seed=5, epoch=1, shard_bytes=np.array(
        [s.size for s in uneven.shards]), window_bytes=2000)))
    assert n_windows >= 6  # small windows: many of them
    for rate in (0.0, 0.3):
        for shuffle in (True, False):
            for window in (2000, "all"):
                for epoch in (0, 1):
                    for rank in range(world_size):
                        plan = plan_of(uneven, mode=mode, rank=rank, world_size=world_size,
                                       rate=rate, shuffle=shuffle, window=window)
                        sh = plan.share(epoch)
                        sh.count.counted()  # the count made on the plan's thread, if any
                        want = oracle(plan, epoch, rank)
                        case = (mode, world_size, rank, rate, shuffle, window, epoch)
                        assert sh.packets.dtype == np.int64, case
                        assert np.array_equal(sh.packets, want[0]), case
                        assert (sh.length, sh.batches, sh.dropped, sh.balanced) == want[1:], case
                        assert (sh.mix_unused, sh.mix_repeated, sh.redelivered) == ({}, {}, 0)
                        if shuffle:
                            assert plan.peak_plan_elements <= (largest_window(plan, epoch)
                                                               + 2 * world_size), case


def test_the_comparison_tells_ranks_and_drops_apart(uneven):
    """What the comparison above would see of a plan that gave position ``p`` to rank
    ``(p + 1) % W``, or read each drop verdict one packet late: another share."""
    plan = plan_of(uneven, mode="packing", rank=1, world_size=3, rate=0.3)
    packets, m = oracle(plan, 0, 1)[:2]
    order = old_order(uneven.base, plan._shard_bytes, seed=5, epoch=0, shuffle=True,
                      window_bytes=2000)
    drop = old_drop(uneven.n_packets, seed=5, epoch=0, rate=0.3)
    for share, verdict in ((order[0::3], drop), (order[2::3], drop),
                           (order[1::3], np.roll(drop, 1))):
        assert not np.array_equal(share[~verdict[share]][:m], packets)


def test_epoch_order_is_its_windows_and_the_order_it_always_was(uneven):
    shard_bytes = np.array([s.size for s in uneven.shards])
    for shuffle in (True, False):
        for window in (1, 2000, None):
            kw = {"seed": 3, "epoch": 2, "shuffle": shuffle, "shard_bytes": shard_bytes,
                  "window_bytes": window}
            order = epoch_order(uneven.base, **kw)
            assert np.array_equal(order, old_order(uneven.base, shard_bytes, seed=3, epoch=2,
                                                   shuffle=shuffle, window_bytes=window))
            pieces = [w.packets() for w in epoch_windows(uneven.base, **kw, block=100)]
            assert np.array_equal(np.concatenate(pieces), order)
            if not shuffle:
                assert max(p.shape[0] for p in pieces) == 100


def fake_corpus(sizes, seed=0):
    """What a Plan reads of a corpus (shard starts, packet count, token counts, shard sizes),
    as plain arrays: datasets too large to write in a test."""
    base = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    n = int(base[-1])
    tokens = np.random.default_rng(seed).integers(0, 300, n).astype(np.int64)
    shards = [types.SimpleNamespace(size=int(s) * 600) for s in sizes]
    return types.SimpleNamespace(base=base, n_packets=n, tokens=tokens, shards=shards)


@pytest.mark.parametrize("mode", ["padded", "packed", "packing"])
def test_the_plan_holds_a_windows_packets_not_the_datasets(mode):
    sizes = np.random.default_rng(1).integers(5, 60, 400)  # ~13,000 packets, ~100 per window
    corpus = fake_corpus(sizes)
    for rate in (0.0, 0.3):
        plan = plan_of(corpus, mode=mode, rank=2, world_size=5, rate=rate, window=40_000,
                       batch_size=4, seq_len=512)
        sh = plan.share(3)
        sh.count.counted()
        big = largest_window(plan, 3)
        assert corpus.n_packets > 50 * big
        assert 0 < plan.peak_plan_elements <= big + 2 * 5
        want = oracle(plan, 3, 2)
        assert np.array_equal(sh.packets, want[0])
        assert (sh.length, sh.batches, sh.dropped, sh.balanced) == want[1:]
    plan = plan_of(corpus, mode=mode, world_size=5, shuffle=False)
    plan.share(0).count.counted()
    assert plan.peak_plan_elements <= 1 << 20  # ndp.loader.ordering.order.BLOCK, unshuffled


def test_planning_an_epoch_allocates_a_fraction_of_its_order():
    """Memory as the allocator sees it: 400,000 packets (their order alone is 3.2 MB), windows
    of ~2,000, 64 ranks: planning allocates far less than the order would take."""
    corpus = fake_corpus(np.full(400, 1000), seed=2)
    for mode in ("padded", "packed", "packing"):
        for rate in (0.0, 0.3):
            plan = plan_of(corpus, mode=mode, rank=63, world_size=64, rate=rate,
                           window=1_200_000, batch_size=8, seq_len=1024)
            plan.share(0).count.counted()  # compiled, warmed
            plan._shares = {}
            tracemalloc.start()
            try:
                sh = plan.share(1)
                sh.count.counted()  # on the plan's thread: traced too
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert sh.length > 0
            assert peak < corpus.n_packets, (mode, rate, peak)  # < 1 byte per packet
    tracemalloc.start()  # what the whole order takes, measured the same way
    try:
        epoch_order(corpus.base, seed=5, epoch=1, shard_bytes=plan._shard_bytes,
                    window_bytes=1_200_000)
        assert tracemalloc.get_traced_memory()[1] >= 8 * corpus.n_packets
    finally:
        tracemalloc.stop()


def test_drop_verdicts_drawn_range_by_range_are_drop_masks():
    rng = np.random.default_rng(11)
    n = 5000
    for rate in (0.0, 0.01, 0.3, 0.9):
        for seed, epoch in ((0, 0), (7, 3)):
            mask = drop_mask(n, seed=seed, epoch=epoch, rate=rate)
            assert np.array_equal(mask, old_drop(n, seed=seed, epoch=epoch, rate=rate))
            for _ in range(40):  # forwards, backwards, overlapping, empty, adjacent ranges
                k = int(rng.integers(0, 8))
                starts = rng.integers(0, n + 1, k)
                stops = np.minimum(starts + rng.integers(0, 900, k), n)
                if k > 1 and rng.random() < 0.3:
                    starts[1] = stops[0]
                got = drop_ranges(starts, stops, seed=seed, epoch=epoch, rate=rate)
                want = [mask[a:b] for a, b in zip(starts, stops)]
                assert np.array_equal(got, np.concatenate(want + [np.zeros(0, bool)]))
    one = drop_ranges(np.array([1]), np.array([2]), seed=0, epoch=0, rate=0.5)
    assert one.shape == (1,) and one[0] == drop_mask(3, seed=0, epoch=0, rate=0.5)[1]


@pytest.mark.parametrize("rows,row_len", [(1, 8), (3, 24), (4, 1)])
def test_batches_counted_per_rank_in_pieces_are_count_batches(rows, row_len):
    rng = np.random.default_rng(rows * 100 + row_len)
    ranks = 5
    lengths = rng.integers(0, 40, 3000)
    take = rng.random(3000) < 0.8
    carry = new_carry(ranks)
    cuts = np.sort(rng.choice(np.arange(1, 600), 20, replace=False)) * ranks
    for a, b in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [3000]])):
        count_batches_by_rank(lengths[a:b], take[a:b], ranks, Shapes.of(rows, row_len), carry)
    for r in range(ranks):
        mine = lengths[r::ranks][take[r::ranks]]
        assert carry[2, r] == count_batches(mine, Shapes.of(rows, row_len))
    # pieces cut anywhere, each from its first element's place (the count pass's blocks of a
    # window, int32 counts, every element taken): the same counts and the same marks
    cuts = np.sort(rng.choice(np.arange(1, 3000), 30, replace=False))
    whole, pieces = new_carry(ranks), new_carry(ranks)
    want = count_batches_by_rank(lengths, None, ranks, Shapes.of(rows, row_len), whole,
                                 every=2)
    got = [count_batches_by_rank(lengths[a:b].astype(np.int32), None, ranks,
                                 Shapes.of(rows, row_len), pieces, every=2, first=int(a))
           for a, b in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [3000]]))]
    assert np.array_equal(pieces, whole) and np.array_equal(np.concatenate(got), want)
    for r in range(ranks):
        assert whole[2, r] == count_batches(lengths[r::ranks], Shapes.of(rows, row_len))


def test_a_windows_every_wth_packet_is_picked_without_the_rest(uneven):
    kw = dict(seed=5, epoch=1, shard_bytes=np.array([s.size for s in uneven.shards]),
              window_bytes=2000)
    for shuffle in (True, False):
        for win in epoch_windows(uneven.base, shuffle=shuffle, block=100, **kw):
            whole = win.packets()
            for step in (1, 3, 8):
                for first in range(step):
                    assert np.array_equal(win.every(first, step), whole[first::step])


def test_the_padded_cut_is_counted_in_the_pass_as_the_share_gives_it(uneven):
    from ndp.loader.layouts.truncation import cut_of

    for rate in (0.0, 0.3):
        for rank in range(3):
            plan = plan_of(uneven, mode="padded", rank=rank, world_size=3, rate=rate,
                           seq_len=11)
            share = plan.share(1)
            share.count.counted()
            assert share.cut == cut_of(np.asarray(uneven.tokens[share.packets[:share.length]]),
                                       11)
            assert share.cut.truncated > 0


def test_the_next_epoch_is_planned_ahead_and_a_closed_loader_leaves_no_planner(uneven):
    """The producer plans epoch e + 1 on a thread of its own when it starts epoch e, so that
    the boundary does not wait for a pass over the windows (seconds at 1e8 packets)."""
    import threading

    from ndp.loader.loader import Loader

    loader = Loader(uneven.paths, batch_size=3, seq_len=24, mode="packed", backend="cpu",
                    output="arrays", seed=5, shuffle_window=2000)
    it = iter(loader)
    next(it)
    thread = loader.plan._ahead
    assert thread is not None and thread.name == "ndp-plan"
    thread.join(timeout=60)
    assert 1 in loader.plan._shares  # made while epoch 0 is delivered
    want = plan_of(uneven, mode="packed").share(1)
    assert np.array_equal(loader.plan._shares[1].packets, want.packets)
    loader.close()
    assert not [t for t in threading.enumerate() if t.name == "ndp-plan"]


def test_a_pass_asked_to_stop_stops_and_stores_nothing(uneven):
    """What ``Loader.close`` does to a plan being made ahead, or to a producer planning when
    it is stopped: the pass gives up before its next window."""
    from ndp.loader.planning.epoch import Stopped

    plan = plan_of(uneven, mode="packed", world_size=3, rate=0.3)  # CRC-Drop: planned in a pass
    with pytest.raises(Stopped):
        plan.share(1, stop=lambda: True)
    assert 1 not in plan._shares
    asked = []
    plan.share(1, stop=lambda: asked.append(1) and False)
    assert len(asked) >= 6 and 1 in plan._shares  # asked before every window
    # without: the share is made at once and its count is a pass that stops the same way,
    # left to be run again
    plan = plan_of(uneven, mode="packed", world_size=3)
    share = plan._share_lazy(1)
    share.count.run(stop=lambda: True)
    assert not share.count.final and not share.count.known
    asked = []
    share.count.run(stop=lambda: asked.append(1) and False)
    assert len(asked) >= 6 and share.count.final
    assert share.batches == plan_of(uneven, mode="packed", world_size=3).share(1).batches
