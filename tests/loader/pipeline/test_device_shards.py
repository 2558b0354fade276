"""The GPU's stage (ndp.loader.pipeline.device_shards) under Numba's simulator: what a chunk reads from the
files, and the index check it makes as shards pass through the bounce buffers.

An index matched by size alone is checked against its packets' headers once, when the shard is
first copied, from the bytes on their way to the device: a steady loop reads nothing from the
files per chunk (it once pread 6 bytes per packet of every chunk, resident shards included), and
an index that lies about a packet's header still stops the loader before that packet is used.
RAMP data: packet k holds tokens k*1000 + arange(n).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from ndp.errors import IndexMismatchError
from ndp.loader.pipeline.device_shards import _PIECE
from ndp.loader.loader import Loader
from ndp.store.files import FILES
from ndp.wire.format import Typ

from ndp_test_helpers import ramp_specs, write_shards

LENGTHS = [int(x) for x in np.random.default_rng(5).integers(1, 30, 240)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """240 ramp packets in 3 shards of 80."""
    d = tmp_path_factory.mktemp("device-shards")
    packets = [s.encode() for s in ramp_specs(LENGTHS)]
    for i in range(0, 240, 80):
        write_shards(d, packets[i: i + 80], prefix=f"s{i:03d}")
    return d


@pytest.fixture
def ranges_read(monkeypatch):
    """Every range read from a shard file through ndp's file pool (one pread(2) each, or a
    few for a short read), counted."""
    seen = {"calls": 0, "ranges": 0}
    real = FILES.read_ranges

    def counting(path, identity, offsets, sizes, dst, starts):
        seen["calls"] += 1
        seen["ranges"] += int(np.asarray(offsets).shape[0])
        return real(path, identity, offsets, sizes, dst, starts)

    monkeypatch.setattr(FILES, "read_ranges", counting)
    return seen


@pytest.mark.parametrize("resident", [False, True])
@pytest.mark.parametrize("mode", ["padded", "packed", "packing"])
def test_a_steady_loop_reads_nothing_from_the_files_and_makes_no_event(corpus, ranges_read,
                                                                       mode, resident):
    """verify="size" (the default): the first epoch reads each shard once, in pieces, and
    checks its headers from those bytes; the next epochs read nothing (the arena holds all
    three shards) and make no CUDA event: a slot's events are made once and reused."""
    loader = Loader(corpus, mode=mode, batch_size=2, seq_len=8, backend="cuda", seed=2,
                    resident=resident, chunk_batches=4, output="arrays")
    sizes = [s.size for s in loader.corpus.shards]
    assert sum(1 for _ in loader) > 8  # several chunks
    pieces = sum(-(-size // _PIECE) for size in sizes)
    # whole shards, piece by piece, plus at most one header cut by a bounce buffer's end each
    assert ranges_read["ranges"] <= pieces + len(sizes)
    loader.close()
    before = dict(ranges_read)
    counts = loader.counters.as_dict()
    batches = sum(sum(1 for _ in loader) for _ in range(2))
    loader.close()
    steady = loader.counters.since(counts)
    assert steady["chunks"] >= 4 and steady["batches"] >= batches
    assert ranges_read == before  # not one pread per chunk, nor per packet
    assert steady["events_created"] == 0 and steady["shard_copies"] == 0


def _lying_copy(corpus, tmp_path):
    """A copy of ``corpus`` whose second index says packet 4 of that shard has another TYP
    (its size and crc32 still match: verify="size" takes it)."""
    from ndp.store.index import read_index, write_index

    lying = tmp_path / "lying"
    shutil.copytree(corpus, lying)
    idx = sorted(lying.glob("*.idx"))[1]
    index = read_index(idx)
    entries = index.entries.copy()
    entries["typ"][4] = int(Typ.FLOAT16)
    write_index(idx, entries, index.shard_size, index.shard_crc32, index.data_offset)
    return lying


@pytest.mark.parametrize("resident", [False, True])
def test_an_index_that_lies_about_a_header_stops_the_gpu_loader(corpus, tmp_path, resident):
    """The lie is found when its shard is copied (at construction for resident shards), named
    by its index and entry; every batch delivered before it is the intact dataset's."""
    lying = _lying_copy(corpus, tmp_path)
    kw = dict(mode="padded", batch_size=2, seq_len=8, backend="cuda", seed=2,
              resident=resident, chunk_batches=4, output="arrays")
    want = [{k: np.array(v.copy_to_host()) for k, v in b.items()}
            for b in Loader(corpus, **kw)]
    got = []
    with pytest.raises(IndexMismatchError, match=r"s080.*\.idx: entry 4 .*disagrees"):
        loader = Loader(lying, **kw)
        for b in loader:
            got.append({k: np.array(v.copy_to_host()) for k, v in b.items()})
    assert len(got) < len(want)
    for x, y in zip(got, want):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


def test_a_chunks_distinct_shards_are_np_uniques():
    """``distinct`` (the shards a chunk needs, counted rather than sorted where they span
    little) gives what ``np.unique`` gives, for dense and for sparse shard numbers."""
    from ndp.loader.pipeline.device_shards import distinct

    rng = np.random.default_rng(0)
    for top in (1, 13, 5000, 10**7):
        ids = rng.integers(0, top, 4096)
        got = distinct(ids)
        assert np.array_equal(got, np.unique(ids)) and got.dtype == np.int64
    assert distinct(np.zeros(0, np.int64)).shape == (0,)


def test_a_chunks_plan_is_each_packets_place_and_limit_in_the_arena():
    """``_stage_plan`` (one compiled pass) gives what the numpy passes gave: each packet's
    offset plus its shard's slot's base, then its shard's end in the arena, for offsets as the
    index holds them (a uint64 field) or as int64, and any dtype of shard numbers."""
    from ndp.loader.pipeline.device_shards import _stage_plan
    from ndp.wire.format import INDEX_ENTRY_DTYPE

    rng = np.random.default_rng(2)
    sizes = rng.integers(100, 10_000, 9).astype(np.int64)
    slot_of = rng.permutation(9).astype(np.int64)
    slot_base = np.arange(9, dtype=np.int64) * 10_000 + 64
    entries = np.zeros(500, INDEX_ENTRY_DTYPE)
    entries["offset"] = rng.integers(0, 100, 500)
    for shards in (rng.integers(0, 9, 500), rng.integers(0, 9, 500).astype(np.int32)):
        base = slot_base[slot_of[shards]]
        want = np.concatenate([entries["offset"].astype(np.int64) + base,
                               base + sizes[shards]])
        for offsets in (entries["offset"], entries["offset"].astype(np.int64)):
            got = np.full(1000, -1, np.int64)
            _stage_plan(offsets, shards, slot_of, slot_base, sizes, got)
            np.testing.assert_array_equal(got, want)
