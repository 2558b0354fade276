"""How ndp's costs grow with the number of documents: open time, first batch, peak RSS,
``next()`` across an epoch boundary and ``ndp index``, at 1e6, 1e7 and 1e8 documents, written
as JSON with a fitted power law per cost (cost ~ N^k) and a model of 1.3e9 documents. This file
is the driver: the command line, the measured processes it runs, the fitted model and the JSON.

    python benchmarks/scale/bench_scale.py                          # 1e6, 1e7, 1e8; every mode
    python benchmarks/scale/bench_scale.py --sizes 1e6,1e7 --modes packed --worlds 8
    python benchmarks/scale/bench_scale.py --at 1e8:worlds=8:modes=padded,packed:node=no
    python benchmarks/scale/bench_scale.py --quick                  # 1e4 and 1e5: a smoke run
    python benchmarks/scale/bench_scale.py --peers torchdata,litdata  # with the peers (scale_peers)
    python benchmarks/scale/bench_scale.py --out benchmarks/results # adds to the project's record

``scale-<time>.json`` goes to ``--out`` (default ``$NDP_RESULTS_DIR``, else ``./ndp-results``;
see ``harness.py``).

**Data.** ``N`` documents of ``--doc-tokens`` (16) uint16 tokens each, generated once into
``--data`` (default ``/tmp/ndp-scale-data``) and reused while they match, then indexed by
``ndp index --write-manifest`` (timed) and, up to ``--verify-max`` documents, checked by
``ndp verify``: ``scale_data.py``.

**Measurements.** Each in a fresh process (``python bench_scale.py --worker``, which runs
``scale_worker.py``'s ``worker``), so that peak RSS is that run's alone: open time, first batch,
peak RSS (``VmHWM``) and the ``next()`` waits across the end of epoch 0, reached by resuming
from a state built from the index (``scale_worker.py`` says how).

**A node.** ``W`` ranks of one node as ``W`` processes started at once (open and first batch
only): the sum of their peak RSS (each process's own peak: the node's peak is at most that) and
the slowest open + first batch. Skipped, with the reason recorded, where ``W`` times rank 0's
peak RSS would pass 80% of this machine's memory.

**Model.** Per cost, a least-squares line through log(cost) against log(N) over the sizes
measured (at least two): the slope ``k`` of cost ~ N^k, and that line's value at 1.3e9
documents (8 ranks a node: rank 0, and the node as 8 times rank 0): labelled as a model, not a
measurement. Peak RSS is fitted above the process's RSS after ``import ndp`` (the interpreter and
libraries do not grow with N).

Timings come from whatever machine runs this; on a shared machine (the project's 2-core CI VM,
other jobs beside) they vary from run to run: the file records the load average at the start
and the end.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import OUT_HELP, add_out_argument, command, write_report  # noqa: E402
from scale.scale_data import (add_dataset_arguments, dataset_matches,  # noqa: E402
                              dataset_spec, ensure_dataset, index_dataset, parse_size,
                              size_name, verify_dataset)
from scale.scale_worker import CHECK_STATES_BATCHES, worker  # noqa: E402

MODES = ("padded", "packed", "packing")
#: the sizes the model is made for: 1.3e9 documents, 8 ranks a node
MODEL_DOCUMENTS = 1.3e9
MODEL_RANKS = 8
NODE_MEMORY_SHARE = 0.8
_COUNTS: list[str] = []  # the folder the runs' epoch counts go to (``counts_dir``)


def counts_dir() -> str:
    """A new empty folder for one run's (or one node's) epoch counts, under one made for this
    command and removed at its end (``main``)."""
    if not _COUNTS:
        _COUNTS.append(tempfile.mkdtemp(prefix="ndp-scale-counts-"))
    return tempfile.mkdtemp(dir=_COUNTS[0])


def run_worker(spec: dict, cwd: Path, counts: str | None = None) -> subprocess.Popen:
    """``bench_scale.py --worker SPEC`` started: ``scale_worker.worker`` (found beside this
    file), its epochs' counts kept in ``counts`` (``NDP_COUNT_CACHE``; a new empty directory
    by default: every run counts afresh, as a first run on a dataset does)."""
    env = dict(os.environ, NDP_COUNT_CACHE=counts or counts_dir())
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker",
                             json.dumps(spec)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def finish_worker(proc: subprocess.Popen, what: str) -> dict:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{what}: the worker failed ({proc.returncode}):\n{err[-4000:]}")
    return json.loads(out.strip().splitlines()[-1])


def memory_mb() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20


def ndp_commit() -> str:
    """The commit of the ndp measured: of the checkout it is imported from (``-dirty`` where
    its sources differ), or a copy's ``.ndp-commit`` file (``git archive`` leaves none)."""
    import ndp

    root = Path(ndp.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=root).stdout.strip()
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, cwd=root).stdout.strip()
        if commit and Path(top).resolve() == root:
            changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no",
                                      "--", "ndp", "kernels", "pyproject.toml"],
                                     capture_output=True, text=True, cwd=root).stdout.strip()
            return commit + ("-dirty" if changed else "")
    except OSError:
        pass
    marker = root / ".ndp-commit"
    if marker.is_file():
        return marker.read_text().strip()[:7] + " (a copy)"
    return ""


