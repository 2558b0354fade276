"""The results files' tables: one renderer per kind of result (``TABLES``), a page's section of
a kind (``section``) and the list of every file (``files_table``), as Markdown. The files are
read and sorted into kinds by ``results``; every number printed here is read from one of them.
Standard library only, like ``results``.
"""

from __future__ import annotations

import posixpath
import re

from results import (
    SITE_RESULTS,
    Result,
    featured,
    fmt,
    is_number,
    kinds_of,
    link,
    of_kind,
    provenance,
)
from mdtable import table
from scale_tables import SCALE_MODEL, _docs, _model_cell, scale as _scale_ndp
from gpu_tables import kernels as _kernels, threads as _threads
from resume_tables import plan_change as _plan_change
from explain_tables import explain as _explain


# --- one table per kind --------------------------------------------------------------------

def _decode(r: Result) -> str:
    rows = [d for d in r.report["decode"] if isinstance(d, dict)]
    return table(
        ["tokens", "packets", "batch", "validate M tok/s", "validate GB/s", "padded M tok/s",
         "packed M tok/s", "byte-wise CRC M tok/s"],
        [[("uint16" if d.get("token_width") == 2 else "int32")
          + (" + loss mask" if d.get("masked") else ""), fmt(d.get("packets"), digits=0),
          f"{d.get('batch', '?')} x {d.get('seq', '?')}",
          fmt(d.get("validate_tokens_per_s"), 1e6, 0), fmt(d.get("validate_gb_per_s"), digits=2),
          fmt(d.get("padded_tokens_per_s"), 1e6, 0), fmt(d.get("packed_tokens_per_s"), 1e6, 0),
          fmt(d.get("bytewise_crc_tokens_per_s"), 1e6, 0)] for d in rows])


def _crc(r: Result) -> str:
    crc = r.report["crc"]
    rows = [c for c in crc.get("ranges", []) if isinstance(c, dict)]
    head = (f"Carry-less multiplication available: {crc.get('clmul', 'n/a')}; "
            f"{crc.get('threads', '?')} thread(s).\n\n")
    return head + table(["range (bytes)", "table loop GB/s", "ndp's host CRC GB/s"],
                        [[fmt(c.get("range_bytes"), digits=0), fmt(c.get("tables_gb_per_s"),
                                                                   digits=2),
                          fmt(c.get("host_gb_per_s"), digits=2)] for c in rows])


def _convert(r: Result) -> str:
    sets = {k: v for k, v in r.report["convert"].items() if isinstance(v, dict)}
    return table(["set", "input MB", "examples", "tokens", "seconds", "M tokens/s",
                  "MB/s of input"],
                 [[k, fmt(v.get("input_mb")), fmt(v.get("examples"), digits=0),
                   fmt(v.get("tokens"), digits=0), fmt(v.get("seconds")),
                   fmt(v.get("tokens_per_s"), 1e6, 2), fmt(v.get("input_mb_per_s"), digits=2)]
                  for k, v in sets.items()])


def _loader(r: Result) -> str:
    rows = [d for d in r.report["loader"] if isinstance(d, dict)]
    return table(["mode", "packets", "batch", "chunk (batches)", "prefetch", "M tokens/s",
                  "`next()` p50 us", "`next()` p99 us", "host CPU s per 1e9 tokens"],
                 [[d.get("mode", "?"), fmt(d.get("packets"), digits=0),
                   f"{d.get('batch', '?')} x {d.get('seq_len', '?')}",
                   d.get("chunk_batches", "n/a"), d.get("prefetch", "n/a"),
                   fmt(d.get("tokens_per_s"), 1e6, 0), fmt(d.get("next_p50_us")),
                   fmt(d.get("next_p99_us"), digits=0),
                   fmt(d.get("host_cpu_s_per_billion_tokens"))] for d in rows])


STAGES = ["stage", "verdicts", "layout", "build", "producer_other", "consumer", "process"]
STAGE_NAMES = {"stage": "reading packets", "verdicts": "verdicts (CRC)", "layout": "layout",
               "build": "build", "producer_other": "producer, rest", "consumer": "consumer",
               "process": "whole process"}


