"""The GPU kernels' profile table (``benchmarks/kernel_profile.py``: Nsight Compute per kernel
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
