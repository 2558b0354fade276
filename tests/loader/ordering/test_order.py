"""Mixing sizes (ndp.loader.ordering.order.mix, the Loader's ``mix_size``): an epoch that ends when a source
runs out, one that uses every source whole and repeats the smaller ones, and one of a set
number of packets; proportions kept, repeats and leftovers counted per source, resume exact."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ndp.errors import ConfigError
from ndp.loader.loader import Loader
from ndp.loader.ordering.order import mix
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp, write_shards


def parts_of(sizes):
    starts = np.cumsum([0] + sizes)
    return [np.arange(a, b, dtype=np.int64) for a, b in zip(starts[:-1], starts[1:])]


@pytest.mark.parametrize("sizes,weights", [([200, 80], [0.7, 0.3]), ([10, 500, 3], [1, 1, 1]),
                                           ([57, 0, 9], [0.2, 0.5, 0.3])])
def test_longest_uses_every_packet_and_repeats_the_smaller_sources(sizes, weights):
    parts = parts_of(sizes)
    merged, unused, again = mix(parts, np.array(weights, float), seed=1, epoch=2, rank=0,
                                size="longest")
    assert not unused.any()
    for g, part in enumerate(parts):
        taken = np.isin(merged, part).sum()
        assert set(part.tolist()) <= set(merged.tolist())  # every packet at least once
        assert again[g] == taken - part.shape[0]
    active = np.array(weights, float) * (np.array(sizes) > 0)
    share = np.array([np.isin(merged, p).sum() for p in parts]) / merged.shape[0]
    assert np.abs(share - active / active.sum()).max() < 2 / merged.shape[0] + 1e-9
    # the same draw for the same seed, epoch and rank; another for the next epoch
    assert np.array_equal(merged, mix(parts, np.array(weights, float), seed=1, epoch=2, rank=0,
                                      size="longest")[0])
    assert not np.array_equal(merged, mix(parts, np.array(weights, float), seed=1, epoch=3,
                                          rank=0, size="longest")[0])


def test_a_number_of_packets_gives_each_source_its_share():
    parts = parts_of([200, 80])
    merged, unused, again = mix(parts, np.array([0.7, 0.3]), seed=0, epoch=0, rank=0, size=150)
    assert merged.shape[0] == 150
    assert np.isin(merged, parts[0]).sum() == 105 and np.isin(merged, parts[1]).sum() == 45
    assert unused.tolist() == [95, 35] and again.tolist() == [0, 0]
    merged, unused, again = mix(parts, np.array([0.7, 0.3]), seed=0, epoch=0, rank=0, size=1000)
    assert unused.tolist() == [0, 0] and again.tolist() == [500, 220]


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    """'web': packets 0..199, 'code': 200..279 (ramp packets, first token = 1000 * number)."""
    d = tmp_path_factory.mktemp("mix")
    write_shards(d / "web", [encode_tokens(ramp(k, 3)) for k in range(200)])
    write_shards(d / "code", [encode_tokens(ramp(k, 3)) for k in range(200, 280)])
    return {"web": d / "web", "code": d / "code"}


def loader(groups, **kw):
    kw.setdefault("mix", {"web": 0.7, "code": 0.3})
    return Loader(groups, mode="padded", batch_size=5, seq_len=8, backend="cpu",
                  output="arrays", seed=4, **kw)


def epoch(ld) -> list[int]:
    return [int(row[0]) // 1000 for b in ld for row in b["input_ids"]]


def test_the_issue_case_upsamples_instead_of_leaving_the_larger_source_unused(groups):
    half = {"web": 0.5, "code": 0.5}
    shortest = loader(groups, mix=half)
    seen = epoch(shortest)
    assert shortest.stats.mix_unused["web"] > 100  # the epoch ended when code ran out
    longest = loader(groups, mix=half, mix_size="longest")
    n = len(longest)
    seen = epoch(longest)
    assert len(seen) == 5 * n and longest.stats.mix_unused == {}
    web = [k for k in seen if k < 200]
    assert sorted(set(web)) == list(range(200)) and len(web) == 200  # each web packet once
    assert set(seen) - set(web) == set(range(200, 280))  # code whole, and again
    assert longest.stats.mix_repeated == {"code": len(seen) - 200 - 80}
    assert len(seen) == 400  # 200 each


def test_a_set_number_of_packets_per_epoch_across_ranks(groups):
    lds = [loader(groups, mix_size=400, rank=r, world_size=2) for r in range(2)]
    lens = [len(ld) for ld in lds]
    assert lens == [40, 40]
    seen = [epoch(ld) for ld in lds]
    assert [len(s) for s in seen] == [200, 200]
    assert sum(sum(ld.stats.sources.values()) for ld in lds) == 400


@pytest.mark.parametrize("size", ["longest", 333])
def test_upsampled_epochs_resume_exactly(groups, size):
    full = loader(groups, mix_size=size)
    want = epoch(full) + epoch(full)
    first = loader(groups, mix_size=size)
    it = iter(first)
    head = [int(row[0]) // 1000 for _ in range(23) for row in next(it)["input_ids"]]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    second = loader(groups, mix_size=size)
    second.load_state_dict(state)
    assert head + epoch(second) + epoch(second) == want
    with pytest.warns(UserWarning, match="mix_size"):  # the rest of its epoch: test_mix_change
        loader(groups, mix_size="shortest").load_state_dict(state)


def test_a_set_number_smaller_than_the_ranks_leaves_some_ranks_nothing(groups):
    """mix_size=1 on 2 ranks: rank 1's part is 0 packets (it once fell back to 'shortest' and
    read a whole epoch); every rank delivers the smallest count, none, and says so: a loop
    over such epochs would never take a step (ndp.loader.options.no_batch)."""
    from ndp.errors import DataError

    lds = [loader(groups, mix_size=1, rank=r, world_size=2) for r in range(2)]
    assert [len(ld) for ld in lds] == [0, 0]
    for r, ld in enumerate(lds):
        with pytest.raises(DataError, match=rf"epoch 0 makes no batch on rank {r}: the share "
                                            rf"of each of 2 ranks holds 0 of the"):
            epoch(ld)
    merged, unused, _ = mix(parts_of([5, 3]), np.array([1.0, 1.0]), seed=0, epoch=0, rank=0,
                            size=0)
    assert merged.shape[0] == 0 and unused.tolist() == [5, 3]


def test_bad_mix_sizes_are_refused(groups):
    for bad in ("largest", 0, -5, 2.5, True):
        with pytest.raises(ConfigError, match="mix_size"):
            loader(groups, mix_size=bad)


# --- the window shuffle (ndp.loader.ordering.order.epoch_order)
# ----------------------------------------------
def test_the_window_shuffle_permutes_documents_within_windows_of_whole_shards():
    from ndp.loader.ordering.order import epoch_order, windows

    sizes = np.array([30, 50, 20, 40, 10, 60])
    base = np.concatenate([[0], np.cumsum(sizes)])
    shard_bytes = sizes * 100
    order = epoch_order(base, seed=3, epoch=1, shard_bytes=shard_bytes, window_bytes=7000)
    assert sorted(order.tolist()) == list(range(base[-1]))  # every packet once
    shard = np.searchsorted(base, order, side="right") - 1
    at = 0
    rng = np.random.Generator(np.random.PCG64([3, 1, 0x0D3E]))
    for window in windows(shard_bytes, rng.permutation(6), 7000):
        n = int(sizes[window].sum())
        assert set(shard[at: at + n].tolist()) == set(window.tolist())  # a window's packets
        assert int(shard_bytes[window[:-1]].sum()) < 7000  # ... are consecutive shards'
        at += n
    again = epoch_order(base, seed=3, epoch=1, shard_bytes=shard_bytes, window_bytes=7000)
    assert np.array_equal(order, again)
    one = epoch_order(base, seed=3, epoch=1, shard_bytes=shard_bytes, window_bytes=None)
    assert not np.array_equal(one, order) and sorted(one.tolist()) == list(range(base[-1]))


def test_one_shard_is_shuffled_whole_each_epoch_not_rotated():
    """The issue's case: one 256 MB shard, and epoch 1 was epoch 0 rotated."""
    from ndp.loader.ordering.order import epoch_order

    base = np.array([0, 20_000])
    e0, e1 = (epoch_order(base, seed=0, epoch=e, shard_bytes=np.array([256 << 20]))
              for e in (0, 1))
    pos0 = np.empty(20_000, np.int64)
    pos0[e0] = np.arange(20_000)
    kept = np.abs(pos0[e1[1:]] - pos0[e1[:-1]]) == 1
    assert kept.mean() < 0.001  # neighbours in epoch 1 were not neighbours in epoch 0
    assert abs(np.corrcoef(pos0, np.argsort(e1))[0, 1]) < 0.05