def _breakdown(r: Result) -> str:
    rows = [d for d in r.report["rows"] if isinstance(d, dict)]
    head = (f"Corpus: {r.report.get('corpus', 'not recorded')}; ndp threads: "
            f"{r.report.get('threads', '?')}; `resident`: {r.report.get('resident', False)}. "
            "CPU nanoseconds per delivered token.\n\n")
    return head + table(
        ["mode, batch", "chunk (batches)", "M tokens/s"] + [STAGE_NAMES[s] for s in STAGES],
        [[f"{d.get('mode', '?')}, {d.get('batch', '?')} x {d.get('seq_len', '?')}",
          d.get("chunk_batches", "n/a"), fmt(d.get("tokens_per_s"), 1e6, 0)]
         + [fmt((d.get("ns_per_token") or {}).get(s), digits=2) for s in STAGES] for d in rows])


def _gpu_host(r: Result) -> str:
    rows = [d for d in r.report["results"] if isinstance(d, dict)]
    c = r.report.get("config") or {}
    where = r.report.get("measured_at")
    head = (f"{'Measured at ' + where + '. ' if where else ''}Batches of {c.get('batch', '?')} x "
            f"{c.get('seq', '?')} tokens; documents of {c.get('doc_tokens_mean', '?')} tokens "
            f"on average; {fmt(c.get('packets'), digits=0)} packets in {c.get('shards', '?')} "
            "shards; device calls counted, not made. Per batch:\n\n")
    calls = ["launch", "memcpy_h2d", "memcpy_d2h", "event_create", "event_record",
             "stream_wait_event", "event_synchronize"]
    return head + table(
        ["mode", "shards", "host us", "within epochs us", "host G tokens/s", "CPU us",
         "consumer CPU us", "CPU s / 1e9 tokens"] + calls,
        [[d.get("mode", "?"), d.get("source", "?"), fmt(d.get("host_us_per_batch"), digits=1),
          fmt(d.get("within_epoch_us_per_batch"), digits=1) if "within_epoch_us_per_batch" in d
          else "n/a",
          fmt(d.get("ceiling_tokens_per_s"), 1e9, 2), fmt(d.get("cpu_us_per_batch"), digits=1),
          fmt(d.get("consumer_cpu_us_per_batch"), digits=1),
          fmt(d.get("cpu_s_per_billion_tokens"), digits=2)]
         + [fmt((d.get("device_calls_per_batch") or {}).get(k), digits=3) for k in calls]
         for d in rows])


def _spread(row: dict, key: str, scale: float = 1.0, digits: int = 1) -> str:
    rounds = [x.get(key) for x in row.get("rounds", []) if isinstance(x, dict)]
    rounds = [x for x in rounds if is_number(x)]
    if len(rounds) < 2:
        return ""
    return f" ({fmt(min(rounds), scale, digits)}-{fmt(max(rounds), scale, digits)})"


