"""ndp.store.remote: a dataset in object storage (moto's S3 server on 127.0.0.1, through s3fs) read
by the Loader, NDPDataset and the CLI, equal bit for bit to the same dataset read from disk;
opened with one small read; and every fault (a dropped connection, a 503, a refused or missing
object, an object replaced by a cut or altered copy, a server that went away) either retried
to the right batches or raised as a ``RemoteError`` naming the URL, with nothing partial left
in the cache.

RAMP data: packet k holds tokens k*1000 + arange(n).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ndp import NDPDataset
from ndp.errors import CacheFullError, ManifestError, RemoteError
from ndp.loader.loader import Loader
from ndp.store.remote import RemoteDataset, is_url, least_cache_limit, node_ranks

from ndp_test_helpers import S3Server, ramp_specs, upload, write_shards

LENGTHS = [int(x) for x in np.random.default_rng(3).integers(1, 40, 60)]
NAMES = ["p0-00000.ndp", "p1-00000.ndp", "p2-00000.ndp"]


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> Path:
    """60 ramp packets (some masked) in three shards of 20."""
    d = tmp_path_factory.mktemp("local")
    specs = ramp_specs(LENGTHS, masked=[k % 5 == 2 for k in range(60)])
    packets = [s.encode() for s in specs]
    for i in range(3):
        write_shards(d, packets[20 * i: 20 * (i + 1)], prefix=f"p{i}")
    return d


_n = 0


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    """Retries 100x sooner than by default: the same retries, less waiting."""
    monkeypatch.setattr("ndp.store.remote.BACKOFF_S", 0.002)


@pytest.fixture
def remote(s3_server, local) -> str:
    """The local dataset uploaded under a bucket of its own (manifest last); its URL."""
    global _n
    _n += 1
    bucket = s3_server.bucket(f"ndp-test-{_n}")
    upload(local, s3_server.fs(), f"{bucket}/data")
    return f"s3://{bucket}/data"


def batches(loader) -> list[dict]:
    """Every batch of an epoch, copied; the loader closed after (its prefetch thread too,
    also when the epoch raised)."""
    with loader:
        return [{k: np.asarray(v).copy() for k, v in b.items()} for b in loader]


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


KW = {"padded": dict(batch_size=4, seq_len=24), "packed": dict(batch_size=2, seq_len=16),
      "packing": dict(batch_size=2, seq_len=48)}


def test_is_url():
    assert is_url("s3://b/p") and is_url("memory://x") and is_url("hf://datasets/a/b")
    assert not is_url("data/") and not is_url("file:///tmp/x") and not is_url(Path("s3:/x"))


@pytest.mark.parametrize("mode", ["padded", "packed", "packing"])
def test_two_ranks_sharing_a_cache_read_what_disk_gives(mode, local, remote, s3_server, tmp_path):
    kw = dict(mode=mode, output="arrays", seed=5, world_size=2, **KW[mode])
    for rank in (0, 1):
        want = batches(Loader(local, rank=rank, **kw))
        got = batches(Loader(remote, rank=rank, storage_options=s3_server.options,
                             cache_dir=tmp_path, **kw))
        assert want and same(got, want)
    for name in NAMES:  # one download per shard for both ranks
        assert s3_server.gets(f"/{remote[5:]}/{name}") == 1


def test_opening_is_one_read_of_the_manifest_and_never_a_listing(local, remote, s3_server,
                                                                 tmp_path):
    prefix = "/" + remote[5:]
    before = len(s3_server.requests)
    dataset = RemoteDataset(remote, storage_options=s3_server.options, cache_dir=tmp_path)
    first = s3_server.requests[before:]
    assert ("GET", f"{prefix}/ndp.json") in first
    assert sorted(p for m, p in first if m == "GET" and p.endswith(".idx")) == \
        sorted(f"{prefix}/{n}.idx" for n in NAMES)
    assert not any("list-type" in q for q in s3_server.queries[before:])
    assert not any(p.endswith(".ndp") for _, p in first)  # no shard read to open it
    dataset.close()
    before = len(s3_server.requests)
    RemoteDataset(remote, storage_options=s3_server.options, cache_dir=tmp_path).close()
    gets = [r for r in s3_server.requests[before:] if r[0] == "GET"]
    assert gets == [("GET", f"{prefix}/ndp.json")]  # the indexes were cached


def test_resume_mid_epoch_from_remote_equals_local(local, remote, s3_server, tmp_path):
    kw = dict(mode="packed", output="arrays", seed=2, batch_size=2, seq_len=16)
    want = batches(Loader(local, **kw))
    first = Loader(remote, storage_options=s3_server.options, cache_dir=tmp_path / "a", **kw)
    it = iter(first)
    head = [{k: np.asarray(v).copy() for k, v in next(it).items()} for _ in range(3)]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    again = Loader(remote, storage_options=s3_server.options, cache_dir=tmp_path / "b", **kw)
    again.load_state_dict(state)
    assert same(head + batches(again), want)


def test_ndpdataset_and_cli_read_a_url(local, remote, s3_server, tmp_path):
    want = NDPDataset(local, seq_len=32)
    got = NDPDataset(remote, seq_len=32, storage_options=s3_server.options,
                     cache_dir=tmp_path)
    assert len(got) == len(want) == 60
    assert all(np.array_equal(got[i]["input_ids"], want[i]["input_ids"]) for i in range(60))
    opts = ["--storage-options", json.dumps(s3_server.options), "--cache-dir", str(tmp_path)]
    for cmd in (["inspect", "--json"], ["verify"]):
        proc = subprocess.run([sys.executable, "-m", "ndp.cli", *cmd, remote, *opts],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "ndp.cli", "inspect", "--json", remote, *opts],
                          capture_output=True, text=True)
    assert sum(r["packets"] for r in json.loads(proc.stdout)) == 60
    for source, out in ((remote, tmp_path / "remote.bin"), (str(local), tmp_path / "local.bin")):
        proc = subprocess.run([sys.executable, "-m", "ndp.cli", "export", source, "-o", str(out),
                               "--no-progress", *opts], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "remote.bin").read_bytes() == (tmp_path / "local.bin").read_bytes()


# ------------------------------------------------------------------------------------ faults
@pytest.mark.parametrize("kind", ["cut", "503"])
def test_a_transient_error_is_retried_to_the_same_batches(kind, local, remote, s3_server,
                                                          tmp_path):
    kw = dict(mode="padded", output="arrays", seed=1, batch_size=4, seq_len=24)
    key = f"/{remote[5:]}/{NAMES[1]}"
    s3_server.fail(key, kind, times=2)
    loader = Loader(remote, storage_options=s3_server.options, cache_dir=tmp_path, **kw)
    assert same(batches(loader), batches(Loader(local, **kw)))
    assert s3_server.gets(key) == 3  # two failed (retried by s3fs or by ndp), one whole


def _no_partial_file(cache: Path, name: str) -> None:
    assert not list(cache.rglob(name)) and not list(cache.rglob(name + ".tmp"))


def test_a_refused_object_is_an_error_naming_it(remote, s3_server, tmp_path):
    s3_server.fail(f"/{remote[5:]}/{NAMES[0]}", "403", times=50)
    loader = Loader(remote, mode="padded", batch_size=4, seq_len=24, output="arrays",
                    shuffle=False, storage_options=s3_server.options, cache_dir=tmp_path)
    with pytest.raises(RemoteError, match=f"{remote}/{NAMES[0]}.*refused"):
        batches(loader)
    s3_server.fail(f"/{remote[5:]}/{NAMES[0]}", "403", times=0)
    _no_partial_file(tmp_path, NAMES[0])


@pytest.mark.parametrize("damage", ["missing", "cut", "altered"])
def test_a_missing_or_replaced_object_is_never_decoded(damage, local, remote, s3_server, tmp_path):
    fs, key = s3_server.fs(), f"{remote[5:]}/{NAMES[2]}"
    data = (local / NAMES[2]).read_bytes()
    if damage == "missing":
        fs.rm(key)
    else:
        fs.pipe(key, data[:-7] if damage == "cut" else data[:50] + bytes([data[50] ^ 1]) + data[51:])
    loader = Loader(remote, mode="packed", batch_size=2, seq_len=16, output="arrays",
                    storage_options=s3_server.options, cache_dir=tmp_path)
    why = "does not exist" if damage == "missing" else "replaced or damaged"
    with pytest.raises(RemoteError, match=f"{remote}/{NAMES[2]}.*{why}"):
        batches(loader)
    _no_partial_file(tmp_path, NAMES[2])


def test_a_server_gone_mid_download_leaves_nothing_partial(local, tmp_path):
    server = S3Server()
    bucket = server.bucket("ndp-gone")
    upload(local, server.fs(), f"{bucket}/data")
    options = server.options
    loader = Loader(f"s3://{bucket}/data", mode="padded", batch_size=4, seq_len=24,
                    output="arrays", storage_options=options, cache_dir=tmp_path)
    server.fail(".ndp", "stop")  # half of the first shard's body, then the server is gone
    try:
        with pytest.raises(RemoteError, match=f"s3://{bucket}/data/p.-00000.ndp.*failed 6 "
                                              f"times"):
            batches(loader)
        # the rest found no server: no shard was asked for twice (the decoder and the
        # prefetcher may each have begun a shard of the first chunk before it stopped)
        got = [path for method, path in server.requests if method == "GET"
               and path.endswith(".ndp")]
        assert 1 <= len(got) <= 2 and len(set(got)) == len(got), got
    finally:
        server.stop()
    for name in NAMES:  # a shard whole before the server went may stay: it is the one sent
        whole = [f for f in tmp_path.rglob(name) if f.read_bytes() == (local / name).read_bytes()]
        assert not list(tmp_path.rglob(name + ".tmp")) and len(whole) == len(
            list(tmp_path.rglob(name))), name


def test_a_cache_limit_too_small_is_refused_at_construction(remote, s3_server, tmp_path):
    with pytest.raises(CacheFullError, match="cache_limit=100 bytes cannot hold"):
        Loader(remote, mode="padded", batch_size=4, seq_len=24, storage_options=s3_server.options,
               cache_dir=tmp_path, cache_limit=100)


def test_the_ranks_of_a_node_are_local_world_size_and_each_pins_two_shards(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert node_ranks() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert node_ranks() == 8
    monkeypatch.setenv("WORLD_SIZE", "2")  # no more ranks on a node than in the job
    assert node_ranks() == 2
    for bad in ("0", "eight"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", bad)
        assert node_ranks() == 1
    sizes = [10, 50, 20, 40, 30]
    assert least_cache_limit(sizes, 1) == 90  # the two largest: one rank's shard, the next
    assert least_cache_limit(sizes, 2) == 140
    assert least_cache_limit(sizes, 4) == 150  # never more than the whole dataset


def test_a_cache_limit_too_small_for_the_ranks_of_the_node_is_refused_when_opened(
        local, remote, s3_server, tmp_path, monkeypatch):
    """Before any index is fetched; a limit that holds what they pin is taken, and read with."""
    sizes = sorted(((local / n).stat().st_size for n in NAMES), reverse=True)
    two = sizes[0] + sizes[1]  # what one rank pins: the shard it reads, the next
    opts = dict(storage_options=s3_server.options)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    RemoteDataset(remote, cache_dir=tmp_path / "one", cache_limit=two, **opts).close()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    before = len(s3_server.requests)
    with pytest.raises(CacheFullError, match=(
            rf"{remote}: cache_limit={two:,} bytes cannot hold .*the 4 rank\(s\) of this node "
            rf".*LOCAL_WORLD_SIZE=4\): {sum(sizes):,} bytes.*at least {sum(sizes):,}, run "
            rf"fewer ranks per node .*own `cache_dir`")):
        RemoteDataset(remote, cache_dir=tmp_path / "four", cache_limit=two, **opts)
    assert not any(p.endswith(".idx") for _, p in s3_server.requests[before:])
    kw = dict(mode="padded", output="arrays", batch_size=4, seq_len=24, shuffle=False)
    loader = Loader(remote, cache_dir=tmp_path / "four", cache_limit=sum(sizes), **opts, **kw)
    assert same(batches(loader), batches(Loader(local, **kw)))  # its prefetch: a quarter


def test_a_cache_of_two_shards_evicts_and_still_gives_every_batch(local, remote, s3_server,
                                                                  tmp_path):
    sizes = sorted((local / n).stat().st_size for n in NAMES)
    kw = dict(mode="padded", output="arrays", batch_size=4, seq_len=24, shuffle=False)
    loader = Loader(remote, storage_options=s3_server.options, cache_dir=tmp_path,
                    cache_limit=2 * sizes[-1], **kw)
    want = batches(Loader(local, **kw))
    assert same(batches(loader), want)
    cache = loader.corpus.remotes[0].cache
    assert cache.stats.evicted >= 1 and cache.held_bytes() <= 2 * sizes[-1]


def test_two_processes_sharing_a_cache_download_each_shard_once(remote, s3_server, tmp_path):
    script = textwrap.dedent(f"""
        import json, sys
        import numpy as np
        from ndp.loader.loader import Loader
        rank = int(sys.argv[1])
        loader = Loader({remote!r}, mode="packed", batch_size=2, seq_len=16, output="arrays",
                        rank=rank, world_size=2, storage_options={s3_server.options!r},
                        cache_dir={str(tmp_path)!r})
        n = sum(1 for _ in loader)
        loader.close()
        print(n)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert outs[0][0] == outs[1][0] and int(outs[0][0]) > 0
    for name in NAMES:
        assert s3_server.gets(f"/{remote[5:]}/{name}") == 1


