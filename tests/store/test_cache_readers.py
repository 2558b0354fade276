"""ndp.store.readers: the readers of a shard cache know of each other from its directory, whatever
launched them (no ``LOCAL_WORLD_SIZE``): a limit too small for the readers open is refused when
one more opens, and readers that pin the whole limit while each waits for room end with a
``CacheFullError`` that says so, at once, instead of waiting out the cache's timeout (600 s).

Real processes on a real cache directory; every run is bounded by a generous timeout that only
a hang reaches (the bounded runs take seconds). RAMP data: packet k holds tokens k*1000 + arange(n).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from ndp.errors import CacheFullError
from ndp.loader.loader import Loader
from ndp.store.cache import PINS, WAIT_S, ShardCache
from ndp.store.readers import LIVE, Registry, stuck
from ndp.store.remote import RemoteDataset

from ndp_test_helpers import ramp_specs, upload, write_shards

#: far below the cache's own wait (``WAIT_S``): a run still going then is waiting it out
HANG_S = 150.0
LAUNCHER = ("LOCAL_WORLD_SIZE", "WORLD_SIZE", "RANK", "LOCAL_RANK")


def _env() -> dict:
    """This environment without the launcher's variables: ranks that only the cache's
    directory can tell of each other."""
    return {k: v for k, v in os.environ.items() if k not in LAUNCHER}


def _run_all(procs: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    """Each process' (exit status, stdout, stderr); a failure naming those still running after
    ``HANG_S`` (then killed)."""
    assert HANG_S < WAIT_S
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"a reader of the cache was still waiting after {HANG_S:.0f} s "
                        f"(the cache's own wait is {WAIT_S:.0f} s): they wait on each other")
        outs.append((p.returncode, out, err))
    return outs


# ------------------------------------------------------------------- the registry, in-process
def test_a_reader_is_registered_while_open_and_one_gone_is_removed(tmp_path):
    a, b = Registry(tmp_path), Registry(tmp_path)
    a.pin(frozenset({"x.ndp"}))
    seen = {r.name: r for r in b.readers()}
    assert set(seen) == {a.name, b.name} and seen[a.name].pins == {"x.ndp"}
    assert seen[a.name].known and seen[a.name].pid == os.getpid()
    a.close()
    assert [r.name for r in b.readers()] == [b.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == [b.name, b.name + LIVE]
    b.close()
    assert not list(tmp_path.iterdir())


def test_stuck_only_when_every_reader_waits_and_the_pins_fill_the_limit(tmp_path):
    a, b = Registry(tmp_path), Registry(tmp_path)
    a.pin(frozenset({"a.ndp"}))
    b.pin(frozenset({"b.ndp"}))
    held = [("a.ndp", 5), ("b.ndp", 5)]
    a.wait("c.ndp", 5, "room")
    assert stuck(a.readers(), held, 10) is None  # b may move on
    b.wait("c.ndp", 5, "lock")  # on a, which waits for room for it
    blocked = stuck(a.readers(), held, 10)
    assert blocked is not None and blocked["pinned"] == {"a.ndp": 5, "b.ndp": 5}
    assert stuck(a.readers(), held, 15) is None  # room for c once the limit is larger
    assert stuck(a.readers(), [("a.ndp", 5), ("z.ndp.tmp", 5)], 10) is None  # z: not pinned
    b.done()
    b.wait("d.ndp", 5, "lock")  # on a download under way, not on a wait
    assert stuck(a.readers(), held, 10) is None
    b.done()
    # a wait in a thread that does not move b's pins: b's own may still move on and unpin
    other = threading.Thread(target=b.wait, args=("c.ndp", 5, "lock"))
    other.start()
    other.join()
    assert stuck(a.readers(), held, 10) is None
    for r in (a, b):
        r.close()


# ----------------------------------------------------------------------- processes, for real
READER = textwrap.dedent("""
    import sys
    import time
    from ndp.errors import CacheFullError
    from ndp.store.cache import ShardCache

    directory, i, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cache = ShardCache(directory, limit=2 * size)  # the default wait: 600 s
    mine = [f"s{i}.ndp", f"t{i}.ndp"]  # the shard it reads and the next, as a Loader pins
    cache.pin(set(mine))
    print("ready", flush=True)
    sys.stdin.readline()  # all registered and pinned: go

    def download(out):
        out.seek(0)
        out.write(bytes([i]) * size)
        out.truncate()
        time.sleep(0.3)  # a real download takes a while: on a loaded machine one reader
        # could otherwise cache both its shards and leave before the others start

    try:
        for name in mine:
            cache.get(name, size, download)
        print("data")
    except CacheFullError as exc:
        print("CacheFullError", exc)
    finally:
        cache.close()
