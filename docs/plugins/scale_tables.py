"""The scale results' tables (``bench_scale.py``: costs against documents): rank 0's costs per
size, mode and world size, the node runs, the datasets and ``ndp index``, and the fitted model.
Standard library only, like ``results``.
"""

from __future__ import annotations

import math

from mdtable import table
from results import Result, fmt, is_number


SCALE_MODES = ("padded", "packed", "packing")


def _scale_key(d: dict) -> tuple:
    mode = d.get("mode")
    return (d.get("documents") if is_number(d.get("documents")) else 0,
            d.get("world") if is_number(d.get("world")) else 0,
            SCALE_MODES.index(mode) if mode in SCALE_MODES else len(SCALE_MODES), str(mode))


def _docs(value) -> str:
    """A document count as ``1e8`` or ``1.3e9`` (two significant digits or fewer), else with
    thousands separators."""
    if not is_number(value) or value <= 0:
        return "n/a"
    exp = math.floor(math.log10(value))
    mantissa = value / 10 ** exp
    if exp >= 4 and abs(mantissa - round(mantissa, 1)) < 1e-9:
        return f"{round(mantissa, 1):g}e{exp}"
    return fmt(value, digits=0)


#: the model's columns: (metric of the rank-0 fit, metric of the node fit, header, digits)
SCALE_MODEL = [("open_plus_first_s", "open_plus_first_s", "open + first batch s", 1),
               ("peak_rss_growth_mb", "peak_rss_mb", "peak RSS MB", 0),
               ("next_p99_ms", None, "`next()` p99 ms", 1),
               ("boundary_step_ms", None, "boundary step ms", 0),
               ("paced_next_p99_ms", None, "paced `next()` p99 ms", 2)]


def _model_cell(fit: dict | None, digits: int) -> str:
    if fit is None:
        return ""
    value = fit.get("peak_rss_mb_at_model_documents", fit.get("at_model_documents"))
    return f"k = {fmt(fit.get('slope'), digits=2)}: {fmt(value, digits=digits)}"


