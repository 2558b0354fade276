"""The GPU Loader's host ceiling, measured without a GPU: its host time and CPU per batch with
every device call replaced by a counting no-op (``null_device.py``).

    python benchmarks/gpu/gpu_host.py                     # 64 x 1024 batches, ~2 minutes on 2 cores
    python benchmarks/gpu/gpu_host.py --quick              # small data, for a smoke run
    python benchmarks/gpu/gpu_host.py --out benchmarks/results   # adds to the project's record

A synthetic dataset of documents of 1 to ``2 * --doc-tokens - 1`` uint16 tokens (uniform, mean
``--doc-tokens``, 1,024 by default: about a FineWeb-Edu document) in shards of ``--shard-mb`` MiB,
page cache warm. For each mode (padded, packed, packing) and each source:

* ``host``: shards copied to the "device" as the chunks need them, through the pinned bounce
  buffers (pread(2) and the header checks included), with ``shuffle_window`` two shards and an
  arena of eight (fewer than the dataset's shards), so shards are copied again each epoch, as
  on a dataset far larger than the device's memory;
* ``resident``: every shard copied once, at construction;

the Loader (``backend="cuda"``, torch output, default chunk size: 64 batches) runs one epoch to
warm up (compilation, allocation), then whole epochs timed until ``--seconds`` have passed, the
consumer taking batches and doing nothing else, so ndp's threads and the consumer share the cores as fast as they go.
Reported per batch: wall microseconds (the host's ceiling: ``batch * seq`` tokens over it is the
most tokens/s the host side can feed), the same within epochs (from each epoch's first batch to
its last: an epoch's start waits 3-7 ms here while the next epoch is planned, counted and its
first window's table built on ndp's other threads, a fifth of an epoch of this default dataset's
1,536 batches and nothing in a run's epochs of 1e5 batches and more), process CPU
microseconds (every thread; every epoch counted, ``harness.fresh_counts``), the consumer
thread's CPU, CPU-seconds per 1e9 tokens, and each kind of device call per batch. The targets of
issue 27 (<= 10 us of host time a batch, <= 1 CPU-s per 1e9 tokens) are reported as met or not.
JSON ``gpu-host-<time>.json`` into ``--out`` (default ``$NDP_RESULTS_DIR``, else ``./ndp-results``).
Not included: the host cost of the device calls themselves (counted here; timed on a GPU by
``bench_gpu_loader.py``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu import null_device  # noqa: E402  (first: it switches Numba's simulator on)
import numpy as np  # noqa: E402

from harness import (add_out_argument, command, fresh_counts, machine,  # noqa: E402
                     write_dataset, write_report)

#: issue 27's targets for the host side (never asserted by tests)
TARGETS = {"host_us_per_batch": 10.0, "cpu_s_per_billion_tokens": 1.0}


def measure(corpus, truth: np.ndarray, *, mode: str, resident: bool, batch: int, seq: int,
            seconds: float, shard_bytes: int) -> dict:
    """One Loader on the null device: a warm-up epoch, then whole epochs for ``seconds``."""
    import ndp

    made: list = []
    base, *extra = mode.split("+")  # "packed+documents": documents=True; "+bos": align
    options = dict(mode=base, batch_size=batch, seq_len=seq, seed=0, backend="cuda",
                   resident=resident, output="torch", documents="documents" in extra,
                   align="bos" if "bos" in extra else None)
    if not resident:
        options.update(shuffle_window=2 * shard_bytes, device_budget=8 * shard_bytes)
    with null_device.null_device(made), fresh_counts():  # each epoch counted, as in a run
        loader = ndp.Loader(corpus, **options)
        engine = made[-1]
        engine.truth = truth
        warm = sum(1 for _ in loader)
        calls0, counts0 = dict(engine.calls), loader.counters.as_dict()
        own0 = engine.own_seconds
        consumer0 = time.thread_time()
        cpu0, t0 = time.process_time(), time.perf_counter()
        batches = epochs = 0
        within = within_batches = 0.0  # from each epoch's first batch to its last
        while time.perf_counter() - t0 < seconds:
            it = iter(loader)
            if next(it, None) is None:
                break
            first, n = time.perf_counter(), 1
            for _b in it:
                n += 1
            within += time.perf_counter() - first
            within_batches += n - 1
            batches += n
            epochs += 1
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        consumer = time.thread_time() - consumer0
        counts = loader.counters.since(counts0)
        calls = {k: engine.calls.get(k, 0) - calls0.get(k, 0) for k in null_device.CALLS}
        own = engine.own_seconds - own0
        threads = threading.active_count()
        chunk_batches = loader.chunk_batches
        stats = loader.stats
        loader.close()
    per = max(batches, 1)
    tokens = batches * batch * seq
    return {
        "mode": mode, "source": "resident" if resident else "host", "warmup_batches": warm,
        "epochs": epochs, "batches": batches, "chunk_batches": chunk_batches, "seconds": wall,
        "host_us_per_batch": wall / per * 1e6,
        # the epochs' starts left out (a run's epochs are far longer than this dataset's)
        "within_epoch_us_per_batch": within / max(within_batches, 1) * 1e6,
        "cpu_us_per_batch": cpu / per * 1e6,
        "consumer_cpu_us_per_batch": consumer / per * 1e6,
        "cpu_s_per_billion_tokens": cpu / max(tokens, 1) * 1e9,
        "ceiling_tokens_per_s": tokens / wall if wall else 0.0,
        "null_device_own_us_per_batch": own / per * 1e6,
        "device_calls_per_batch": {k: v / per for k, v in calls.items()},
        "counters_per_batch": {k: v / per for k, v in counts.items() if k != "batches"},
        "threads_alive": threads,
        # align="bos": of the stream's tokens read or passed over, the share passed over
        "left_over_share": stats.left_over_tokens / max(stats.tokens + stats.left_over_tokens,
                                                        1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=96 << 20, help="tokens in the dataset")
    ap.add_argument("--doc-tokens", type=int, default=1024, help="mean document length")
    ap.add_argument("--shard-mb", type=int, default=16)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=4.0,
                    help="timed per run (whole epochs, at least one)")
    ap.add_argument("--modes", default="padded,packed,packing",
                    help="modes to run; packed+documents: packed with documents=True; "
                         "packed+bos: with align='bos' (packed+documents+bos: both)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the modes this many times over, interleaved; with a mode and its "
                         "+ variant (packed, packed+documents) the report compares their "
                         "medians (``extra_cpu``)")
    ap.add_argument("--sources", default="host,resident", help="host, resident or both")
    ap.add_argument("--quick", action="store_true", help="small data, for a smoke run")
    add_out_argument(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.tokens, args.doc_tokens, args.shard_mb = 1 << 20, 64, 1
        args.batch, args.seq, args.seconds = 8, 128, 0.2
    report = {
        "benchmark": "gpu_host",
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command(__file__, argv),
        "machine": machine(),
        "config": {"counts": "each run counts its epochs afresh (harness.fresh_counts)",
                   "tokens": args.tokens, "doc_tokens_mean": args.doc_tokens,
                   "token_width": 2, "shard_mb": args.shard_mb, "batch": args.batch,
                   "seq": args.seq, "seconds": args.seconds, "output": "torch"},
        "targets": TARGETS, "results": [],
        "not_included": "the host cost of the device calls themselves (counted per batch in "
                        "device_calls_per_batch; timed on a GPU by bench_gpu_loader.py)",
    }
    from ndp.store.corpus import Corpus

    # padded rows cut at seq_len (documents of up to 2 * doc_tokens): counted, not news here
    warnings.filterwarnings("ignore", message="ndp.Loader: padded rows cut")
    with tempfile.TemporaryDirectory(prefix="ndp-gpu-host-") as tmp:
        data = write_dataset(Path(tmp), tokens=args.tokens, doc_tokens=args.doc_tokens,
                             shard_mb=args.shard_mb)
        corpus = Corpus(data, manifest="ignore")
        truth = null_device.verdicts_of(corpus)
        report["config"].update(packets=len(corpus), shards=len(corpus.shards))
        for mode in args.modes.split(",") * args.repeat:
            for resident in [s == "resident" for s in args.sources.split(",")]:
                row = measure(corpus, truth, mode=mode, resident=resident, batch=args.batch,
                              seq=args.seq, seconds=args.seconds,
                              shard_bytes=args.shard_mb << 20)
                report["results"].append(row)
                _print(row)
    rows = report["results"]
    report["extra_cpu"] = extra_cpu(rows)
    for line in report["extra_cpu"]:
        print(f"{line['mode']} over {line['base']} ({line['source']}, medians of "
              f"{line['runs']}): {line['base_cpu_us']:.1f} -> {line['cpu_us']:.1f} us/batch "
              f"({100 * line['extra']:+.1f}% CPU per token)")
    report["targets_met"] = {
        "host_us_per_batch": max(r["host_us_per_batch"] for r in rows)
        <= TARGETS["host_us_per_batch"],
        "cpu_s_per_billion_tokens": max(r["cpu_s_per_billion_tokens"] for r in rows)
        <= TARGETS["cpu_s_per_billion_tokens"],
    }
    print("targets met:", report["targets_met"])
    write_report(args.out, "gpu-host", report)
    return 0


def extra_cpu(rows: list[dict]) -> list[dict]:
    """Each ``base+option`` mode's CPU per batch against its ``base`` mode's, per source: the
    medians of the runs (``--repeat``), and the relative difference (issue 36: documents=True
    adds at most 10% host CPU per token)."""
    by: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        by.setdefault((r["mode"], r["source"]), []).append(r["cpu_us_per_batch"])
    out = []
    for (mode, source), runs in by.items():
        base = mode.split("+")[0]
        if base == mode or (base, source) not in by:
            continue
        a, b = float(np.median(by[(base, source)])), float(np.median(runs))
        out.append({"mode": mode, "base": base, "source": source, "runs": len(runs),
                    "base_cpu_us": a, "cpu_us": b, "extra": b / a - 1})
    return out


def _print(row: dict) -> None:
    calls = row["device_calls_per_batch"]
    print(f"{row['mode']:8s} {row['source']:9s} {row['host_us_per_batch']:8.1f} us/batch "
          f"({row['ceiling_tokens_per_s'] / 1e9:6.2f} G tok/s; within epochs "
          f"{row['within_epoch_us_per_batch']:.1f})  cpu {row['cpu_us_per_batch']:8.1f}"
          f" us/batch ({row['cpu_s_per_billion_tokens']:.2f} s/1e9 tok), consumer "
          f"{row['consumer_cpu_us_per_batch']:.1f} us; per batch: "
          + ", ".join(f"{k} {v:.3f}" for k, v in calls.items() if v))


if __name__ == "__main__":
    sys.exit(main())
