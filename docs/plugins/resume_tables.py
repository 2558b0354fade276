"""The table of what a resume costs when the plan changed by hand or the dataset grew
(``benchmarks/plan/bench_plan_change.py``). Standard library only, like ``results``.
"""

from __future__ import annotations

from mdtable import table
from results import Result, fmt


def plan_change(r: Result) -> str:
    """Per size and case: the state's load, the first batch, their sum against a plain
    resume's, CPU and peak RSS of the resuming process."""
    rows = []
    for size in r.report.get("sizes", []):
        for case, got in (size.get("cases") or {}).items():
            rows.append([f"{size.get('documents', 0):.0e}", case,
                         *(fmt(got.get(key), digits=2) for key in ("open_s", "load_state_s",
                                                                   "first_batch_s")),
                         fmt(got.get("over_same_settings"), digits=1),
                         fmt(got.get("cpu_s"), digits=1), fmt(got.get("peak_rss_mb"), digits=0)])
    head = (f"Rank 0 of {r.report.get('world_size', '?')} resumes in a fresh process from its "
            f"state after {r.report.get('steps_before_state', '?')} batches of a "
            f"{r.report.get('mode', '?')} run mixing two halves of the dataset "
            f"{r.report.get('old_mix', '?')}.\n\n")
    return head + table(["documents", "case", "open s", "load_state_dict s", "first batch s",
                         "x plain resume", "CPU s", "peak RSS MB"], rows)
