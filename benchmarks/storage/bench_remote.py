"""A dataset read from object storage against the same dataset on local disk.

    pip install -e ".[dev]"                      # moto[server] and s3fs among them
    python benchmarks/storage/bench_remote.py            # ~1 minute on 2 cores
    python benchmarks/storage/bench_remote.py --quick    # a smaller dataset
    python benchmarks/storage/bench_remote.py --out benchmarks/results  # to the project's record

A dataset of ramp packets (2-byte tokens, ``--shards`` shards of ``--shard-mb``) is written to
local disk and uploaded to moto's S3 server, started as a process of its own on 127.0.0.1 (so
it does not share this process's interpreter). One epoch of ``ndp.Loader(mode="packed",
batch_size=16, seq_len=1024)`` on the CPU is then read three ways, each in a process of its own:
from the local directory (page cache warm), from the URL with an empty cache (``cold``: every
shard downloaded while the epoch runs) and from the URL again with the cache the cold run
filled (``warm``: one GET of the manifest, nothing else). Each row: time to the first batch
(opening included), tokens/s after it (and over the whole epoch with its start), host CPU
seconds per 1e9 tokens over the epoch (this process: the loader's threads, the prefetch
downloads), and the bytes the cache downloaded. JSON into
``--out`` (default ``$NDP_RESULTS_DIR``, else ``./ndp-results``): ``remote-<time>.json``.

Loopback is not a network: a cold read here is bounded by moto (a Python server) and this
machine's two cores, not by bandwidth; the cold row says what the cache and prefetch cost, not
what S3 would deliver.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import add_out_argument, command, machine, write_report  # noqa: E402

B, T = 16, 1024


def write_dataset(directory: Path, *, shards: int, shard_mb: float) -> dict:
    """Ramp packets of 2,000 tokens (2-byte ids) in ``shards`` shards of about ``shard_mb``."""
    from ndp.wire.packet import encode_tokens
    from ndp.store.writer import ShardWriter

    per_shard = int(shard_mb * (1 << 20)) // (2 * 2000 + 8)
    rng = np.random.default_rng(0)
    tokens = 0
    with ShardWriter(directory, max_shard_bytes=int(shard_mb * (1 << 20)) + (1 << 16)) as w:
        for _ in range(shards * per_shard):
            ids = rng.integers(0, 50_000, 2000, dtype=np.int64)
            w.write(encode_tokens(ids, width=2))
            tokens += 2000
    return {"shards": len(list(directory.glob("*.ndp"))), "tokens": tokens,
            "bytes": sum(p.stat().st_size for p in directory.glob("*.ndp"))}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def options(endpoint: str) -> dict:
    return {"key": "bench", "secret": "bench", "skip_instance_cache": True,
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}


def read_epoch(data: str, storage_options: dict | None, cache_dir: str | None) -> dict:
    """One epoch, in this process: time to first batch, tokens/s, CPU s per 1e9 tokens."""
    from ndp.loader.loader import Loader

    cpu0, t0 = time.process_time(), time.perf_counter()
    loader = Loader(data, mode="packed", batch_size=B, seq_len=T, output="arrays", seed=0,
                    storage_options=storage_options, cache_dir=cache_dir)
    first = None
    tokens = after_first = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - t0
            t1 = time.perf_counter()
        else:
            after_first += batch["x"].size
        tokens += batch["x"].size
    wall = time.perf_counter() - t0
    steady = time.perf_counter() - t1
    cpu = time.process_time() - cpu0
    stats = loader.corpus.remotes[0].cache.stats if loader.corpus.remotes else None
    loader.close()
    return {"time_to_first_batch_s": first, "seconds": wall, "tokens": tokens,
            "tokens_per_s": after_first / steady,
            "tokens_per_s_with_start": tokens / wall,
            "host_cpu_s_per_billion_tokens": cpu / tokens * 1e9,
            "downloaded_bytes": stats.bytes_downloaded if stats else 0,
            "downloads": stats.downloads if stats else 0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smaller dataset")
    ap.add_argument("--shards", type=int, default=None)
    ap.add_argument("--shard-mb", type=float, default=16.0)
    add_out_argument(ap)
    ap.add_argument("--read", nargs=3, help=argparse.SUPPRESS)  # DATA OPTIONS CACHE: one row
    args = ap.parse_args(argv)
    if args.read:
        data, opts, cache = args.read
        print(json.dumps(read_epoch(data, json.loads(opts), None if cache == "-" else cache)))
        return 0
    shards = args.shards or (4 if args.quick else 16)
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                               str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import s3fs

        fs = s3fs.S3FileSystem(**options(endpoint))
        for _ in range(100):
            try:
                fs.call_s3("create_bucket", Bucket="ndp-bench")
                break
            except OSError:
                time.sleep(0.1)
        with tempfile.TemporaryDirectory(prefix="ndp-remote-") as tmp:
            local = Path(tmp) / "data"
            data = write_dataset(local, shards=shards, shard_mb=args.shard_mb)
            t = time.perf_counter()
            for f in sorted(local.iterdir(), key=lambda p: p.name == "ndp.json"):
                fs.put_file(str(f), f"ndp-bench/data/{f.name}")
            upload_s = time.perf_counter() - t
            print(f"data: {data['shards']} shards, {data['tokens']:,} tokens, "
                  f"{data['bytes'] / 1e6:.0f} MB (uploaded in {upload_s:.1f} s)", flush=True)
            cache = str(Path(tmp) / "cache")
            rows = []
            for name, where, opts, cdir in (
                    ("local-disk", str(local), None, "-"),
                    ("s3-cold-cache", "s3://ndp-bench/data", options(endpoint), cache),
                    ("s3-warm-cache", "s3://ndp-bench/data", options(endpoint), cache)):
                proc = subprocess.run([sys.executable, __file__, "--read", where,
                                       json.dumps(opts), cdir], capture_output=True, text=True)
                if proc.returncode:
                    raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
                row = {"name": name, **json.loads(proc.stdout.strip().splitlines()[-1])}
                rows.append(row)
                print(f"{name:14s} first batch {row['time_to_first_batch_s']:6.3f} s  "
                      f"{row['tokens_per_s'] / 1e6:7.1f} M tokens/s  CPU "
                      f"{row['host_cpu_s_per_billion_tokens']:6.1f} s/Gtok  downloaded "
                      f"{row['downloaded_bytes'] / 1e6:6.0f} MB", flush=True)
    finally:
        server.terminate()
        server.wait()
    report = {
        "benchmark": "remote",
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command(__file__, argv),
        "machine": machine(),
        "config": {"B": B, "T": T, "mode": "packed", "backend": "cpu", **data,
                   "upload_seconds": upload_s, "server": "moto (python -m moto.server)"},
        "rows": rows,
    }
    write_report(args.out, "remote", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
