"""What a training job watches of its data: how long ``next()`` waited, tokens/s, drops by
reason, batches left, per rank and across ranks (``loader.telemetry()``, ``gather``), and
their export (``ndp.loader.metrics``: Prometheus; a TensorBoard or W&B line).

``next()`` waits only when it takes a new chunk from the producer (``ndp.loader.pipeline.running``):
every other batch is served from the chunk it holds. So ``Waits`` records each of those waits
(its total, its largest, and a histogram of powers of two from 1 us), and a ``next()`` that
took no chunk counts as a wait of 0: the quantiles are over every batch handed out. Everything
else is ``loader.stats``, read when asked, so the figures equal the stats'.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any

#: the histogram's upper bounds, in seconds: 1 us, 2 us, 4 us, ... ~34 s, then +inf
BOUNDS = tuple(2.0 ** k * 1e-6 for k in range(26))


class Waits:
    """The consumer's waits for chunks (module docstring); thread-safe to read."""

    def __init__(self) -> None:
        self.counts = [0] * (len(BOUNDS) + 1)  # the last: past the largest bound
        self.total = 0.0
        self.largest = 0.0
        self.started: float | None = None  # when the first batch was asked for
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        """One wait for a chunk (or an epoch's end)."""
        k = 0 if seconds <= BOUNDS[0] else min(len(BOUNDS), math.ceil(
            math.log2(seconds / BOUNDS[0])))
        with self._lock:
            if self.started is None:
                self.started = time.perf_counter() - seconds
            self.counts[k] += 1
            self.total += seconds
            self.largest = max(self.largest, seconds)

    def histogram(self, batches: int) -> list[tuple[float, int]]:
        """``(upper bound in seconds, count)`` over ``batches`` next() calls, cumulative as
        Prometheus' buckets are (the last bound ``inf``): the calls that took no chunk are in
        the first bucket."""
        with self._lock:
            counts = list(self.counts)
        counts[0] += max(batches - sum(counts), 0)
        out, run = [], 0
        for bound, n in zip((*BOUNDS, math.inf), counts):
            run += n
            out.append((bound, run))
        return out

    def quantile(self, q: float, batches: int) -> float:
        """The ``q`` quantile of the wait per ``next()`` (its bucket's upper bound; 0 for the
        calls that took no chunk)."""
        hist = self.histogram(batches)
        total = hist[-1][1]
        if not total:
            return 0.0
        with self._lock:
            zero = max(batches - sum(self.counts), 0)
        if q * total <= zero:
            return 0.0
        for bound, run in hist:
            if run >= q * total:
                return min(bound, self.largest)
        return self.largest


def thread_cpu_seconds() -> float:
    """CPU seconds of this process's threads that are ndp's (named ``ndp-*``), from /proc
    (0.0 where /proc has no per-thread figures)."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if not f.read().startswith("ndp-"):
                    continue
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total


def telemetry(loader: Any) -> dict:
    """This rank's figures (``Loader.telemetry``)."""
    stats = loader.stats
    waits: Waits = loader._waits
    n = stats.batches
    now = time.perf_counter()
    elapsed = 0.0 if waits.started is None else now - waits.started
    return {
        "rank": loader.rank, "world_size": loader.world_size, "epoch": loader.epoch,
        "step": loader.step, "batches": n,
        # known without waiting for the epoch's count, else None
        "remaining": loader.remaining if loader.plan.counted(loader.epoch) else None,
        "tokens": stats.tokens, "seconds": elapsed,
        "tokens_per_s": stats.tokens / elapsed if elapsed > 0 else 0.0,
        "wait_seconds": stats.wait_seconds, "wait_p50_s": waits.quantile(0.5, n),
        "wait_p99_s": waits.quantile(0.99, n), "wait_max_s": waits.largest,
        "wait_histogram": waits.histogram(n),
        "packets": stats.packets, "valid": stats.valid, "corrupt": dict(stats.corrupt),
        "dropped_on_purpose": stats.dropped_on_purpose,
        "skipped_batches": stats.skipped_batches,
        "ndp_thread_cpu_seconds": thread_cpu_seconds(),
    }


def scalars(figures: dict, prefix: str = "ndp/") -> dict[str, float]:
    """``figures`` (``telemetry``) as flat scalars for a logger: ``corrupt`` by reason, the
    histogram left out."""
    out = {}
    for key, value in figures.items():
        if key == "corrupt":
            out.update({f"{prefix}corrupt/{r}": float(v) for r, v in value.items()})
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[prefix + key] = float(value)
    return out


def gather(loader: Any) -> list[dict]:
    """Every rank's ``telemetry``, rank by rank, through ``torch.distributed`` when it is
    initialised (a collective: every rank must call it), else this rank's alone; the slowest
    rank is the one that waited longest (``slowest``)."""
    mine = telemetry(loader)
    try:
        import torch.distributed as dist
    except ImportError:
        return [mine]
    if not (dist.is_available() and dist.is_initialized()):
        return [mine]
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return sorted(everyone, key=lambda f: f["rank"])


def slowest(figures: list[dict]) -> dict:
    """The rank of ``figures`` (``gather``) that waited longest for its data."""
    return max(figures, key=lambda f: f["wait_seconds"])