def machine() -> dict:
    """``harness.machine()`` (it imports ndp: called in the driver only, never where a worker
    times ``import ndp``), with the commit and path of the ndp measured (a copy's too)."""
    import ndp
    from harness import machine as common

    out = common()
    out.update(ndp_commit=ndp_commit(), ndp_path=str(Path(ndp.__file__).resolve().parent))
    return out


def fit(points: list[tuple[float, float]]) -> dict | None:
    """Least squares of log(cost) on log(N): slope k and the line's value at the model size."""
    points = [(n, c) for n, c in points if c and c > 0 and math.isfinite(c)]
    if len({n for n, _ in points}) < 2:
        return None
    x = np.log([n for n, _ in points])
    y = np.log([c for _, c in points])
    k, a = np.polyfit(x, y, 1)
    return {"slope": float(k), "at_model_documents": float(math.exp(a + k * math.log(
        MODEL_DOCUMENTS))), "sizes": sorted({int(n) for n, _ in points})}


#: the costs fitted, per record: (key, unit, what); peak RSS is fitted above the RSS after import
FITTED = [("open_s", "s", "open (Loader constructor)"),
          ("first_batch_s", "s", "first next()"),
          ("open_plus_first_s", "s", "open + first batch"),
          ("peak_rss_growth_mb", "MB", "peak RSS above the RSS after import ndp"),
          ("next_p99_ms", "ms", "p99 next() across the epoch boundary"),
          ("paced_next_p99_ms", "ms", "p99 next() across the boundary, a paced consumer"),
          ("boundary_step_ms", "ms", "the step across the epoch boundary")]