def test_a_url_without_a_manifest_is_not_a_dataset(s3_server, tmp_path):
    bucket = s3_server.bucket("ndp-no-manifest")
    s3_server.fs().pipe(f"{bucket}/data/p0-00000.ndp", b"\xaa")
    with pytest.raises(ManifestError, match="ndp.json: not there"):
        Loader(f"s3://{bucket}/data", batch_size=1, seq_len=8,
               storage_options=s3_server.options, cache_dir=tmp_path)


def test_one_prefetch_thread_per_dataset_and_none_after_close(remote, s3_server, tmp_path):
    import threading

    def prefetchers() -> int:
        return sum(t.name == "ndp-prefetch" and t.is_alive() for t in threading.enumerate())

    before = prefetchers()
    loader = Loader(remote, mode="packed", batch_size=2, seq_len=16, output="arrays",
                    storage_options=s3_server.options, cache_dir=tmp_path)
    for _ in range(2):  # two epochs: the same thread, asleep between its downloads
        for _ in loader:
            assert prefetchers() - before <= 1
    assert prefetchers() - before == 1
    loader.close()
    assert prefetchers() == before


def test_the_cuda_backend_reads_a_url_as_the_cpu_backend_reads_disk(local, remote, s3_server,
                                                                   tmp_path):
    """Whole shards staged on the device (``ndp.loader.pipeline.device_shards``) from the cache: under the
    simulator without a GPU, on the device with one."""
    kw = dict(mode="padded", output="arrays", seed=4, batch_size=6, seq_len=24, prefetch=1)
    want = batches(Loader(local, **kw))[:3]
    with Loader(remote, backend="cuda", storage_options=s3_server.options, cache_dir=tmp_path,
                **kw) as loader:
        got = []
        for batch in loader:
            got.append({k: v.copy_to_host() if hasattr(v, "copy_to_host") else np.asarray(v)
                        for k, v in batch.items()})
            if len(got) == 3:
                break
    assert same(got, want)


