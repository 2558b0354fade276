"""On a real GPU: the CUDA decoder at sizes that straddle block and grid boundaries, the types
it launches with, the DLPack handoff to torch and CuPy on their own streams, and a memcheck run
over hostile input. Skipped (with the reason) where no CUDA device can be used."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ndp.engine.decoder import CpuDecoder
from ndp.engine.cuda_decoder import CudaDecoder

from ndp_test_helpers import build_stream, ramp_mask

pytestmark = pytest.mark.gpu

HOSTILE_RUN = Path(__file__).parents[1] / "kernels" / "hostile_run.py"


def big_stream(n_packets: int, seed: int = 0):
    """``n_packets`` ramp-like packets of 0..1100 tokens, mixed widths and masks, with every
    seventh packet corrupted; token ``i`` of packet ``k`` is ``(k * 7919 + i) % 60000``."""
    from ndp.wire.packet import encode_tokens

    rng = np.random.default_rng(seed)
    packets = []
    for k in range(n_packets):
        n = int(rng.integers(0, 1100))
        tokens = (k * 7919 + np.arange(n)) % 60000
        width = 2 if k % 3 else 4
        mask = ramp_mask(n, k) if k % 4 == 1 else None
        p = bytearray(encode_tokens(tokens, width=width, mask=mask))
        if k % 7 == 3:
            p[int(rng.integers(0, len(p)))] ^= 0x10
        packets.append(bytes(p))
    return build_stream(packets, header=True)


def host(array) -> np.ndarray:
    """A NumPy copy of a device array; host arrays (status, rows, lengths) as they are."""
    return array if isinstance(array, np.ndarray) else array.copy_to_host()


def assert_equal_padded(gpu, cpu):
    for name in ("input_ids", "labels", "attention_mask", "lengths", "status", "rows"):
        np.testing.assert_array_equal(host(getattr(gpu, name)), getattr(cpu, name),
                                      err_msg=name)
    assert gpu.stats == cpu.stats


@pytest.mark.parametrize("n_packets", [1, 255, 256, 257, 4097])
@pytest.mark.parametrize("max_len", [1, 255, 256, 257, 1031])
def test_padded_at_block_boundaries(n_packets, max_len):
    stream = big_stream(n_packets, seed=n_packets)
    dec, cpu = CudaDecoder(), CpuDecoder()
    for source in (stream.array, dec.resident(stream.array)):
        assert_equal_padded(dec.decode_padded(source, stream.offsets, seq_len=max_len),
                            cpu.decode_padded(stream.array, stream.offsets, seq_len=max_len))


@pytest.mark.parametrize("batch_size,seq_len,start", [(1, 1, 0), (64, 1024, 5), (7, 4097, 1000),
                                                      (None, 2048, 0)])
def test_packed_at_block_boundaries(batch_size, seq_len, start):
    stream = big_stream(3000, seed=7)
    dec, cpu = CudaDecoder(), CpuDecoder()
    want = cpu.decode_packed(stream.array, stream.offsets, batch_size=batch_size,
                             seq_len=seq_len, start=start)
    for source in (stream.array, dec.resident(stream.array)):
        got = dec.decode_packed(source, stream.offsets, batch_size=batch_size, seq_len=seq_len,
                                start=start)
        np.testing.assert_array_equal(got.x.copy_to_host(), want.x)
        np.testing.assert_array_equal(got.y.copy_to_host(), want.y)
        assert got.stats == want.stats


def test_kernels_launch_only_with_the_signatures_compiled_to_ptx(tmp_path):
    import importlib

    from numba.core import sigutils

    import ndp
    from ndp.kernels import CUDA_MODULES

    stream = big_stream(300)
    dec = CudaDecoder()
    dec.decode_padded(stream.array, stream.offsets, seq_len=64)
    dec.decode_packed(dec.resident(stream.array), stream.offsets, batch_size=2, seq_len=64)
    (tmp_path / "s.ndp").write_bytes(stream.data)
    for mode in ("padded", "packed", "packing"):  # the Loader launches the packing kernel
        with ndp.Loader(tmp_path, mode=mode, batch_size=4, seq_len=64, backend="cuda",
                        manifest="ignore") as loader:  # a bare shard: no ndp.json
            next(iter(loader))
    for module in map(importlib.import_module, CUDA_MODULES):
        for name, (kernel, sigs) in module.SIGNATURES.items():
            expected = {sigutils.normalize_signature(s)[0] for s in sigs}
            assert set(kernel.overloads) <= expected, name
            assert kernel.overloads, f"{name} was never launched"


def test_torch_takes_batches_on_its_own_stream():
    torch = pytest.importorskip("torch")
    stream = big_stream(500)
    dec, cpu = CudaDecoder(ring=2), CpuDecoder()
    want = cpu.decode_padded(stream.array, stream.offsets, seq_len=300)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        batch = dec.decode_padded(stream.array, stream.offsets, seq_len=300)
        ids = torch.from_dlpack(batch.input_ids)
        total = (ids * 3).sum()  # queued on the side stream, ordered after ndp's kernels
        assert side.cuda_stream in batch.input_ids._consumers.streams
        # two more batches reuse the ring: the reuse waits for the work queued on `side`
        dec.decode_padded(stream.array, stream.offsets[:10], seq_len=300)
        dec.decode_padded(stream.array, stream.offsets[:10], seq_len=300)
    side.synchronize()
    assert ids.is_cuda and ids.dtype == torch.int64
    assert int(total) == int(want.input_ids.sum()) * 3


def test_cupy_takes_batches_through_dlpack():
    cupy = pytest.importorskip("cupy")
    stream = big_stream(100)
    batch = CudaDecoder().decode_packed(stream.array, stream.offsets, batch_size=4, seq_len=128)
    want = CpuDecoder().decode_packed(stream.array, stream.offsets, batch_size=4, seq_len=128)
    np.testing.assert_array_equal(cupy.from_dlpack(batch.x).get(), want.x)


@pytest.mark.skipif(not shutil.which("compute-sanitizer"), reason="compute-sanitizer not found")
def test_memcheck_is_clean_on_hostile_input():
    proc = subprocess.run(
        # --report-api-errors no: the CUDA bindings probe driver entry points
        # (cuGetProcAddress_v2 -> CUDA_ERROR_INVALID_VALUE) on purpose; those are not memory
        # errors, and with them reported the run fails 34 times on a clean H100 run
        ["compute-sanitizer", "--tool", "memcheck", "--report-api-errors", "no",
         "--error-exitcode", "9", sys.executable, str(HOSTILE_RUN)],
        capture_output=True, text=True, timeout=1200,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "ERROR SUMMARY: 0 errors" in out
    assert "equal to the CPU" in out


def test_small_decodes_print_no_low_occupancy_warnings():
    """ndp sizes its grids on purpose; Numba's 'Grid size 1 will likely result in GPU
    under-utilization' was printed dozens of times per run."""
    import warnings

    stream = big_stream(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dec = CudaDecoder()
        dec.decode_padded(stream.array, stream.offsets, seq_len=16)
        dec.decode_packed(stream.array, stream.offsets, batch_size=1, seq_len=8)


def test_the_first_decode_after_a_resident_copy_sees_the_whole_shard():
    """F4 on a device: a large shard made resident and decoded at once, from its tail (what a
    copy still landing on another stream would get wrong), 20 times over, equals the CPU's."""
    stream = big_stream(60000, seed=11)  # ~50 MB
    tail = stream.offsets[-4096:]
    want = CpuDecoder().decode_padded(stream.array, tail, seq_len=1031)
    for _ in range(20):
        dec = CudaDecoder()
        got = dec.decode_padded(dec.resident(stream.array), tail, seq_len=1031)
        assert_equal_padded(got, want)


def test_a_torch_consumer_on_its_own_stream_reads_its_batch_not_the_next(tmp_path):
    """F7/F8 on a device: with torch's current stream a side stream that is kept busy, every
    batch's sum, taken on that stream, equals the CPU backend's (no batch is overwritten or
    read before its chunk is built, however far the producer runs ahead)."""
    import torch

    import ndp

    stream = big_stream(3000, seed=5)
    root = tmp_path
    (root / "s.ndp").write_bytes(stream.data)
    kw = dict(mode="packed", batch_size=4, seq_len=256, seed=1, chunk_batches=4,
              manifest="ignore")
    want = [int(b["x"].sum()) for b in ndp.Loader(root, backend="cpu", **kw)]
    side = torch.cuda.Stream()
    sums = []
    with torch.cuda.stream(side):
        for b in ndp.Loader(root, backend="cuda", **kw):
            torch.cuda._sleep(200_000)  # the consumer's work lags its host loop
            sums.append(b["x"].sum())
    side.synchronize()
    assert [int(s) for s in sums] == want


@pytest.mark.parametrize("mode", ["padded", "packed", "packing"])
def test_a_loader_of_long_packets_gives_the_cpus_batches(tmp_path, mode):
    """Packets of 900-1,100 tokens (2-4 KB) take the verdicts of several threads a packet
    (``verdict_cuda.verdicts_lanes_cuda``, 8 or 16 lanes); every seventh packet has a flipped
    byte, CRC-Drop adds more: batches and counts equal the CPU backend's, resident or not."""
    import ndp
    from ndp.engine import cuda as cuda_engine
    from ndp.wire.packet import encode_tokens

    from ndp_test_helpers import write_shards

    rng = np.random.default_rng(3)
    packets = []
    for k in range(600):
        n = int(rng.integers(900, 1100))
        p = bytearray(encode_tokens((k * 7919 + np.arange(n)) % 60000, width=2 if k % 3 else 4,
                                    mask=ramp_mask(n, k) if k % 4 == 1 else None))
        if k % 7 == 3:
            p[int(rng.integers(0, len(p)))] ^= 0x10
        packets.append(bytes(p))
    write_shards(tmp_path, packets, max_shard_bytes=256 << 10)
    lanes = []
    real = cuda_engine.CudaEngine.verdict_lanes

    def spy(self, staged):
        lanes.append(real(self, staged))
        return lanes[-1]

    kw = dict(mode=mode, batch_size=8, seq_len=1104, seed=4, crc_drop_rate=0.05,
              output="arrays")
    with ndp.Loader(tmp_path, backend="cpu", **kw) as cpu:
        want = [{k: v.copy() for k, v in b.items()} for b in cpu]
        want_stats = cpu.stats.as_dict()
    for resident in (False, True):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(cuda_engine.CudaEngine, "verdict_lanes", spy)
            with ndp.Loader(tmp_path, backend="cuda", resident=resident, **kw) as gpu:
                got = [{k: host(v).copy() for k, v in b.items()} for b in gpu]
                got_stats = gpu.stats.as_dict()
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a.keys() == b.keys()
            for name in a:
                np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        for d in (got_stats, want_stats):
            d.pop("wait_seconds", None)
        assert got_stats == want_stats and want_stats["corrupt"].get("BAD_CRC", 0) > 0
    assert lanes and set(lanes) <= {8, 16}
