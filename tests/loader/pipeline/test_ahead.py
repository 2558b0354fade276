"""Two chunks in flight (ndp.loader.pipeline.ahead): the next chunk is staged and its verdicts queued
before the chunk ahead of it is laid out, and nothing a user sees changes: the batches, states
and stats are those of one chunk at a time, also where the guess of the next start was wrong
(dropped packets moved it) and the chunk was staged again, and where the device arena must keep
the chunk in flight's shards while the next one's arrive.

On the CPU backend and under the simulator the Loader stages one chunk at a time by default
(there is no device to keep busy); the tests turn staging ahead on there, so that the same code
runs as on a GPU. RAMP data: packet k holds tokens k*1000 + arange(n).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from ndp.loader.loader import Loader

from ndp_test_helpers import ramp_specs, write_shards

MODES = ["padded", "packed", "packing"]
N = 120
LENGTHS = [int(x) for x in np.random.default_rng(8).integers(1, 20, N)]
DAMAGED = (9, 40, 41, 77)  # payload bytes flipped after the index was written: BAD_CRC


def _write(directory, per_shard: int, damaged=()) -> None:
    packets = [s.encode() for s in ramp_specs(LENGTHS)]
    for i in range(0, N, per_shard):
        write_shards(directory, packets[i: i + per_shard], prefix=f"s{i:03d}")
    for path in sorted(directory.glob("*.ndp")):
        raw = bytearray(path.read_bytes())
        for k in damaged:
            at = raw.find(packets[k])
            if at >= 0:
                raw[at + 8] ^= 0x10
        path.write_bytes(bytes(raw))


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    d = tmp_path_factory.mktemp("ahead-clean")
    _write(d, 20)
    return d


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The clean packets in 24 shards of 5: a chunk reads from one to three of them."""
    d = tmp_path_factory.mktemp("ahead-tiny")
    _write(d, 5)
    return d


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    d = tmp_path_factory.mktemp("ahead-damaged")
    _write(d, 20, DAMAGED)
    return d


def make(path, overlap: bool, **kw) -> Loader:
    kw.setdefault("batch_size", 2)
    kw.setdefault("seq_len", 8)
    kw.setdefault("backend", "cpu")
    kw.setdefault("output", "arrays")
    kw.setdefault("seed", 3)
    kw.setdefault("chunk_batches", 2)
    loader = Loader(path, **kw)
    loader._producer.set_overlap(overlap)
    return loader


def host(a) -> np.ndarray:
    return a if isinstance(a, np.ndarray) else a.copy_to_host()


def record(loader: Loader, epochs: int = 2) -> tuple[list, list, dict]:
    """Every batch (host copies) and state of ``epochs`` epochs, and the stats after them."""
    batches, states = [], []
    for _ in range(epochs):
        for batch in loader:
            batches.append({k: host(v).copy() for k, v in batch.items()})
            states.append(json.dumps(loader.state_dict(), sort_keys=True))
    stats = loader.stats.as_dict()
    stats.pop("wait_seconds")
    loader.close()
    return batches, states, stats


def assert_same(a: tuple, b: tuple) -> None:
    assert len(a[0]) == len(b[0])
    for i, (x, y) in enumerate(zip(a[0], b[0])):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=f"batch {i}, {k}")
    assert a[1] == b[1] and a[2] == b[2]


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("mode", (*MODES, "packed+bos"))
def test_staging_ahead_changes_no_batch_state_or_stat(damaged, mode, backend):
    """Damaged packets (and CRC-Drop) in every chunk's neighbourhood: in packed mode they move
    chunks' ends, so some chunks staged ahead are dropped and staged again; the epoch is the
    one of one chunk at a time, batch for batch, state for state. (A ring with room for every
    chunk and the count known before the first: a chunk is staged ahead wherever the plan
    allows, whatever the machine's pace.)"""
    kw = dict(mode=mode.split("+")[0], backend=backend, crc_drop_rate=0.1,
              align="bos" if mode.endswith("+bos") else None)  # windows at documents too
    ahead = make(damaged, True, prefetch=300, **kw)
    len(ahead)
    got = record(ahead)
    want = record(make(damaged, False, **kw))
    assert_same(got, want)
    assert want[2]["corrupt"].get("BAD_CRC", 0) > 0
    c = ahead.counters
    assert c.chunks / 3 < c.staged_ahead and c.ahead_dropped <= c.staged_ahead
    if mode.startswith("packed"):  # a chunk holding a damaged packet ends later than the
        # index says
        assert c.ahead_dropped > 0


