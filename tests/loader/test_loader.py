"""ndp.Loader: coverage and order, rank splits, exact resume, CRC-Drop, corruption accounting,
the producer thread's errors and shutdown, and the same batches from both backends.

RAMP data: packet k holds tokens k*1000 + arange(n), so a row's first token names its packet
and a window's tokens say where in the stream it was cut.
"""

from __future__ import annotations

import gc
import json
import threading
import time

import numpy as np
import pytest

from ndp.errors import ConfigError
from ndp.loader.loader import Loader
from ndp.wire.packet import encode_packet, encode_tokens
from ndp.wire.format import Typ

from ndp_test_helpers import ramp, ramp_specs, write_shards

LENGTHS = [int(x) for x in np.random.default_rng(0).integers(1, 30, 41)]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """41 ramp packets (some masked) in three shards of 12, 17 and 12 packets."""
    d = tmp_path_factory.mktemp("corpus")
    specs = ramp_specs(LENGTHS, masked=[k % 5 == 2 for k in range(41)])
    packets = [s.encode() for s in specs]
    for i, part in enumerate((packets[:12], packets[12:29], packets[29:])):
        write_shards(d, part, prefix=f"p{i}")
    return d


def host(a) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    return a.copy_to_host() if hasattr(a, "copy_to_host") else a.numpy()


def take(loader, n=None) -> list[dict]:
    """Up to ``n`` batches (the rest of the epoch with None), copied to host arrays."""
    out = []
    for batch in loader:
        out.append({k: host(v).copy() for k, v in batch.items()})
        if n is not None and len(out) == n:
            break
    return out


