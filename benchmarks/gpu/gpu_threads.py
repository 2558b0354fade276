"""Where the GPU Loader's host time goes, thread by thread, on a real device.

    python benchmarks/gpu/gpu_threads.py --out benchmarks/results     # on a machine with a CUDA GPU

``bench_gpu_loader.py`` gives tokens/s and the process's CPU; this splits them. One corpus (as
``bench_gpu_loader.py`` writes it), ``ndp.Loader(backend="cuda", resident=True)``, torch output,
64 x 1024, each mode, with two consumers:

* ``sum``: what a training step does first, a kernel that reads the batch (as
  ``bench_gpu_loader.py``);
* ``next``: ``next()`` alone, the producer's pace with nothing else asking for the GIL but it.

Per run: tokens/s; CPU microseconds per batch of each thread (``ndp-loader``, the producer;
``MainThread``, the consumer; ``ndp-plan``, ``ndp-warm``, the rest), read from
``/proc/self/task/*/stat``; the share of chunks staged ahead; and a sampled profile: a thread
that wakes every millisecond and records, for the producer and the consumer, the innermost frame
of ``ndp`` code and the innermost frame of all (function and line). The sampler needs the GIL
too, so it sees a thread where it is when the GIL changes hands: read it for shares, not
microseconds. JSON ``gpu-threads-<time>.json`` into ``--out`` (``sim-threads-*`` under the
simulator, whose figures mean nothing: the test suite's smoke run).
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import add_out_argument, command, machine, report_path, write_report  # noqa: E402
from gpu.bench_gpu import device_info  # noqa: E402
from gpu.bench_gpu_loader import write_corpus  # noqa: E402

from ndp.engine.backend import simulated  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[str, float]:
    """CPU seconds of every thread of this process, by name (threads of one name summed)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: collections.Counter = collections.Counter()
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        cpu = (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime
        out[names.get(int(tid), "other")] += cpu
    return dict(out)


class Sampler:
    """Every ``period`` seconds, the innermost ndp frame and the innermost frame of the
    threads named in ``watch``."""

    def __init__(self, watch: tuple[str, ...], period: float = 1e-3) -> None:
        self.watch, self.period = watch, period
        self.ours: dict[str, collections.Counter] = {w: collections.Counter() for w in watch}
        self.leaf: dict[str, collections.Counter] = {w: collections.Counter() for w in watch}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            ids = {t.ident: t.name for t in threading.enumerate() if t.name in self.watch}
            for ident, frame in sys._current_frames().items():
                name = ids.get(ident)
                if name is None:
                    continue
                code = frame.f_code
                self.leaf[name][f"{Path(code.co_filename).name}:{code.co_name}:{frame.f_lineno}"] += 1
                f = frame
                while f is not None and "/ndp/" not in f.f_code.co_filename:
                    f = f.f_back
                if f is not None:
                    c = f.f_code
                    self.ours[name][f"{Path(c.co_filename).name}:{c.co_name}:{f.f_lineno}"] += 1

    def top(self, n: int = 25) -> dict:
        return {w: {"ndp": _shares(self.ours[w], n), "leaf": _shares(self.leaf[w], n)}
                for w in self.watch}


def _shares(counter: collections.Counter, n: int) -> list:
    total = max(sum(counter.values()), 1)
    return [[k, round(v / total, 4)] for k, v in counter.most_common(n)]


def run(root: Path, mode: str, consumer: str, seconds: float, batch: int, seq: int) -> dict:
    import ndp
    import torch

    loader = ndp.Loader(root / "ndp", mode=mode, batch_size=batch, seq_len=seq, seed=0,
                        backend="cuda", resident=True)

    def batches():
        while True:
            yield from loader

    it = batches()
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(64):
        next(it)
    sync()
    counts0, cpu0 = loader.counters.as_dict(), thread_cpu()
    n, t0 = 0, time.perf_counter()
    with Sampler(("ndp-loader", "MainThread")) as sampler:
        while time.perf_counter() - t0 < seconds:
            b = next(it)
            if consumer == "sum":
                next(iter(b.values())).sum()
            n += 1
        sync()
    wall = time.perf_counter() - t0
    cpu1, counts = thread_cpu(), loader.counters.since(counts0)
    loader.close()
    # threads that ended meanwhile (a count pass) leave the sum: only positive differences
    per = {k: (cpu1[k] - cpu0.get(k, 0.0)) / n * 1e6 for k in cpu1 if cpu1[k] > cpu0.get(k, 0.0)}
    return {"mode": mode, "consumer": consumer, "batches": n, "seconds": wall,
            "tokens_per_s": n * batch * seq / wall,
            "thread_cpu_us_per_batch": {k: round(v, 2) for k, v in per.items() if v},
            "staged_ahead_per_chunk": counts["staged_ahead"] / max(counts["chunks"], 1),
            "profile": sampler.top()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=64 << 20)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--modes", nargs="+", default=["padded", "packed", "packing"])
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval for the run (Python's default: 0.005 s), to "
                         "see how much of the time is threads waiting for the GIL")
    add_out_argument(ap)
    args = ap.parse_args(argv)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    report = {"benchmark": "gpu_threads",
              "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": command(__file__, argv),
              "machine": machine(), "device": device_info(),
              "config": {"tokens": args.tokens, "batch": args.batch, "seq": args.seq,
                         "seconds": args.seconds, "resident": True, "output": "torch",
                         "switch_interval": sys.getswitchinterval()},
              "results": []}
    with tempfile.TemporaryDirectory(prefix="ndp-gpu-threads-") as tmp:
        root = write_corpus(Path(tmp), args.tokens, args.seq)
        for mode in args.modes:
            for consumer in ("sum", "next"):
                row = run(root, mode, consumer, args.seconds, args.batch, args.seq)
                report["results"].append(row)
                print(f"{mode:8s} {consumer:5s} {row['tokens_per_s'] / 1e9:6.3f} G tok/s  "
                      f"ahead {row['staged_ahead_per_chunk']:.2f}/chunk  "
                      f"{row['thread_cpu_us_per_batch']}", flush=True)
                for who, prof in row["profile"].items():
                    print(f"   {who}: " + "; ".join(f"{k} {v:.0%}" for k, v in
                                                    prof["ndp"][:8]), flush=True)
    tag = "sim-threads" if simulated() else "gpu-threads"  # the simulator's times mean nothing
    write_report(None, tag, report, path=report_path(args.out, tag, precise=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
