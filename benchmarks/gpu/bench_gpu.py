"""GPU decode calls against CPU decode, in tokens/s delivered as ready torch tensors on the GPU.

This measures the batch-by-batch decoder API (``ndp.Decoder``), whose every call pays one host
wait; ``bench_gpu_loader.py`` measures the Loader, which decodes chunks of many batches per
call and is what a training loop uses.

    python benchmarks/gpu/bench_gpu.py            # on a machine with a CUDA GPU (a few minutes)
    python benchmarks/gpu/bench_gpu.py --quick    # smaller shard
    python benchmarks/gpu/bench_gpu.py --out benchmarks/results   # adds to the project's record

In one run, on one synthetic shard of full-length packets (CRC on, so every token is validated):

* ``gpu_host``: GPU decode from host memory: each call's packets are gathered into pinned
  memory, copied to the device, validated and built there;
* ``gpu_resident``: GPU decode of a shard copied to the device once;
* ``cpu_copy``: the baseline, CPU decode (every core) then a copy of the int64 tensors to the GPU.

Each runs the padded (SFT) and packed (pretraining) layouts the way a training loop consumes
them: the next chunk is submitted before the current one is taken (``ring`` slots in flight),
and the consumer's ``next()`` (take the batch, wrap it as torch tensors) is timed on its own for
p50/p99. Alongside: host CPU time per billion tokens (process CPU time: every thread), peak
device memory, and the physical limits measured in the same run (pinned host-to-device and
device-to-device copy bandwidth). JSON goes to ``gpu-<time>.json`` in ``--out`` (default
``$NDP_RESULTS_DIR``, else ``./ndp-results``), with the device and versions.

``--smoke`` runs a tiny shard through the same code under Numba's CUDA simulator (set
NUMBA_ENABLE_CUDASIM=1): figures from it mean nothing and are marked ``simulated``; the test
suite uses it so this script cannot rot on machines without a GPU.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cpu.bench_cpu import synthetic_shard  # noqa: E402
from harness import add_out_argument, command, machine, write_report  # noqa: E402

from ndp.adapters.torch import to_torch  # noqa: E402
from ndp.engine.backend import simulated  # noqa: E402
from ndp.engine.decoder import CpuDecoder  # noqa: E402
from ndp.engine.device import device_memory_info  # noqa: E402
from ndp.engine.cuda_decoder import CudaDecoder  # noqa: E402

TARGETS = {"gpu_host_tokens_per_s": 5e9, "gpu_resident_tokens_per_s": 50e9, "next_p50_us": 20.0}


def device_info() -> dict:
    if simulated():
        return {"name": "Numba CUDA simulator", "simulated": True}
    from numba import cuda

    dev = cuda.get_current_device()
    free, total = device_memory_info()
    info = {"name": dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name),
            "compute_capability": list(dev.compute_capability),
            "multiprocessors": dev.MULTIPROCESSOR_COUNT, "memory_gb": round(total / 2**30, 1),
            "simulated": False}
    try:
        import cupy

        info["driver_version"] = cupy.cuda.runtime.driverGetVersion()
        info["runtime_version"] = cupy.cuda.runtime.runtimeGetVersion()
        info["cupy"] = cupy.__version__
    except Exception:  # noqa: BLE001 - optional detail
        pass
    try:
        import numba_cuda

        info["numba_cuda"] = numba_cuda.__version__
    except Exception:  # noqa: BLE001
        pass
    return info


def physical_limits(nbytes: int) -> dict:
    """Pinned H2D and D2D copy bandwidth, best of 5, timed with CUDA events."""
    if simulated():
        return {}
    import cupy
    import cupyx

    host = cupyx.empty_pinned((nbytes,), dtype=np.uint8)
    host[:] = 1
    dev = cupy.empty(nbytes, dtype=np.uint8)
    dev2 = cupy.empty(nbytes, dtype=np.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)

    def timed(fn) -> float:
        best = float("inf")
        for _ in range(6):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            fn()
            end.record(stream)
            end.synchronize()
            best = min(best, cupy.cuda.get_elapsed_time(start, end) / 1e3)
        return best

    h2d = timed(lambda: dev.set(host, stream=stream))
    d2d = timed(lambda: dev2.data.copy_from_device_async(dev.data, nbytes, stream=stream))
    return {"bytes": nbytes, "h2d_pinned_gb_per_s": nbytes / h2d / 1e9,
            "d2d_gb_per_s": 2 * nbytes / d2d / 1e9}  # D2D reads and writes every byte


class Meter:
    """Wall time, process CPU time, consumer-side next() latencies and peak device memory."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.tokens = 0
        self.min_free = device_memory_info()[0]
        self.free_before = self.min_free
        self.wall = self.cpu = 0.0

    def __enter__(self) -> Meter:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self._wall
        self.cpu = time.process_time() - self._cpu

    def sample_memory(self) -> None:
        self.min_free = min(self.min_free, device_memory_info()[0])

    def result(self) -> dict:
        lat = np.array(self.latencies) * 1e6
        return {
            "tokens": self.tokens, "seconds": self.wall,
            "tokens_per_s": self.tokens / self.wall if self.wall else 0.0,
            "host_cpu_s_per_billion_tokens": self.cpu / self.tokens * 1e9 if self.tokens else None,
            "next_p50_us": float(np.percentile(lat, 50)) if lat.size else None,
            "next_p99_us": float(np.percentile(lat, 99)) if lat.size else None,
            "batches": int(lat.size),
            "peak_device_bytes": int(self.free_before - self.min_free),
        }