def _loaders(r: Result) -> str:
    rows = [d for d in r.report["pipelines"] if isinstance(d, dict)]
    config = r.report.get("config") or {}
    n = r.report.get("rounds")
    head = (f"Batches of {config.get('B', '?')} x {config.get('T', '?')}; "
            f"{fmt(config.get('tokens'), digits=0)} tokens in "
            f"{fmt(config.get('documents'), digits=0)} documents; each pipeline ran "
            f"{fmt(config.get('seconds'), digits=0)} s; first batch on "
            f"{fmt(config.get('large_tokens'), digits=0)} tokens.")
    if is_number(n) and n > 1:
        head += (f" {n} rounds: each figure is the median of its rounds, the range of host "
                 "CPU in brackets.")
    out = [head, "", table(
        ["pipeline", "M tokens/s", "rows/s", "`next()` p50 / p99 us", "host CPU s per 1e9 tokens",
         "peak RSS MB", "first batch s"],
        [[d.get("name", "?"), fmt(d.get("tokens_per_s"), 1e6), fmt(d.get("samples_per_s"),
                                                                   digits=0),
          f"{fmt(d.get('next_p50_us'), digits=0)} / {fmt(d.get('next_p99_us'), digits=0)}",
          fmt(d.get("host_cpu_s_per_billion_tokens"))
          + _spread(d, "host_cpu_s_per_billion_tokens"),
          fmt(d.get("peak_rss_mb"), digits=0), fmt(d.get("time_to_first_batch_s"), digits=2)]
         for d in rows])]
    paired = r.report.get("paired") or {}
    if paired:
        out += ["", "Host CPU per token, the cheapest peer of each round over ndp's:", "", table(
            ["shape", "ndp", "peer (per round)", "ratio per round", "median"],
            [[shape, p.get("ndp", "?"),
              ", ".join(sorted({x.get("peer", "?") for x in p.get("per_round", [])})),
              ", ".join(fmt(x.get("ratio"), digits=2) for x in p.get("per_round", [])),
              fmt(p.get("median"), digits=2) + "x"] for shape, p in paired.items()])]
    converted = {d.get("name"): d["conversion"] for d in rows
                 if isinstance(d.get("conversion"), dict)}
    if converted:
        out += ["", "The peers' conversions of the data, as recorded: " + "; ".join(
            f"`{k}` {fmt(v.get('convert_seconds'), digits=1)} s, "
            f"{fmt(v.get('converted_bytes'), 1e6, 0)} MB" for k, v in converted.items()) + "."]
    semantics = {d.get("name"): d.get("semantics") for d in rows if d.get("semantics")}
    if semantics:
        out += ["", "What each pipeline serves, as the file records it:", ""]
        out += [f"* `{k}`: {v}" for k, v in semantics.items()]
    return "\n".join(out)


def _gpu(r: Result) -> str:
    results = {k: v for k, v in r.report["results"].items() if isinstance(v, dict)}
    config = r.report.get("config") or {}
    head = ", ".join(f"{k} {v}" for k, v in config.items() if k != "command")
    out = [f"Configuration: {head}." if head else "", "", table(
        ["pipeline", "G tokens/s", "`next()` p50 / p99 us", "host CPU s per 1e9 tokens",
         "launches per batch", "host waits per batch"],
        [[k, fmt(v.get("tokens_per_s"), 1e9, 3),
          f"{fmt(v.get('next_p50_us'), digits=0)} / {fmt(v.get('next_p99_us'), digits=0)}",
          fmt(v.get("host_cpu_s_per_billion_tokens"), digits=2),
          fmt((v.get("per_batch") or {}).get("launches"), digits=3),
          fmt((v.get("per_batch") or {}).get("host_waits"), digits=3)]
         for k, v in results.items()])]
    limits = r.report.get("physical_limits") or {}
    if limits:
        out += ["", "Copy bandwidth measured in the same run: " + ", ".join(
            f"{k} {fmt(v, digits=1)}" for k, v in limits.items())]
    targets, met = r.report.get("targets") or {}, r.report.get("targets_met") or {}
    if targets:
        out += ["", "Targets recorded in the file: " + ", ".join(
            f"{k} {fmt(v, digits=0)} ({'met' if met.get(k) else 'not met'})"
            for k, v in targets.items())]
    return "\n".join(out)


