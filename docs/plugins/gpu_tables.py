"""The GPU kernels' profile table (``benchmarks/gpu/kernel_profile.py``: Nsight Compute per kernel
launch). Standard library only, like ``results``.
"""

from __future__ import annotations

from mdtable import table
from results import Result, fmt

#: the kernel a launch ran, by the name Numba gives it
KERNEL_NAMES = ("verdicts_lanes_cuda", "verdicts_cuda", "build_padded_cuda", "build_packed_cuda",
                "build_packing_cuda")


def kernel_name(full: str) -> str:
    return next((k for k in KERNEL_NAMES if k in full), full[:40])


def kernels(r: Result) -> str:
    """Per mode and kernel (the first launch profiled of each): time, tokens/s alone, DRAM
    traffic against the floor, throughput and occupancy."""
    rows = []
    for mode, entry in r.report.get("modes", {}).items():
        seen = set()
        for launch in entry.get("launches") or []:
            name = kernel_name(str(launch.get("kernel", "")))
            if name in seen:
                continue
            seen.add(name)
            rows.append([mode, f"`{name}`", fmt(launch.get("duration_us")),
                         fmt(launch.get("tokens_per_s"), 1e9, 1),
                         fmt(launch.get("dram_gb_per_s"), digits=0),
                         fmt(launch.get("dram_pct_of_peak")),
                         fmt(launch.get("dram_bytes_over_floor"), digits=2),
                         fmt(launch.get("sm_pct_of_peak")),
                         f"{fmt(launch.get('achieved_occupancy_pct'))} / "
                         f"{fmt(launch.get('theoretical_occupancy_pct'))}",
                         fmt(launch.get("registers_per_thread"), digits=0),
                         f"{fmt(launch.get('grid_size'), digits=0)} x "
                         f"{fmt(launch.get('block_size'), digits=0)}"])
    cfg = r.report.get("config", {})
    head = (f"A chunk of {cfg.get('batch', '?')} x {cfg.get('seq', '?')} batches, full size "
            f"(64 batches: 4 Mi tokens), int32 ids, shards resident on the device.\n\n")
    return head + table(["mode", "kernel", "us a chunk", "G tokens/s alone", "DRAM GB/s",
                         "% of DRAM peak", "DRAM bytes / floor", "SM %",
                         "occupancy achieved / theoretical %", "registers", "grid x block"], rows)


def threads(r: Result) -> str:
    """``benchmarks/gpu/gpu_threads.py``: per mode and consumer, tokens/s and each thread's CPU per
    batch, the chunks staged ahead, and where the producer's samples fell most."""
    config = r.report.get("config") or {}
    rows = []
    for row in r.report.get("results") or []:
        cpu = row.get("thread_cpu_us_per_batch") or {}
        top = ((row.get("profile") or {}).get("ndp-loader") or {}).get("ndp") or []
        rows.append([row.get("mode", "?"), row.get("consumer", "?"),
                     fmt(row.get("tokens_per_s"), 1e9, 3), fmt(cpu.get("ndp-loader")),
                     fmt(cpu.get("MainThread")),
                     fmt(sum(v for k, v in cpu.items() if k not in ("ndp-loader", "MainThread"))),
                     fmt(row.get("staged_ahead_per_chunk"), digits=2),
                     "; ".join(f"`{name}` {share:.0%}" for name, share in top[:3])])
    head = (f"Resident shards, {config.get('batch', '?')} x {config.get('seq', '?')}, torch "
            f"output, {fmt(config.get('seconds'))} s a run, GIL switch interval "
            f"{config.get('switch_interval', '?')} s. `sum`: the consumer queues a kernel on each "
            "batch; `next`: it only takes them.\n\n")
    return head + table(["mode", "consumer", "G tokens/s", "producer CPU us/batch",
                         "consumer CPU us/batch", "other threads us/batch",
                         "chunks staged ahead / chunk", "producer's samples, most"], rows)