def model(records: list[dict], index: list[dict]) -> dict:
    """Fitted slopes and the 1.3e9-document values, per (mode, world, which)."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["mode"], r["world"], r["which"]), []).append(r)
    fits = []
    for (mode, world, which), rows in sorted(groups.items()):
        for key, unit, what in FITTED + ([("peak_rss_mb", "MB", "peak RSS")]
                                         if which == "node" else []):
            if which == "node" and key not in ("open_plus_first_s", "peak_rss_mb"):
                continue
            f = fit([(r["documents"], r.get(key)) for r in rows])
            if f is None:
                continue
            if key == "peak_rss_growth_mb":
                base = float(np.median([r["rss_after_import_mb"] for r in rows]))
                f["plus_import_mb"] = base
                f["peak_rss_mb_at_model_documents"] = f["at_model_documents"] + base
            fits.append({"mode": mode, "world": world, "which": which, "metric": key,
                         "unit": unit, "what": what, **f})
    f = fit([(r["documents"], r["seconds"]) for r in index])
    if f is not None:
        fits.append({"mode": None, "world": None, "which": "ndp index", "metric": "index_s",
                     "unit": "s", "what": "ndp index --write-manifest", **f})
    node = []
    for f in fits:
        if f["which"] == "rank 0" and f["world"] == MODEL_RANKS and f["metric"] == \
                "peak_rss_growth_mb":
            node.append({"mode": f["mode"], "ranks": MODEL_RANKS,
                         "node_peak_rss_mb": MODEL_RANKS * f["peak_rss_mb_at_model_documents"]})
    return {"label": "model: a power law fitted to the sizes measured, extrapolated; not a "
                     "measurement",
            "documents": MODEL_DOCUMENTS, "ranks_per_node": MODEL_RANKS, "fits": fits,
            "node_from_rank0": node}


def parse_at(text: str) -> tuple[int, dict]:
    """``1e8:worlds=8:modes=padded,packed:node=no`` -> (size, overrides)."""
    size, *parts = text.split(":")
    out: dict = {}
    for part in parts:
        key, _, value = part.partition("=")
        if key == "worlds":
            out["worlds"] = [int(w) for w in value.split(",")]
        elif key == "modes":
            out["modes"] = value.split(",")
        elif key == "node":
            out["node"] = value in ("yes", "1", "true")
        else:
            raise argparse.ArgumentTypeError(f"--at: unknown key {key!r} in {text!r}")
    return parse_size(size), out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="ndp's costs against the number of documents: open, first batch, peak RSS, "
                    "next() across an epoch boundary, ndp index; JSON with a fitted model")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default=None,
                        help="documents, comma-separated (default 1e6,1e7,1e8; --quick 1e4,1e5)")
    parser.add_argument("--modes", default=",".join(MODES), help="Loader modes, comma-separated")
    parser.add_argument("--worlds", default=None,
                        help="world sizes, rank 0 of each timed (default 1,8; --quick 1,2)")
    parser.add_argument("--at", action="append", type=parse_at, default=[], metavar="SPEC",
                        help="per-size overrides: SIZE[:worlds=W,..][:modes=M,..][:node=yes|no]")
    parser.add_argument("--no-node", action="store_true",
                        help="no run of every rank of a node as processes at once")
    parser.add_argument("--quick", action="store_true",
                        help="1e4 and 1e5 documents, batches of 8 x 256, 2 ranks, 16 batches "
                             "each side of the boundary: a smoke run")
    parser.add_argument("--batch", type=int, default=None, help="batch size (default 16)")
    parser.add_argument("--seq", type=int, default=None, help="seq_len (default 1024)")
    add_dataset_arguments(parser)
    parser.add_argument("--boundary", type=int, default=None,
                        help="batches timed on each side of the epoch boundary (default 64)")
    parser.add_argument("--check-states", choices=("auto", "yes", "no"), default="auto",
                        help=f"check the built resume state by iterating to it (auto: epochs "
                             f"of at most {CHECK_STATES_BATCHES:,} batches)")
    parser.add_argument("--verify-max", type=parse_size, default=10**7,
                        help="run 'ndp verify' on datasets of at most this many documents")
    parser.add_argument("--peers", default="", help="also torchdata, litdata (comma-separated) "
                        "on the same documents, rank 0 of 1: scale_peers.py (default: none)")
    add_out_argument(parser, OUT_HELP)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    for name, full, quick in (("sizes", "1e6,1e7,1e8", "1e4,1e5"), ("worlds", "1,8", "1,2"),
                              ("batch", 16, 8), ("seq", 1024, 256), ("boundary", 64, 16)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    overrides = dict(args.at)
    unknown = sorted(set(overrides) - set(sizes))
    if unknown:
        parser.error(f"--at names sizes not in --sizes: {unknown}")
    modes = args.modes.split(",")
    if set(modes) - set(MODES):
        parser.error(f"--modes: unknown {sorted(set(modes) - set(MODES))}")
    worlds = [int(w) for w in args.worlds.split(",")]
    peer_list = [p for p in args.peers.split(",") if p]
    if peer_list:
        from scale import scale_peers
        if set(peer_list) - set(scale_peers.PEERS):
            parser.error(f"--peers: unknown {sorted(set(peer_list) - set(scale_peers.PEERS))}")
    data = args.data.resolve()
    repo = Path(__file__).resolve().parents[2]
    if data == repo or repo in data.parents:
        parser.error(f"--data {data} is inside the repository: give a folder outside it")
    data.mkdir(parents=True, exist_ok=True)

    import ndp

    report = {
        "benchmark": "scale",
        "command": command(__file__, argv),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "load_average_start": list(os.getloadavg()),
        "config": {"batch": args.batch, "seq_len": args.seq, "doc_tokens": args.doc_tokens,
                   "vocab": args.vocab, "token_typ": "TOKEN_IDS_U16", "shard_mb": args.shard_mb,
                   "backend": "cpu", "output": "arrays", "seed": 0, "rank": 0,
                   "boundary_batches": args.boundary, "warm_batches": 8},
        "method": {
            "open": "ndp.Loader(...) constructor, in a fresh process",
            "first_batch": "the first next() after it",
            "peak_rss": "the process's VmHWM: the larger of its peak to the first batch and "
                        "its peak across the epoch boundary (VmHWM reset after the resume, "
                        "whose own peak is resume_peak_rss_mb); rss_after_first_batch_mb is "
                        "the peak to the first batch",
            "epoch_boundary": (
                "resumed from a state built for batch len(loader) - boundary - 8 of epoch 0 "
                "(Loader.state_dict() with the position the mode's layout gives after that "
                "batch, from the index's token counts, sealed by ndp.loader.states.state.seal and "
                "checked by load_state_dict); 8 untimed batches; then every next() of the "
                "last `boundary` batches of epoch 0 and the first `boundary` of epoch 1, the "
                "step across the boundary (StopIteration, iter(), first next()) as one wait"),
            "node": "every rank of a node (rank 0..W-1 of W) as W processes started at once, "
                    "open and first batch only: the sum of each process's own peak RSS and "
                    "the slowest open + first batch; the ranks share one epoch count "
                    "(ndp.loader.planning.shared_count), as a node's ranks do",
            "counts": "every run counts its epochs afresh: NDP_COUNT_CACHE is a new empty "
                      "directory per process (per node for a node's ranks)",
            "ndp_index": "python -m ndp.cli index --write-manifest DIR, timed in a process of "
                         "its own (its peak RSS from wait4)",
        },
        "datasets": [], "index": [], "records": [], "skipped": [],
    }
    ndp_file = ndp.__file__

    # the warm-up: Numba's cache filled (and checked loadable) before any timed run
    warm_dir = data / "warmup"
    warm_spec = dataset_spec(4096, args)
    if not dataset_matches(warm_dir, warm_spec) or not (warm_dir / "ndp.json").is_file():
        ensure_dataset(warm_dir, warm_spec)
        index_dataset(warm_dir)
    for mode in modes:
        finish_worker(run_worker({"data": str(warm_dir), "mode": mode, "batch": args.batch,
                                  "seq": args.seq, "rank": 0, "world": 1, "boundary": 2},
                                 data), f"warm-up {mode}")
    if peer_list:
        scale_peers.warm_up(data, args, peer_list, report)
    print(f"ndp from {Path(ndp_file).parent}; data in {data}", flush=True)

    for n in sizes:
        over = overrides.get(n, {})
        folder = data / f"docs-{size_name(n)}"
        spec = dataset_spec(n, args)
        made = ensure_dataset(folder, spec)
        print(f"{size_name(n)}: {made['shards']} shards, {made['bytes'] / 1e9:.2f} GB "
              + ("reused" if made["reused"] else f"generated in {made['generated_seconds']:.1f} s"),
              flush=True)
        idx = index_dataset(folder)
        if idx["packets"] != n or idx["corrupt"]:
            raise SystemExit(f"ndp index found {idx['packets']} packets and {idx['corrupt']} "
                             f"corrupt regions in {folder}; expected {n} and none")
        print(f"  ndp index: {idx['seconds']:.1f} s, peak RSS {idx['peak_rss_mb']:.0f} MB",
              flush=True)
        report["index"].append({"documents": n, **idx})
        verified = None
        if n <= args.verify_max:
            verified = verify_dataset(folder)
            print(f"  ndp verify: ok in {verified['seconds']:.1f} s", flush=True)
        report["datasets"].append({"documents": n, "path": str(folder), **spec, **made,
                                   "tokens": n * args.doc_tokens, "verify": verified
                                   or f"not run (over --verify-max {args.verify_max:.0e}); the "
                                      f"Loader runs validate what they decode"})
        for world in over.get("worlds", worlds):
            for mode in over.get("modes", modes):
                base = {"data": str(folder), "mode": mode, "batch": args.batch, "seq": args.seq,
                        "world": world}
                check = {"yes": True, "no": False, "auto": "auto"}[args.check_states]
                res = finish_worker(run_worker({**base, "rank": 0, "boundary": args.boundary,
                                                "check_state": check}, data),
                                    f"{size_name(n)} {mode} world {world}")
                if res["ndp_file"] != ndp_file:
                    raise SystemExit(f"the worker imported ndp from {res['ndp_file']}, the "
                                     f"driver from {ndp_file}")
                rec = {"documents": n, "mode": mode, "world": world, "which": "rank 0",
                       **{k: v for k, v in res.items() if k != "ndp_file"}}
                rec["open_plus_first_s"] = rec["open_s"] + rec["first_batch_s"]
                rec["peak_rss_growth_mb"] = rec["peak_rss_mb"] - rec["rss_after_import_mb"]
                report["records"].append(rec)
                print(f"  {mode:8s} rank 0 of {world}: open {rec['open_s']:6.2f} s  first "
                      f"batch {rec['first_batch_s']:6.2f} s  peak RSS {rec['peak_rss_mb']:7.0f} "
                      f"MB  next() p99 {rec.get('next_p99_ms', float('nan')):8.2f} ms  "
                      f"boundary step {rec.get('boundary_step_ms', float('nan')):8.1f} ms  "
                      f"paced p99 {rec.get('paced_next_p99_ms', float('nan')):6.2f} ms  "
                      f"({rec['batches_per_epoch']:,} batches)", flush=True)
                if world < 2 or args.no_node or not over.get("node", True):
                    continue
                need = world * rec["peak_rss_mb"]
                limit = NODE_MEMORY_SHARE * memory_mb()
                if need > limit:
                    why = (f"{world} x rank 0's peak RSS ({rec['peak_rss_mb']:,.0f} MB) = "
                           f"{need:,.0f} MB, over {NODE_MEMORY_SHARE:.0%} of this machine's "
                           f"{memory_mb():,.0f} MB")
                    report["skipped"].append({"documents": n, "mode": mode, "world": world,
                                              "which": "node", "reason": why})
                    print(f"  {mode:8s} node of {world}: skipped: {why}", flush=True)
                    continue
                t0 = time.perf_counter()
                shared = counts_dir()  # the node's ranks share it
                procs = [run_worker({**base, "rank": r, "boundary": 0}, data, shared)
                         for r in range(world)]
                ranks = [finish_worker(p, f"{size_name(n)} {mode} rank {r} of {world}")
                         for r, p in enumerate(procs)]
                wall = time.perf_counter() - t0
                node = {"documents": n, "mode": mode, "world": world, "which": "node",
                        "ranks": world, "wall_s": wall,
                        "open_s": max(r["open_s"] for r in ranks),
                        "first_batch_s": max(r["first_batch_s"] for r in ranks),
                        "open_plus_first_s": max(r["open_s"] + r["first_batch_s"]
                                                 for r in ranks),
                        "peak_rss_mb": sum(r["peak_rss_mb"] for r in ranks),
                        "peak_rss_max_rank_mb": max(r["peak_rss_mb"] for r in ranks),
                        "rss_after_import_mb": sum(r["rss_after_import_mb"] for r in ranks)}
                report["records"].append(node)
                print(f"  {mode:8s} node of {world}: slowest open + first batch "
                      f"{node['open_plus_first_s']:6.2f} s  sum of peak RSS "
                      f"{node['peak_rss_mb']:7.0f} MB", flush=True)
        if peer_list:
            scale_peers.measure(n, data, args, report, peer_list)
    report["model"] = model(report["records"], report["index"])
    report["load_average_end"] = list(os.getloadavg())
    write_report(args.out, "scale", report)
    if _COUNTS:
        shutil.rmtree(_COUNTS.pop(), ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
