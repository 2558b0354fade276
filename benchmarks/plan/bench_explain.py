"""What ``loader.explain(step)`` costs at the size users bring (issue 36: one step at 1e8
documents in under a second).

On the synthetic dataset of ``bench_scale.py`` (documents of 16 tokens), rank 3 of ``--world``
(8) asks each mode, in a process of its own, for run steps from the epoch's start to its far
end, one after the other: each call's wall and CPU seconds, and the first call's apart (it
loads Numba's cached compilations, and counts the epoch where ``len`` is not yet known). How
it grows (``ndp.loader.explain``): ``padded`` finds a batch by arithmetic; ``packing`` by one
compiled pass over the index token counts of the share positions from the count's mark
before it (``ndp.loader.planning.marks``: every 256th batch; O(1)); ``packed`` reads and
checks the packets from its mark (marks at most 2**20 tokens apart, O(1)) once every
packet is known to decode to its index's tokens (``ndp.store.clean``: a pass over the data,
once per dataset and kept, timed apart as ``clean_check``), else from the epoch's start
(O(position), the bytes too), or from the last step explained in the same epoch or where the
Loader stands (a loop's position, or a resumed state's): the last call, in a Loader resumed
from a state saved after ``--loop-steps`` batches, asks for the step 5 after it.

    python benchmarks/plan/bench_explain.py --out benchmarks/results            # 1e8 documents
    python benchmarks/plan/bench_explain.py --sizes 1e5 --smoke
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import add_out_argument, command, machine, report_path, write_report  # noqa: E402
from scale.scale_data import (add_dataset_arguments, dataset_spec, ensure_dataset,  # noqa: E402
                              index_dataset, parse_size, size_name)

#: per mode: (batch_size, seq_len) and the steps asked, as fractions of the epoch's batches
SHAPES = {"padded": (64, 64), "packing": (64, 64), "packed": (64, 1024)}
FRACTIONS = (0.0, 0.001, 0.01, 0.1, 0.5)

#: one mode, in a process of its own: argv[1] is a JSON of what to do
CHILD = r"""
import json, resource, sys, time
import ndp
job = json.loads(sys.argv[1])
loader = ndp.Loader(job["data"], **job["kw"])
t = time.perf_counter()
n = len(loader)
count_s = time.perf_counter() - t
# packed: the one check that every packet decodes to its index's tokens (kept: a later
# process finds it), which packed marks rely on; timed apart from the calls
from ndp.loader.planning.shared_count import count_dir
from ndp.store.clean import all_clean
t, c = time.perf_counter(), time.process_time()
clean = (all_clean(loader.corpus, loader.vocab_size, keep=count_dir(), progress=False)
         if job["kw"]["mode"] == "packed" else None)
check = {"clean": clean, "wall_s": time.perf_counter() - t, "cpu_s": time.process_time() - c}
rows = []
for f in job["fractions"]:
    step = min(int(f * n), n - 1)
    t, c = time.perf_counter(), time.process_time()
    ex = loader.explain(step)
    rows.append({"step": step, "fraction": f, "wall_s": time.perf_counter() - t,
                 "cpu_s": time.process_time() - c, "pieces": len(ex.pieces),
                 "rows": ex.rows})
# from a state saved a few steps before (a checkpoint; ndp explain --state): found from there
it = iter(loader)
for _ in range(job["loop_steps"]):
    next(it)
state = loader.state_dict()
loader.close()
loader = ndp.Loader(job["data"], **job["kw"])
loader.load_state_dict(state)
step = loader.step + 5
t, c = time.perf_counter(), time.process_time()
ex = loader.explain(step)
rows.append({"step": step, "fraction": step / n, "wall_s": time.perf_counter() - t,
             "cpu_s": time.process_time() - c, "pieces": len(ex.pieces), "rows": ex.rows,
             "after_loop_steps": job["loop_steps"]})
loader.close()
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"batches": n, "len_s": count_s, "clean_check": check, "calls": rows,
                  "peak_rss_mb": hwm / 1024}))
"""


def measure(n: int, mode: str, args: argparse.Namespace) -> dict:
    folder = args.data / f"docs-{size_name(n)}"
    made = ensure_dataset(folder, dataset_spec(n, args))
    if not (folder / "ndp.json").exists() or not made["reused"]:
        index_dataset(folder)
    B, T = SHAPES[mode]
    kw = dict(mode=mode, batch_size=B, seq_len=T, seed=0, output="arrays", backend="cpu",
              rank=3, world_size=args.world)
    job = json.dumps({"data": str(folder), "kw": kw, "fractions": FRACTIONS,
                      "loop_steps": args.loop_steps})
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, "-c", CHILD, job], capture_output=True,
                             text=True, cwd=tmp)
    if out.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{out.stderr[-3000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    check = got["clean_check"]
    if check["clean"] is not None:
        print(f"{size_name(n)} {mode}: packets checked against their indexes "
              f"(clean: {check['clean']}) in {check['wall_s']:.2f} s wall, "
              f"{check['cpu_s']:.2f} s CPU, once", flush=True)
    for row in got["calls"]:
        print(f"{size_name(n)} {mode}: step {row['step']:>9,} ({row['fraction']:.1%}) "
              f"{row['wall_s']:.2f} s wall, {row['cpu_s']:.2f} s CPU", flush=True)
    return {"documents": n, "mode": mode, "batch_size": B, "seq_len": T,
            "shards": made["shards"], **got}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1e8", help="documents, comma separated")
    parser.add_argument("--modes", default="padded,packing,packed")
    parser.add_argument("--world", type=int, default=8, help="ranks of the run")
    parser.add_argument("--loop-steps", type=int, default=20,
                        help="batches before the state the last call's Loader resumes from; "
                             "it explains the step 5 after it (found from there)")
    add_dataset_arguments(parser)
    parser.add_argument("--smoke", action="store_true", help="small shards, seconds")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.shard_mb, args.data = 0.5, Path(tempfile.mkdtemp(prefix="ndp-explain-"))
    started = time.perf_counter()
    rows = [measure(parse_size(s), mode, args) for s in args.sizes.split(",")
            for mode in args.modes.split(",")]
    report = {"benchmark": "explain",
              "command": command(__file__, argv),
              "when": datetime.now(timezone.utc).isoformat(), "machine": machine(),
              "world_size": args.world, "rank": 3, "rows": rows,
              "seconds": time.perf_counter() - started}
    write_report(None, "explain", report,
                 path=report_path(args.out, "explain", tag="-smoke" if args.smoke else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