""")


def test_four_processes_pinning_a_limit_of_two_shards_end_with_a_cache_full_error(tmp_path):
    """Two of them cache their first shard and fill the limit; then every one waits for room
    that only another's unpinning could make: none can move on, and the first to see it says
    so. Each ends: with that error, the give-up it wrote, or its data once those are gone."""
    size = 1000
    procs = [subprocess.Popen([sys.executable, "-c", READER, str(tmp_path), str(i), str(size)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_env())
             for i in range(4)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()[-2000:]
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = _run_all(procs)
    assert all(code == 0 for code, _, _ in outs), [err[-2000:] for _, _, err in outs]
    said = [out.strip() for _, out, _ in outs]
    pattern = (rf"{re.escape(str(tmp_path))}: caching [st]\d\.ndp \(1,000 bytes\) can never "
               rf"happen: every one of the (\d) reader\(s\) of this cache, in \1 process\(es\) "
               rf"\(pid \d+ on .*\), waits for room .* the 2 shard\(s\) they pin \(2,000 bytes: "
               rf"s\d\.ndp, s\d\.ndp\) leave less than 1,000 bytes under cache_limit=2,000, .*"
               rf"Raise cache_limit to at least 3,000 bytes")
    found = [re.search(pattern, s) for s in said]
    # the first to find it counted all four; the others stopped at their next poll, naming
    # its give-up, or found the same among those left, or (once those gone unpinned) read on
    assert "4" in [m.group(1) for m in found if m], said
    for s, m in zip(said, found):
        assert m or s == "data" or re.search(
            r"^CacheFullError .*process \d+ on .* gave up at .* caching [st]\d\.ndp", s), s
    assert not list(tmp_path.glob("*.tmp"))
    assert not list((tmp_path / PINS).iterdir())  # every reader unregistered


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> Path:
    """60 ramp packets in six shards of 10: four ranks' shares of an unshuffled epoch each
    span two shards, as in the trial, so each rank needs two at once."""
    d = tmp_path_factory.mktemp("local")
    lengths = [int(x) for x in np.random.default_rng(3).integers(1, 40, 60)]
    packets = [s.encode() for s in ramp_specs(lengths)]
    for i in range(6):
        write_shards(d, packets[10 * i: 10 * (i + 1)], prefix=f"p{i}")
    return d


def _sizes(local: Path) -> list[int]:
    """The shards' bytes, largest first."""
    return sorted((p.stat().st_size for p in local.glob("*.ndp")), reverse=True)


_n = 0


@pytest.fixture
def remote(s3_server, local) -> str:
    global _n
    _n += 1
    bucket = s3_server.bucket(f"ndp-readers-{_n}")
    upload(local, s3_server.fs(), f"{bucket}/data")
    return f"s3://{bucket}/data"