def _sync_torch() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_gpu(source, dec: CudaDecoder, chunks: list[np.ndarray], layout: str, seq: int) -> dict:
    """The pipelined loop: submit chunk i+1 before taking chunk i, as a prefetching loader does."""
    meter = Meter()

    def submit(offs):
        if layout == "padded":
            return dec.submit_padded(source, offs, seq_len=seq)
        # packed: all whole windows of the chunk's stream (decode_packed waits for the length)
        batch = dec.decode_packed(source, offs, batch_size=None, seq_len=seq)
        return _Ready(batch)

    with meter:
        pending = submit(chunks[0])
        for i in range(len(chunks)):
            nxt = submit(chunks[i + 1]) if i + 1 < len(chunks) else None
            t = time.perf_counter()
            batch = pending.result()  # the consumer's next(): take the batch ...
            tensors = to_torch(batch)  # ... as torch tensors on the device
            meter.latencies.append(time.perf_counter() - t)
            meter.tokens += batch.stats.tokens
            del tensors
            if i % 16 == 0:
                meter.sample_memory()
            pending = nxt
        dec.synchronize()
        _sync_torch()
    return meter.result()


class _Ready:
    def __init__(self, value) -> None:
        self.value = value

    def result(self):
        return self.value


def run_cpu_copy(data, chunks: list[np.ndarray], layout: str, seq: int) -> dict:
    """CPU decode into reused buffers, then the int64 tensors copied to the GPU."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dec = CpuDecoder()
    meter = Meter()
    with meter:
        for i, offs in enumerate(chunks):
            t = time.perf_counter()
            if layout == "padded":
                batch = dec.decode_padded(data, offs, seq_len=seq)
            else:
                batch = dec.decode_packed(data, offs, batch_size=None, seq_len=seq)
            tensors = {k: v.to(device) for k, v in to_torch(batch).items()}
            meter.latencies.append(time.perf_counter() - t)
            meter.tokens += batch.stats.tokens
            del tensors
            if i % 16 == 0:
                meter.sample_memory()
        _sync_torch()
    return meter.result()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smaller shard")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny run for the test suite (under NUMBA_ENABLE_CUDASIM=1)")
    ap.add_argument("--packets", type=int, default=None, help="packets in the shard")
    ap.add_argument("--seq", type=int, default=1024, help="tokens per packet and row length")
    ap.add_argument("--chunk", type=int, default=4096, help="packets per decode call")
    ap.add_argument("--width", type=int, default=4, choices=(2, 4), help="bytes per token")
    ap.add_argument("--ring", type=int, default=3)
    add_out_argument(ap)
    args = ap.parse_args(argv)
    if args.smoke:
        args.packets, args.seq, args.chunk = args.packets or 24, min(args.seq, 16), 8
    n_packets = args.packets or (32_768 if args.quick else 262_144)
    if not simulated():
        from ndp.engine.backend import cuda_unavailable_reason

        reason = cuda_unavailable_reason()
        if reason is not None:
            print(f"bench_gpu needs a CUDA GPU: {reason}", file=sys.stderr)
            return 2

    data, offsets = synthetic_shard(n_packets, args.seq, args.width, masked=False)
    chunks = [offsets[i: i + args.chunk] for i in range(0, n_packets, args.chunk)]
    # packed chunks overlap by nothing; each decodes every whole window its own stream holds
    print(f"shard: {n_packets} packets x {args.seq} tokens ({args.width}-byte), "
          f"{data.nbytes / 2**20:.0f} MiB; {len(chunks)} chunks of {args.chunk} packets", flush=True)
    report = {
        "benchmark": "gpu_decode",
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "device": device_info(),
        "config": {"packets": n_packets, "seq": args.seq, "chunk": args.chunk,
                   "token_width": args.width, "ring": args.ring, "shard_bytes": int(data.nbytes),
                   "command": command(__file__, argv)},
        "physical_limits": physical_limits(min(int(data.nbytes), 1 << 30)),
        "targets": TARGETS,
        "results": {},
    }
    dec = CudaDecoder(ring=args.ring)
    resident = dec.resident(data, name="bench shard")
    for layout in ("padded", "packed"):
        for name, fn in (
            ("gpu_host", lambda: run_gpu(data, dec, chunks, layout, args.seq)),
            ("gpu_resident", lambda: run_gpu(resident, dec, chunks, layout, args.seq)),
            ("cpu_copy", lambda: run_cpu_copy(data, chunks, layout, args.seq)),
        ):
            fn()  # warm-up pass: kernel compilation, page faults, allocator growth
            row = fn()
            report["results"][f"{name}_{layout}"] = row
            print(f"{name:13s} {layout:6s} {row['tokens_per_s'] / 1e9:8.3f} G tok/s  next() p50 "
                  f"{row['next_p50_us']:9.1f} us  p99 {row['next_p99_us']:9.1f} us  host CPU "
                  f"{row['host_cpu_s_per_billion_tokens']:7.2f} s/Gtok  peak device "
                  f"{row['peak_device_bytes'] / 2**20:7.0f} MiB", flush=True)
    res = report["results"]
    report["targets_met"] = {
        "gpu_host_tokens_per_s": res["gpu_host_padded"]["tokens_per_s"] >= TARGETS["gpu_host_tokens_per_s"],
        "gpu_resident_tokens_per_s":
            res["gpu_resident_padded"]["tokens_per_s"] >= TARGETS["gpu_resident_tokens_per_s"],
        "next_p50_us": res["gpu_resident_padded"]["next_p50_us"] <= TARGETS["next_p50_us"],
    }
    if report["physical_limits"]:
        print(f"physical limits: pinned H2D {report['physical_limits']['h2d_pinned_gb_per_s']:.1f} "
              f"GB/s, D2D {report['physical_limits']['d2d_gb_per_s']:.1f} GB/s")
    write_report(args.out, "sim" if simulated() else "gpu", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