def _train_gpt2(r: Result) -> str:
    """``train_gpt2.py``: one row per feed of the same model, step times and what waited."""
    rows = [d for d in r.report["rows"] if isinstance(d, dict)]
    config, model = r.report.get("config") or {}, r.report.get("model") or {}
    first = rows[0] if rows else {}
    head = (f"Model: {model.get('layers', '?')} layers, d = {model.get('d', '?')}, "
            f"{model.get('heads', '?')} heads, vocabulary {fmt(model.get('vocab'), digits=0)} "
            f"({fmt(first.get('parameters'), 1e6, 0)} M parameters), "
            f"{'compiled' if first.get('compiled') else 'not compiled'}, on "
            f"{first.get('device', '?')}; batches of {config.get('B', '?')} x "
            f"{config.get('T', '?')}, {config.get('warmup', '?')} warm-up steps, then "
            f"{config.get('steps', '?')} timed. Each feed reads its own order of the windows.\n\n")
    return head + table(
        ["feed", "step ms, mean / p50 / p99", "share of the step waiting for data",
         "tokens/s", "host CPU s per 1e9 tokens (the whole training process)"],
        [[d.get("name", "?"), f"{fmt(d.get('step_ms_mean'), digits=1)} / "
          f"{fmt(d.get('step_ms_p50'), digits=1)} / {fmt(d.get('step_ms_p99'), digits=1)}",
          fmt(100 * d["wait_fraction"], digits=2) + "%" if is_number(d.get("wait_fraction"))
          else "n/a", fmt(d.get("tokens_per_s"), digits=0),
          fmt(d.get("host_cpu_s_per_billion_tokens"), digits=0)] for d in rows])


def _accounting(r: Result) -> str:
    rows = [d for d in r.report["accounting"] if isinstance(d, dict)]
    keys = ["chunks", "launches", "h2d_copies", "d2h_copies", "host_waits", "dlpack_exports"]
    return ("Counted under Numba's CUDA simulator: the counts are the GPU path's, the times "
            "mean nothing.\n\n" + table(
                ["mode", "resident", "batch", "chunk (batches)", "batches"]
                + [k.replace("_", " ") + " per batch" for k in keys],
                [[d.get("mode", "?"), d.get("resident", "?"),
                  f"{d.get('batch', '?')} x {d.get('seq_len', '?')}", d.get("chunk_batches", "?"),
                  fmt(d.get("batches"), digits=0)]
                 + [fmt((d.get("per_batch") or {}).get(k), digits=3) for k in keys]
                 for d in rows]))


def _remote(r: Result) -> str:
    config = r.report.get("config") or {}
    rows = [d for d in r.report["rows"] if isinstance(d, dict)]
    head = (f"{config.get('shards', '?')} shards, {fmt(config.get('tokens'), digits=0)} tokens, "
            f"{fmt(config.get('bytes'), 1e6, 0)} MB, served by {config.get('server', '?')}; one "
            f"epoch of `mode=\"{config.get('mode', '?')}\"`, {config.get('B', '?')} x "
            f"{config.get('T', '?')}, backend {config.get('backend', '?')}, in a fresh process "
            "per row.\n\n")
    return head + table(
        ["read from", "first batch s", "M tokens/s after it", "host CPU s per 1e9 tokens",
         "downloaded MB", "downloads"],
        [[d.get("name", "?"), fmt(d.get("time_to_first_batch_s"), digits=2),
          fmt(d.get("tokens_per_s"), 1e6), fmt(d.get("host_cpu_s_per_billion_tokens"), digits=0),
          fmt(d.get("downloaded_bytes"), 1e6, 0), fmt(d.get("downloads"), digits=0)]
         for d in rows])


def _shuffle(r: Result) -> str:
    rep = r.report
    peers = ", ".join(f"{k} {v}" for k, v in (rep.get("peers") or {}).items())
    head = (f"{fmt(rep.get('docs'), digits=0)} documents of {fmt(rep.get('doc_bytes'), digits=0)} "
            f"bytes, one rank, epoch 0 to epoch 1; regions of "
            f"{fmt(rep.get('region_bytes'), 2 ** 20, 0)} MiB. Peers: {peers or 'not recorded'}."
            "\n\n")
    rows = {k: v for k, v in rep["rows"].items() if isinstance(v, dict)}
    return head + table(
        ["order", "share of neighbours kept from the last epoch",
         "\\|corr\\| of positions between epochs", "regions among 8 batches of 64 documents"],
        [[k, f"{v['adjacent_kept']:.1e}" if is_number(v.get("adjacent_kept")) else "n/a",
          fmt(v.get("position_corr"), digits=4),
          f"{fmt(v.get('regions_per_8_batches'), digits=1)} of "
          f"{fmt(v.get('regions_in_corpus'), digits=0)}"] for k, v in rows.items()])


