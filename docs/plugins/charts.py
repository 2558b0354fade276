"""The performance pages' charts, drawn from results files at build time (matplotlib, Agg).

Bars start at zero on a linear axis, so their lengths compare; a figure a file lacks gets no
bar. The scale chart is the exception: costs against documents on log-log axes, lines through
the sizes measured (a power law is a straight line there), the model's extrapolation dotted and
its point hollow. Each chart's title names the machine and the date its file records, and the
page prints the same under it with the file's name.
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


#: the scale chart's panels: (record key or "index", the model's metric, axis label)
SCALE_PANELS = [("open_plus_first_s", "open_plus_first_s", "open + first batch (s)"),
                ("peak_rss_mb", "peak_rss_growth_mb", "peak RSS (MB)"),
                ("next_p99_ms", "next_p99_ms", "next() p99 across the epoch boundary (ms)"),
                ("boundary_step_ms", "boundary_step_ms", "the step across the boundary (ms)"),
                ("index", "index_s", "ndp index --write-manifest (s); a peer's conversion")]


def scale(result: Result) -> bytes:
    """Costs against documents, log-log, one line per mode and world size (rank 0 solid, a
    node's runs dashed, a peer loader's rows (``--peers``) dash-dotted, one colour per line in
    every panel), the model at its document count dotted with a hollow point
    (``bench_scale.py``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rep = result.report
    records = [r for r in rep["records"] if isinstance(r, dict)
               and is_number(r.get("documents"))]
    mdl = rep.get("model") if isinstance(rep.get("model"), dict) else {}
    fits = [f for f in mdl.get("fits", []) if isinstance(f, dict)]
    at = mdl.get("documents")
    lines: dict[tuple, list[dict]] = {}
    for r in records:
        lines.setdefault((str(r.get("which")), str(r.get("mode")), r.get("world")), []).append(r)
    lines[("ndp index", "", None)] = [{"documents": d.get("documents"), "index": d.get("seconds")}
                                      for d in rep.get("index", []) if isinstance(d, dict)]
    for d in rep.get("peer_conversions", []):  # bench_scale.py --peers: their data's cost
        if isinstance(d, dict):
            lines.setdefault((f"{d.get('which')} conversion", "", None), []).append(
                {"documents": d.get("documents"), "index": d.get("convert_seconds")})
    index = {k for k in lines if k[0] == "ndp index" or k[0].endswith(" conversion")}
    peer = {k for k in lines if k[0] not in ("rank 0", "node") and k not in index}
    order = sorted(lines, key=lambda k: (k in index, k[0] == "node", k in peer,
                                         str(k[2]), k[1], k[0]))
    colors = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(order)}
    names = {k: k[0] if k in index else
             f"{k[0]}, {k[1]} windows, rank 0 of {k[2]}" if k in peer else
             f"{k[1]}, {'rank 0 of' if k[0] == 'rank 0' else 'node of'} {k[2]}" for k in order}
    fig, grid = plt.subplots(2, 3, figsize=(13, 7.5))
    handles: dict[tuple, object] = {}
    for ax, (key, metric, label) in zip(grid.flat, SCALE_PANELS):
        for k in order:
            which, mode, world = k
            if (key == "index") != (k in index):
                continue
            if which == "node" and key not in ("open_plus_first_s", "peak_rss_mb"):
                continue
            points = sorted((r["documents"], r.get(key)) for r in lines[k]
                            if is_number(r.get("documents")) and is_number(r.get(key))
                            and r.get(key) > 0)
            if not points:
                continue
            (line,) = ax.plot([p[0] for p in points], [p[1] for p in points],
                              "--" if which == "node" else "-." if k in peer or (
                                  k in index and which != "ndp index") else "-",
                              marker="o", markersize=4,
                              color=colors[k])
            handles.setdefault(k, line)
            fit = next((f for f in fits if f.get("metric") == metric and f.get("which") == which
                        and (f.get("mode") or "") == mode and f.get("world") == world), None)
            value = None if fit is None else fit.get("peak_rss_mb_at_model_documents",
                                                     fit.get("at_model_documents"))
            if is_number(at) and is_number(value) and value > 0 and which != "node":
                ax.plot([points[-1][0], at], [points[-1][1], value], ":", color=colors[k])
                ax.plot([at], [value], "o", markerfacecolor="none", color=colors[k])
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("documents")
        ax.set_title(label, fontsize=9)
        ax.grid(which="both", alpha=0.3)
        if not ax.lines:
            ax.annotate("no figures in this file", (0.5, 0.5), xycoords="axes fraction",
                        ha="center", color="grey")
    legend = grid.flat[-1]
    legend.axis("off")
    shown = [k for k in order if k in handles]
    legend.legend([handles[k] for k in shown], [names[k] for k in shown], loc="center",
                  fontsize=8, title="solid: ndp, rank 0; dashed: a node's ranks at once; "
                  "dash-dot: a peer\ndotted to a hollow point: the model", title_fontsize=7)
    note = f"; the model at {at:.2g} documents" if is_number(at) else ""
    fig.suptitle(f"Costs against documents (log-log{note}): {_title(result)}", fontsize=10)
    return _png(fig)


#: kind -> the function that draws the newest file of that kind
CHARTS = {"loaders": loaders, "decode": decode, "breakdown": breakdown, "remote": remote,
          "gpu": gpu, "gpu-loader": gpu, "scale": scale}
