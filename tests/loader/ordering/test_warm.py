"""The next window's entry table built ahead (ndp.loader.ordering.warm): the window after the
producer's, at an epoch's end the next epoch's first, once each, on a thread that is gone when
done and when the Loader is closed."""

from __future__ import annotations

import threading

import numpy as np

from ndp.loader.loader import Loader
from ndp.loader.ordering.order import epoch_windows
from ndp.loader.ordering.share import RankOrder
from ndp.loader.ordering.warm import Warmer
from ndp.store.corpus import Corpus
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp, write_shards


def shards(tmp_path, n=12, per=10):
    for i in range(n):
        write_shards(tmp_path, [encode_tokens(ramp(100 * (per * i + k), 3 + k % 5))
                                for k in range(per)], prefix=f"s{i:03d}")
    return Corpus(tmp_path)


def order_of(corpus, epoch, window_bytes, world_size=1, rank=0):
    sizes = np.array([s.size for s in corpus.shards], np.int64)
    wins = list(epoch_windows(corpus.base, seed=1, epoch=epoch, shard_bytes=sizes,
                              window_bytes=window_bytes))
    return RankOrder(wins, rank=rank, world_size=world_size,
                     length=corpus.n_packets // world_size, corpus=corpus)


def test_the_window_after_the_producers_is_built_ahead_then_the_next_epochs_first(tmp_path):
    corpus = shards(tmp_path)
    size = corpus.shards[0].size
    share, after = order_of(corpus, 0, 3 * size), order_of(corpus, 1, 3 * size)
    assert len(share.windows) == 4
    warm = Warmer()
    for k in range(4):
        pos = share.tables.span(k)[0]  # the first share position of window k
        assert share.window_at(pos) == k
        warm.ahead(share, pos, lambda: after)
        warm.join()
        if k < 3:
            assert k + 1 in share.tables.held() and k + 2 not in share.tables.held()
        else:
            assert after.tables.held() == [0]
    built = share.tables.built
    warm.ahead(share, share.tables.span(2)[0], lambda: after)  # built already: not again
    warm.join()
    assert share.tables.built == built and warm.windows == 4
    warm.ahead(np.arange(5), 0)  # a share built whole: nothing built ahead
    assert warm.windows == 4


def test_a_loader_builds_windows_ahead_and_leaves_no_thread(tmp_path):
    corpus = shards(tmp_path)
    loader = Loader(tmp_path, mode="packed", batch_size=1, seq_len=4, backend="cpu",
                    output="arrays", shuffle_window=3 * corpus.shards[0].size)
    it = iter(loader)
    for _ in range(40):
        next(it)
    assert loader._producer.warmer.windows >= 1
    loader.close()
    assert not [t for t in threading.enumerate() if t.name == "ndp-warm"]


def test_stop_abandons_the_build_under_way_and_the_loader_waits_for_no_table(tmp_path,
                                                                           monkeypatch):
    """``Warmer.stop`` (a Loader's close) sets the build's stop flag and joins its thread: a
    build that would run until told (a window of 1e8 documents takes seconds) ends at once,
    keeps no table, and leaves no build marked; ``join`` alone still waits."""
    import time

    from ndp.loader.ordering import share_entries

    corpus = shards(tmp_path)
    share = order_of(corpus, 0, 3 * corpus.shards[0].size)
    started = threading.Event()
    real = share_entries._own_packets

    saw = []

    def endless(*args):  # the compiled pass, on a window too large to finish before close
        started.set()
        stop, until = args[-1], time.monotonic() + 60  # (a bound, so a failure cannot hang)
        while not stop[0] and time.monotonic() < until:
            time.sleep(0.001)
        saw.append(bool(stop[0]))
        return real(*args)

    monkeypatch.setattr(share_entries, "_own_packets", endless)
    warm = Warmer()
    warm.current(share, 0)
    warm.ahead(share, 0)  # the chunk it was started for is laid out: the build goes
    assert started.wait(10)
    warm.stop()
    assert saw == [True]
    assert not [t for t in threading.enumerate() if t.name == "ndp-warm" and t.is_alive()]
    assert share.tables.held() == [] and not share.tables._making
    monkeypatch.setattr(share_entries, "_own_packets", real)
    warm.current(share, 0)  # built again when next needed
    warm.ahead(share, 0)
    warm.join()
    assert share.tables.held() == [0]


def test_a_build_started_for_a_chunk_waits_until_that_chunk_is_laid_out(tmp_path, monkeypatch):
    """A run's first chunk reads its entries one by one while its window's table is built
    (``current``); the build starts once ``ahead`` says the chunk is laid out, so that the
    first batch does not share the host's cores with it; ``stop`` releases it too."""
    from ndp.loader.ordering import warm as warm_module

    monkeypatch.setattr(warm_module, "GO_WAIT", 60.0)  # only the chunk (or stop) releases it
    corpus = shards(tmp_path)
    share = order_of(corpus, 0, 3 * corpus.shards[0].size)
    warm = Warmer()
    warm.current(share, 0)
    thread = warm._thread
    thread.join(0.3)  # a build of this window takes milliseconds: it has not begun
    assert thread.is_alive() and share.tables.built == 0 and share.tables.held() == []
    warm.ahead(share, 0)
    warm.join()
    assert share.tables.held() == [0] and share.tables.built == 1
    other = order_of(corpus, 1, 3 * corpus.shards[0].size)
    warm.current(other, 0)
    warm.stop()  # a close before the chunk: the thread goes at once, with nothing built
    assert not warm._thread.is_alive() and other.tables.built == 0