def _train(r: Result, page: str | None) -> str:
    config = r.report.get("config") or {}
    runs = {k: v for k, v in r.report["runs"].items() if isinstance(v, dict)}
    head = (f"Device: {r.report.get('device', '?')}; {config.get('steps', '?')} steps of "
            f"{config.get('B', '?')} x {config.get('T', '?')}, vocabulary "
            f"{fmt(config.get('vocab'), digits=0)}, {fmt(config.get('documents'), digits=0)} "
            "documents, the same initial weights and document order for every feed. Largest "
            f"difference between the loss curves: "
            f"{fmt(r.report.get('max_abs_loss_difference'), digits=6)}.\n\n")
    out = head + table(
        ["feed", "step ms, mean", "step ms, p50", "share of the step waiting for data",
         "last loss"],
        [[k, fmt(v.get("step_s_mean"), 1e-3, 2), fmt(v.get("step_s_p50"), 1e-3, 2),
          fmt(100 * v["wait_fraction"], digits=2) + "%" if is_number(v.get("wait_fraction"))
          else "n/a", fmt((v.get("loss") or [None])[-1], digits=4)] for k, v in runs.items()])
    figure = r.report.get("figure")
    if isinstance(figure, str) and (r.folder is None or not (r.folder / figure).is_file()):
        out += f"\n\nThe file names a figure, `{figure}`, that `benchmarks/results/` does not hold."
    elif isinstance(figure, str) and page is not None:
        src = posixpath.relpath(f"{SITE_RESULTS}/{figure}", posixpath.dirname(page) or ".")
        out += (f"\n\n![The loss curves of {r.name}]({src})\n\n"
                f"*The loss curves, drawn by the benchmark itself ({figure}); {r.machine}, "
                f"{r.when}.*")
    return out


def _scale(r: Result) -> str:
    """``scale_tables.scale``, and where the file has rows of peer loaders (``bench_scale.py
    --peers``), those beside ndp's packed rank 0 of 1, their data's cost and their model, before
    ndp's model."""
    text = _scale_ndp(r)
    rep = r.report
    rows = [d for d in rep["records"] if isinstance(d, dict)
            and d.get("which") not in (None, "rank 0", "node")]
    if not rows:
        return text
    peers = sorted({str(d["which"]) for d in rows})
    rows += [d for d in rep["records"] if isinstance(d, dict) and d.get("which") == "rank 0"
             and d.get("mode") == "packed" and d.get("world") == 1]
    rows.sort(key=lambda d: (d.get("documents") if is_number(d.get("documents")) else 0,
                             d.get("which") != "rank 0", str(d.get("which"))))

    def name(d: dict) -> str:
        return "ndp packed" if d.get("which") == "rank 0" else str(d.get("which"))

    out = ["", (f"Peer loaders on the same documents ({', '.join(peers)}): each document "
                "followed by EOS in a uint16 stream, converted once into the peer's own format;"
                " each peer in a fresh process in an environment of its own, rank 0 of 1, "
                "`num_workers=0` (each loader's default), its packed-window pipeline with "
                "`shuffle=True`; `next()` across the end of epoch 0 reached by the peer's own "
                "`load_state_dict` (`scale_peers.py`). Import: the peer's (torch included) or "
                "`import ndp`."), "", table(
               ["documents", "loader", "import s", "open s", "first batch s",
                "peak RSS to first batch MB", "peak RSS MB", "`next()` p50 ms",
                "`next()` p99 ms", "boundary step ms", "batches per epoch"],
               [[_docs(d.get("documents")), name(d), fmt(d.get("import_s"), digits=2),
                 fmt(d.get("open_s"), digits=2), fmt(d.get("first_batch_s"), digits=2),
                 fmt(d.get("rss_after_first_batch_mb"), digits=0),
                 fmt(d.get("peak_rss_mb"), digits=0), fmt(d.get("next_p50_ms"), digits=3),
                 fmt(d.get("next_p99_ms"), digits=2), fmt(d.get("boundary_step_ms"), digits=1),
                 fmt(d.get("batches_per_epoch"), digits=0)] for d in rows])]
    conv = [d for d in rep.get("peer_conversions", []) if isinstance(d, dict)]
    if conv:
        out += ["", ("The peers' data, made once per size (`reused`: by an earlier run, whose "
                     "figures these are):"), "", table(
                    ["documents", "loader", "format", "conversion s", "GB", "reused"],
                    [[_docs(d.get("documents")), d.get("which", "?"), d.get("format", "?"),
                      fmt(d.get("convert_seconds"), digits=1),
                      fmt(d.get("converted_bytes"), 1e9, 2), "yes" if d.get("reused") else "no"]
                     for d in conv])]
    mdl = rep.get("model") if isinstance(rep.get("model"), dict) else {}
    fits = {(f.get("which"), f.get("metric")): f for f in mdl.get("fits", [])
            if isinstance(f, dict) and f.get("which") in peers}
    if fits:
        out += ["", (f"**Model, not a measurement**, for the peers as for ndp below: slope k "
                     f"and value at {_docs(mdl.get('documents'))} documents."), "", table(
                    ["loader"] + [header for _, _, header, _ in SCALE_MODEL],
                    [[p] + [_model_cell(fits.get((p, metric)), digits)
                            for metric, _, _, digits in SCALE_MODEL] for p in peers])]
    head, sep, tail = text.partition("\n\n**Model")
    return head + "\n" + "\n".join(out) + sep + tail


