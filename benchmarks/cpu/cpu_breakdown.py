"""Where the CPU Loader's host CPU goes, stage by stage, in nanoseconds of CPU per token.

    python benchmarks/cpu/cpu_breakdown.py               # bench_loaders' corpus, B=16 and B=64
    python benchmarks/cpu/cpu_breakdown.py --data DIR    # an NDP dataset of your own
    python benchmarks/cpu/cpu_breakdown.py --resident  # shards read into memory once (resident)
    python benchmarks/cpu/cpu_breakdown.py --smoke       # tiny, for the test suite
    python benchmarks/cpu/cpu_breakdown.py --out benchmarks/results   # adds to the project's record

``ndp.Loader`` (CPU backend, torch tensors out) runs for a time budget per mode and batch size
after a warm-up, on one ndp thread (``ndp.engine.threads.set_num_threads(1)``: a stage's work
then all runs on the thread that calls it, where ``time.thread_time`` sees it). ``--modes``
picks the modes (``packed+documents``: packed with ``documents=True``, what the documents'
boundaries cost on the CPU backend), ``--repeat`` runs them over, interleaved. The producer's stages are timed on
its thread: ``stage`` (reading the chunk's packets with pread), ``verdicts`` (CRC and checks),
``layout`` (batches from the verdicts, on the host), ``build`` (the output arrays), and the rest
of its loop (``producer_other``: planning, header checks, queue hand-offs). ``consumer`` is the
thread that iterates; ``process`` all of the process's CPU time. Per mode: tokens/s, and each
figure as CPU nanoseconds per delivered token (real tokens: padding excluded), so they add up to
about ``process``.

The corpus by default is ``bench_loaders.py``'s (the standard library's source, 9 M tokens,
documents of about 3,000 characters, EOS after each). Writes ``cpu-breakdown-<time>.json``
into ``--out`` (default ``$NDP_RESULTS_DIR``, else ``./ndp-results``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import add_out_argument, command, machine, write_report  # noqa: E402

STAGES = (("ndp.loader.pipeline.stage", "HostStager", "stage", "stage"),
          ("ndp.engine.cpu", "CpuEngine", "submit_verdicts", "verdicts"),
          ("ndp.loader.pipeline.chunks", "ChunkDecoder", "_layout", "layout"),
          ("ndp.loader.pipeline.chunks", "ChunkDecoder", "_build", "build"),
          ("ndp.loader.pipeline.producer", "Producer", "_epoch", "producer"))


def instrument() -> Counter:
    """Wrap each stage's method so its thread CPU time adds up in the returned counter."""
    import importlib

    spent: Counter = Counter()
    for module, cls, method, key in STAGES:
        owner = getattr(importlib.import_module(module), cls)
        inner = getattr(owner, method)

        def timed(*args, _inner=inner, _key=key, **kwargs):
            t = time.thread_time()
            try:
                return _inner(*args, **kwargs)
            finally:
                spent[_key] += time.thread_time() - t

        setattr(owner, method, timed)
    return spent


def smoke_corpus(work: Path) -> Path:
    """300 documents of 10 to 200 random uint16 tokens, in one shard."""
    import numpy as np

    from ndp.wire.packet import encode_tokens
    from ndp.store.writer import ShardWriter

    rng = np.random.default_rng(0)
    with ShardWriter(work / "ndp") as w:
        for n in rng.integers(10, 200, 300):
            w.write(encode_tokens(rng.integers(2, 1000, n), width=2))
    return work / "ndp"