def scale(r: Result) -> str:
    """``bench_scale.py``: rank 0's costs per size, mode and world size, the node runs, the
    datasets and ``ndp index``, and the fitted model (labelled as one)."""
    rep = r.report
    config = rep.get("config") or {}
    records = sorted((d for d in rep["records"] if isinstance(d, dict)), key=_scale_key)
    rank0 = [d for d in records if d.get("which") == "rank 0"]
    node = [d for d in records if d.get("which") == "node"]
    head = (f"Documents of {config.get('doc_tokens', '?')} tokens "
            f"({config.get('token_typ', '?')}); batches of {config.get('batch', '?')} x "
            f"{config.get('seq_len', '?')}, backend `{config.get('backend', '?')}`, output "
            f"`{config.get('output', '?')}`; each row in a fresh process, rank 0 of the world "
            f"size shown. `next()` p99: over the last {config.get('boundary_batches', '?')} "
            f"batches of epoch 0 and the first {config.get('boundary_batches', '?')} of epoch "
            "1, resumed from a state built near the end of epoch 0; the boundary step is the "
            "wait from epoch 0's last batch to epoch 1's first. A consumer that does nothing "
            "between batches waits for every chunk the producer decodes; the paced columns "
            "cross the boundary again with a consumer that takes twice the producer's time a "
            "batch (sleeping, as a host waits on a GPU step): what it waits is a stall. Peak "
            "RSS to the first batch "
            "is the process's high-water mark then; peak RSS, the larger of that and its peak "
            "across the boundary (the resume's own peak left out).")
    out = [head, "", table(
        ["documents", "mode", "ranks", "open s", "first batch s", "open + first s",
         "peak RSS to first batch MB", "peak RSS MB", "`next()` p99 ms",
         "boundary step ms", "paced `next()` p99 ms", "paced boundary step ms",
         "batches per epoch"],
        [[_docs(d.get("documents")), d.get("mode", "?"), d.get("world", "?"),
          fmt(d.get("open_s"), digits=2), fmt(d.get("first_batch_s"), digits=2),
          fmt(d.get("open_plus_first_s"), digits=2),
          fmt(d.get("rss_after_first_batch_mb"), digits=0), fmt(d.get("peak_rss_mb"), digits=0),
          fmt(d.get("next_p99_ms"), digits=2), fmt(d.get("boundary_step_ms"), digits=1),
          fmt(d.get("paced_next_p99_ms"), digits=2),
          fmt(d.get("paced_boundary_step_ms"), digits=2),
          fmt(d.get("batches_per_epoch"), digits=0)] for d in rank0])]
    if node:
        out += ["", "Every rank of a node as processes started at once (open and first batch "
                "only): the slowest rank, and the sum of each process's own peak RSS (the "
                "node's peak is at most that).", "", table(
                    ["documents", "mode", "ranks", "slowest open + first s",
                     "sum of peak RSS MB", "largest rank's peak RSS MB"],
                    [[_docs(d.get("documents")), d.get("mode", "?"), d.get("ranks", "?"),
                      fmt(d.get("open_plus_first_s"), digits=2),
                      fmt(d.get("peak_rss_mb"), digits=0),
                      fmt(d.get("peak_rss_max_rank_mb"), digits=0)] for d in node])]
    skipped = [d for d in rep.get("skipped", []) if isinstance(d, dict)]
    if skipped:
        out += ["", "Not run: " + "; ".join(
            f"{_docs(d.get('documents'))} {d.get('mode', '?')}, {d.get('which', '?')} of "
            f"{d.get('world', '?')} ({d.get('reason', 'no reason recorded')})"
            for d in skipped) + "."]
    sets = {d.get("documents"): d for d in rep.get("datasets", []) if isinstance(d, dict)}
    index = [d for d in rep.get("index", []) if isinstance(d, dict)]
    if index:
        out += ["", "The datasets and `ndp index --write-manifest` on each (its own process):",
                "", table(["documents", "shards", "GB", "generated in s", "ndp index s",
                           "ndp index peak RSS MB"],
                          [[_docs(d.get("documents")),
                            fmt(sets.get(d.get("documents"), {}).get("shards"), digits=0),
                            fmt(sets.get(d.get("documents"), {}).get("bytes"), 1e9, 2),
                            fmt(sets.get(d.get("documents"), {}).get("generated_seconds"),
                                digits=1),
                            fmt(d.get("seconds"), digits=1), fmt(d.get("peak_rss_mb"), digits=0)]
                           for d in index])]
    mdl = rep.get("model") if isinstance(rep.get("model"), dict) else {}
    fits = [f for f in mdl.get("fits", []) if isinstance(f, dict)]
    if fits:
        at = _docs(mdl.get("documents"))
        by = {(f.get("which"), f.get("mode"), f.get("world"), f.get("metric")): f for f in fits}
        groups = sorted({(f.get("which"), f.get("mode"), f.get("world")) for f in fits
                         if f.get("which") in ("rank 0", "node")},
                        key=lambda g: (g[0] != "rank 0",) + _scale_key(
                            {"mode": g[1], "world": g[2]}))
        rows = []
        for which, mode, world in groups:
            cells = [_model_cell(by.get((which, mode, world, rank_metric if which == "rank 0"
                                         else node_metric)), digits)
                     for rank_metric, node_metric, _, digits in SCALE_MODEL]
            sizes = next((f.get("sizes", []) for k, f in by.items() if k[:3] == (which, mode,
                                                                                world)), [])
            rows.append([mode, world, which, ", ".join(_docs(n) for n in sizes), *cells])
        out += ["", f"**Model, not a measurement**: per cost, the slope k of a power law (cost "
                f"~ N^k) fitted through the sizes measured, and its value at {at} documents "
                "(peak RSS fitted above the RSS after `import ndp`, then added back).", "",
                table(["mode", "ranks", "which", "sizes fitted"]
                      + [f"{header} at {at}" for _, _, header, _ in SCALE_MODEL], rows)]
        index_fit = by.get(("ndp index", None, None, "index_s"))
        if index_fit is not None:
            out += ["", f"`ndp index`: {_model_cell(index_fit, 1)} s at {at} documents."]
        per_node = [n for n in mdl.get("node_from_rank0", []) if isinstance(n, dict)]
        if per_node:
            out += ["", f"A node of {mdl.get('ranks_per_node', '?')} ranks, {at} documents, "
                    "as that many times rank 0's modelled peak RSS: " + ", ".join(
                        f"{n.get('mode', '?')} {fmt(n.get('node_peak_rss_mb'), 1024, 1)} GB"
                        for n in per_node) + "."]
    return "\n".join(out)
