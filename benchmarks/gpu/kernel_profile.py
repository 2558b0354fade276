"""Nsight Compute on the verdict and build kernels: achieved bandwidth and occupancy (issue 37).

    python benchmarks/gpu/kernel_profile.py --out benchmarks/results   # on a GPU, with ncu
    python benchmarks/gpu/kernel_profile.py --modes padded --chunks 1   # one mode, one chunk
    python benchmarks/gpu/kernel_profile.py --drive padded --corpus DIR # what ncu runs (a child)

For each mode a child process (``--drive MODE``) runs the GPU Loader at ``--batch`` x ``--seq``
(64 x 1024) over a synthetic corpus held on the device (``resident=True``: no host copy shares
the device with the kernels), under ``ncu --profile-from-start off``. The child takes batches
until the chunks have grown to full size (``CHUNK_BATCHES_MAX`` batches), then opens the
profiler's range (``cudaProfilerStart``) and takes ``--chunks`` more chunks, so that the launches
profiled are full chunks of a steady loop (``--launch-count`` caps them at 2 per chunk).

The corpus is the GPU benchmark's (``bench_gpu_loader.write_corpus``): packets of ``--seq``
random int32 ids below 150,000, CRC on, so every packet's bytes are read by the verdict kernel.

Per kernel launch: duration, DRAM bytes read and written (and their rate), DRAM, memory and SM
throughput as % of peak, achieved and theoretical occupancy, registers per thread, block and
grid size, waves per SM; with the chunk's tokens, the kernel's tokens/s alone and its floor: the
fewest bytes it must move (each packet byte read once, each output written once) against the
DRAM bytes it moved. JSON goes to ``kernel-profile-<time>.json`` in ``--out`` (default
``$NDP_RESULTS_DIR``, else ``./ndp-results``), with ncu's CSV as it came, the machine and the
command. Needs a CUDA GPU and ``ncu`` (CUDA's toolkit, ``$CUDA_HOME/bin`` or on PATH).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu.gpu_check import cuda_tool  # noqa: E402
from harness import add_out_argument, command, machine, write_report  # noqa: E402

MODES = ("padded", "packed", "packing")
#: what ncu collects, by its metric names (no sections: one pass set, a few replays a kernel)
METRICS = {
    "gpu__time_duration.sum": "duration_ns",
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__bytes_write.sum": "dram_write_bytes",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct_of_peak",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory_pct_of_peak",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct_of_peak",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical_occupancy_pct",
    "launch__registers_per_thread": "registers_per_thread",
    "launch__block_size": "block_size",
    "launch__grid_size": "grid_size",
    "launch__waves_per_multiprocessor": "waves_per_sm",
}
KERNELS = "regex:verdicts_(lanes_)?cuda|build_(padded|packed|packing)_cuda"
#: what ncu collects: the metrics by name, or (should this ncu not know one of them) the
#: sections that hold them, whose raw page names the same metrics
COLLECT = (["--metrics", ",".join(METRICS)],
           ["--section", "SpeedOfLight", "--section", "Occupancy", "--section", "LaunchStats",
            "--metrics", "dram__bytes_read.sum,dram__bytes_write.sum"])


def ncu_path() -> str | None:
    """``ncu`` on PATH, in the usual CUDA install places or in Nsight Compute's own."""
    return cuda_tool("ncu", "/opt/nvidia/nsight-compute/*/ncu")


def drive(mode: str, corpus: Path, batch: int, seq: int, chunks: int) -> dict:
    """The child: a resident GPU Loader in ``mode``, warmed to full chunks, then ``chunks``
    chunks inside the profiler's range. Returns what a profiled chunk holds."""
    from numba import cuda

    import ndp
    from ndp.engine.backend import simulated
    from ndp.loader.pipeline.chunks import CHUNK_BATCHES_MAX

    profile = not simulated()  # the simulator has no profiler: the test suite drives it so

    loader = ndp.Loader(corpus / "ndp", mode=mode, batch_size=batch, seq_len=seq, seed=0,
                        backend="cuda", resident=True, output="arrays")
    per_chunk = loader.chunk_batches
    it = iter(loader)
    # growth is 1, 2, 4, ... batches a chunk; the ring runs up to a few chunks ahead
    for _ in range(2 * CHUNK_BATCHES_MAX + 4 * per_chunk):
        first = next(it)
    cuda.synchronize()
    if profile:
        cuda.profile_start()
    for _ in range(chunks * per_chunk):
        next(it)
    cuda.synchronize()
    if profile:
        cuda.profile_stop()
    # what the build kernel writes: the (rows, columns) outputs (packing's cu_seqlens is not)
    out_bytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in first.values()
                    if len(v.shape) == 2)
    loader.close()
    return {"mode": mode, "chunk_batches": per_chunk, "chunk_tokens": per_chunk * batch * seq,
            "chunk_output_bytes": per_chunk * out_bytes}


