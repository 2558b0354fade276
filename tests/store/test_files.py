"""Shard files that change under a reader, and how many a reader keeps open (ndp.store.files): a
shard cut or replaced while a Loader reads it is a ShardChangedError naming it (once a SIGBUS that
killed the process without a traceback); at most a bounded number of files is open, whatever the
shard count, and close() releases them. Scenarios that could kill the process run in a child
process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ndp.errors import ShardChangedError
from ndp.store.files import FILES
from ndp.loader.loader import Loader

from ndp_test_helpers import ramp_specs, write_shards


def shards(directory, n_shards: int, per_shard: int = 20, length: int = 200):
    for i in range(n_shards):
        specs = ramp_specs([length] * per_shard)
        write_shards(directory, [s.encode() for s in specs], prefix=f"s{i:04d}")
    return directory


def run_child(code: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {})))


CUT = """
    import os, sys
    from ndp.loader.loader import Loader
    from ndp.errors import ShardChangedError
    loader = Loader(sys.argv[1], mode=sys.argv[3], batch_size=2, seq_len=64, shuffle=False,
                    backend=sys.argv[2], output="arrays", prefetch=0, chunk_batches=1)
    it = iter(loader)
    next(it)
    for name in sorted(os.listdir(sys.argv[1])):
        if name.endswith(".ndp"):
            os.truncate(os.path.join(sys.argv[1], name), 100)  # cut every shard in place
    try:
        for _ in it:
            pass
    except ShardChangedError as exc:
        print("REFUSED", exc)
        sys.exit(0)
    print("NOT NOTICED")
    sys.exit(3)
"""


@pytest.mark.parametrize("backend,mode", [("cpu", "padded"), ("cpu", "packed"),
                                          ("cuda", "padded")])
def test_a_shard_cut_under_a_running_loader_is_an_error_naming_it(tmp_path, backend, mode):
    """The CPU backend reads the cut shard's packets again and finds it short; the GPU's
    stage holds the first shard on the device (its headers were checked as it was copied) and
    reads from the files only the shards it copies next, whose changed identity it refuses."""
    shards(tmp_path, 2)
    result = run_child(CUT, str(tmp_path), backend, mode)
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr[-2000:])
    if backend == "cpu":
        assert "REFUSED" in result.stdout and "s0000-00000.ndp" in result.stdout
        assert "cut or changed while ndp read it" in result.stdout
    else:
        assert "REFUSED" in result.stdout and "-00000.ndp" in result.stdout
        assert ("cut or changed while ndp read it" in result.stdout
                or "replaced or rewritten while ndp read it" in result.stdout)


def test_a_shard_replaced_under_a_loader_is_refused_when_reopened(tmp_path, monkeypatch):
    monkeypatch.setenv("NDP_MAX_OPEN_FILES", "1")  # every switch of shard reopens a file
    shards(tmp_path, 3)
    loader = Loader(tmp_path, batch_size=2, seq_len=64, shuffle=False, backend="cpu",
                    output="arrays", prefetch=0, chunk_batches=1)
    it = iter(loader)
    next(it)
    victim = tmp_path / "s0002-00000.ndp"
    data = victim.read_bytes()
    victim.unlink()
    victim.write_bytes(data)  # same bytes, another file (a re-copy, a re-convert)
    with pytest.raises(ShardChangedError, match="s0002-00000.ndp.*replaced"):
        for _ in it:
            pass
    loader.close()


MANY = """
    import os, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    from ndp.loader.loader import Loader
    before = len(os.listdir("/proc/self/fd"))
    most = 0
    for k in range(3):
        loader = Loader(sys.argv[1], batch_size=8, seq_len=32, backend="cpu", output="arrays",
                        seed=k)
        for batch in loader:
            most = max(most, len(os.listdir("/proc/self/fd")))
        assert loader.stats.valid == 300 * 4, loader.stats
        loader.close()
    after = len(os.listdir("/proc/self/fd"))
    from ndp.engine.threads import get_num_threads
    print("FDS", before, most, after, get_num_threads() - 1)
"""


@pytest.mark.slow
def test_300_shards_under_ulimit_256_and_files_released_on_close(tmp_path):
    shards(tmp_path, 300, per_shard=4, length=20)
    result = run_child(MANY, str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    before, most, after, workers = map(int, result.stdout.split("FDS")[1].split())
    # ndp's bound (an eighth of the limit), and a few open for a moment, one a thread: the
    # producer's index read, the plan thread's (the count) and its count lock, the warm
    # thread's (the next window's entries), each of ndp's pool workers' (a window's indexes
    # are read and checked on the pool), the numba cache, a pipe (seen at once, by a thread
    # listing /proc/self/fd every 0.2 ms: 32 shards, 5 indexes, a lock, a pipe and a few
    # closing, with one worker)
    assert most - before <= 256 // 8 + 7 + workers
    assert after <= before + 1


def test_closed_loaders_hold_no_files(tmp_path):
    shards(tmp_path, 8, per_shard=3, length=10)
    for _ in range(20):
        loader = Loader(tmp_path, batch_size=2, seq_len=8, backend="cpu", output="arrays")
        for _ in loader:
            pass
        loader.close()
    assert FILES.count(tmp_path) == 0


def test_reads_are_exact_and_cut_reads_are_refused(tmp_path):
    from ndp.store.shard import Shard

    (info,) = write_shards(tmp_path, [s.encode() for s in ramp_specs([50, 60, 70])])
    shard = Shard(info.path)
    raw = info.path.read_bytes()
    offsets = np.array([0, 40, 100], np.int64)
    sizes = np.array([10, 60, 5], np.int64)
    out = np.zeros(int(sizes.sum()), np.uint8)
    shard.read_ranges(offsets, sizes, out, np.array([0, 10, 70], np.int64))
    assert bytes(out) == raw[0:10] + raw[40:100] + raw[100:105]
    assert shard.crc32() == info.crc32
    with pytest.raises(ShardChangedError, match="bytes at offset"):
        shard.read(len(raw) - 4, 8)
    shard.close()