def test_a_packed_epoch_of_one_shard_is_no_rotation_of_the_last(tmp_path):
    write_shards(tmp_path, [encode_tokens(ramp(k, 50)) for k in range(400)])
    loader = Loader(tmp_path, mode="packed", batch_size=4, seq_len=64, backend="cpu",
                    output="arrays", seed=0)
    streams = [np.concatenate([b["x"].copy().ravel() for b in loader]) for _ in range(2)]
    docs = [s // 1000 for s in streams]  # ramp tokens: 1000 * document + position
    starts = [d[np.flatnonzero(np.diff(d)) + 1] for d in docs]  # each document, in order
    follows = {(a, b) for a, b in zip(starts[0][:-1], starts[0][1:])}
    same = sum((a, b) in follows for a, b in zip(starts[1][:-1], starts[1][1:]))
    assert same < 0.05 * len(starts[1])


def test_the_shuffle_window_is_part_of_the_state(groups):
    from ndp.errors import LoaderStateError

    a = Loader(groups["web"], mode="padded", batch_size=5, seq_len=8, backend="cpu",
               output="arrays", shuffle_window=1 << 20)
    it = iter(a)
    next(it)
    state = a.state_dict()
    a.close()
    assert state["shuffle_window"] == 1 << 20 and state["order"] == "windows-v2"
    with pytest.raises(LoaderStateError, match="shuffle_window"):
        Loader(groups["web"], mode="padded", batch_size=5, seq_len=8, backend="cpu",
               output="arrays", shuffle_window="all").load_state_dict(state)
    for bad in (0, "most", 1.5):
        with pytest.raises(ConfigError, match="shuffle_window"):
            Loader(groups["web"], mode="padded", batch_size=5, seq_len=8, backend="cpu",
                   output="arrays", shuffle_window=bad)


# --- len(loader) with a set number of packets per epoch ----------------------------------------
@pytest.fixture(scope="module")
def varied(tmp_path_factory):
    """'web': 120 ramp packets, 'code': 60, of 1 to 40 tokens each."""
    d = tmp_path_factory.mktemp("varied")
    lengths = np.random.default_rng(3).integers(1, 41, 180).tolist()
    write_shards(d / "web", [encode_tokens(ramp(k, n)) for k, n in enumerate(lengths[:120])])
    write_shards(d / "code", [encode_tokens(ramp(k, n))
                              for k, n in enumerate(lengths[120:], start=120)])
    return {"web": d / "web", "code": d / "code"}


@pytest.mark.parametrize("mode", ["padded", "packed", "packing"])
def test_an_int_mix_size_fixes_len_in_padded_mode_only(varied, mode):
    """An int ``mix_size`` fixes the packets of an epoch, hence its padded batches; packed and
    packing batches follow the tokens of the packets drawn, which change with the epoch."""
    lds = [Loader(varied, mode=mode, batch_size=4, seq_len=16, backend="cpu", output="arrays",
                  seed=4, mix={"web": 0.6, "code": 0.4}, mix_size=90, rank=r, world_size=2)
           for r in range(2)]
    lens = []
    for _ in range(4):
        lens.append(len(lds[0]))
        assert [sum(1 for _ in ld) for ld in lds] == [lens[-1]] * 2  # what each rank yields
    if mode == "padded":
        assert lens == [12] * 4  # 90 packets, 45 a rank, 4 a batch
    else:  # as Loader.__len__ says; a change here must change what it says
        assert len(set(lens)) > 1, lens
