"""Several nodes, as far as one machine shows them: two ``torchrun`` launches of two ranks each
(``--nnodes 2 --node-rank 0|1``, static rendezvous on 127.0.0.1) train over a dataset in S3 (a
real endpoint: moto's server), each node with its own shard cache and count cache, as two
machines would have. Every rank's batches are the ones a Loader given its rank and the world
size of 4 makes from a local copy, each rank takes the same number of steps (an all-reduce a
batch), and each node's cache, shared by its two ranks, holds every shard once."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ndp.loader.loader import Loader

from ndp_test_helpers import ramp_specs, upload, write_shards

WORKER = textwrap.dedent("""
    import datetime, hashlib, json, os, sys
    import torch
    import torch.distributed as dist
    from ndp.loader.loader import Loader

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Embedding(1000, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = Loader(sys.argv[1], mode="packed", batch_size=2, seq_len=16, seed=5,
                    backend="cpu", storage_options=json.loads(sys.argv[2]),
                    cache_dir=os.environ["NODE_CACHE"])  # RANK, WORLD_SIZE from torchrun
    digests, n = [], len(loader)  # this epoch's (read after the loop: the next one's)
    for batch in loader:
        loss = model(batch["x"] % 1000).float().pow(2).mean()
        opt.zero_grad()
        loss.backward()  # every rank takes part, batch for batch
        opt.step()
        digests.append(hashlib.sha256(batch["x"].numpy().tobytes()).hexdigest())
    # A file per rank: a line of over 4 KiB that two ranks print to one pipe can interleave.
    result = os.path.join(os.environ["RESULTS"], f"rank{dist.get_rank()}.json")
    with open(result + ".tmp", "w") as f:
        json.dump({"rank": dist.get_rank(), "local": os.environ["LOCAL_RANK"],
                   "node": os.environ["GROUP_RANK"], "n": n, "digests": digests}, f)
    os.replace(result + ".tmp", result)
    loader.close()
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # gloo's threads can abort the interpreter's teardown
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_of_two_ranks_over_object_storage(tmp_path, s3_server):
    pytest.importorskip("torch.distributed")
    import hashlib

    local = tmp_path / "local"
    lengths = [int(x) for x in np.random.default_rng(8).integers(1, 60, 240)]
    packets = [s.encode() for s in ramp_specs(lengths)]
    for i in range(4):
        write_shards(local, packets[60 * i: 60 * (i + 1)], prefix=f"p{i}")
    bucket = s3_server.bucket("ndp-nodes")
    upload(local, s3_server.fs(), f"{bucket}/data")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = _free_port()
    procs = []
    for node in range(2):
        env = dict(os.environ, RESULTS=str(tmp_path),
                   NODE_CACHE=str(tmp_path / f"node{node}" / "cache"),
                   NDP_COUNT_CACHE=str(tmp_path / f"node{node}" / "counts"),
                   NDP_NUM_THREADS="1", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
             "--nproc-per-node", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
             "--master-port", str(port), str(script), f"s3://{bucket}/data",
             json.dumps(s3_server.options)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=300)[0])
    finally:
        for p in procs:
            p.kill()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    results = {}
    for path in tmp_path.glob("rank*.json"):
        got = json.loads(path.read_text())
        results[got["rank"]] = got
    assert sorted(results) == [0, 1, 2, 3]
    assert {(r["node"], r["local"]) for r in results.values()} == {
        (str(n), str(k)) for n in range(2) for k in range(2)}
    steps = {len(r["digests"]) for r in results.values()}
    assert len(steps) == 1 and steps.pop() == results[0]["n"] > 3
    for rank, got in results.items():  # the batches a Loader of that rank makes locally
        with Loader(local, mode="packed", batch_size=2, seq_len=16, seed=5, backend="cpu",
                    rank=rank, world_size=4, output="arrays") as one:
            want = [hashlib.sha256(b["x"].tobytes()).hexdigest() for b in one]
        assert got["digests"] == want, f"rank {rank}"
    for node in range(2):  # every shard, in one copy in the node's cache its ranks share
        cached = sorted(p.name for p in (tmp_path / f"node{node}" / "cache").rglob("*.ndp"))
        assert cached == [f"p{i}-00000.ndp" for i in range(4)]


def test_the_guides_loader_reads_its_bucket_as_written(tmp_path, s3_server, monkeypatch):
    """docs/guides/multi-node.md's Python block as written, but for where its cache lies: its
    bucket is the S3 endpoint on 127.0.0.1 (``AWS_ENDPOINT_URL``, which botocore reads, so the
    block needs no storage options), and the Loader it makes delivers a batch."""
    from ndp_test_helpers import markdown_blocks

    page = Path(__file__).resolve().parents[2] / "docs" / "guides" / "multi-node.md"
    (code,) = [c for lang, c in markdown_blocks(page.read_text(encoding="utf-8"))
               if lang == "python"]
    assert "/local/nvme/ndp" in code
    local = tmp_path / "local"
    write_shards(local, [s.encode() for s in ramp_specs([700] * 40)])
    upload(local, s3_server.fs(), f"{s3_server.bucket('bucket')}/tokens")
    for name, value in (("AWS_ENDPOINT_URL", s3_server.endpoint), ("AWS_ACCESS_KEY_ID", "testing"),
                        ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    namespace: dict = {}
    exec(compile(code.replace("/local/nvme/ndp", str(tmp_path / "cache")), str(page), "exec"),
         namespace)
    with namespace["loader"] as loader:
        batch = next(iter(loader))
    assert tuple(batch["x"].shape) == (16, 1024)