@pytest.mark.parametrize("mode", MODES)
def test_a_resumed_run_stages_ahead_the_same_batches(damaged, mode):
    """A state saved after every few batches resumes to the same rest of the epoch with
    staging ahead on, and a resumed Loader's first chunk is staged like any other."""
    full = record(make(damaged, False, mode=mode, seed=9), epochs=1)
    for cut in (1, 4, 7):
        first = make(damaged, True, mode=mode, seed=9)
        it = iter(first)
        for _ in range(cut):
            next(it)
        state = json.loads(json.dumps(first.state_dict()))
        first.close()
        second = make(damaged, True, mode=mode, seed=9, chunk_batches=3)
        second.load_state_dict(state)
        rest = record(second, epochs=1)
        assert_same((full[0][cut:], full[1][cut:], rest[2]), rest)


def test_the_verdicts_of_the_next_chunk_are_queued_before_this_ones_are_waited_for(clean):
    """Clean data, the count known, room in the ring for every chunk of the epoch: each
    chunk's verdict wait comes after the next chunk's verdicts were queued, but for the
    epoch's last chunk (the next epoch's first is staged after it); and the build of a chunk
    follows its own wait, also with windows at documents (``align="bos"``, whose next start
    the index predicts as well). One chunk at a time (overlap off), every wait follows its
    own chunk's verdicts at once."""
    for overlap, align in ((True, None), (False, None), (True, "bos")):
        loader = make(clean, overlap, mode="packed", backend="cuda", prefetch=32, align=align)
        engine, log = loader.engine, []
        submit, wait = engine.submit_verdicts, engine.read_verdicts

        def submitted(staged, slot, vocab, _real=submit):
            log.append(("submit", slot.index))
            return _real(staged, slot, vocab)

        def waited(slot, n, _real=wait):
            log.append(("wait", slot.index))
            return _real(slot, n)

        engine.submit_verdicts, engine.read_verdicts = submitted, waited
        want = len(loader)  # the count is known before the first chunk
        assert sum(1 for _ in loader) == want
        loader.close()
        waits = [i for i, (what, _) in enumerate(log) if what == "wait"]
        submits = [i for i, (what, _) in enumerate(log) if what == "submit"]
        # the k-th wait is preceded by k + 2 submits when the next chunk was staged ahead
        overlapped = sum(1 for k, at in enumerate(waits)
                         if sum(1 for s in submits if s < at) >= k + 2)
        if overlapped == 0:
            assert not overlap
            assert all(log[at - 1] == ("submit", log[at][1]) for at in waits)
        else:
            assert overlap
            # all but the epoch's last chunk, and the next epoch's chunks the close cut
            assert overlapped >= len(waits) - 3 and len(waits) >= 8
            assert loader.counters.ahead_dropped <= 1  # clean data: every guess holds


@pytest.mark.parametrize("slots", [2, 3])
@pytest.mark.parametrize("mode", ["padded", "packed"])
def test_the_chunk_in_flight_keeps_its_shards_in_a_small_device_arena(tiny, mode, slots):
    """Room for 2 or 3 of 24 shards, unshuffled: a chunk staged ahead must not evict a shard the
    chunk before still has to build from (its build is queued after the next chunk's
    verdicts); where there is no room beside it, no chunk is staged ahead. The batches are the
    CPU's."""
    size = max(p.stat().st_size for p in tiny.glob("*.ndp"))
    kw = dict(mode=mode, shuffle=False, chunk_batches=2)
    loader = make(tiny, True, backend="cuda", device_budget=slots * (-(-size // 256) * 256),
                  **kw)
    got = record(loader)
    assert_same(got, record(make(tiny, False, **kw)))
    assert loader.counters.shard_copies >= 2 * 24
    assert loader.counters.staged_ahead > 0
