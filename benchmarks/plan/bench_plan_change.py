"""What a resume costs when the plan changed by hand or the dataset grew (issue 35, items 3-4).

A run of ``--world`` ranks (8) mixes two sources (the synthetic dataset of ``bench_scale.py``,
its shards split in two groups, "a" and "b") 50/50 in ``padded`` mode; rank 0 saves its state
after ``--steps`` batches (one state is enough in padded mode). Each case then makes a Loader
for rank 0 in a fresh process, loads the state, and takes the first batch, timed; the process's
peak RSS (VmHWM) and CPU seconds are read at its end:

* ``same settings``: a plain resume (the baseline);
* ``another mix``: weights 20/80 (the rest of the epoch mixed again: ``ndp.loader.states.elastic``);
* ``another batch size``: 128 rows instead of 64 (the rest of the epoch in the new shape);
* ``grown by a shard``: the state saved on the dataset without group b's last shard, resumed on
  the whole one (its epoch over the shards it began with: ``ndp.store.growth``);
* ``grown and another mix``: both.

How it grows: a plain resume of a mixed run plans the epoch whole, O(packets); a change plans
the old run's epoch once more (every old rank's share from one order: ``ndp.loader.ordering.whole``)
and the rest once, so O(packets) too, a few times the plain resume's cost.

    python benchmarks/plan/bench_plan_change.py --out benchmarks/results     # 1e7 and 1e8 documents
    python benchmarks/plan/bench_plan_change.py --sizes 1e5 --smoke
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
from scale.scale_data import (  # noqa: E402
    add_dataset_arguments,
    dataset_spec,
    ensure_dataset,
    index_dataset,
    parse_size,
    size_name,
)

OLD_MIX = {"a": 0.5, "b": 0.5}
CASES = {
    "same settings": {},
    "another mix": {"mix": {"a": 0.2, "b": 0.8}},
    "another batch size": {"batch_size": 128},
    "grown by a shard": {"grown": True},
    "grown and another mix": {"grown": True, "mix": {"a": 0.2, "b": 0.8}},
}

#: one case, in a process of its own: argv[1] is a JSON of what to do
CHILD = r"""
import json, resource, sys, time, warnings
t0 = time.perf_counter()
import ndp
job = json.loads(sys.argv[1])
warnings.simplefilter("ignore")
imported = time.perf_counter()
loader = ndp.Loader(job["groups"], **job["kw"])
opened = time.perf_counter()
loader.load_state_dict(job["state"])
loaded = time.perf_counter()
batch = next(iter(loader))
first = time.perf_counter()
assert batch["input_ids"].shape[0] == job["kw"]["batch_size"]
rest = loader.state_dict().get("elastic") is not None
loader.close()
usage = resource.getrusage(resource.RUSAGE_SELF)
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"import_s": imported - t0, "open_s": opened - imported,
                  "load_state_s": loaded - opened, "first_batch_s": first - loaded,
                  "total_s": first - imported, "cpu_s": usage.ru_utime + usage.ru_stime,
                  "peak_rss_mb": hwm / 1024, "in_a_remainder": rest}))
"""


def groups_of(folder: Path, *, grown: bool) -> dict:
    shards = sorted(str(p) for p in folder.glob("shard-*.ndp"))
    if len(shards) < 3:
        raise SystemExit(f"{folder} has {len(shards)} shard(s): two groups and one shard to "
                         f"append need 3 or more (a smaller --shard-mb makes more, in another "
                         f"--data folder than bench_scale.py's)")
    half = len(shards) // 2
    return {"a": shards[:half], "b": shards[half:] if grown else shards[half:-1]}


def saved_state(groups: dict, kw: dict, steps: int) -> dict:
    """Rank 0's state after ``steps`` batches of the old run."""
    import ndp

    loader = ndp.Loader(groups, **kw)
    it = iter(loader)
    for _ in range(steps):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    return state


def run_case(groups: dict, kw: dict, state: dict) -> dict:
    job = json.dumps({"groups": groups, "kw": kw, "state": state})
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, "-c", CHILD, job], capture_output=True,
                             text=True, cwd=tmp)
    if out.returncode != 0:
        raise SystemExit(f"case failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(n: int, args: argparse.Namespace) -> dict:
    folder = args.data / f"docs-{size_name(n)}"
    made = ensure_dataset(folder, dataset_spec(n, args))
    if not (folder / "ndp.json").exists() or not made["reused"]:
        index_dataset(folder)
    kw = dict(mode="padded", batch_size=64, seq_len=args.doc_tokens, seed=0, output="arrays",
              backend="cpu", rank=0, world_size=args.world, mix=OLD_MIX)
    states = {grown: saved_state(groups_of(folder, grown=not grown), kw, args.steps)
              for grown in (False, True)}
    cases = {}
    for name, change in CASES.items():
        new = {**kw, **{k: v for k, v in change.items() if k != "grown"}}
        got = run_case(groups_of(folder, grown=True), new, states[change.get("grown", False)])
        cases[name] = got
        print(f"{size_name(n)} {name}: load {got['load_state_s']:.2f} s, first batch "
              f"{got['first_batch_s']:.2f} s, {got['peak_rss_mb']:,.0f} MB", flush=True)
    base = cases["same settings"]["total_s"]
    for got in cases.values():
        got["over_same_settings"] = got["total_s"] / base
    return {"documents": n, "shards": made["shards"], "cases": cases}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1e7,1e8", help="documents, comma separated")
    parser.add_argument("--world", type=int, default=8, help="ranks of the run")
    parser.add_argument("--steps", type=int, default=20, help="batches before the state")
    add_dataset_arguments(parser)
    parser.add_argument("--smoke", action="store_true", help="small shards, seconds")
    add_out_argument(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.shard_mb, args.data = 0.5, Path(tempfile.mkdtemp(prefix="ndp-plan-change-"))
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    started = time.perf_counter()
    results = [measure(n, args) for n in sizes]
    report = {"benchmark": "plan-change",
              "command": command(__file__, argv),
              "when": datetime.now(timezone.utc).isoformat(), "machine": machine(),
              "world_size": args.world, "steps_before_state": args.steps,
              "old_mix": OLD_MIX, "mode": "padded", "batch_size": 64,
              "sizes": results, "seconds": time.perf_counter() - started}
    write_report(None, "plan-change", report,
                 path=report_path(args.out, "plan-change", tag="-smoke" if args.smoke else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