def measure(data: Path, spent: Counter, *, mode: str, batch: int, seq: int, pad: int,
            seconds: float, chunk_batches: int | None = None, resident: bool = False) -> dict:
    import ndp

    base, *extra = mode.split("+")  # "packed+documents": packed with documents=True
    loader = ndp.Loader(data, mode=base, batch_size=batch, seq_len=seq, pad_token_id=pad,
                        seed=0, backend="cpu", chunk_batches=chunk_batches, resident=resident,
                        documents="documents" in extra)

    def forever():
        while True:
            yield from loader

    it = forever()
    for _ in range(3):  # warm-up: compile, first chunks
        next(it)
    spent.clear()
    cpu0, main0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
    tokens = batches = 0
    while time.perf_counter() - wall0 < seconds:
        b = next(it)
        tokens += int(b["x"].numel()) if "x" in b else int(b["attention_mask"].numpy().sum())
        batches += 1
    wall = time.perf_counter() - wall0
    cpu, main = time.process_time() - cpu0, time.thread_time() - main0
    loader.close()
    per = 1e9 / tokens
    staged = ("stage", "verdicts", "layout", "build")
    row = {"mode": mode, "batch": batch, "seq_len": seq, "batches": batches, "tokens": tokens,
           "seconds": wall, "tokens_per_s": tokens / wall,
           "chunk_batches": loader.chunk_batches,
           "ns_per_token": {k: spent[k] * per for k in staged}}
    row["ns_per_token"]["producer_other"] = (spent["producer"] - sum(spent[k] for k in staged)
                                             ) * per
    row["ns_per_token"]["consumer"] = main * per
    row["ns_per_token"]["process"] = cpu * per
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, help="an NDP dataset (default: bench_loaders' corpus)")
    ap.add_argument("--batches", type=int, nargs="+", default=None, help="default 16 64")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--pad", type=int, default=None, help="pad token id (default: the corpus')")
    ap.add_argument("--seconds", type=float, default=None, help="per row (default 8)")
    ap.add_argument("--chunk-batches", type=int, default=None,
                    help="the Loader's chunk_batches (default: its own choice)")
    ap.add_argument("--resident", action="store_true",
                    help="the Loader's resident=True: every shard read into memory once")
    ap.add_argument("--modes", default="packed,padded",
                    help="modes to run, in turn; packed+documents: packed with documents=True")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the modes this many times over, interleaved")
    ap.add_argument("--smoke", action="store_true", help="tiny data and runs, for the tests")
    add_out_argument(ap)
    args = ap.parse_args(argv)
    from ndp.engine.threads import set_num_threads

    set_num_threads(1)
    spent = instrument()
    seconds = args.seconds or (0.3 if args.smoke else 8.0)
    batches = args.batches or ([2] if args.smoke else [16, 64])
    seq = 64 if args.smoke and args.seq == 1024 else args.seq
    with tempfile.TemporaryDirectory(prefix="ndp-breakdown-") as tmp:
        data, pad, corpus = args.data, args.pad, "given"
        if data is None and args.smoke:
            data, corpus = smoke_corpus(Path(tmp)), "smoke (random documents)"
        elif data is None:
            from loaders import bench_loaders

            cfg = bench_loaders.prepare(Path(tmp), max_files=None, large_tokens=1)
            data, corpus = Path(tmp) / "ndp", f"bench_loaders ({cfg['tokens']:,} tokens)"
            pad = cfg["pad"] if pad is None else pad
        rows = []
        for mode in args.modes.split(",") * args.repeat:
            for b in batches:
                row = measure(data, spent, mode=mode, batch=b, seq=seq, pad=pad or 0,
                              seconds=seconds, chunk_batches=args.chunk_batches,
                              resident=args.resident)
                rows.append(row)
                ns = row["ns_per_token"]
                print(f"{mode:16s} B={b:<3d} {row['tokens_per_s'] / 1e6:7.1f} M tok/s  CPU ns/token: "
                      + "  ".join(f"{k} {v:.2f}" for k, v in ns.items()), flush=True)
    report = {"benchmark": "cpu-breakdown", "created": dt.datetime.now().isoformat(),
              "command": command(__file__, argv),
              "machine": machine(), "corpus": corpus, "threads": 1, "resident": args.resident,
              "rows": rows}
    write_report(args.out, "cpu-breakdown", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
