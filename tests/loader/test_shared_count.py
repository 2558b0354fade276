"""An epoch's count made once and shared (ndp.loader.shared_count): a rank finds the count
another made, reads the bound of the one making it, takes over from one that gave up, and
counts again over a file that is not its key's; the batches never depend on any of it."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from filelock import FileLock

import ndp.loader.count as count_module
from ndp.loader.loader import Loader
from ndp.loader.shared_count import SharedCount, count_dir
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp, write_shards


@pytest.fixture
def data(tmp_path):
    write_shards(tmp_path, [encode_tokens(ramp(40 * k, 5 + k % 31)) for k in range(400)])
    return tmp_path


KW = dict(batch_size=2, seq_len=16, backend="cpu", output="arrays", seed=3, world_size=3)


def batches(loader):
    return [{k: v.copy() for k, v in b.items()} for b in loader]


def same(a, b):
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


def passes(monkeypatch):
    """Count the passes this process makes."""
    made = []
    real = count_module.count_pass

    def counted(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(count_module, "count_pass", counted)
    return made


@pytest.mark.parametrize("mode", ["padded", "packed", "packing"])
def test_the_other_ranks_find_the_count_the_first_made(data, mode, monkeypatch):
    made = passes(monkeypatch)
    first = Loader(data, mode=mode, rank=0, **KW)
    got0 = batches(first)
    first.close()  # its plan's thread too (counting the epochs after, ahead)
    assert made
    shared = str(count_dir())
    monkeypatch.setenv("NDP_COUNT_CACHE", "off")
    alone = [Loader(data, mode=mode, rank=rank, **KW).plan.share(0) for rank in range(3)]
    for sh in alone:
        sh.count.counted()
    monkeypatch.setenv("NDP_COUNT_CACHE", shared)
    made = passes(monkeypatch)
    for rank in (1, 2):  # the count of epoch 0 is written: found at once, no pass
        other = Loader(data, mode=mode, rank=rank, **KW)
        sh = other.plan.share(0)
        assert sh.count.final and made == []
        assert sh.batches == alone[rank].batches == len(got0)
        assert sh.cut == alone[rank].cut and (sh.cut is not None) == (mode == "padded")
        other.close()
    monkeypatch.setenv("NDP_COUNT_CACHE", "off")  # the batches do not depend on it
    again = Loader(data, mode=mode, rank=0, **KW)
    assert same(batches(again), got0)
    timeless = [{k: v for k, v in x.stats.as_dict().items() if k != "wait_seconds"}
                for x in (again, first)]
    assert timeless[0] == timeless[1]
    again.close()


@pytest.mark.parametrize("mode", ["packed", "packing"])
def test_a_rank_delivers_below_the_bound_another_rank_writes(data, mode, monkeypatch):
    """Another rank holds the lock: this one makes no pass, delivers the batches below the
    bound read from the other's file, waits, and finishes when the count is written."""
    want = batches(Loader(data, mode=mode, rank=1, **{**KW}))
    monkeypatch.setenv("NDP_COUNT_CACHE", str(count_dir()) + "-2")  # not found written
    made = passes(monkeypatch)
    loader = Loader(data, mode=mode, rank=1, **KW)
    shared = SharedCount.open({**loader.plan.count_fields(0), "count_version": 1})
    other = FileLock(str(shared.lock_path))
    other.acquire()
    after = SharedCount.open({**loader.plan.count_fields(1), "count_version": 1})
    ahead = FileLock(str(after.lock_path))  # epoch 1's too: no pass at all
    ahead.acquire()
    try:
        shared.publish(4)
        it = iter(loader)
        got = [{k: v.copy() for k, v in next(it).items()} for _ in range(3)]
        late = threading.Timer(0.3, lambda: shared.save({"batches": len(want), "cuts": None}))
        late.start()
        got += batches(it)  # waits at the bound, then goes on to the count
        late.join()
        assert made == [] and same(got, want)
        loader.close()
    finally:
        other.release()
        ahead.release()


def test_a_rank_takes_over_a_count_left_unfinished(data, monkeypatch):
    made = passes(monkeypatch)
    loader = Loader(data, mode="packed", rank=0, **KW)
    shared = SharedCount.open({**loader.plan.count_fields(0), "count_version": 1})
    other = FileLock(str(shared.lock_path), thread_local=False)
    other.acquire()
    threading.Timer(0.3, other.release).start()  # the rank counting is gone, nothing written
    n = len(loader)  # waits, then counts here
    assert made == [1] and shared.found() == {"batches": n, "cuts": None}
    loader.close()


def test_a_count_file_that_is_not_its_keys_is_counted_again(data, monkeypatch):
    first = Loader(data, mode="packed", rank=0, **KW)
    n = len(first)
    shared = SharedCount.open({**first.plan.count_fields(0), "count_version": 1})
    raw = json.loads(shared.path.read_text())
    for damage in ("result", "key", "text"):
        bad = dict(raw)
        if damage == "result":
            bad["result"] = {"batches": n + 5, "cuts": None}  # its crc32 no longer holds
        elif damage == "key":
            bad["key"] = {**raw["key"], "seq_len": 99}
        shared.path.write_text("{not json" if damage == "text" else json.dumps(bad))
        made = passes(monkeypatch)
        again = Loader(data, mode="packed", rank=0, **KW)
        assert len(again) == n and made == [1], damage
        assert shared.found() == {"batches": n, "cuts": None}  # written over
        again.close()
    first.close()


def test_another_nodes_lock_is_not_waited_for_but_its_count_is_taken(data, monkeypatch):
    """A count folder shared by nodes: a rank counts on its own while another node's rank
    holds that node's lock, and takes a count any node finished."""
    import socket

    here = socket.gethostname()
    made = passes(monkeypatch)
    loader = Loader(data, mode="packed", rank=0, **KW)
    fields = {**loader.plan.count_fields(0), "count_version": 1}
    monkeypatch.setattr(socket, "gethostname", lambda: "node-b")
    elsewhere = SharedCount.open(fields)  # node-b's rank, counting
    monkeypatch.setattr(socket, "gethostname", lambda: here)
    shared = SharedCount.open(fields)
    assert elsewhere.path == shared.path and elsewhere.lock_path != shared.lock_path
    other_node = FileLock(str(elsewhere.lock_path))
    other_node.acquire()
    try:
        n = len(loader)  # counted here: not waiting on node-b
    finally:
        other_node.release()
    assert made == [1] and elsewhere.found() == {"batches": n, "cuts": None}
    monkeypatch.setattr(socket, "gethostname", lambda: "node-b")
    again = Loader(data, mode="packed", rank=1, **KW)
    assert again.plan.share(0).count.final and made == [1]  # the finished count is shared
    loader.close()


def test_the_count_is_keyed_by_what_it_depends_on(data, monkeypatch):
    made = passes(monkeypatch)
    for kw in [{}, {"seed": 4}, {"seq_len": 8}, {"batch_size": 3}, {"world_size": 2},
               {"shuffle_window": "all"}, {"mode": "packing"}]:
        Loader(data, **{**KW, "mode": "packed", **kw}).plan.epoch_batches(0)
    assert len(made) == 7
    Loader(data, **{**KW, "mode": "packed", "rank": 2}).plan.epoch_batches(0)  # not the rank
    assert len(made) == 7
    monkeypatch.setenv("NDP_COUNT_CACHE", "off")
    Loader(data, **{**KW, "mode": "packed"}).plan.epoch_batches(0)
    assert len(made) == 8 and count_dir() is None
