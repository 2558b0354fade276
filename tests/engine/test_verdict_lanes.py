"""Which verdict kernel a chunk gets on a GPU: long packets several threads each
(``verdict_cuda.verdicts_lanes_cuda``), by the mean packet size its stage reports."""

from __future__ import annotations

import numpy as np

import ndp
from ndp.engine import cuda as cuda_engine
from ndp.engine.cpu import Staged
from ndp.kernels import verdict_cuda
from ndp.wire.format import FRAME_BYTES
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import write_shards


def test_the_engine_gives_long_packets_lanes_by_their_mean_size(monkeypatch):
    pick = cuda_engine.CudaEngine.verdict_lanes
    monkeypatch.setattr(cuda_engine, "simulated", lambda: True)
    assert pick(None, Staged(None, None, None, 10, packet_bytes=41_060)) == 1  # one-thread blocks
    monkeypatch.setattr(cuda_engine, "simulated", lambda: False)
    assert pick(None, Staged(None, None, None, 10, packet_bytes=41_060)) == 32  # 4 KB each
    assert pick(None, Staged(None, None, None, 10, packet_bytes=400)) == 1
    assert pick(None, Staged(None, None, None, 10)) == 1  # size not known: one thread each
    assert pick(None, Staged(None, None, None, 0, packet_bytes=0)) == 1


def test_a_gpu_loaders_stage_reports_its_packets_mean_size(tmp_path, monkeypatch):
    """The device stage knows no packet's size without reading it: it reports the corpus's
    mean (shard bytes over packets), which for packets of one size is theirs."""
    packets = [encode_tokens(np.arange(k, k + 300), width=4) for k in range(40)]
    write_shards(tmp_path, packets)
    seen = []
    real = cuda_engine.CudaEngine.submit_verdicts

    def spy(self, staged, slot, vocab):
        seen.append((staged.packet_bytes, staged.n))
        return real(self, staged, slot, vocab)

    monkeypatch.setattr(cuda_engine.CudaEngine, "submit_verdicts", spy)
    with ndp.Loader(tmp_path, mode="padded", batch_size=4, seq_len=300, backend="cuda",
                    output="arrays", shuffle=False) as loader:
        next(iter(loader))
    size = FRAME_BYTES + 4 * 300
    assert seen and all(abs(b / n - size) < 2 for b, n in seen)  # a shard header's few bytes
    assert verdict_cuda.lanes_for(size) == 8  # 1,208 bytes: 8 lanes of 151


def test_a_loaders_long_packets_through_the_lanes_kernel_give_the_cpus_batches(tmp_path,
                                                                               monkeypatch):
    """The engine's launch of ``verdicts_lanes_cuda`` under the simulator (which would give a
    chunk one thread a packet; here it is made to take the lanes a GPU takes): packets of
    900-1,100 tokens, every seventh with a flipped byte, CRC-Drop on; batches and counts equal
    the CPU's. ``tests/engine/test_gpu_device.py`` runs every mode on a device."""
    rng = np.random.default_rng(3)
    packets = []
    for k in range(40):
        n = int(rng.integers(900, 1100))
        p = bytearray(encode_tokens((k * 7919 + np.arange(n)) % 60000, width=2 if k % 3 else 4))
        if k % 7 == 3:
            p[int(rng.integers(0, len(p)))] ^= 0x10
        packets.append(bytes(p))
    write_shards(tmp_path, packets, max_shard_bytes=70 << 10)
    used = []

    def lanes(self, staged):
        used.append(verdict_cuda.lanes_for(staged.packet_bytes / staged.n))
        return used[-1]

    kw = dict(mode="packed", batch_size=4, seq_len=256, seed=4, crc_drop_rate=0.05,
              output="arrays")
    with ndp.Loader(tmp_path, backend="cpu", **kw) as cpu:
        want = [b["x"].copy() for b in cpu]
        want_stats = cpu.stats.as_dict()
    monkeypatch.setattr(cuda_engine.CudaEngine, "verdict_lanes", lanes)
    with ndp.Loader(tmp_path, backend="cuda", **kw) as gpu:
        got = [b["x"].copy_to_host() for b in gpu]
        got_stats = gpu.stats.as_dict()
    np.testing.assert_array_equal(np.stack(got), np.stack(want))
    for d in (got_stats, want_stats):
        d.pop("wait_seconds")
    assert got_stats == want_stats and want_stats["corrupt"].get("BAD_CRC", 0) > 0
    assert used and set(used) == {16}  # about 2.7 KB a packet