def test_a_reader_open_in_another_process_is_counted_when_the_cache_is_opened(
        local, remote, s3_server, tmp_path, monkeypatch):
    """No LOCAL_WORLD_SIZE: the limit holds what one reader pins, and a second reader that
    opens while the first is open is refused; once the first is gone, it opens."""
    sizes = _sizes(local)
    two = sizes[0] + sizes[1]
    opts = dict(storage_options=s3_server.options, cache_dir=str(tmp_path), cache_limit=two)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from ndp.store.remote import RemoteDataset
        dataset = RemoteDataset({remote!r}, **{opts!r})
        print("open", flush=True)
        sys.stdin.readline()
        dataset.close()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_env())
    try:
        assert holder.stdout.readline().strip() == "open", holder.stderr.read()[-2000:]
        for name in LAUNCHER:
            monkeypatch.delenv(name, raising=False)
        with pytest.raises(CacheFullError, match=(
                rf"{remote}: cache_limit={two:,} bytes cannot hold .*the 2 rank\(s\) of "
                rf"this node .*\(2 reader\(s\) of it open now, this one included, "
                rf"registered in {re.escape(str(tmp_path))}.*LOCAL_WORLD_SIZE=unset\): "
                rf"{sum(sizes[:4]):,} bytes")):
            RemoteDataset(remote, **opts)
    finally:
        holder.communicate("close\n", timeout=HANG_S)
    dataset = RemoteDataset(remote, **opts)  # alone now
    assert dataset.readers == 1
    dataset.close()


LOADER = textwrap.dedent("""
    import json, sys
    import numpy as np
    from ndp.errors import CacheFullError
    from ndp.loader.loader import Loader
    from ndp.store.remote import RemoteDataset

    url, options, cache, limit, rank, checked = sys.argv[1:7]
    if checked == "unchecked":  # as if every rank had opened before the others registered
        RemoteDataset._check_limit = lambda self: None
    try:
        loader = Loader(url, mode="packed", batch_size=2, seq_len=16, output="arrays",
                        shuffle=False, rank=int(rank), world_size=4,
                        storage_options=json.loads(options), cache_dir=cache,
                        cache_limit=int(limit))
    except CacheFullError as exc:  # refused when opened
        loader = exc
    print("ready", flush=True)  # nothing more before "go": the test reads this line alone
    sys.stdin.readline()  # every rank opened: read at once, as ranks in step do
    if isinstance(loader, CacheFullError):
        print(json.dumps({"error": str(loader)}))
        sys.exit(0)
    try:
        with loader:
            rows = [np.asarray(b["x"]).tolist() for b in loader]
        print(json.dumps({"rows": rows}))
    except CacheFullError as exc:
        print(json.dumps({"error": str(exc)}))
""")


@pytest.mark.parametrize("checked", ["checked", "unchecked"])
def test_four_ranks_on_a_cache_of_two_shards_without_local_world_size_all_end(
        checked, local, remote, s3_server, tmp_path):
    """The trial's case: each rank either reads its share (the batches a local read gives) or
    raises ``CacheFullError``; none waits on the others' pins. Checked when opened, the ranks
    that open after another is registered are refused; unchecked (each rank opened alone),
    the ranks' producers wait on each other's pins, and the cache finds that out."""
    limit = 2 * _sizes(local)[0]
    procs = [subprocess.Popen([sys.executable, "-c", LOADER, remote,
                               json.dumps(s3_server.options), str(tmp_path), str(limit),
                               str(rank), checked], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_env())
             for rank in range(4)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready", p.stderr.read()[-2000:]
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = _run_all(procs)
    assert all(code == 0 for code, _, _ in outs), [err[-2000:] for _, _, err in outs]
    for rank, (_, out, _) in enumerate(outs):
        got = json.loads(out.strip().splitlines()[-1])
        if "error" in got:
            assert f"cache_limit={limit:,}" in got["error"], got["error"]
            assert "raise cache_limit" in got["error"].lower(), got["error"]
            continue
        kw = dict(mode="packed", batch_size=2, seq_len=16, output="arrays", shuffle=False,
                  rank=rank, world_size=4)
        with Loader(local, **kw) as want:
            assert got["rows"] == [np.asarray(b["x"]).tolist() for b in want]
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_cache_closed_and_used_again_registers_again(tmp_path):
    cache = ShardCache(tmp_path, limit=10)
    assert cache.readers() == 1
    cache.close()
    assert cache.readers() == 0
    cache.pin({"a.ndp"})
    assert cache.readers() == 1
    cache.close()