def packets_of(batches) -> list[int]:
    return [int(row[0]) // 1000 for b in batches for row in b["input_ids"]]


def assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def make(corpus_dir, **kw) -> Loader:
    kw.setdefault("batch_size", 4)
    kw.setdefault("seq_len", 8)
    kw.setdefault("backend", "cpu")
    kw.setdefault("output", "arrays")
    return Loader(corpus_dir, **kw)


# --- order and coverage ------------------------------------------------------------------------
def test_padded_epoch_covers_every_packet_once_in_a_new_order_each_epoch(corpus_dir):
    loader = make(corpus_dir, seed=3)
    epochs = [packets_of(take(loader)) for _ in range(3)]
    for seen in epochs:
        assert sorted(seen) == list(range(41))
    assert epochs[0] != epochs[1] != epochs[2]
    assert loader.epoch == 3


def test_unshuffled_padded_rows_are_the_ramp_in_order(corpus_dir):
    batches = take(make(corpus_dir, shuffle=False, seq_len=32))
    assert packets_of(batches) == list(range(41))
    rows = np.concatenate([b["input_ids"] for b in batches])
    for k, n in enumerate(LENGTHS):
        np.testing.assert_array_equal(rows[k, :n], ramp(k, n))
        assert (rows[k, n:] == 0).all()


def test_packed_windows_cut_the_stream_in_order(corpus_dir):
    loader = make(corpus_dir, mode="packed", shuffle=False, batch_size=2, seq_len=5)
    batches = take(loader)
    stream = np.concatenate([ramp(k, n) for k, n in enumerate(LENGTHS)])
    x = np.concatenate([b["x"] for b in batches]).reshape(-1)
    np.testing.assert_array_equal(x, stream[: x.shape[0]])
    for b, start in zip(batches, range(0, x.shape[0], 10)):
        y = b["y"].reshape(-1)
        want = stream[start + 1: start + 11]
        assert ((y == want) | (y == -100)).all()  # -100 where a masked packet's bit is 0
    s = loader.stats
    assert s.tokens == x.shape[0] and s.tokens + s.unused_tokens == stream.shape[0]
    assert s.unused_tokens < 2 * 5 + 1 and s.packets == 41 and s.valid == 41


def test_packing_lays_whole_documents_end_to_end(corpus_dir):
    L = 40
    loader = make(corpus_dir, mode="packing", seed=6, batch_size=3, seq_len=L)
    batches = take(loader)
    seen = []
    for b in batches:
        assert b["input_ids"].shape == (3, L) and b["position_ids"].shape == (3, L)
        cu = b["cu_seqlens"]
        assert cu[0] == 0 and cu[-1] == 3 * L and (np.diff(cu) > 0).all()
        flat = {k: b[k].reshape(-1) for k in ("input_ids", "labels", "attention_mask",
                                               "position_ids")}
        for a, z in zip(cu[:-1], cu[1:]):
            ids = flat["input_ids"][a:z]
            if flat["attention_mask"][a] == 0:  # a row's padding
                assert (flat["attention_mask"][a:z] == 0).all() and (ids == 0).all()
                continue
            k = int(ids[0]) // 1000
            seen.append(k)
            np.testing.assert_array_equal(ids, ramp(k, LENGTHS[k]))  # whole, uncut (all < L)
            np.testing.assert_array_equal(flat["position_ids"][a:z], np.arange(z - a))
            assert flat["labels"][a] == -100  # no document predicts the next one's start
            assert ((flat["labels"][a + 1:z] == ids[1:]) | (flat["labels"][a + 1:z] == -100)).all()
        assert (np.diff(cu) <= L).all() and ((cu[1:] % L == 0) | (np.diff(cu) < L)).all()
    assert sorted(seen) == list(range(41))
    assert loader.stats.tokens == sum(LENGTHS)
    # rows are full up to the next example that would not fit
    assert len(batches) <= -(-sum(LENGTHS) // (3 * L)) + 3


# --- ranks ----------------------------------------------------------------------------------
@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_ranks_are_disjoint_equal_and_count_what_they_leave_out(corpus_dir, world_size):
    loaders = [make(corpus_dir, seed=5, rank=r, world_size=world_size)
               for r in range(world_size)]
    seen = [packets_of(take(loader)) for loader in loaders]
    flat = [k for s in seen for k in s]
    assert len(set(flat)) == len(flat)  # no packet twice
    # every rank the same batches and packets; the 41 % W packets cut to get there, counted
    assert len({loader.stats.batches for loader in loaders}) == 1
    assert len(set(map(len, seen))) == 1
    balance = [loader.stats.rank_balance for loader in loaders]
    assert len(flat) == 41 - 41 % world_size and sum(balance) == 41 % world_size


def test_torch_output_without_torch_says_what_to_install(corpus_dir, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    with pytest.raises(ConfigError,
                       match=r'pip install "neural-datagram\[torch\]".*output=.arrays.'):
        Loader(corpus_dir, batch_size=2, seq_len=8, backend="cpu")
    make(corpus_dir)  # output="arrays" needs no torch


def test_rank_from_the_environment(corpus_dir, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = make(corpus_dir)
    assert (loader.rank, loader.world_size) == (1, 3)
    with pytest.raises(ConfigError, match="rank"):
        make(corpus_dir, rank=3, world_size=3)


# --- exact resume ---------------------------------------------------------------------------
def _run(loader, n_batches: int) -> list[dict]:
    """``n_batches`` batches across epochs."""
    out: list[dict] = []
    while len(out) < n_batches:
        out.extend(take(loader, n_batches - len(out)))
    return out


@pytest.mark.parametrize("mode", ["padded", "packed", "packing"])
@pytest.mark.parametrize("cut", [1, 4, 10, 11, 13, 25])
def test_resume_gives_the_batches_of_an_uninterrupted_run(corpus_dir, mode, cut):
    kw = dict(mode=mode, seed=11, batch_size=3, seq_len=6, crc_drop_rate=0.1)
    full = _run(make(corpus_dir, **kw), 30)
    first = make(corpus_dir, **kw)
    head = _run(first, cut)
    state = json.loads(json.dumps(first.state_dict()))  # JSON round trip
    first.close()
    second = make(corpus_dir, **kw)
    second.load_state_dict(state)
    assert_same(head + _run(second, 30 - cut), full)


def test_resume_after_repeated_resumes(corpus_dir):
    kw = dict(mode="packed", seed=2, batch_size=2, seq_len=7)
    full = _run(make(corpus_dir, **kw), 40)
    got: list[dict] = []
    state = None
    for chunk in (3, 1, 9, 2, 12, 13):
        loader = make(corpus_dir, **kw)
        if state is not None:
            loader.load_state_dict(state)
        got.extend(_run(loader, chunk))
        state = loader.state_dict()
        loader.close()
    assert_same(got, full)


@pytest.mark.parametrize("mode", ["padded", "packed"])
def test_remaining_is_what_the_next_loop_yields_and_len_stays_the_epoch(corpus_dir, mode):
    """``len`` is the whole epoch (LR schedules count on it), also after a resume mid-epoch;
    ``remaining`` is what the loop still yields: ``len`` at an epoch's start, the rest after
    ``load_state_dict``, one less per batch taken."""
    kw = dict(mode=mode, seed=5, batch_size=3, seq_len=6, crc_drop_rate=0.1)
    loader = make(corpus_dir, **kw)
    n = len(loader)
    assert n > 4 and loader.remaining == n
    for cut in (0, 1, 2, n // 2, n - 1, n):
        first = make(corpus_dir, **kw)
        if cut:
            take(first, cut)
        state = first.state_dict()
        first.close()
        second = make(corpus_dir, **kw)
        second.load_state_dict(state)
        assert (len(second), second.remaining) == (n, n - cut), cut
        seen = 0
        for _ in second:
            seen += 1
            assert second.remaining == n - cut - seen
        assert seen == n - cut
        assert second.remaining == len(second)  # the next epoch, from its start


def test_state_of_another_configuration_is_refused(corpus_dir):
    state = make(corpus_dir, seed=1).state_dict()
    with pytest.raises(ConfigError, match="seed"):
        make(corpus_dir, seed=2).load_state_dict(state)
    with pytest.raises(ConfigError, match="crc_drop_rate"):
        make(corpus_dir, seed=1, crc_drop_rate=0.3).load_state_dict(state)
    # another batch_size goes on in the new shape, said (ndp.loader.states.resume)
    with pytest.warns(UserWarning, match="this state was made with batch_size="):
        make(corpus_dir, seed=1, batch_size=5).load_state_dict(state)


# --- determinism and backends --------------------------------------------------------------
def test_same_seed_same_batches_other_seed_other_order(corpus_dir):
    a = take(make(corpus_dir, seed=9))
    assert_same(a, take(make(corpus_dir, seed=9)))
    assert packets_of(a) != packets_of(take(make(corpus_dir, seed=10)))


@pytest.mark.parametrize("mode", ["padded", "packed", "packing"])
def test_cpu_and_cuda_backends_give_the_same_batches(corpus_dir, mode):
    kw = dict(mode=mode, seed=4, batch_size=6, seq_len=24, prefetch=1)
    cpu = _run(make(corpus_dir, **kw), 4)
    cuda = _run(make(corpus_dir, backend="cuda", **kw), 4)
    assert_same(cpu, cuda)


def test_resident_corpus_on_the_cuda_backend(corpus_dir):
    kw = dict(seed=4, batch_size=8, seq_len=16, prefetch=1)
    assert_same(_run(make(corpus_dir, backend="cuda", resident=True, **kw), 3),
                _run(make(corpus_dir, **kw), 3))


# --- CRC-Drop and corruption ----------------------------------------------------------------
def test_crc_drop_is_seeded_and_counted_apart(corpus_dir):
    loader = make(corpus_dir, seed=1, crc_drop_rate=0.3)
    seen = packets_of(take(loader))
    assert 0 < loader.stats.dropped_on_purpose < 41
    assert len(seen) + loader.stats.dropped_on_purpose == 41
    assert loader.stats.corrupt == {}
    assert seen == packets_of(take(make(corpus_dir, seed=1, crc_drop_rate=0.3)))
    with pytest.raises(ConfigError, match="crc_drop_rate"):
        make(corpus_dir, crc_drop_rate=1.0)


@pytest.mark.parametrize("verify", ["size", "full"])
def test_corrupted_packets_are_lost_alone_and_counted(tmp_path, verify):
    specs = ramp_specs([5, 6, 7, 8, 9, 10])
    packets = [s.encode() for s in specs]
    packets.insert(2, encode_packet(b"\x00" * 7, typ=Typ.TOKEN_IDS))  # BAD_LENGTH
    packets.insert(5, encode_packet(b"\x00\x01", typ=0x7E))  # UNKNOWN_TYPE
    (info,) = write_shards(tmp_path, packets)
    raw = bytearray(info.path.read_bytes())
    at = raw.rindex(encode_tokens(ramp(5, 10)))  # damage the last packet's payload
    raw[at + 12] ^= 0x40
    info.path.write_bytes(bytes(raw))
    if verify == "full":  # the crc32 check finds the index stale: rescanned with a warning
        with pytest.warns(UserWarning, match="scanning the shard"):
            loader = make(tmp_path, shuffle=False, batch_size=3, seq_len=12, verify=verify)
    else:  # the index still matches by size; the packet's own CRC catches the damage
        loader = make(tmp_path, shuffle=False, batch_size=3, seq_len=12, verify=verify)
    seen = packets_of(take(loader))
    assert seen == [0, 1, 2, 3, 4]  # every intact packet, nothing else
    s = loader.stats
    if verify == "full":
        assert s.corrupt == {"BAD_LENGTH": 1, "UNKNOWN_TYPE": 1}
        assert s.corrupt_regions == 1 and s.corrupt_bytes == len(packets[-1])
        assert s.packets == 7 and s.valid == 5
    else:
        assert s.corrupt == {"BAD_LENGTH": 1, "UNKNOWN_TYPE": 1, "BAD_CRC": 1}
        assert s.corrupt_regions == 0
        assert s.packets == 8 and s.valid == 5


# --- the producer thread --------------------------------------------------------------------
def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ndp-loader"]


def test_a_producer_exception_reaches_the_consumer(corpus_dir):
    # threads of loaders that earlier tests dropped may still wait for the garbage collector:
    # this loader's own thread is the one that must have ended
    others = set(_threads())
    loader = make(corpus_dir, shuffle=False, chunk_batches=1)
    calls = {"n": 0}
    real = loader.engine.submit_verdicts

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise ValueError("disk on fire")
        return real(*args, **kwargs)

    loader.engine.submit_verdicts = failing
    got = []
    with pytest.raises(ValueError, match="disk on fire"):
        for batch in loader:
            got.append(batch)
    assert len(got) == 2
    assert not set(_threads()) - others


def test_break_close_and_garbage_collection_leave_no_threads(corpus_dir):
    loader = make(corpus_dir, prefetch=1)
    for _ in loader:
        break
    gc.collect()
    assert not _threads()
    it = iter(loader)
    next(it)
    assert _threads()
    loader.close()
    assert not _threads()
    with make(corpus_dir) as other:
        next(iter(other))
    gc.collect()
    assert not _threads()
    loader = make(corpus_dir)
    it = iter(loader)
    next(it)
    del it, loader
    gc.collect()
    assert not _threads()
    loader = make(corpus_dir)
    take(loader)  # a whole epoch: the producer goes on into the next one ...
    assert len(_threads()) == 1
    del loader  # ... until the loader is dropped
    gc.collect()
    for _ in range(50):
        if not _threads():
            break
        time.sleep(0.02)
    assert not _threads()


def test_stats_as_a_dict(corpus_dir, capsys):
    loader = make(corpus_dir, seq_len=10, progress=True)
    take(loader)
    assert "ndp epoch 0" in capsys.readouterr().err  # the progress bar
    d = loader.stats.as_dict()
    assert d["batches"] == 11 and d["packets"] == 41 and d["valid"] == 41
    assert d["tokens"] + d["truncated_tokens"] == sum(LENGTHS)
    assert d["wait_seconds"] >= 0
    json.dumps(d)


def test_bad_arguments(corpus_dir, tmp_path):
    with pytest.raises(ConfigError, match="mode"):
        make(corpus_dir, mode="zigzag")
    with pytest.raises(ConfigError, match="batch_size"):
        make(corpus_dir, batch_size=0)
    with pytest.raises(ConfigError, match="no .*shards"):
        make(tmp_path)


# --- mixing ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def groups_dir(tmp_path_factory):
    """Two groups: 'web' (packets 0..199, SRC TEXT_CORPUS) and 'code' (200..279, CODE_REPO)."""
    d = tmp_path_factory.mktemp("groups")
    web = [encode_tokens(ramp(k, 3), src=0x01) for k in range(200)]
    code = [encode_tokens(ramp(k, 3), src=0x02) for k in range(200, 280)]
    write_shards(d / "web", web[:120], prefix="a")
    write_shards(d / "web", web[120:], prefix="b")
    write_shards(d / "code", code)
    return d


def _mixed(groups_dir, **kw):
    kw.setdefault("mix", {"web": 1.0, "code": 1.0})
    kw.setdefault("seed", 7)
    return make({"web": groups_dir / "web", "code": groups_dir / "code"}, **kw)


def test_mixing_by_group_keeps_the_proportions_until_a_source_runs_out(groups_dir):
    loader = _mixed(groups_dir, mix={"web": 3.0, "code": 1.0})
    seen = packets_of(take(loader))
    web = sum(k < 200 for k in seen)
    assert len(seen) == len(set(seen))
    assert 0.68 < web / len(seen) < 0.82
    s = loader.stats
    assert s.sources == {"web": web, "code": len(seen) - web}
    # the epoch ended when one source ran out; what the other had left is counted
    assert s.sources["web"] == 200 or s.sources["code"] == 80
    assert sum(s.sources.values()) + sum(s.mix_unused.values()) == 280


def test_mixing_is_deterministic_resumable_and_split_across_ranks(groups_dir):
    kw = dict(mix={"web": 2.0, "code": 1.0}, batch_size=5)
    full = _run(_mixed(groups_dir, **kw), 70)
    assert_same(full, _run(_mixed(groups_dir, **kw), 70))
    first = _mixed(groups_dir, **kw)
    head = _run(first, 17)
    second = _mixed(groups_dir, **kw)
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert_same(head + _run(second, 53), full)
    shares = [set(packets_of(take(_mixed(groups_dir, rank=r, world_size=3, **kw))))
              for r in range(3)]
    assert not (shares[0] & shares[1]) and not (shares[1] & shares[2])
    with pytest.warns(UserWarning, match="mix="):  # goes on in its epoch: test_mix_change
        _mixed(groups_dir, mix={"web": 1.0, "code": 2.0}, batch_size=5).load_state_dict(
            first.state_dict())
    with pytest.raises(ConfigError, match="seed"):  # what cannot be exact stays refused
        _mixed(groups_dir, seed=9, **kw).load_state_dict(first.state_dict())


def test_mixing_by_src_type(groups_dir):
    loader = make(groups_dir / "web", mix={"TEXT_CORPUS": 1.0}, mix_by="src")
    assert sorted(packets_of(take(loader))) == list(range(200))
    both = make([groups_dir / "web", groups_dir / "code"], mix_by="src", seed=1,
                mix={"TEXT_CORPUS": 0.0, 2: 1.0})  # weight 0 leaves a source out, counted
    seen = packets_of(take(both))
    assert sorted(seen) == list(range(200, 280))
    assert both.stats.mix_unused == {"TEXT_CORPUS": 200}


def test_mixing_weights_must_name_every_source(groups_dir):
    with pytest.raises(ConfigError, match="no weight to \\['code'\\]"):
        _mixed(groups_dir, mix={"web": 1.0})
    with pytest.raises(ConfigError, match="not a group"):
        _mixed(groups_dir, mix={"web": 1.0, "code": 1.0, "books": 1.0})
    with pytest.raises(ConfigError, match="weights"):
        _mixed(groups_dir, mix={"web": 0.0, "code": 0.0})
    with pytest.raises(ConfigError, match="mix_by"):
        _mixed(groups_dir, mix_by="colour")


def test_no_memory_growth_over_many_epochs(corpus_dir):
    import tracemalloc

    loader = make(corpus_dir, mode="packing", seq_len=16, crc_drop_rate=0.1)
    for _ in range(3):  # warm up: buffers reach their size, caches fill
        for _ in loader:
            pass
    tracemalloc.start()
    try:
        for _ in range(3):
            for _ in loader:
                pass
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(25):
            for _ in loader:
                pass
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes more after 25 epochs"
    assert len(_threads()) == 1  # one producer for the loader's life, not one per epoch
    loader.close()
    assert not _threads()


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_a_batch_stays_valid_until_the_second_batch_after_it_is_taken(corpus_dir, prefetch):
    loader = make(corpus_dir, batch_size=2, prefetch=prefetch, seed=8)
    it = iter(loader)
    held = next(it)
    for _ in range(8):
        snapshot = {k: v.copy() for k, v in held.items()}
        newer = next(it)
        time.sleep(0.02)  # let the producer run as far ahead as it can
        for k in held:
            np.testing.assert_array_equal(held[k], snapshot[k])
        held = newer
    loader.close()


def test_mixing_skips_a_source_with_nothing_in_this_share():
    from ndp.loader.ordering.order import mix

    merged, unused, _ = mix([np.arange(5), np.zeros(0, np.int64)], np.array([1.0, 1.0]), seed=0,
                         epoch=0, rank=0)
    assert merged.tolist() == [0, 1, 2, 3, 4] and unused.tolist() == [0, 0]


def _intact_and_lying(tmp_path, lie) -> tuple:
    """A three-shard ramp dataset, and a copy whose second index has ``lie(entries)`` applied
    to its entries (its size and crc32 still match)."""
    import shutil

    from ndp.store.index import read_index, write_index

    specs = ramp_specs(LENGTHS, masked=[k % 5 == 2 for k in range(41)])
    packets = [s.encode() for s in specs]
    intact = tmp_path / "intact"
    for i, part in enumerate((packets[:12], packets[12:29], packets[29:])):
        write_shards(intact, part, prefix=f"p{i}")
    lying = tmp_path / "lying"
    shutil.copytree(intact, lying)
    idx = sorted(lying.glob("*.idx"))[1]
    index = read_index(idx)
    entries = index.entries.copy()
    lie(entries)
    write_index(idx, entries, index.shard_size, index.shard_crc32, index.data_offset)
    return intact, lying


@pytest.mark.parametrize("mode", ["padded", "packed", "packing"])
def test_a_lying_index_changes_no_batch(tmp_path, mode):
    """One length bit flipped in an index (its size and crc32 still match; it once made packed
    mode deliver 16 tokens twice and 8 never). With verify="full" (at open), and with
    verify="size" too (when the shard's entries are first read: a LEN cut short leaves a gap
    after its entry, whose header is read when the entries are checked), it is rebuilt with a
    warning and every batch is the one the intact dataset gives."""

    def flip_length_bit(entries):
        entries["length"][4] ^= 0x0004

    intact, lying = _intact_and_lying(tmp_path, flip_length_bit)
    kw = dict(mode=mode, seed=3, batch_size=3, seq_len=7)
    want = _run(make(intact, **kw), 25)
    for verify in ("full", "size"):
        with pytest.warns(UserWarning, match="disagrees with the packet header"):
            got = _run(make(lying, verify=verify, **kw), 25)
        assert_same(got, want)


@pytest.mark.parametrize("mode", ["padded", "packed", "packing"])
def test_an_index_whose_typ_lies_stops_the_loader_at_that_packet(tmp_path, mode):
    """A TYP changed in an index leaves no gap, so verify="size" (no read of the shards at
    start) finds it only when the packets are read: the loader stops with an
    IndexMismatchError when it reaches the packet, after batches that all equal the intact
    dataset's; verify="full" rebuilds it at start with a warning."""
    from ndp.errors import IndexMismatchError
    from ndp.wire.format import Typ

    def change_typ(entries):
        entries["typ"][4] = int(Typ.FLOAT16) if entries["typ"][4] != Typ.FLOAT16 else int(
            Typ.TOKEN_IDS)

    intact, lying = _intact_and_lying(tmp_path, change_typ)
    kw = dict(mode=mode, seed=3, batch_size=3, seq_len=7)
    want = _run(make(intact, **kw), 25)
    with pytest.warns(UserWarning, match="disagrees with the packet header"):
        loader = make(lying, verify="full", **kw)
    assert_same(_run(loader, 25), want)
    got: list[dict] = []
    loader = make(lying, verify="size", **kw)
    with pytest.raises(IndexMismatchError, match="disagrees with the packet header"):
        while len(got) < 25:
            got.extend(take(loader, 25 - len(got)))
    assert len(got) < 25  # stopped, the batches before it intact (none if it was first)
    assert_same(got, want[:len(got)])


# --- misuse: named errors at the call that is wrong --------------------------------------------
def test_one_loop_at_a_time(corpus_dir):
    from ndp.errors import LoaderUsageError

    loader = make(corpus_dir)
    it = iter(loader)
    first = next(it)
    with pytest.raises(LoaderUsageError, match="one loop at a time"):
        next(iter(loader))  # a second loop in this thread
    caught = []

    def other_thread():
        try:
            next(iter(loader))
        except LoaderUsageError as err:
            caught.append(err)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert len(caught) == 1
    second = next(it)  # the first loop goes on, undisturbed
    assert packets_of([{"input_ids": first["input_ids"]}, {"input_ids": second["input_ids"]}])
    loader.close()


def test_a_loop_over_a_closed_loader_says_so_and_a_new_loop_goes_on(corpus_dir):
    from ndp.errors import LoaderUsageError

    loader = make(corpus_dir, shuffle=False)
    it = iter(loader)
    got = [{k: v.copy() for k, v in next(it).items()}]
    loader.close()
    with pytest.raises(LoaderUsageError, match="closed"):
        next(it)
    got += take(loader)  # a new loop: from where the first one stopped
    assert packets_of(got) == list(range(41))


@pytest.mark.parametrize("name,value", [("batch_size", 2.5), ("seq_len", "8"),
                                        ("prefetch", -1), ("chunk_batches", 0),
                                        ("seed", -3), ("batch_size", True)])
def test_bad_option_types_are_refused_at_construction(corpus_dir, name, value):
    with pytest.raises(ConfigError, match=name):
        make(corpus_dir, **{name: value})


def test_a_running_producer_is_stopped_at_interpreter_exit(corpus_dir):
    """A script that ends without close() must not leave the producer inside compiled code
    while the interpreter finalizes (pthread_exit there aborts the process)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys, threading
        import ndp.loader.loader as L
        import ndp.loader.pipeline.running as R
        loader = L.Loader(sys.argv[1], batch_size=2, seq_len=8, backend="cpu", output="arrays")
        next(iter(loader))  # the producer goes on decoding ahead
        def check():  # atexit runs handlers last-registered first: this one after ndp's
            alive = [t.name for t in threading.enumerate() if t.name == "ndp-loader"]
            print("ALIVE", alive, flush=True)
        import atexit
        atexit.register(check)
        atexit.unregister(R._stop_all)
        atexit.register(R._stop_all)  # so ndp's runs first, then check()
    """)
    result = subprocess.run([sys.executable, "-c", code, str(corpus_dir)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ALIVE []" in result.stdout


@pytest.mark.parametrize("mode, batch_size, seq_len", [("padded", 64, 10**9),
                                                       ("packed", 1, 2**62),
                                                       ("packing", 8, 2**40)])
def test_a_batch_no_memory_holds_is_refused_at_construction_naming_its_bytes(
        corpus_dir, mode, batch_size, seq_len):
    """Refused before anything is read, not a MemoryError at the first next() (seq_len=10**9),
    nor an epoch of no batch (packed, seq_len=2**62)."""
    with pytest.raises(ConfigError, match=r"seq_len=.*needs at least [\d,]+ bytes.* memory"):
        Loader(corpus_dir, mode=mode, batch_size=batch_size, seq_len=seq_len, backend="cpu",
               output="arrays")


def test_the_memory_bound_is_the_machines_and_a_seq_len_past_every_packet_is_allowed(
        corpus_dir, monkeypatch):
    import ndp.loader.options as options

    big = Loader(corpus_dir, mode="padded", batch_size=2, seq_len=2**12, backend="cpu",
                 output="arrays", prefetch=0)  # longer than every packet: padding, allowed
    assert next(iter(big))["input_ids"].shape == (2, 2**12)
    big.close()
    monkeypatch.setattr(options, "memory_bytes", lambda: 10**6)
    with pytest.raises(ConfigError, match=r"more than this machine's 1,000,000 bytes"):
        Loader(corpus_dir, mode="padded", batch_size=2, seq_len=2**12, backend="cpu",
               output="arrays")
    monkeypatch.setattr(options, "memory_bytes", lambda: None)  # unknown: no bound
    Loader(corpus_dir, mode="padded", batch_size=2, seq_len=2**12, backend="cpu",
           output="arrays").close()