def _bad_inputs(r: Result) -> str:
    cases = [c for c in r.report["cases"] if isinstance(c, dict)]
    groups: dict[str, list[dict]] = {}
    for c in cases:
        groups.setdefault(str(c.get("group", "?")), []).append(c)
    head = (f"**{r.report.get('handled', '?')} of {r.report.get('tried', '?')} cases "
            "handled.**\n\n")
    summary = table(["group", "cases", "handled"],
                    [[g, len(cs), sum(bool(c.get("handled")) for c in cs)]
                     for g, cs in groups.items()])
    details = table(["group", "case", "handled", "what ndp did"],
                    [[c.get("group", "?"), c.get("case", "?"), "yes" if c.get("handled") else "NO",
                      re.sub(r"/tmp/\S+?/", ".../", str(c.get("detail", "")))[:160]]
                     for c in cases], numbers=False)
    return head + summary + "\n\n??? note \"Every case\"\n\n" + _indent(details)


def _schedule(r: Result) -> str:
    """``bench_schedule.py``: per mode, what a schedule's machinery adds to host CPU per
    token, the warm-up against its phases' fixed shapes, and next() at changes."""
    rows = []
    for mode, m in r.report["modes"].items():
        if not isinstance(m, dict):
            continue
        warm = m.get("warm-up", {})
        rows.append([mode, _num(m.get("machinery_us_per_chunk"), 1),
                     _num(m.get("machinery_share_of_chunk_percent"), 3),
                     _pct(m.get("machinery_cpu_over_fixed_percent")),
                     _pct(m.get("schedule_cpu_over_fixed_percent")),
                     _num(warm.get("cpu_s_per_1e9_tokens")),
                     _num(m.get("expected_cpu_s_per_1e9_tokens")),
                     _num(warm.get("next_us_steady_p99")), _num(warm.get("next_us_boundary_p99")),
                     _num(m.get("boundary_p99_over_steady_p99"), 2)])
    sched = r.report.get("schedule", {})
    head = ("Schedule: " + ", ".join(f"`{k}` {[p[1] for p in v.get('phases', [])]} from steps "
                                     f"{[p[0] for p in v.get('phases', [])]}"
                                     for k, v in sched.items() if isinstance(v, dict))
            + f"; a training step sleeps {r.report.get('train_factor', '?')}x ndp's decode time "
              f"per token.\n\n")
    return head + table(["mode", "schedule's work us/chunk", "% of a chunk's CPU",
                         "run against fixed (median of rounds)", "warm-up vs its phases fixed",
                         "warm-up CPU-s / 1e9 tokens", "its phases fixed", "next() p99 steady us",
                         "p99 at changes us", "ratio"], rows)


