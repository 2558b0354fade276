"""The performance pages' charts, drawn from results files at build time (matplotlib, Agg).

Bars start at zero on a linear axis, so their lengths compare; a figure a file lacks gets no
bar. Each chart's title names the machine and the date its file records, and the page prints
the same under it with the file's name.
"""

from __future__ import annotations

import io

from results import Result, is_number
from tables import STAGE_NAMES, STAGES

BLUE, GREY = "#4878a8", "#a0a0a0"


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _title(result: Result) -> str:
    return f"{result.machine.split(';')[0]}, {result.when}"


def _barh(ax, labels: list[str], values: list, *, xlabel: str, ndp_first: bool = True) -> None:
    colors = [BLUE if str(label).startswith("ndp") or not ndp_first else GREY
              for label in labels]
    heights = [v if is_number(v) else 0.0 for v in values]
    ax.barh(labels, heights, color=colors)
    for y, v in enumerate(values):
        if not is_number(v):
            ax.annotate("n/a", (0, y), xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize=8, color="grey")
    ax.set_xlim(left=0)
    ax.set_xlabel(xlabel)
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)


def _figure(width: float, height: float, ncols: int = 1):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=(width, height), squeeze=False)


def loaders(result: Result) -> bytes:
    """Tokens/s and host CPU per token of every pipeline in a ``bench_loaders.py`` file."""
    rows = [r for r in result.report["pipelines"] if isinstance(r, dict)]
    names = [str(r.get("name", "?")) for r in rows]
    config = result.report.get("config") or {}
    fig, axes = _figure(11, 0.32 * len(rows) + 1.4, ncols=2)
    _barh(axes[0][0], names, [r.get("tokens_per_s", 0) / 1e6 if is_number(r.get("tokens_per_s"))
                              else None for r in rows], xlabel="M tokens/s (more is better)")
    _barh(axes[0][1], names, [r.get("host_cpu_s_per_billion_tokens") for r in rows],
          xlabel="host CPU s per 1e9 tokens (less is better)")
    axes[0][1].set_yticklabels([])
    fig.suptitle(f"Loaders, {config.get('B', '?')} x {config.get('T', '?')}: {_title(result)}",
                 fontsize=10)
    return _png(fig)


def decode(result: Result) -> bytes:
    """Validate, padded and packed decode rates per token layout (``bench_cpu.py``)."""
    import numpy as np

    rows = [r for r in result.report["decode"] if isinstance(r, dict)]
    labels = [("uint16" if r.get("token_width") == 2 else "int32")
              + (" + mask" if r.get("masked") else "") for r in rows]
    fig, axes = _figure(9, 3.4)
    ax = axes[0][0]
    x = np.arange(len(rows))
    for i, (step, color) in enumerate((("validate", "#4878a8"), ("padded", "#6aa56a"),
                                       ("packed", "#d08a3c"))):
        values = [r.get(f"{step}_tokens_per_s") for r in rows]
        ax.bar(x + (i - 1) * 0.27, [v / 1e6 if is_number(v) else 0.0 for v in values], 0.27,
               label=step, color=color)
    ax.set_xticks(x)
    ax.set_xticklabels(labels)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("M tokens/s")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(f"CPU decode, CRC on: {_title(result)}", fontsize=10)
    return _png(fig)


def breakdown(result: Result) -> bytes:
    """CPU nanoseconds per token by stage, stacked (``cpu_breakdown.py``)."""
    rows = [r for r in result.report["rows"] if isinstance(r, dict)]
    labels = [f"{r.get('mode', '?')} B={r.get('batch', '?')}" for r in rows]
    fig, axes = _figure(9, 0.45 * len(rows) + 2.0)
    ax = axes[0][0]
    left = [0.0] * len(rows)
    for stage in STAGES[:-1]:
        widths = [(r.get("ns_per_token") or {}).get(stage) for r in rows]
        widths = [w if is_number(w) else 0.0 for w in widths]
        ax.barh(labels, widths, left=left, label=STAGE_NAMES[stage])
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlim(left=0)
    ax.invert_yaxis()
    ax.set_xlabel("CPU ns per delivered token")
    ax.legend(fontsize=8, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.25),
              frameon=False)
    ax.set_title(f"The CPU Loader by stage: {_title(result)}", fontsize=10)
    return _png(fig)


def remote(result: Result) -> bytes:
    """Tokens/s and first batch, local disk against object storage (``bench_remote.py``)."""
    rows = [r for r in result.report["rows"] if isinstance(r, dict)]
    names = [str(r.get("name", "?")) for r in rows]
    fig, axes = _figure(10, 0.4 * len(rows) + 1.3, ncols=2)
    _barh(axes[0][0], names, [r["tokens_per_s"] / 1e6 if is_number(r.get("tokens_per_s"))
                              else None for r in rows], xlabel="M tokens/s after the first batch",
          ndp_first=False)
    _barh(axes[0][1], names, [r.get("time_to_first_batch_s") for r in rows],
          xlabel="first batch (s)", ndp_first=False)
    axes[0][1].set_yticklabels([])
    fig.suptitle(f"Object storage against local disk: {_title(result)}", fontsize=10)
    return _png(fig)


def gpu(result: Result) -> bytes:
    """Tokens/s of every pipeline in a GPU results file."""
    results = {k: v for k, v in result.report["results"].items() if isinstance(v, dict)}
    names = list(results)
    fig, axes = _figure(9, 0.32 * len(names) + 1.3)
    _barh(axes[0][0], names, [v["tokens_per_s"] / 1e9 if is_number(v.get("tokens_per_s"))
                              else None for v in results.values()], xlabel="G tokens/s",
          ndp_first=False)
    device = (result.report.get("device") or {}).get("name", "GPU not recorded")
    axes[0][0].set_title(f"{device}: {_title(result)}", fontsize=10)
    return _png(fig)


#: kind -> the function that draws the newest file of that kind
CHARTS = {"loaders": loaders, "decode": decode, "breakdown": breakdown, "remote": remote,
          "gpu": gpu, "gpu-loader": gpu}
