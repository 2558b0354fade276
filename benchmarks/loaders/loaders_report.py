"""The report of ``bench_loaders.py``: rounds summarized, peers paired with ndp, figures drawn."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loaders import peers

#: the figures a row's rounds are summarized by (their median)
ROUND_FIGURES = ("tokens_per_s", "samples_per_s", "next_p50_us", "next_p99_us",
                 "host_cpu_s_per_billion_tokens", "peak_rss_mb", "worker_peak_rss_mb")


def is_sft(name: str) -> bool:
    """Whether a pipeline serves padded one-document rows (else windows of T+1 tokens)."""
    return name.endswith("-padded") or "-sft-" in name or name in ("jsonl-tokenize", "hf-datasets")


def summarize(runs: list[dict]) -> dict:
    """One pipeline's rounds as one row: the first round's record with the median of each of
    ``ROUND_FIGURES``, and every round under ``rounds`` (a single run is returned as it is)."""
    row = dict(runs[0])
    if len(runs) > 1:
        row.update({k: float(np.median([r[k] for r in runs])) for k in ROUND_FIGURES})
        row["rounds"] = list(runs)
    return row


def paired(names: list[str], rounds: list[dict]) -> dict:
    """Round by round, the lowest host CPU per token among the peers over ndp's CPU Loader's,
    for SFT rows (``ndp-cpu-padded``) and windows (``ndp-cpu-packed``), and the median."""
    out = {}
    for shape, ours in (("sft", "ndp-cpu-padded"), ("windows", "ndp-cpu-packed")):
        theirs = [n for n in names if n in peers.PIPELINES and is_sft(n) == (shape == "sft")]
        if ours not in names or not theirs:
            continue
        per_round = []
        for r in rounds:
            best = min(theirs, key=lambda n: r[n]["host_cpu_s_per_billion_tokens"])
            per_round.append({"peer": best, "ratio": r[best]["host_cpu_s_per_billion_tokens"]
                              / r[ours]["host_cpu_s_per_billion_tokens"]})
        out[shape] = {"ndp": ours, "per_round": per_round,
                      "median": float(np.median([p["ratio"] for p in per_round]))}
    return out



def figures(report: dict, stem: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["pipelines"]
    names = [r["name"] for r in rows]
    out = []
    for key, label, log in (("tokens_per_s", "tokens/s (real tokens)", True),
                            ("next_p50_us", "consumer next() p50 (us)", True),
                            ("time_to_first_batch_s", "time to first batch, >= 1B tokens (s)",
                             True),
                            ("peak_rss_mb", "peak RSS (MB)", False)):
        fig, ax = plt.subplots(figsize=(8, 3.6))
        ax.barh(names, [r[key] for r in rows], color="#4878a8")
        if log:  # bars from zero cannot be drawn on it: the title says so
            ax.set_xscale("log")
        else:
            ax.set_xlim(left=0)
        ax.set_xlabel(label + (" (log scale)" if log else ""))
        ax.invert_yaxis()
        when = str(report.get("created") or report.get("date") or "")[:16]
        ax.set_title(f"{label}{' (log scale)' if log else ''}: {report['config']['B']} x "
                     f"{report['config']['T']}, {report['machine']['cpu']} "
                     f"({report['machine']['cores']} cores), {when}", fontsize=9)
        fig.tight_layout()
        path = stem.with_name(f"{stem.name}-{key}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(path.name)
    return out
