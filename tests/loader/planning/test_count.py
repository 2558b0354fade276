"""An epoch's batch count made while its batches are delivered (ndp.loader.planning.count): bounds
that only grow, the producer delivering what is below them and waiting for the rest, a
stopped count taken up again, a failed one raised to whoever waits; and the Loader's first
batches come before the count is known, the same batches as ever."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import ndp.loader.planning.count as count_module
from ndp.loader.planning.count import Count
from ndp.loader.planning.epoch import Stopped
from ndp.loader.loader import Loader
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp, write_shards


def started_count(work_after):
    """A Count whose pass runs on a thread: publishes 3, then ``work_after(count)``."""
    started, gate = threading.Event(), threading.Event()

    def work(count, stop):
        count.publish(3)
        count.publish(2)  # a smaller bound is no news
        started.set()
        gate.wait(30)
        work_after(count)

    count = Count(work=work)
    thread = threading.Thread(target=count.run)
    thread.start()
    started.wait(30)
    return count, gate, thread


def test_a_count_gives_its_bound_until_it_is_done():
    count, gate, thread = started_count(lambda c: c.finish(7))
    assert not count.known and not count.final
    assert count.bound(0) == (3, False) and count.bound(2) == (3, False)
    with pytest.raises(Stopped):
        count.bound(3, stop=lambda: True)  # the producer stopped while it waits
    gate.set()
    assert count.bound(3) == (7, True) and count.batches() == 7
    thread.join()
    assert count.final and count.known and count.bound(9) == (7, True)


def test_a_failed_count_fails_every_wait():
    def fail(count):
        raise OSError("index unreadable")

    count, gate, thread = started_count(fail)
    gate.set()
    thread.join()
    with pytest.raises(OSError, match="unreadable"):
        count.batches()
    with pytest.raises(OSError, match="unreadable"):
        count.bound(5)


def test_a_count_nobody_runs_is_run_by_who_waits_for_it():
    """The plan's thread was stopped (a producer restarted): the count is made where asked."""
    ran = []

    def work(count, stop):
        ran.append(threading.current_thread())
        count.finish(4)

    count = Count(work=work)
    assert count.batches() == 4 and ran == [threading.current_thread()]
    assert Count(9).final and Count(9).bound(20) == (9, True)  # known from the start


@pytest.mark.parametrize("mode", ["packed", "packing"])
def test_the_first_batches_come_before_the_epoch_is_counted(tmp_path, monkeypatch, mode):
    write_shards(tmp_path, [encode_tokens(ramp(40 * k, 5 + k % 31)) for k in range(400)])
    kw = dict(mode=mode, batch_size=2, seq_len=16, backend="cpu", output="arrays", seed=3)
    first = Loader(tmp_path, **kw)
    want = [{k: v.copy() for k, v in b.items()} for b in first]
    gate = threading.Event()
    real = count_module.count_pass

    def held(*args, **kwargs):  # the pass publishes its bounds, then is slow to finish
        out = real(*args, **kwargs)
        gate.wait(60)
        return out

    monkeypatch.setattr(count_module, "count_pass", held)
    monkeypatch.setenv("NDP_COUNT_CACHE", "off")  # counted here, not found written
    loader = Loader(tmp_path, **kw)
    it = iter(loader)
    # every batch but the last comes while the count is held (its bound is the count)
    got = [{k: v.copy() for k, v in next(it).items()} for _ in range(len(want) - 1)]
    assert not loader.plan.counted(0)
    gate.set()
    got += [{k: v.copy() for k, v in b.items()} for b in it]
    assert loader.plan.epoch_batches(0) == len(want) == len(got) > 5
    for a, b in zip(got, want):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    # and what is counted: the last chunk read to the share's end only once the count said
    # it was the last (packed: the leftover packets' tokens counted as unused)
    timeless = [{k: v for k, v in x.stats.as_dict().items() if k != "wait_seconds"}
                for x in (loader, first)]
    assert timeless[0] == timeless[1]
    loader.close()
    first.close()


def test_a_resume_mid_epoch_does_not_wait_for_the_count(tmp_path, monkeypatch):
    """load_state_dict checks the state's batch against the count's bound, not the count: a
    resume at 1e8 packets does not wait for the pass; a batch past the count is still refused."""
    write_shards(tmp_path, [encode_tokens(ramp(40 * k, 5 + k % 31)) for k in range(400)])
    kw = dict(mode="packed", batch_size=2, seq_len=16, backend="cpu", output="arrays", seed=3)
    first = Loader(tmp_path, **kw)
    it = iter(first)
    for _ in range(4):
        next(it)
    state, n = first.state_dict(), len(first)
    rest = [{k: v.copy() for k, v in b.items()} for b in it]
    first.close()
    gate = threading.Event()
    real = count_module.count_pass

    def held(*args, **kwargs):  # a long count: it ends when let go or told to stop
        out = real(*args, **kwargs)
        stop, waited = kwargs.get("stop"), time.monotonic()
        while not gate.wait(0.01):
            if stop is not None and stop():
                raise Stopped("the count was stopped")  # as a real pass is, part way
            assert time.monotonic() - waited < 60
        return out

    monkeypatch.setattr(count_module, "count_pass", held)
    monkeypatch.setenv("NDP_COUNT_CACHE", "off")  # counted here, not found written
    loader = Loader(tmp_path, **kw)
    loader.load_state_dict(state)  # returns while the count is held
    assert not loader.plan.counted(0)
    gate.set()
    got = [{k: v.copy() for k, v in b.items()} for b in loader]
    assert len(got) == len(rest) == n - 4
    for a, b in zip(got, rest):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    loader.close()
    from ndp.errors import LoaderStateError
    from ndp.loader.states.state import seal

    with pytest.raises(LoaderStateError, match=f"batch {n + 1} is outside epoch 0, in which "
                                               f"every rank delivers {n} batches"):
        Loader(tmp_path, **kw).load_state_dict(
            seal({**{k: v for k, v in state.items() if k != "check"}, "batch": n + 1,
                  "step": n + 1}))