def test_verify_of_a_url_fails_a_shard_that_is_not_the_manifests(local, remote, s3_server,
                                                                 tmp_path):
    data = (local / NAMES[1]).read_bytes()
    s3_server.fs().pipe(f"{remote[5:]}/{NAMES[1]}", data[:40] + bytes([data[40] ^ 4]) + data[41:])
    proc = subprocess.run([sys.executable, "-m", "ndp.cli", "verify", remote,
                           "--storage-options", json.dumps(s3_server.options), "--cache-dir",
                           str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"FAIL  {remote}/{NAMES[1]}" in proc.stdout and "2 passed, 1 failed" in proc.stdout


# ------------------------------------------------------------------------ the cache reused
def _other_packets(name: str, tmp_path: Path) -> bytes:
    """Shard ``name`` (``p<i>-00000.ndp``) written again from packets of the same lengths and
    masks but other tokens: a valid shard of the same size, not the manifest's."""
    i = int(name[1])
    specs = ramp_specs(LENGTHS[20 * i: 20 * (i + 1)], stride=7777,
                       masked=[k % 5 == 2 for k in range(20 * i, 20 * (i + 1))])
    d = tmp_path / "other"
    d.mkdir(exist_ok=True)
    write_shards(d, [s.encode() for s in specs], prefix=f"p{i}")
    return (d / name).read_bytes()


def _put(path: Path, data: bytes, how: str) -> None:
    """``data`` into ``path``: written over its bytes (the same inode), or renamed over it."""
    if how == "rewritten":
        with open(path, "r+b") as f:
            f.write(data)
    else:
        (path.parent / "x.part").write_bytes(data)
        (path.parent / "x.part").replace(path)


@pytest.mark.parametrize("how", ["rewritten", "replaced"])
def test_a_cached_shard_replaced_by_other_packets_is_downloaded_again(how, local, remote,
                                                                      s3_server, tmp_path):
    """The next open of the dataset with the same cache finds the cached file's identity is not
    the one checked when it was downloaded: it checks its crc32, warns and downloads it again."""
    kw = dict(mode="packed", output="arrays", batch_size=2, seq_len=16, shuffle=False)
    opts = dict(storage_options=s3_server.options, cache_dir=tmp_path / "cache")
    want = batches(Loader(local, **kw))
    assert same(batches(Loader(remote, **opts, **kw)), want)
    (cached,) = (tmp_path / "cache").rglob(NAMES[1])
    other = _other_packets(NAMES[1], tmp_path)
    assert len(other) == cached.stat().st_size and other != cached.read_bytes()
    _put(cached, other, how)
    where = re.escape(str(cached))
    with pytest.warns(UserWarning, match=rf"{where}: .*not the shard.*downloaded again"):
        got = batches(Loader(remote, **opts, **kw))
    assert same(got, want)
    assert cached.read_bytes() == (local / NAMES[1]).read_bytes()
    assert s3_server.gets(f"/{remote[5:]}/{NAMES[1]}") == 2
    assert s3_server.gets(f"/{remote[5:]}/{NAMES[0]}") == 1  # an intact shard: not read again


def test_a_cached_shard_replaced_while_its_dataset_is_open_is_downloaded_again(
        local, remote, s3_server, tmp_path):
    """Within one open (a Loader's producer reads ahead, so its epochs cannot show it): the
    shard's next read finds the file changed, checks it and downloads it again."""
    data = (local / NAMES[2]).read_bytes()
    dataset = RemoteDataset(remote, storage_options=s3_server.options, cache_dir=tmp_path)
    shard = dataset.shards[2]

    def read() -> bytes:
        dst = np.zeros(len(data), np.uint8)
        shard.read_ranges(np.zeros(1, np.int64), np.array([len(data)], np.int64), dst,
                          np.zeros(1, np.int64))
        return dst.tobytes()

    try:
        assert read() == data and read() == data
        assert dataset.cache.stats.rechecked == 0  # an unchanged file: one stat, no crc32
        _put(shard.path, _other_packets(NAMES[2], tmp_path), "rewritten")
        with pytest.warns(UserWarning, match=rf"{re.escape(str(shard.path))}: .*not the shard"):
            assert read() == data
        assert shard.path.read_bytes() == data and dataset.cache.stats.rechecked == 1
    finally:
        dataset.close()
