"""The Loader's pipeline in chunks (ndp.loader.planning.plan, ndp.loader.pipeline.chunks, ndp.loader.layouts.layout,
ndp.loader.pipeline.serve): the batches do not depend on how many are decoded per chunk, resume
exactly
inside and between chunks, are the same from the CUDA backend (simulator) whether shards are
resident or come and go through the device arena, and the device work per batch is bounded by
counts, not timings.

RAMP data: packet k holds tokens k*1000 + arange(n); some packets are masked, some longer than a
row, some empty, and a few are damaged on disk after their index was written (the size-only
index match lets them through; their CRC drops them).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from ndp.errors import ConfigError
from ndp.loader.loader import Loader
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp, ramp_specs, write_shards

MODES = ["padded", "packed", "packing"]
N_PACKETS = 90
LENGTHS = [int(x) for x in np.random.default_rng(3).integers(0, 22, N_PACKETS)]
DAMAGED = (7, 31, 32, 60)  # payload bytes flipped: BAD_CRC


def _write_corpus(directory, per_shard: int) -> None:
    specs = ramp_specs(LENGTHS, masked=[k % 4 == 1 for k in range(N_PACKETS)])
    packets = [s.encode() for s in specs]
    for i in range(0, N_PACKETS, per_shard):
        write_shards(directory, packets[i: i + per_shard], prefix=f"s{i:03d}")
    for path in sorted(directory.glob("*.ndp")):  # damage after the index was written
        raw = bytearray(path.read_bytes())
        for k in DAMAGED:
            body = packets[k][8:-2]
            at = raw.find(packets[k])
            if at >= 0 and body:
                raw[at + 8] ^= 0x10
        path.write_bytes(bytes(raw))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """90 packets in 6 shards of 15."""
    d = tmp_path_factory.mktemp("chunks")
    _write_corpus(d, 15)
    return d


@pytest.fixture(scope="module")
def tiny_shards(tmp_path_factory):
    """The same 90 packets in 30 shards of 3: a chunk spans many shards."""
    d = tmp_path_factory.mktemp("tiny")
    _write_corpus(d, 3)
    return d


def host(a) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    return a.copy_to_host() if hasattr(a, "copy_to_host") else a.numpy()


def run(loader: Loader, n_batches: int) -> list[dict]:
    """``n_batches`` batches across epochs, copied to host arrays."""
    out: list[dict] = []
    while len(out) < n_batches:
        for batch in loader:
            out.append({k: host(v).copy() for k, v in batch.items()})
            if len(out) == n_batches:
                break
    return out


def assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=f"batch {i}, {k}")


def make(path, **kw) -> Loader:
    kw.setdefault("batch_size", 3)
    kw.setdefault("seq_len", 8)
    kw.setdefault("backend", "cpu")
    kw.setdefault("output", "arrays")
    kw.setdefault("seed", 5)
    kw.setdefault("crc_drop_rate", 0.1)
    return Loader(path, **kw)


def stats(loader: Loader) -> dict:
    d = loader.stats.as_dict()
    d.pop("wait_seconds")
    return d


def epochs(loader: Loader, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        out.extend({k: host(v).copy() for k, v in b.items()} for b in loader)
    return out


@pytest.mark.parametrize("mode", MODES)
def test_batches_and_counts_do_not_depend_on_the_chunk_size(corpus, mode):
    """Nor on the ramp of the first chunks after a start (1, 2, 4, ... batches)."""
    ref_loader = make(corpus, mode=mode, chunk_batches=1)
    ref = epochs(ref_loader, 2)
    assert stats(ref_loader)["corrupt"].get("BAD_CRC", 0) > 0  # the damage was met
    for chunk in (2, 3, 7, 64):
        loader = make(corpus, mode=mode, chunk_batches=chunk)
        assert_same(epochs(loader, 2), ref)
        assert stats(loader) == stats(ref_loader), chunk
        c = loader.counters  # the producer may be a chunk or two into the third epoch
        assert c.batches >= len(ref) and c.batches <= c.chunks * chunk
        # full chunks but at epoch ends, after the first few (1, 2, 4, ... batches)
        assert c.chunks <= 3 * -(-len(ref) // (2 * chunk)) + 2 + chunk.bit_length()


@pytest.mark.parametrize("mode", MODES)
def test_every_packet_is_accounted_for_each_epoch(corpus, mode):
    loader = make(corpus, mode=mode, chunk_batches=4, crc_drop_rate=0.0)
    promised = len(loader)
    got = epochs(loader, 1)
    assert len(got) == promised  # len() is exact whatever is corrupt
    s = loader.stats
    empty = sum(1 for k, n in enumerate(LENGTHS) if n == 0 and k not in DAMAGED)
    intact = sum(n for k, n in enumerate(LENGTHS) if k not in DAMAGED)
    if mode != "packed":
        assert s.packets == N_PACKETS and s.valid + sum(s.corrupt.values()) == N_PACKETS
        assert empty and s.corrupt == {"BAD_CRC": len(DAMAGED), "EMPTY": empty}
        assert s.tokens + s.truncated_tokens == intact
        return
    # packed: the damage leaves the stream short of the batches the index promises, so the
    # epoch goes on from the start of the share, counted
    assert s.repeated > 0 and s.packets - s.repeated == N_PACKETS
    assert s.valid + sum(s.corrupt.values()) == s.packets
    assert s.corrupt["BAD_CRC"] >= len(DAMAGED) and s.corrupt["EMPTY"] >= empty
    assert s.tokens == promised * loader.batch_size * loader.seq_len
    assert s.tokens - intact < loader.batch_size * loader.seq_len + max(LENGTHS) * s.repeated


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cut", [1, 3, 4, 8, 17])
def test_resume_inside_and_between_chunks(corpus, mode, cut):
    kw = dict(mode=mode, chunk_batches=3, seed=11)
    full = run(make(corpus, **kw), 24)
    first = make(corpus, **kw)
    head = run(first, cut)
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    second = make(corpus, chunk_batches=5, **{k: v for k, v in kw.items() if k != "chunk_batches"})
    second.load_state_dict(state)  # another chunk size resumes the same batches
    assert_same(head + run(second, 24 - cut), full)


@pytest.mark.parametrize("mode", MODES)
def test_cuda_chunks_equal_the_cpu_batches(corpus, mode):
    want = run(make(corpus, mode=mode, chunk_batches=1), 14)
    assert_same(run(make(corpus, mode=mode, backend="cuda", chunk_batches=4), 14), want)
    assert_same(run(make(corpus, mode=mode, backend="cuda", resident=True), 14), want)
    assert_same(run(make(corpus, mode=mode, resident=True, chunk_batches=5), 14), want)  # CPU


@pytest.mark.parametrize("mode", ["padded", "packed"])
def test_shards_come_and_go_through_a_small_device_arena(corpus, mode):
    """Room for two shards of six, unshuffled: each is copied when a chunk needs it (or just
    before) and evicted least recently used; the batches are the CPU's."""
    size = max(p.stat().st_size for p in corpus.glob("*.ndp"))
    loader = make(corpus, mode=mode, backend="cuda", chunk_batches=2, shuffle=False,
                  device_budget=2 * (-(-size // 256) * 256))
    got = epochs(loader, 2)
    assert_same(got, epochs(make(corpus, mode=mode, chunk_batches=2, shuffle=False), 2))
    assert loader.counters.shard_copies >= 2 * 6  # every shard, again in the second epoch


def test_a_chunk_needing_more_shards_than_the_arena_holds_is_cut(tiny_shards):
    size = max(p.stat().st_size for p in tiny_shards.glob("*.ndp"))
    loader = make(tiny_shards, backend="cuda", chunk_batches=8, shuffle=False,
                  device_budget=3 * (-(-size // 256) * 256))
    assert_same(epochs(loader, 1), epochs(make(tiny_shards, chunk_batches=8, shuffle=False), 1))
    assert loader.counters.chunks > -(-N_PACKETS // (3 * 8))  # more chunks than asked for


def test_device_budgets_that_cannot_work_are_refused(corpus):
    size = max(p.stat().st_size for p in corpus.glob("*.ndp"))
    with pytest.raises(ConfigError, match="at least 2"):
        make(corpus, backend="cuda", device_budget=size + 10, shuffle=False)
    slot = -(-size // 256) * 256
    with pytest.raises(ConfigError, match="at least 6 .*two shuffle windows"):
        make(corpus, backend="cuda", device_budget=5 * slot)  # a window holds all 6 shards
    make(corpus, backend="cuda", device_budget=6 * slot).close()
    with pytest.raises(ConfigError, match="resident=True needs"):
        make(corpus, backend="cuda", resident=True, device_budget=size)


def chunk_of_each_batch(chunk_batches: int, per_epoch: int, n: int) -> list[int]:
    """Which chunk each of the first ``n`` padded batches comes from: chunks of 1, 2, 4, ...
    batches after the producer starts, then ``chunk_batches``, cut at every epoch's end."""
    ids: list[int] = []
    size, chunk, in_epoch = 1, 0, 0
    while len(ids) < n:
        take = min(size, per_epoch - in_epoch)
        ids += [chunk] * take
        chunk, in_epoch = chunk + 1, (in_epoch + take) % per_epoch
        size = min(2 * size, chunk_batches)
    return ids[:n]


@pytest.mark.parametrize("chunk_batches", [1, 2, 3, 8])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_batch_stays_valid_until_a_batch_of_the_second_chunk_after_it_is_taken(
        corpus, chunk_batches, prefetch):
    """Padded batches of 3 packets, 30 per epoch: whenever the consumer looks, every batch of
    the newest batch's chunk and of the chunk before it is intact, epoch boundaries included."""
    import time

    loader = make(corpus, chunk_batches=chunk_batches, prefetch=prefetch, crc_drop_rate=0.0)
    chunk = chunk_of_each_batch(chunk_batches, 30, 75)
    it = iter(loader)
    held, snapshots = [], []
    for i in range(75):
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        held.append(batch)
        snapshots.append({name: v.copy() for name, v in batch.items()})
        time.sleep(0.002)  # let the producer run as far ahead as it can
        for j in range(i, -1, -1):
            if chunk[j] < chunk[i] - 1:
                break
            for name in held[j]:
                np.testing.assert_array_equal(held[j][name], snapshots[j][name])
    loader.close()


def test_the_first_chunks_after_a_start_are_small(corpus):
    """The first batch waits for one batch's decode, not a whole chunk's."""
    loader = make(corpus, chunk_batches=8, prefetch=0)
    it = iter(loader)
    next(it)
    loader.close()
    assert loader.counters.batches <= 1 + 2 + 4 + 8  # the ramp, and at most one chunk ahead


@pytest.mark.parametrize("prefetch", [0, 1])
def test_the_next_epochs_first_chunk_is_decoded_while_the_last_ones_are_served(tmp_path,
                                                                               prefetch):
    """An epoch's end holds no slot: the producer puts it and goes on to decode the next
    epoch's first chunk while the consumer still serves the chunk before the epoch's last
    (waiting to put the end kept it from decoding until the consumer took the short last
    chunk, and a consumer slower than the decode then waited at every boundary)."""
    import time

    write_shards(tmp_path, [encode_tokens(ramp(100 * k, 4)) for k in range(12)])
    loader = Loader(tmp_path, mode="padded", batch_size=2, seq_len=4, backend="cpu",
                    output="arrays", shuffle=False, chunk_batches=2, prefetch=prefetch)
    assert len(loader) == 6  # chunks of 1, 2, 2 and 1 batches (the first chunks ramp up)
    it = iter(loader)
    for _ in range(4):  # the first batch of the third chunk: the fourth is the epoch's last
        next(it)
    deadline = time.monotonic() + 10
    while loader.counters.chunks < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert loader.counters.chunks == 5  # the 4 of epoch 0, and epoch 1's first
    assert len(list(it)) == 2 and loader.epoch == 1
    loader.close()


@pytest.mark.parametrize("mode", MODES)
def test_the_consumers_release_is_waited_for_just_before_the_build(corpus, mode):
    """A slot's outputs are claimed (the compute stream waits for the consumer's release of
    the slot's last chunk, and DLPack consumers are fenced) after the chunk's verdicts are
    read and just before its build writes them: the producer's one host wait, for the
    verdicts, never waits for the consumer's GPU work."""
    loader = Loader(corpus, mode=mode, batch_size=2, seq_len=8, backend="cuda", seed=4,
                    chunk_batches=2, output="arrays")
    engine, log = loader.engine, []

    def spy(name):
        real = getattr(engine, name)

        def logged(*args, **kwargs):
            log.append(name)
            return real(*args, **kwargs)

        setattr(engine, name, logged)

    for name in ("submit_verdicts", "read_verdicts", "claim", f"build_{mode}"):
        spy(name)
    assert sum(1 for _ in loader) >= 4
    loader.close()
    assert log.count("claim") == log.count(f"build_{mode}") >= 4
    for i, name in enumerate(log):
        if name == "claim":
            assert log[i - 1] == "read_verdicts" and log[i + 1] == f"build_{mode}", log


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_a_padded_batch_with_no_row_is_counted_and_warned_about_once(corpus, backend):
    """batch_size=1: a dropped packet (corrupt, or empty) leaves its batch no row, whose mean
    loss is NaN. It is still delivered (every rank delivers as many batches), counted in
    ``stats.empty_batches`` and warned about once, naming what to do."""
    loader = Loader(corpus, mode="padded", batch_size=1, seq_len=8, backend=backend, seed=1,
                    chunk_batches=8, output="arrays")
    with pytest.warns(UserWarning, match="has no rows") as caught:
        rows = [b["input_ids"].shape[0] for b in loader]
    loader.close()
    assert len([w for w in caught if "has no rows" in str(w.message)]) == 1
    dropped = sum(loader.stats.corrupt.values())
    assert dropped >= len(DAMAGED) and rows.count(0) == dropped
    assert loader.stats.empty_batches == dropped == loader.stats.as_dict()["empty_batches"]
    assert len(rows) == N_PACKETS


@pytest.mark.parametrize("lie", ["zero LENs", "an offset one byte off"])
@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("mode", MODES)
def test_a_first_chunk_read_entry_by_entry_from_a_lying_index_is_read_again(tmp_path,
                                                                             monkeypatch, mode,
                                                                             backend, lie):
    """An index whose LEN fields are all zero, or with one offset off (its size and crc32
    still match). While its
    window's table is built, the first chunk reads its entries one by one, before the index's
    first-use check: the header check refused the chunk, or, when the table came first, the
    check rescanned the shard and the batches were exact (one or the other, run to run). Now
    the chunk makes the check (a rescan, with a warning) and is staged again: always exact. On
    a GPU, whose stage reads the shards' indexes whole as it copies them, the check comes first.
    """
    import shutil
    import time

    from ndp.loader.ordering import share_entries
    from ndp.store.index import read_index, write_index

    intact = tmp_path / "intact"
    packets = [s.encode() for s in ramp_specs(LENGTHS, masked=[k % 4 == 1 for k in range(90)])]
    write_shards(intact, packets[:45], prefix="a")
    write_shards(intact, packets[45:], prefix="b")
    lying = tmp_path / "lying"
    shutil.copytree(intact, lying)
    for idx in sorted(lying.glob("*.idx")):
        index = read_index(idx)
        entries = index.entries.copy()
        if lie == "zero LENs":
            entries["length"] = 0
        else:
            entries["offset"][3] += 1
        write_index(idx, entries, index.shard_size, index.shard_crc32, index.data_offset)
    kw = dict(mode=mode, batch_size=2, seq_len=8, backend=backend, seed=5, chunk_batches=4,
              output="arrays", manifest="ignore")

    def host(v):
        return np.array(v.copy_to_host()) if hasattr(v, "copy_to_host") else v.copy()

    want = [{k: host(v) for k, v in b.items()} for b in Loader(intact, **kw)]
    real = share_entries.ShareEntries.prepare

    def slow(self, k):  # the warmer's build comes after the first chunk, every time
        time.sleep(0.5)
        return real(self, k)

    monkeypatch.setattr(share_entries.ShareEntries, "prepare", slow)
    with pytest.warns(UserWarning, match="scanning the shard instead"):
        loader = Loader(lying, **kw)
        got = [{k: host(v) for k, v in b.items()} for b in loader]
    assert loader.corpus.shards and len(got) == len(want) > 0
    for x, y in zip(got, want):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
