"""Accounting of the decode path (ndp.engine.counters): what the CUDA backend does per batch, pinned
by counts rather than timings, so the fixed per-call cost that made the GPU path slow cannot creep
back. Runs under Numba's CUDA simulator without a GPU (the counts are the same on a device).

A Loader at its default chunk size (64 batches on the CUDA backend), over whole epochs, for each
mode, from host memory (shards through the device arena) and resident: per batch at most 0.1
kernel launches, 0.05 host waits, 0.05 device-to-host copies and 0.1 host-to-device copies, and
one DLPack export per output per chunk (what lets the ring see whether a chunk's batches are
still held, ``ndp.loader.pipeline.serve``), never one per batch.
"""

from __future__ import annotations

import numpy as np
import pytest

from ndp.engine.counters import Counters
from ndp.engine.cpu import OUTPUTS
from ndp.loader.loader import Loader

from ndp_test_helpers import ramp_specs, write_shards

BOUNDS = {"launches": 0.1, "host_waits": 0.05, "d2h_copies": 0.05, "h2d_copies": 0.1}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """900 short ramp packets in 3 shards: a few hundred small batches per epoch."""
    d = tmp_path_factory.mktemp("accounting")
    lengths = [int(x) for x in np.random.default_rng(9).integers(1, 12, 900)]
    packets = [s.encode() for s in ramp_specs(lengths)]
    for i in range(0, 900, 300):
        write_shards(d, packets[i: i + 300], prefix=f"s{i}")
    return d


def _epoch(loader: Loader) -> int:
    return sum(1 for _ in loader)


@pytest.mark.parametrize("resident", [False, True])
@pytest.mark.parametrize("mode,batch_size,seq_len", [("padded", 2, 8), ("packed", 2, 6),
                                                     ("packing", 2, 16)])
def test_device_work_per_batch_is_bounded_over_whole_epochs(corpus, mode, batch_size, seq_len,
                                                            resident):
    loader = Loader(corpus, mode=mode, batch_size=batch_size, seq_len=seq_len, backend="cuda",
                    resident=resident, seed=1, output="torch")
    assert loader.chunk_batches == 64
    first = _epoch(loader)  # slots allocated and wrapped, shards copied
    assert first > 3 * 64  # several chunks per epoch
    loader.close()  # the producer stops: what it did is what the consumer took, or a little more
    before = loader.counters.as_dict()
    batches = sum(_epoch(loader) for _ in range(2))
    loader.close()
    steady = loader.counters.since(before)
    made = steady["batches"]
    assert made >= batches
    for name, bound in BOUNDS.items():
        assert steady[name] / made <= bound, (name, steady)
    n_outputs = len(OUTPUTS[mode])
    assert 0 < steady["dlpack_exports"] <= steady["chunks"] * n_outputs, steady  # per chunk
    assert steady["held_chunks"] == 0  # a loop that drops its batches never costs new buffers
    assert steady["shard_copies"] == 0  # every shard of this corpus stays in the arena
    total = loader.counters
    assert total.shard_copies == 3  # each shard copied once, whole


def test_documents_cost_one_launch_and_two_copies_a_chunk(corpus):
    """``documents=True`` (``ndp.loader.layouts.documents``): one more kernel (``position_ids`` and
    ``document_ids`` from the documents' starts) and two more copies (those starts, and the
    ``cu_seqlens``) per chunk, on the CPU backend one more kernel call."""
    counts = {}
    for documents in (False, True):
        for backend in ("cuda", "cpu"):
            loader = Loader(corpus, mode="packed", batch_size=2, seq_len=6, backend=backend,
                            seed=1, output="arrays", resident=True, documents=documents)
            _epoch(loader)
            loader.close()
            before = loader.counters.as_dict()
            _epoch(loader)
            loader.close()
            counts[documents, backend] = loader.counters.since(before)
    for backend, copies in (("cuda", 2), ("cpu", 0)):
        plain, docs = counts[False, backend], counts[True, backend]
        assert min(plain["chunks"], docs["chunks"]) > 3  # as far as each producer got

        def per_chunk(c: dict, name: str) -> float:
            return c[name] / c["chunks"]
        assert per_chunk(docs, "launches") == per_chunk(plain, "launches") + 1
        assert per_chunk(docs, "h2d_copies") == per_chunk(plain, "h2d_copies") + copies
        assert per_chunk(docs, "d2h_copies") == per_chunk(plain, "d2h_copies")
        assert per_chunk(docs, "host_waits") == per_chunk(plain, "host_waits")


def test_the_cpu_backend_counts_its_kernel_calls(corpus):
    loader = Loader(corpus, mode="padded", batch_size=4, seq_len=8, backend="cpu",
                    chunk_batches=8, output="arrays")
    batches = _epoch(loader)
    loader.close()
    c = loader.counters
    assert c.batches >= batches and c.launches == 2 * c.chunks  # verdicts, then one build
    assert c.host_waits == c.h2d_copies == c.d2h_copies == c.dlpack_exports == 0


def test_per_batch_and_since():
    c = Counters(chunks=2, batches=128, launches=4, host_waits=2)
    assert c.per_batch()["launches"] == 4 / 128 and "batches" not in c.per_batch()
    before = c.as_dict()
    c.launches += 3
    assert c.since(before)["launches"] == 3 and c.since(before)["host_waits"] == 0


@pytest.mark.parametrize("documents", (False, True))
def test_windows_at_documents_cost_no_launch_nor_copy(corpus, documents):
    """``align="bos"`` (``ndp.loader.layouts.align``): each window's start travels with the plan's
    one copy (and with the documents' starts), so a chunk costs the launches, copies and host
    waits of unaligned windows on both backends."""
    counts = {}
    for align in (None, "bos"):
        for backend in ("cuda", "cpu"):
            loader = Loader(corpus, mode="packed", batch_size=2, seq_len=6, backend=backend,
                            seed=1, output="arrays", resident=True, documents=documents,
                            align=align)
            _epoch(loader)
            loader.close()
            before = loader.counters.as_dict()
            _epoch(loader)
            loader.close()
            counts[align, backend] = loader.counters.since(before)
    for backend in ("cuda", "cpu"):
        plain, aligned = counts[None, backend], counts["bos", backend]
        assert min(plain["chunks"], aligned["chunks"]) > 3
        for name in ("launches", "h2d_copies", "d2h_copies", "host_waits"):
            assert (aligned[name] / aligned["chunks"] == plain[name] / plain["chunks"]), name
