"""The ``explain`` results table (``benchmarks/plan/bench_explain.py``: what
``loader.explain(step)`` costs at scale). Standard library only, like ``results``.
"""

from __future__ import annotations

from mdtable import table
from results import Result, fmt


def explain(r: Result) -> str:
    """Per dataset size and mode: each step asked (from the epoch's start to its middle, one
    after the other in one process), its wall and CPU seconds."""
    rows, checks = [], []
    for row in r.report.get("rows") or []:
        check = row.get("clean_check") or {}
        if check.get("clean") is not None:
            checks.append(f"{row.get('documents', 0):,.0f} documents, {row.get('mode', '?')}: "
                          f"{fmt(check.get('wall_s'), digits=1)} s wall, "
                          f"{fmt(check.get('cpu_s'), digits=1)} s CPU (clean: "
                          f"{'yes' if check['clean'] else 'no'})")
        for i, call in enumerate(row.get("calls") or []):
            rows.append([f"{row.get('documents', 0):,.0f}", row.get("mode", "?"),
                         f"{row.get('batch_size', '?')} x {row.get('seq_len', '?')}",
                         f"{call.get('step', 0):,} ({call.get('fraction', 0):.1%})",
                         fmt(call.get("wall_s"), digits=2), fmt(call.get("cpu_s"), digits=2),
                         "first call" if i == 0 else (
                             f"resumed from step {call['after_loop_steps']}'s state"
                             if "after_loop_steps" in call else "")])
    head = (f"Rank {r.report.get('rank', '?')} of {r.report.get('world_size', '?')}; each "
            "mode in a fresh process, its epoch counted first (`len`); the steps asked one "
            "after the other, so a step is found from the step before it or from the count's "
            "mark before it, whichever is later. The first call "
            "loads Numba's cached compilations.\n\n")
    if checks:
        head += ("Before the calls, once per dataset (and kept for later processes), the check "
                 "that every packet decodes to its index's tokens, which `packed` marks rely "
                 "on: " + "; ".join(checks) + ".\n\n")
    return head + table(["documents", "mode", "batch", "step (of the epoch)", "wall s",
                         "CPU s", ""], rows)