def _first_batch(r: Result) -> str:
    c = r.report.get("config") or {}
    rows = []
    for mode, d in (r.report.get("results") or {}).items():
        if not isinstance(d, dict):
            continue
        cold, ready = d.get("cold") or {}, d.get("numba_ready") or {}
        length = (d.get("len_cold") or {}).get("len_s")
        rows.append([mode, _num(cold.get("to_first_batch_s"), 3),
                     _num(ready.get("to_first_batch_s"), 3), _num(d.get("numba_setup_s"), 3),
                     _num(ready.get("loader_s"), 3), _num(ready.get("first_next_s"), 3),
                     _num(ready.get("close_s"), 3),
                     "-" if length is None else _num(length, 3)])
    size = ("" if c.get("doc_tokens_mean") is None
            else f" of {c.get('doc_tokens_mean')} tokens on average")
    head = (f"{fmt(c.get('documents'), digits=0)} documents{size}; batches of {c.get('batch', '?')} x {c.get('seq', '?')}, "
            f"{c.get('backend', '?')} backend, {c.get('output', '?')} output; a new process per "
            f"run, medians of {c.get('repeat', '?')}. Seconds:\n\n")
    return head + table(["mode", "Loader() to first batch", "the same, Numba set up first",
                         "Numba's set-up", "Loader()", "first next()", "close() after it",
                         "len(), empty count cache"], rows)


def _pct(value) -> str:
    return "?" if not isinstance(value, (int, float)) else f"{value:+.1f}%"


def _num(value, digits: int = 0) -> str:
    return "?" if not isinstance(value, (int, float)) else f"{value:,.{digits}f}"


TABLES = {"decode": _decode, "crc": _crc, "convert": _convert, "loader": _loader,
          "breakdown": _breakdown, "gpu-host": _gpu_host, "loaders": _loaders, "gpu": _gpu,
          "gpu-loader": _gpu,
          "accounting": _accounting, "remote": _remote, "shuffle": _shuffle,
          "bad-inputs": _bad_inputs, "scale": _scale, "train-gpt2": _train_gpt2,
          "schedule": _schedule, "kernels": _kernels, "plan-change": _plan_change,
          "gpu-threads": _threads, "explain": _explain, "first-batch": _first_batch}


def render(kind: str, result: Result, page: str | None) -> str:
    """The table (and notes) of ``kind`` in ``result``."""
    if kind == "train":
        return _train(result, page)
    return TABLES[kind](result)


def _indent(text: str) -> str:
    return "\n".join(("    " + line) if line else "" for line in text.splitlines())


def section(kind: str, results: list[Result], page: str | None,
            charts: dict[str, str] | None = None) -> str:
    """Every file of ``kind``: the featured runs in full (each with its chart, a Markdown image
    from ``charts`` by file name, under it), then the others folded, newest first."""
    files = of_kind(results, kind)
    if not files:
        return ("No results file of this kind in `benchmarks/results/` yet: the command above "
                "makes one.\n")
    first = featured(kind, results)
    out = []
    for r in first:
        out += [provenance(r, page), "", render(kind, r, page), ""]
        if charts and r.name in charts:
            out += [charts[r.name], ""]
    older = [r for r in files if r not in first]
    if older:
        out += [f"Other runs ({len(older)}), newest first:", ""]
        for r in older:
            out += [f"??? note \"{r.name}: {r.when}\"", "",
                    _indent(provenance(r, page) + "\n\n" + render(kind, r, page)), ""]
    return "\n".join(out).rstrip() + "\n"


def files_table(results: list[Result], skipped: list[tuple[str, str]], page: str | None) -> str:
    """Every results file: what it holds, when, on what, by which command."""
    rows = [[link(r.name, page), ", ".join(kinds_of(r.name, r.report)), r.when,
             r.machine.split(";")[0], f"`{r.command}`"] for r in results]
    rows += [[f"`{name}`", f"not shown: {why}", "", "", ""] for name, why in skipped]
    return table(["file", "holds", "date", "machine", "command"], rows)
