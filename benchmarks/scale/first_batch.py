"""What the first batch waits for in a fresh process (issue 37, item 4): ``ndp.Loader(...)`` to
its first ``next()``, each mode, with ndp and torch imported and the dataset in the page cache.

Each run is a new process that imports ndp and torch, then times ``Loader(...)`` and the first
``next()`` (CPU backend, torch output, batches of ``--batch`` x ``--seq``). A run is made twice:

* ``cold``: as a script meets it: the first compiled function the Loader calls also sets up
  Numba's CPU target in this process (its typing and lowering registries: a fixed cost, the
  same for any dataset and any compiled function);
* ``numba_ready``: the same, after one compiled call of ndp's (``tokens_of`` on one entry) has
  set Numba up: the Loader's own part, its cached kernels' loads included.

The difference is Numba's set-up; what is left grows with nothing the dataset holds (the index
is read lazily, the first window's table is not waited for). Then ``close()`` right after the
first batch is timed too (``close_s``): what leaving a loop early waits for while ndp's threads
stop. A third run per mode, ``len_cold``, times ``len(loader)`` right after ``Loader(...)`` with
an empty count cache (``NDP_COUNT_CACHE``: a new folder; Numba set up first): what a script that
asks for the epoch's length before its loop waits for, the exact count made from nothing (in
``packed`` and ``packing`` mode a pass over every packet's index entry; ``padded``: arithmetic).
Medians of ``--repeat`` runs.
JSON ``first-batch-<time>.json`` into ``--out``.

    python benchmarks/scale/first_batch.py --out benchmarks/results    # 1e6 documents, ~1 minute
    python benchmarks/scale/first_batch.py --data DIR --out benchmarks/results  # e.g. 1e8 docs
    python benchmarks/scale/first_batch.py --quick                       # a smoke run
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import add_out_argument, command, machine, write_dataset, write_report  # noqa: E402

MODES = ("padded", "packed", "packing")


def child(data: str, mode: str, ready: str, batch: int, seq: int) -> None:
    """One fresh process's run (``ready``: "0" cold, "1" Numba set up first, "len" the
    length asked for): prints its timings as a JSON line."""
    import numpy as np
    import torch  # noqa: F401  (imported, as in a training script)

    import ndp

    t = time.perf_counter()
    if ready != "0":
        from ndp.store.columns import tokens_of

        tokens_of(np.zeros(1, np.uint16), np.zeros(1, np.uint8))
    t0 = time.perf_counter()
    loader = ndp.Loader(data, mode=mode, batch_size=batch, seq_len=seq, seed=0, backend="cpu",
                        output="torch")
    t1 = time.perf_counter()
    if ready == "len":
        n = len(loader)
        t2 = time.perf_counter()
        loader.close()
        print(json.dumps({"numba_setup_s": t0 - t, "loader_s": t1 - t0, "len_s": t2 - t1,
                          "batches": n}))
        return
    it = iter(loader)  # kept: a loop's iterator lives on (dropping it stops the producer)
    next(it)
    t2 = time.perf_counter()
    del it
    loader.close()  # a loop left after its first batch: what stopping ndp's threads waits for
    t3 = time.perf_counter()
    print(json.dumps({"numba_setup_s": t0 - t, "loader_s": t1 - t0, "first_next_s": t2 - t1,
                      "to_first_batch_s": t2 - t0, "close_s": t3 - t2}))


def write_data(root: Path, documents: int, doc_tokens: int) -> Path:
    """``documents`` documents of 1 to ``2 * doc_tokens - 1`` tokens (``gpu_host``'s data)."""
    return write_dataset(root, tokens=documents * doc_tokens, doc_tokens=doc_tokens, shard_mb=64)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--documents", type=int, default=1_000_000)
    ap.add_argument("--data", type=Path, help="an ndp dataset to read instead of writing one "
                    "(bench_scale.py's, for 1e8 documents)")
    ap.add_argument("--doc-tokens", type=int, default=20, help="mean document length")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="small data, one run: a smoke run")
    ap.add_argument("--child", nargs=3, metavar=("DATA", "MODE", "READY"), help=argparse.SUPPRESS)
    add_out_argument(ap)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], args.child[2], args.batch, args.seq)
        return 0
    if args.quick:
        args.documents, args.repeat, args.batch, args.seq = 2000, 1, 4, 64

    report = {
        "benchmark": "first_batch",
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command(__file__, argv),
        "machine": machine(),
        "config": {"documents": args.documents, "doc_tokens_mean": args.doc_tokens,
                   "batch": args.batch, "seq": args.seq, "repeat": args.repeat,
                   "backend": "cpu", "output": "torch",
                   "page_cache": "warm: the dataset was just written and read once",
                   "count_cache": "empty: each run counts into a new folder"},
        "results": {},
    }
    with tempfile.TemporaryDirectory(prefix="ndp-first-batch-") as tmp:
        if args.data is not None:
            from ndp.store.corpus import Corpus

            data = str(args.data)
            report["config"].update(documents=len(Corpus(data)), data=data,
                                    doc_tokens_mean=None)
        else:
            data = str(write_data(Path(tmp), args.documents, args.doc_tokens))
        subprocess.run([sys.executable, __file__, "--child", data, "packed", "1", "--batch",
                        str(args.batch), "--seq", str(args.seq)], check=True,
                       capture_output=True)  # pages in, compilations cached
        for mode in MODES:
            row = {}
            for name, ready in (("cold", "0"), ("numba_ready", "1"), ("len_cold", "len")):
                runs = []
                for _ in range(args.repeat):
                    with tempfile.TemporaryDirectory(prefix="ndp-counts-", dir=tmp) as counts:
                        proc = subprocess.run(
                            [sys.executable, __file__, "--child", data, mode, ready, "--batch",
                             str(args.batch), "--seq", str(args.seq)],
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "NDP_COUNT_CACHE": counts})
                    if proc.returncode:
                        raise RuntimeError(f"{mode} run failed:\n{proc.stderr[-3000:]}")
                    runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
                row[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                row[name]["runs"] = runs
            row["numba_setup_s"] = row["numba_ready"]["numba_setup_s"]
            report["results"][mode] = row
            print(f"{mode:8s} Loader() to first batch: {row['cold']['to_first_batch_s']:.3f} s "
                  f"as a script meets it, {row['numba_ready']['to_first_batch_s']:.3f} s with "
                  f"Numba set up ({row['numba_setup_s']:.3f} s); close() after it "
                  f"{row['numba_ready']['close_s']:.3f} s; len() on an empty count cache "
                  f"{row['len_cold']['len_s']:.3f} s", flush=True)
    write_report(args.out, "first-batch", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
