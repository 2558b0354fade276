"""A rank's own packets' index entries, a window at a time (ndp.loader.ordering.share_entries): any
range of share positions gives the entries a gather by packet gives, across windows and past
the share's own packets; a table holds the rank's packets of one window; at most two are held;
building them does not fill the corpus' entry cache."""

from __future__ import annotations

import numpy as np
import pytest

from ndp.loader.ordering import share_entries
from ndp.loader.ordering.order import epoch_windows
from ndp.loader.ordering.share import RankOrder
from ndp.store.corpus import Corpus
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp, write_shards


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("uneven")
    sizes = np.random.default_rng(3).integers(1, 60, 24)
    at = 0
    for i, n in enumerate(sizes.tolist()):
        write_shards(path, [encode_tokens(ramp(100 * (at + k), 1 + (at + k) % 9))
                            for k in range(n)], prefix=f"s{i:03d}")
        at += n
    return Corpus(path)


def order_of(corpus, *, world_size, rank, window, repeat=False, shuffle=True):
    sizes = np.array([s.size for s in corpus.shards], np.int64)
    wins = list(epoch_windows(corpus.base, seed=7, epoch=2, shuffle=shuffle, shard_bytes=sizes,
                              window_bytes=window, block=50))
    return RankOrder(wins, rank=rank, world_size=world_size,
                     length=corpus.n_packets // world_size, repeat=repeat, corpus=corpus)


@pytest.mark.parametrize("world_size", [1, 3, 8])
@pytest.mark.parametrize("shuffle", [True, False])
def test_every_range_is_the_gather_by_packet(corpus, world_size, shuffle, monkeypatch):
    monkeypatch.setattr("ndp.loader.ordering.share_entries.BLOCK", 7)  # blocks of entries and places
    size = int(np.median([s.size for s in corpus.shards]))
    rng = np.random.default_rng(world_size)
    for rank in range(world_size):
        share = order_of(corpus, world_size=world_size, rank=rank, window=3 * size,
                         repeat=True, shuffle=shuffle)
        n = len(share)
        want = corpus.entries_at(np.asarray(share))
        spans = [share.tables.span(k) for k in range(len(share.windows))]
        assert spans[0][0] == 0 and spans[-1][1] == share.length
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # back to back
        for a, b in [(0, n), (0, 1), (n - 1, n), (share.length - 3, share.length + 4)] + [
                tuple(sorted(rng.integers(0, n + 1, 2))) for _ in range(25)]:
            got = share.tables.entries(int(a), int(b))
            assert got.tobytes() == want[a:b].tobytes(), (rank, a, b)
        held = len(share.tables.held())  # two, or a few more small ones
        assert held <= 2 or (held <= share_entries.MOST_HELD
                             and share.tables._held_bytes() <= share_entries.HELD_BYTES)


@pytest.mark.parametrize("world_size", [1, 3])
def test_a_held_table_gives_a_chunks_packets_and_shards_without_walking_the_order(
        corpus, world_size, monkeypatch):
    """A range in one window whose table is held: its packets and their shard numbers are
    sliced from the table (what was worked out to build it), equal to a walk of the order;
    a range across windows, past the share's own packets, or in a window not held is
    walked as before."""
    size = int(np.median([s.size for s in corpus.shards]))
    for rank in range(world_size):
        share = order_of(corpus, world_size=world_size, rank=rank, window=3 * size,
                         repeat=True)
        walked = []
        real = share._places

        def counting(*args, **kwargs):
            walked.append(1)
            return real(*args, **kwargs)

        monkeypatch.setattr(share, "_places", counting)
        for k in range(len(share.windows)):
            share.tables.table(k)  # held (the last two)
        for k in range(len(share.windows)):
            s0, s1 = share.tables.span(k)
            for a, b in ((s0, s1), (s0, s0 + 1), ((s0 + s1) // 2, s1)):
                if b <= a:
                    continue
                held = k in share.tables.held()
                before = len(walked)
                packets, shards = share.with_shards(a, b)
                assert (len(walked) == before) == held, (k, a, b)
                np.testing.assert_array_equal(packets, real(np.arange(a, b)))
                np.testing.assert_array_equal(shards, corpus.shard_of(packets))
        n = len(share)
        before = len(walked)
        packets, _ = share.with_shards(share.length - 2, min(n, share.length + 2))
        assert len(walked) > before  # across the repeat: walked
        np.testing.assert_array_equal(
            packets, real(np.arange(share.length - 2, min(n, share.length + 2))))


def test_a_table_holds_the_ranks_packets_of_its_window_only(corpus):
    share = order_of(corpus, world_size=4, rank=1, window=1 << 62)  # "all": one window
    assert len(share.windows) == 1
    table = share.tables.table(0)
    assert table.shape[0] == share.length <= corpus.n_packets // 4
    many = order_of(corpus, world_size=4, rank=1, window=500)
    for k in range(len(many.windows)):
        a, b = many.tables.span(k)
        assert many.tables.table(k).shape[0] == b - a <= many.windows[k].size // 4 + 1
    assert many.tables.largest <= max(w.size for w in many.windows) // 4 + 1


def test_building_tables_reads_in_passing_not_into_the_entry_cache(corpus):
    fresh = Corpus(corpus.paths[0].parent)
    share = order_of(fresh, world_size=2, rank=0, window=1 << 62)
    share.tables.table(0)
    mine = set(fresh.shard_of(np.asarray(share)).tolist())
    assert {s for s, index in enumerate(fresh.indexes) if index.loaded} == mine  # checked
    assert fresh.entry_cache.held_bytes == 0  # and none of them held


def test_while_a_table_is_built_a_chunk_reads_its_entries_one_by_one(corpus):
    """A run's first chunk does not wait for its window's whole table: while a thread has
    claimed the window, up to DIRECT positions are read entry by entry (LazyIndex.read_at),
    the same entries, from indexes checked whole first (an entry is never read unchecked);
    a larger range, or one nobody builds, waits for the table."""
    fresh = Corpus(corpus.paths[0].parent)
    share = order_of(fresh, world_size=3, rank=2, window=1 << 62)
    want = corpus.entries_at(np.asarray(share))  # the same files, another corpus
    tables = share.tables
    assert tables.claim(0) and not tables.claim(0)  # a thread is about to build it
    got = tables.entries(5, 40)
    assert got.tobytes() == want[5:40].tobytes() and tables.direct == 35
    assert tables.held() == []
    touched = set(fresh.shard_of(np.asarray(share)[5:40]).tolist())
    assert {s for s, index in enumerate(fresh.indexes) if index.loaded} == touched  # checked
    tables.unclaim(0)
    assert tables.entries(5, 40).tobytes() == want[5:40].tobytes()  # nobody builds: built
    assert tables.held() == [0] and tables.direct == 35


def test_a_lying_index_is_refused_before_an_entry_of_it_is_read_one_by_one(tmp_path):
    """Entries read one by one while the table is built come from an index checked whole
    first: a lie that keeps every packet header (an entry repeated) is caught there, where
    the check each packet gets as it is decoded cannot see it (the held-out trial's silent
    wrong rows)."""
    from ndp.errors import IndexMismatchError
    from ndp.store.index import read_index, write_index
    from ndp.store.shard import Shard

    write_shards(tmp_path, [encode_tokens(ramp(100 * k, 3 + k % 4)) for k in range(30)])
    (path,) = sorted(tmp_path.glob("*.ndp"))
    index = read_index(Shard(path).index_path)
    lie = index.entries.copy()
    lie["offset"][7] = lie["offset"][6]  # a packet twice, one left out
    write_index(Shard(path).index_path, lie, index.shard_size, index.shard_crc32,
                index.data_offset)
    fresh = Corpus(tmp_path, on_stale="error")
    share = order_of(fresh, world_size=1, rank=0, window=1 << 62)
    tables = share.tables
    assert tables.claim(0)
    with pytest.raises(IndexMismatchError, match="repeats or overlaps"):
        tables.entries(0, 3)
    tables.unclaim(0)
    with pytest.raises(IndexMismatchError, match="repeats or overlaps"):
        tables.table(0)


def test_a_stopped_build_keeps_nothing_and_the_next_builds_whole(corpus):
    """A table whose ``stop`` flag is set (the warmer's, when a loop is left) is abandoned:
    ``TableStopped``, no table held, no build left marked; asked again, it is built whole."""
    from ndp.loader.ordering.share_entries import TableStopped

    share = order_of(corpus, world_size=3, rank=1, window=10**9)
    with pytest.raises(TableStopped):
        share.tables.table(0, np.ones(1, np.uint8))
    assert share.tables.held() == [] and not share.tables._making
    got = share.tables.table(0)
    s0, s1 = share.tables.span(0)
    assert got.tobytes() == corpus.entries_at(np.asarray(share)[s0:s1]).tobytes()


def test_the_compiled_search_is_searchsorteds_for_short_and_long_arrays():
    """The table build's per-packet search (counted through a short array, binary on a long
    one) finds what ``np.searchsorted(..., side="right") - 1`` finds, repeats included."""
    from ndp.loader.ordering.share_entries import _last_at_or_before

    rng = np.random.default_rng(5)
    for n in [0, 1, 2, 63, 64, 65, 66, 200, 1000]:
        a = np.sort(rng.integers(0, 3 * n + 2, n)).astype(np.int64)
        for v in rng.integers(-2, 3 * n + 4, 60).tolist() + a.tolist()[:20]:
            want = int(np.searchsorted(a, v, side="right")) - 1
            assert _last_at_or_before(a, np.int64(v)) == want, (n, v)


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_window_of_many_shards_has_the_gather_by_packets_entries(tmp_path, shuffle,
                                                                   monkeypatch):
    from ndp.loader.ordering.share_entries import NO_STOP

    """A window of 80 shards (more than the search counts through), some empty of this rank's
    packets, on 3 ranks: each table holds, shard and number too, what a gather by packet
    gives."""
    monkeypatch.setattr("ndp.loader.ordering.share_entries.BLOCK", 5)
    at = 0
    for i in range(80):
        n = 1 + i % 4
        write_shards(tmp_path, [encode_tokens(ramp(at + k, 1 + k)) for k in range(n)],
                     prefix=f"s{i:03d}")
        at += n
    corpus = Corpus(tmp_path)
    total = int(sum(s.size for s in corpus.shards))
    for rank in range(3):
        share = order_of(corpus, world_size=3, rank=rank, window=total, shuffle=shuffle)
        for k in range(len(share.windows)):
            s0, s1 = share.tables.span(k)
            out, shard, local = share.tables._build(k, NO_STOP)
            packets = np.asarray(share)[s0:s1]
            assert out.tobytes() == corpus.entries_at(packets).tobytes()
            assert (shard == corpus.shard_of(packets)).all()
            assert (local == packets - corpus.base[shard]).all()


def test_small_windows_tables_are_held_while_a_chunk_reads_across_them(corpus, monkeypatch):
    """A chunk, its look-ahead and the chunk staged after it may read three small windows in
    turn, again and again: their tables are each built once (two held tables were built
    again at every turn); tables too large for ``HELD_BYTES`` are held two at a time."""
    share = order_of(corpus, world_size=2, rank=1, window=500)
    spans = [share.tables.span(k) for k in range(4)]
    for _ in range(5):
        for a, b in spans[:3]:
            share.tables.entries(a, b)
    assert share.tables.built == 3 and share.tables.held() == [0, 1, 2]
    monkeypatch.setattr(share_entries, "HELD_BYTES", 0)  # as if they were large
    big = order_of(corpus, world_size=2, rank=1, window=500)
    for _ in range(2):
        for a, b in spans[:3]:
            big.tables.entries(a, b)
    assert big.tables.built == 6 and len(big.tables.held()) == 2
