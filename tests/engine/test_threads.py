"""ndp's host threads (ndp.engine.threads): bounded, asleep when idle, fork-safe, and no OpenMP.

Thread states are read from /proc (Linux): a worker waiting for work must be sleeping ('S'),
never running ('R') while there is nothing to do, which is what Numba's OpenMP workers did.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from ndp.engine import threads
from ndp.errors import ConfigError


@njit(nogil=True)
def _fill(out, lo, hi):  # pragma: no cover - compiled
    for i in range(lo, hi):
        out[i] += i + 1


@pytest.fixture
def three_threads():
    threads.set_num_threads(3)
    yield
    threads.set_num_threads(None)


def _state(thread: threading.Thread) -> str:
    """The kernel's scheduling state of a thread: R running, S sleeping, ..."""
    stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def _all_asleep(group: list[threading.Thread], timeout: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(_state(t) == "S" for t in group if t.is_alive()):
            return True
        time.sleep(0.01)
    return False


def test_every_item_is_done_once_across_the_threads(three_threads):
    for n in (0, 1, 2, 7, 1000, 100_003):
        out = np.zeros(n, np.int64)
        threads.parallel_for(_fill, n, out, grain=1)
        np.testing.assert_array_equal(out, np.arange(1, n + 1))
    assert threads.get_num_threads() == 3
    assert len(threads.worker_threads()) == 2  # the caller is the third


def test_small_work_stays_in_the_calling_thread(three_threads):
    seen = []
    threads.parallel_for(lambda lo, hi: seen.append(threading.get_ident()), 100, grain=64)
    assert seen == [threading.get_ident()]


def test_an_exception_in_any_range_reaches_the_caller_after_all_ranges_ran(three_threads):
    done = []

    def work(lo, hi):
        done.append(lo)
        if lo > 0:
            raise ValueError(f"range from {lo}")

    with pytest.raises(ValueError, match="range from"):
        threads.parallel_for(work, 30, grain=1)
    assert sorted(done) == [0, 10, 20]


def test_the_thread_count_is_bounded_and_can_be_changed():
    threads.set_num_threads(2)
    threads.parallel_for(_fill, 10, np.zeros(10, np.int64), grain=1)
    assert len(threads.worker_threads()) == 1
    threads.set_num_threads(1)
    threads.parallel_for(_fill, 10, np.zeros(10, np.int64), grain=1)
    assert threads.worker_threads() == []  # the old pool's workers have stopped
    threads.set_num_threads(None)
    with pytest.raises(ConfigError):
        threads.set_num_threads(0)


def test_the_default_leaves_the_other_ranks_their_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    monkeypatch.delenv("NDP_NUM_THREADS", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert threads.default_num_threads() == threads.MAX_DEFAULT_THREADS == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert threads.default_num_threads() == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "128")
    assert threads.default_num_threads() == 1
    monkeypatch.setenv("NDP_NUM_THREADS", "6")
    assert threads.default_num_threads() == 6
    monkeypatch.setenv("NDP_NUM_THREADS", "many")
    with pytest.raises(ConfigError, match="NDP_NUM_THREADS"):
        threads.default_num_threads()


def test_idle_workers_sleep(three_threads):
    threads.parallel_for(_fill, 1000, np.zeros(1000, np.int64), grain=1)
    assert _all_asleep(threads.worker_threads())


def test_a_loader_waiting_on_a_full_queue_sleeps_and_costs_no_cpu(tmp_path, three_threads):
    from ndp.loader.loader import Loader

    from ndp_test_helpers import ramp_specs, write_shards

    write_shards(tmp_path, [s.encode() for s in ramp_specs([30] * 400)])
    loader = Loader(tmp_path, batch_size=4, seq_len=32, backend="cpu", output="arrays",
                    chunk_batches=2, prefetch=1)
    it = iter(loader)
    next(it)  # the producer fills the queue and the ring, then waits
    ndp_threads = [t for t in threading.enumerate()
                   if t.name == "ndp-loader" or t.name.startswith(threads.THREAD_NAME)]
    assert len(ndp_threads) == 3  # the producer and two workers, nothing more
    assert _all_asleep(ndp_threads)
    cpu = time.process_time()
    time.sleep(0.5)
    assert time.process_time() - cpu < 0.1  # spinning threads would burn 0.5 s each
    loader.close()


def test_a_forked_child_gets_its_own_threads(three_threads):
    import multiprocessing

    threads.parallel_for(_fill, 10, np.zeros(10, np.int64), grain=1)  # the parent's pool
    with multiprocessing.get_context("fork").Pool(1) as pool:
        assert pool.apply(_child_sum) == sum(range(1, 1001))


def _child_sum() -> int:
    out = np.zeros(1000, np.int64)
    threads.parallel_for(_fill, 1000, out, grain=1)  # the parent's workers do not exist here
    return int(out.sum())


def test_no_kernel_starts_numbas_openmp_threads(tmp_path):
    code = """
import sys, numpy as np, numba, ndp
sys.path.insert(0, sys.argv[2])
from conftest import ramp_specs, write_shards
from pathlib import Path
write_shards(Path(sys.argv[1]), [s.encode() for s in ramp_specs([40] * 600)])
for mode in ("padded", "packed", "packing"):
    for _ in ndp.Loader(sys.argv[1], mode=mode, batch_size=8, seq_len=32, backend="cpu",
                        output="arrays"):
        pass
try:
    print("threading layer:", numba.threading_layer())
except ValueError:
    print("no threading layer")
"""
    tests_dir = str(Path(__file__).resolve().parents[1])  # conftest.py
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path), tests_dir],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "no threading layer" in out.stdout, out.stdout


def test_a_caller_runs_the_ranges_no_busy_worker_started(three_threads):
    """The pool is shared: while both workers run another caller's long ranges, a
    ``parallel_for`` runs all of its own ranges itself and returns, rather than waiting for a
    worker; each range still runs exactly once."""
    release = threading.Event()
    entered = threading.Barrier(4)  # the other caller, both workers, and this test

    def hold(lo, hi):  # the other caller's ranges, each held until released (its own first,
        entered.wait(10)  # so it takes none of the others: the workers do)
        release.wait(30)

    other = threading.Thread(target=threads.parallel_for, args=(hold, 3), kwargs={"grain": 1})
    other.start()
    try:
        entered.wait(10)  # both workers are inside ``hold``, and so is the other caller
        out = np.zeros(90, np.int64)
        finished = threading.Event()
        runner = threading.Thread(target=lambda: (threads.parallel_for(_fill, 90, out, grain=1),
                                                  finished.set()))
        runner.start()
        assert finished.wait(20)  # done while the workers are still held
        assert not release.is_set()
        np.testing.assert_array_equal(out, np.arange(1, 91))
    finally:
        release.set()
        other.join(30)
    out = np.zeros(90, np.int64)  # the ranges the workers skipped did not run twice
    threads.parallel_for(_fill, 90, out, grain=1)
    np.testing.assert_array_equal(out, np.arange(1, 91))
