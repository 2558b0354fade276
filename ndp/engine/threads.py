"""ndp's host threads: a few, bounded, and asleep when there is no work.

The CPU kernels (``ndp.kernels``) are serial Numba functions that release the GIL and take the
range ``[lo, hi)`` of items they work on; ``parallel_for`` splits the items across this pool and
the calling thread. The pool replaces Numba's ``parallel=True``: on its OpenMP threading layer
the idle workers spin between parallel regions, so a loader that decodes a batch every few hundred
microseconds kept every core of the machine busy (212-275 CPU-seconds per billion tokens on 16
cores against 14 on 2; see ``../shared/gpu-baseline``). Here a worker waits on a queue (a futex
in the kernel: no CPU at all) and a loader blocked on a full queue costs nothing.

How many threads: ``set_num_threads(n)`` for the process, else ``NDP_NUM_THREADS``, else
``cores // LOCAL_WORLD_SIZE`` capped at ``MAX_DEFAULT_THREADS``: a node of 64 cores running 8
ranks gives each rank 4, and the training loop keeps the rest. The count includes the calling
thread, so ``n`` threads means ``n - 1`` workers; ``1`` runs everything in the caller.

Handing work to a worker costs tens of microseconds (a queue put, a wake-up, the GIL), so small
jobs run in the calling thread, and the Loader hands the kernels whole chunks of batches.

The pool is shared by every caller in the process (the producer's decode, the plan's count of an
epoch, the first reads of a window's indexes), so a range handed to it may find every worker
busy with another caller's. A range is taken by whoever starts it first: the caller, done with
its own range, runs those of its ranges that no worker has started, so ``parallel_for`` is
never slower than running its ranges in the caller, however busy the pool is.
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from ndp.errors import ConfigError

#: the default never takes more than this many threads per process
MAX_DEFAULT_THREADS = 4
#: prefix of every worker thread's name (tests count them)
THREAD_NAME = "ndp-worker"

_lock = threading.Lock()
_requested: int | None = None
_pool: _Pool | None = None


def default_num_threads() -> int:
    """``NDP_NUM_THREADS`` if set, else this process's cores divided among the ranks of the node
    (``LOCAL_WORLD_SIZE``, which torchrun sets), at most ``MAX_DEFAULT_THREADS``."""
    env = os.environ.get("NDP_NUM_THREADS")
    if env:
        try:
            n = int(env)
        except ValueError:
            raise ConfigError(f"NDP_NUM_THREADS must be a positive integer, got {env!r}") from None
        if n < 1:
            raise ConfigError(f"NDP_NUM_THREADS must be a positive integer, got {env!r}")
        return n
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    return max(1, min(MAX_DEFAULT_THREADS, (cores or 1) // local))


def set_num_threads(n: int | None) -> None:
    """Use ``n`` host threads (the caller's included) for ndp's CPU work from now on; ``None``
    goes back to the default. Workers already started beyond ``n`` are stopped."""
    global _requested, _pool
    if n is not None and (not isinstance(n, int) or n < 1):
        raise ConfigError(f"the number of threads must be a positive integer, got {n!r}")
    with _lock:
        _requested = n
        old, _pool = _pool, None
    if old is not None:
        old.shutdown()


def get_num_threads() -> int:
    """How many threads ``parallel_for`` uses (the caller's included)."""
    return _get_pool().n


def parallel_for(kernel: Callable[..., Any], n_items: int, *args: Any, grain: int = 1) -> None:
    """Run ``kernel(*args, lo, hi)`` over ``[0, n_items)``, split into contiguous ranges of at
    least ``grain`` items, on the pool and the calling thread; returns when all are done, and
    raises the first exception any range raised. ``kernel`` must release the GIL (Numba
    ``nogil``) for the ranges to run at once."""
    if n_items <= 0:
        return
    pool = _get_pool()
    parts = max(1, min(pool.n, n_items // max(1, grain)))
    if parts == 1:
        kernel(*args, 0, n_items)
        return
    pool.run(kernel, n_items, parts, args)


def worker_threads() -> list[threading.Thread]:
    """ndp's live worker threads (for tests and diagnostics)."""
    return [t for t in threading.enumerate() if t.name.startswith(THREAD_NAME)]


class _Pool:
    def __init__(self, n: int) -> None:
        self.n = n
        self.pid = os.getpid()
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.closed = False  # after shutdown, work runs in the calling thread
        self.threads = [threading.Thread(target=self._work, name=f"{THREAD_NAME}-{i}",
                                         daemon=True) for i in range(n - 1)]
        for t in self.threads:
            t.start()

    def _work(self) -> None:
        while True:
            task = self.tasks.get()  # blocks in the kernel: an idle worker uses no CPU
            if task is None:
                return
            kernel, args, lo, hi, done, taken = task
            if not taken.acquire(blocking=False):
                continue  # its caller ran it
            try:
                kernel(*args, lo, hi)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                done.put(exc)
            else:
                done.put(None)

    def run(self, kernel: Callable[..., Any], n_items: int, parts: int, args: tuple) -> None:
        if self.closed:
            kernel(*args, 0, n_items)
            return
        bounds = [n_items * i // parts for i in range(parts + 1)]
        done: queue.SimpleQueue = queue.SimpleQueue()
        taken = [threading.Lock() for _ in range(parts)]  # held by whoever runs the range
        for i in range(1, parts):
            self.tasks.put((kernel, args, bounds[i], bounds[i + 1], done, taken[i]))
        first: BaseException | None = None
        waiting = 0
        for i in range(parts):  # its own range, then each no worker has started
            if i and not taken[i].acquire(blocking=False):
                waiting += 1  # a worker runs it
                continue
            try:
                kernel(*args, bounds[i], bounds[i + 1])
            except BaseException as exc:  # noqa: BLE001 - raised after the others finish
                if first is None:
                    first = exc
        for _ in range(waiting):  # the ranges share the caller's arrays: wait for all
            exc = done.get()
            if first is None and exc is not None:
                first = exc
        if first is not None:
            raise first

    def shutdown(self) -> None:
        self.closed = True
        for _ in self.threads:
            self.tasks.put(None)
        for t in self.threads:
            t.join(timeout=5)


@atexit.register
def _shutdown_at_exit() -> None:
    """Join the workers before the interpreter finalizes: a daemon thread that wakes up during
    finalization is ended by pthread_exit, which can abort the process ("terminate called
    without an active exception") when it unwinds through compiled frames."""
    pool = _pool
    if pool is not None and pool.pid == os.getpid():
        pool.shutdown()


def _get_pool() -> _Pool:
    global _pool
    pool = _pool
    if pool is not None and pool.pid == os.getpid():
        return pool
    with _lock:
        if _pool is None or _pool.pid != os.getpid():  # new, or inherited by a fork: no threads
            _pool = _Pool(_requested if _requested is not None else default_num_threads())
        return _pool