@pytest.mark.parametrize("mode", ["packing", "packed"])
def test_a_first_bound_from_entries_read_one_by_one_changes_no_count_or_mark(
        tmp_path, monkeypatch, mode):
    """The pass counts the first ``PRIME`` places of the first window from their entries read
    one by one (a bound before the window is read whole; packed: the places are counted again
    by the pass), holds, then counts the rest from the window's column: the count and the
    marks are those of one pass over the column, wherever the first part ends."""
    for s in range(3):
        write_shards(tmp_path, [encode_tokens(ramp(40 * k, 5 + (k * 7 + s) % 31))
                                for k in range(150)], prefix=f"s{s}")
    monkeypatch.setenv("NDP_COUNT_CACHE", "off")  # counted here, not found written
    read = []
    real = count_module.tokens_one_by_one
    monkeypatch.setattr(count_module, "tokens_one_by_one",
                        lambda corpus, win, n: read.append(n) or real(corpus, win, n))
    got = []
    for prime in (0, 1, 7, 100, 10_000):
        monkeypatch.setattr(count_module, "PRIME", prime)
        read.clear()
        loader = Loader(tmp_path, mode=mode, batch_size=2, seq_len=16, backend="cpu",
                        output="arrays", seed=3, rank=1, world_size=2)
        count = loader.plan.share(0).count
        waited = time.monotonic()  # the first places read, before the count is asked for
        while prime and not read:
            assert time.monotonic() - waited < 60
            time.sleep(0.001)
        count.counted()
        assert read == ([min(prime, 450)] if prime else []), prime
        got.append((count.batches(), count.marks))
        loader.close()
    assert got[0][0] > 10 and got[0][1] is not None and all(g == got[0] for g in got)


def held_count(first_bound: int):
    """A Count whose pass runs on a thread: publishes ``first_bound``, holds, then finishes
    with 9; and a list that gets "held" when the hold returned."""
    after = []

    def work(count, stop):
        count.publish(first_bound)
        count.hold(stop)
        after.append("held")
        count.finish(9)

    count = Count(work=work)
    thread = threading.Thread(target=count.run)
    thread.start()
    return count, after, thread


@pytest.mark.parametrize("wanted", ["bound past the first chunk", "batches", "counted"])
def test_a_pass_holds_after_its_first_bound_until_more_is_wanted(wanted):
    """The first chunk has the host to itself: the pass waits after its first bound until the
    producer asks for a bound past that chunk, or someone for the count."""
    count, after, thread = held_count(5)
    assert count.bound(0) == (5, False)  # the first chunk's bound lets nothing go on
    time.sleep(0.2)
    assert after == [] and not count.final and not count.wanted
    if wanted == "batches":
        assert count.batches() == 9
    elif wanted == "counted":
        count.counted()
    else:
        assert count.bound(2) == (5, False)
    thread.join(30)
    assert after == ["held"] and count.final and count.batches() == 9


def test_a_hold_ends_by_itself_is_stopped_and_never_holds_without_a_bound(monkeypatch):
    monkeypatch.setattr(count_module, "GO_WAIT", 0.1)
    count, after, thread = held_count(5)
    thread.join(30)  # nobody asked: the pass goes on after GO_WAIT
    assert after == ["held"] and count.final
    monkeypatch.setattr(count_module, "GO_WAIT", 60.0)
    count, after, thread = held_count(0)  # no bound to deliver from: no hold
    thread.join(30)
    assert after == ["held"] and count.final
    stopped = Count(work=lambda c, stop: (c.publish(3), c.hold(stop), c.finish(1)))
    stopped.run(stop=lambda: True)  # closing: the held pass is left undone, to run again
    assert not stopped.final and stopped.peek() == (3, False)


def test_a_windows_token_counts_stop_between_shards(tmp_path, monkeypatch):
    """A closing Loader stops the count's read of a window after the shard under way (each
    index is read and checked whole on first use: a window's are a second at 1e8), not after
    the window."""
    from ndp.engine import threads
    from ndp.loader.ordering.window import Window
    from ndp.loader.planning.epoch import window_tokens
    from ndp.store.columns import Column
    from ndp.store.corpus import Corpus

    for s in range(6):
        write_shards(tmp_path, [encode_tokens(ramp(40 * k, 5 + k % 7)) for k in range(50)],
                     prefix=f"s{s}")
    corpus = Corpus(tmp_path)
    base = np.asarray(corpus.base, np.int64)
    win = Window(base[:-1], base[1:]) if base.shape[0] == 7 else Window(base, np.append(
        base[1:], len(corpus)))
    assert win.size == len(corpus) == 300
    want = window_tokens(corpus, win)
    np.testing.assert_array_equal(want, corpus.tokens[np.arange(300)])
    read = []
    real = Column.passing
    monkeypatch.setattr(Column, "passing",
                        lambda self, s, e, out: read.append(s) or real(self, s, e, out))
    with pytest.raises(Stopped):
        window_tokens(corpus, win, stop=lambda: len(read) >= 2)
    # the shards under way when it stopped (one a thread: two ranges of three on the pool, or
    # one of six on a single thread), and none of the others
    assert 2 <= len(read) <= 1 + threads.get_num_threads() < 6
