"""An epoch's count made once and shared (ndp.loader.planning.shared_count): a rank finds the count
another made, reads the bound of the one making it, takes over from one that gave up, and
counts again over a file that is not its key's; the batches never depend on any of it."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from filelock import FileLock

import ndp.loader.planning.count as count_module
from ndp.loader.loader import Loader
from ndp.loader.planning.shared_count import VERSION, SharedCount, count_dir
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
    shared = SharedCount.open({**loader.plan.count_fields(0), "count_version": VERSION})
    other = FileLock(str(shared.lock_path))
    other.acquire()
    after = SharedCount.open({**loader.plan.count_fields(1), "count_version": VERSION})
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
    shared = SharedCount.open({**loader.plan.count_fields(0), "count_version": VERSION})
    other = FileLock(str(shared.lock_path), thread_local=False)
    other.acquire()
    threading.Timer(0.3, other.release).start()  # the rank counting is gone, nothing written
    n = len(loader)  # waits, then counts here
    assert made == [1] and shared.found()["batches"] == n
    loader.close()


def test_a_count_file_that_is_not_its_keys_is_counted_again(data, monkeypatch):
    first = Loader(data, mode="packed", rank=0, **KW)
    n = len(first)
    shared = SharedCount.open({**first.plan.count_fields(0), "count_version": VERSION})
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
        assert shared.found()["batches"] == n  # written over
        again.close()
    first.close()


def test_another_nodes_lock_is_not_waited_for_but_its_count_is_taken(data, monkeypatch):
    """A count folder shared by nodes: a rank counts on its own while another node's rank
    holds that node's lock, and takes a count any node finished."""
    import socket

    here = socket.gethostname()
    made = passes(monkeypatch)
    loader = Loader(data, mode="packed", rank=0, **KW)
    fields = {**loader.plan.count_fields(0), "count_version": VERSION}
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
    assert made == [1] and elsewhere.found()["batches"] == n
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


# --- the count cache never changes a batch: damaged indexes with the cache cold, warm, stale --
def _lie(case: str, e: np.ndarray) -> np.ndarray:
    """A sound index's entries made to lie in one way, as many entries as before (the file
    keeps its size, so its stamp can be given back: see ``stale`` below)."""
    from ndp.wire.format import Typ

    e = e.copy()
    if case == "repeated":  # the held-out trial's: entries 1-5 equal to entry 0
        e[1:6] = e[0]
    elif case == "swapped":
        e[[2, 3]] = e[[3, 2]]
    elif case == "length_bit":
        e["length"][3] ^= 0x0004
    elif case == "lengths_zeroed":
        e["length"] = 0
    elif case == "offset_off_by_one":
        e["offset"][2] += 1
    elif case == "into_header":
        e["offset"][0] = 4
    elif case == "typ":  # a lie only the packet's own header shows: refused as it is decoded
        e["typ"][1] = int(Typ.FLOAT16)
    else:
        raise AssertionError(case)
    return e


DAMAGES = ["repeated", "swapped", "length_bit", "lengths_zeroed", "offset_off_by_one",
           "into_header", "typ"]


def _outcome(data, mode):
    """The batches the two ranks of a Loader deliver (or the named error one raises), and
    what they warned about indexes."""
    import warnings

    from ndp.errors import NDPError

    got: list = []
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            for rank in (0, 1):
                loader = Loader(data, mode=mode, rank=rank, **{**KW, "world_size": 2})
                got += [batches(loader), len(loader)]
                loader.close()
        except NDPError as exc:
            got = type(exc).__name__
    return got, [str(w.message) for w in said if "index" in str(w.message)]