def parse_raw_csv(text: str) -> list[dict]:
    """ncu's ``--csv --page raw --print-units base`` output: one dict per profiled launch with
    its kernel name and the ``METRICS`` it holds, as floats (the name ``METRICS`` gives)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, body = rows[0], rows[1:]
    if body and not body[0][0].strip():  # the units row
        body = body[1:]
    launches = []
    for row in body:
        if len(row) != len(header):
            continue
        got = dict(zip(header, row))
        launch = {"kernel": got.get("Kernel Name", "")}
        for metric, name in METRICS.items():
            value = got.get(metric, "").replace(",", "").strip()
            try:
                launch[name] = float(value)
            except ValueError:
                launch[name] = None
        launches.append(launch)
    return launches


def summarise(launch: dict, chunk: dict, packet_bytes: int) -> dict:
    """A launch's derived figures: DRAM rate, tokens/s alone, and bytes moved over the floor."""
    out = dict(launch)
    ns = launch.get("duration_ns")
    read, write = launch.get("dram_read_bytes"), launch.get("dram_write_bytes")
    if not ns:
        return out
    out["duration_us"] = ns / 1e3
    out["tokens_per_s"] = chunk["chunk_tokens"] / (ns / 1e9)
    if read is not None and write is not None:
        out["dram_gb_per_s"] = (read + write) / ns
        # the fewest bytes: the chunk's packets read once; the verdicts (8 B a packet, about
        # nothing) or the outputs written once
        floor = packet_bytes + (chunk["chunk_output_bytes"] if "build" in launch["kernel"] else 0)
        out["floor_bytes"] = floor
        out["dram_bytes_over_floor"] = (read + write) / floor
    return out


def profile(ncu: str, collect: list[str], mode: str, corpus: Path, args: argparse.Namespace,
            log: Path) -> dict:
    """One mode's child run under ncu: its exit status, ncu's CSV, the chunk and launches."""
    here = Path(__file__).resolve()
    cmd = [ncu, "--profile-from-start", "off", "--kernel-name", KERNELS,
           "--launch-count", str(2 * args.chunks), *collect, "--clock-control", "none",
           "--csv", "--page", "raw", "--print-units", "base", "--log-file", str(log),
           sys.executable, str(here), "--drive", mode, "--corpus", str(corpus),
           "--batch", str(args.batch), "--seq", str(args.seq), "--chunks", str(args.chunks)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=here.parents[2])
    text = log.read_text() if log.exists() else ""
    chunk = next((json.loads(line.split(":", 1)[1]) for line in proc.stdout.splitlines()
                  if line.startswith("chunk:")), None)
    entry = {"returncode": proc.returncode, "collected": collect, "ncu_csv": text,
             "chunk": chunk, "launches": parse_raw_csv(text) if chunk else []}
    if proc.returncode or not entry["launches"]:
        entry["output_tail"] = (proc.stdout + proc.stderr)[-3000:] + text[-2000:]
    return entry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--chunks", type=int, default=2, help="full chunks profiled a mode (2)")
    ap.add_argument("--tokens", type=int, default=96 << 20, help="tokens in the corpus")
    ap.add_argument("--drive", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    add_out_argument(ap)
    args = ap.parse_args(argv)
    if args.drive:
        print("chunk:", json.dumps(drive(args.drive, args.corpus, args.batch, args.seq,
                                          args.chunks)), flush=True)
        return 0
    ncu = ncu_path()
    if ncu is None:
        print("kernel_profile needs Nsight Compute's ncu (CUDA's toolkit): not found",
              file=sys.stderr)
        return 2
    from gpu.bench_gpu import device_info
    from gpu.bench_gpu_loader import write_corpus

    report = {
        "benchmark": "kernel_profile",
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command(__file__, argv),
        "machine": machine(), "device": device_info(),
        "ncu": subprocess.run([ncu, "--version"], capture_output=True,
                              text=True).stdout.strip().splitlines()[-1:],
        "config": {"batch": args.batch, "seq": args.seq, "tokens": args.tokens,
                   "token_width": 4, "resident": True, "chunks": args.chunks,
                   "metrics": list(METRICS)},
        "modes": {},
    }
    with tempfile.TemporaryDirectory(prefix="ndp-kernel-profile-") as tmp:
        corpus = write_corpus(Path(tmp), args.tokens, args.seq)
        (corpus / "tokens.bin").unlink()
        packet_bytes = 8 + 4 * args.seq + 2  # frame, int32 ids, CRC-16
        for mode in args.modes:
            for collect in COLLECT:
                entry = profile(ncu, collect, mode, corpus, args, Path(tmp) / f"{mode}.csv")
                if entry.get("launches"):
                    break
            if entry.get("launches"):
                per_packet = packet_bytes * entry["chunk"]["chunk_tokens"] // args.seq
                entry["launches"] = [summarise(launch, entry["chunk"], per_packet)
                                     for launch in entry["launches"]]
            report["modes"][mode] = entry
            _print(mode, entry)
    write_report(args.out, "kernel-profile", report)
    ok = all(e["returncode"] == 0 and e.get("launches") for e in report["modes"].values())
    return 0 if ok else 1


def _print(mode: str, entry: dict) -> None:
    if not entry.get("launches"):
        print(f"{mode}: no launches profiled (exit {entry['returncode']})\n"
              f"{entry.get('output_tail', '')}")
        return
    for launch in entry["launches"]:
        name = next((k for k in ("verdicts", "build_padded", "build_packed", "build_packing")
                     if k in launch["kernel"]), launch["kernel"][:30])

        def f(key: str, scale: float = 1.0, fmt: str = ".1f") -> str:
            value = launch.get(key)
            return "?" if value is None else format(value * scale, fmt)

        print(f"{mode:8s} {name:14s} {f('duration_us')} us  {f('tokens_per_s', 1e-9, '.2f')} "
              f"G tok/s  DRAM {f('dram_gb_per_s')} GB/s ({f('dram_pct_of_peak')}% of peak, "
              f"x{f('dram_bytes_over_floor', 1, '.2f')} the floor)  SM {f('sm_pct_of_peak')}%  "
              f"occupancy {f('achieved_occupancy_pct')}/{f('theoretical_occupancy_pct')}%  "
              f"regs {f('registers_per_thread', 1, '.0f')}  grid {f('grid_size', 1, '.0f')}x"
              f"{f('block_size', 1, '.0f')}")


if __name__ == "__main__":
    sys.exit(main())