@pytest.mark.parametrize("mode", ["padded", "packed", "packing"])
@pytest.mark.parametrize("case", DAMAGES)
@pytest.mark.parametrize("cache", ["cold", "warm", "stale"])
def test_a_damaged_index_gives_the_same_batches_whatever_the_count_cache_holds(
        tmp_path, case, mode, cache, monkeypatch):
    """cold: no count cached; warm: the count an earlier read of the damaged files made;
    stale: the intact dataset's count, the index then damaged in place with its size and
    modification time given back (the count's key cannot tell). Each gives the intact
    batches with a warning that says the shard is scanned, or refuses by name, as cold does."""
    import os

    from ndp.wire.format import INDEX_ENTRY_DTYPE, INDEX_HEADER_BYTES

    intact = tmp_path / "intact"
    write_shards(intact, [encode_tokens(ramp(40 * k, 5 + k % 31)) for k in range(60)],
                 max_shard_bytes=1 << 17)
    idx = sorted(intact.glob("*.idx"))[0]
    monkeypatch.setenv("NDP_COUNT_CACHE", str(tmp_path / "off-counts"))
    want, _ = _outcome(intact, mode)
    assert isinstance(want, list) and want[1] > 0
    monkeypatch.setenv("NDP_COUNT_CACHE", str(tmp_path / "counts"))
    if cache == "stale":
        _outcome(intact, mode)  # the intact count, cached
    raw = idx.read_bytes()
    st = os.stat(idx)
    lie = _lie(case, np.frombuffer(raw[INDEX_HEADER_BYTES:], INDEX_ENTRY_DTYPE))
    idx.write_bytes(raw[:INDEX_HEADER_BYTES] + lie.tobytes())
    if cache == "stale":
        os.utime(idx, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif cache == "warm":
        _outcome(intact, mode)  # the damaged files' count, cached
    got, said = _outcome(intact, mode)
    if case == "typ":  # the packet's header shows it as it is decoded: refused by name;
        # a stale count, made from the intact entries, is refused first, by the digests
        assert got == ("CountCacheError" if cache == "stale" else "IndexMismatchError")
        return
    assert got[1::2] == want[1::2]
    assert same(got[0], want[0]) and same(got[2], want[2])
    assert said and all("scanning the shard instead" in w for w in said)


def test_a_cached_count_made_from_other_entries_is_refused_and_removed(data, monkeypatch):
    """A count file for this key whose entries digests are not the ones the indexes hold
    (what an index changed in place with its stamp kept would leave): a named error before
    any batch of that shard, the file removed, and the next run counts afresh."""
    import zlib

    from ndp.errors import CountCacheError

    first = Loader(data, mode="packed", rank=0, **KW)
    n = len(first)
    want = batches(first)
    first.close()
    shared = SharedCount.open({**first.plan.count_fields(0), "count_version": VERSION})
    raw = json.loads(shared.path.read_text())
    result = raw["result"]
    assert result["digests"] and all(d is not None for d in result["digests"])
    result["digests"][0] ^= 1
    result["batches"] = n + 3  # what such a count would say
    raw["crc32"] = zlib.crc32(json.dumps(result, sort_keys=True).encode())
    shared.path.write_text(json.dumps(raw))
    with pytest.raises(CountCacheError, match="counted afresh"):
        batches(Loader(data, mode="packed", rank=0, **KW))
    assert not shared.path.exists()
    again = Loader(data, mode="packed", rank=0, **KW)
    assert len(again) == n and same(batches(again), want)
    again.close()


def test_an_index_rewritten_in_place_is_counted_again(data, monkeypatch):
    """The held-out trial's: a count made from an index later repaired (or damaged) in place
    must not be found for it: the count's key names each index file's size and time."""
    import os

    made = passes(monkeypatch)
    Loader(data, **{**KW, "mode": "packing"}).plan.epoch_batches(0)
    Loader(data, **{**KW, "mode": "packing"}).plan.epoch_batches(0)
    assert len(made) == 1
    idx = sorted(data.glob("*.idx"))[0]
    st = os.stat(idx)
    idx.write_bytes(idx.read_bytes())  # the same bytes, written again: another version
    os.utime(idx, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    Loader(data, **{**KW, "mode": "packing"}).plan.epoch_batches(0)
    assert len(made) == 2
