"""``loader.telemetry()`` (``ndp.loader.telemetry``) and its export (``ndp.loader.metrics``):
the figures equal ``loader.stats``; the waits of ``next()`` are a histogram over every batch;
a scrape of a real Prometheus endpoint on 127.0.0.1 returns the stats' numbers; the logger
scalars are flat; ``gather`` without ``torch.distributed`` is this rank's alone."""

from __future__ import annotations

import math
import sys
import urllib.request
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import golden  # noqa: E402

import ndp  # noqa: E402
from ndp.loader.telemetry import BOUNDS, Waits, gather, slowest  # noqa: E402


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    return golden.write_datasets(tmp_path_factory.mktemp("telemetry"))


def ran(datasets, steps=30, **over):
    kw = dict(mode="packed", seed=7, crc_drop_rate=0.1, backend="cpu", output="arrays",
              rank=1, world_size=2, **golden.SHAPES["packed"]) | over
    loader = ndp.Loader(datasets["main"], **kw)
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(steps):
            next(it)
    return loader


def test_the_histogram_counts_every_next_and_its_quantiles():
    w = Waits()
    for s in (0.5e-6, 3e-6, 3e-6, 1e-3):
        w.add(s)
    hist = w.histogram(10)  # 6 next() calls took no chunk: waits of 0
    assert hist[-1] == (math.inf, 10) and [b for b, _ in hist[:-1]] == list(BOUNDS)
    assert dict(hist)[BOUNDS[0]] == 7 and dict(hist)[4e-6] == 9 and dict(hist)[1.024e-3] == 10
    assert w.quantile(0.5, 10) == 0.0 and w.quantile(0.9, 10) == 4e-6
    assert w.quantile(1.0, 10) == 1e-3 == w.largest  # never past the largest wait
    assert w.total == pytest.approx(0.5e-6 + 6e-6 + 1e-3)


def test_the_figures_are_the_stats(datasets):
    with ran(datasets) as loader:
        f = loader.telemetry()
        stats = loader.stats
        assert (f["rank"], f["world_size"], f["step"], f["batches"]) == (1, 2, 30, 30)
        assert f["tokens"] == stats.tokens and f["packets"] == stats.packets
        assert f["corrupt"] == stats.corrupt and sum(f["corrupt"].values()) > 0
        assert f["remaining"] == len(loader) - 30
        assert f["wait_seconds"] == stats.wait_seconds > 0
        assert 0 <= f["wait_p50_s"] <= f["wait_p99_s"] <= f["wait_max_s"]
        assert f["wait_histogram"][-1][1] == 30 and f["tokens_per_s"] > 0
        flat = ndp.telemetry_scalars(loader)
        assert flat["ndp/tokens"] == stats.tokens and all(
            isinstance(v, float) for v in flat.values())
        assert {f"ndp/corrupt/{r}" for r in stats.corrupt} <= set(flat)
        assert gather(loader)[0]["batches"] == 30 and slowest(gather(loader))["rank"] == 1


def scrape(port: int) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_a_prometheus_scrape_returns_the_stats(datasets):
    pytest.importorskip("prometheus_client")
    with ran(datasets) as loader:
        server, port = ndp.serve_metrics(loader, port=0)
        try:
            got = scrape(port)
            stats = loader.stats
            r = (("rank", "1"),)
            assert got[("ndp_batches_total", r)] == stats.batches == 30
            assert got[("ndp_tokens_total", r)] == stats.tokens
            assert got[("ndp_packets_total", r)] == stats.packets
            for reason, n in stats.corrupt.items():
                assert got[("ndp_dropped_packets_total", (("rank", "1"), ("reason", reason)))] == n
            assert got[("ndp_batches_remaining", r)] == len(loader) - 30
            assert got[("ndp_wait_seconds_count", r)] == 30
            assert got[("ndp_wait_seconds_sum", r)] == pytest.approx(stats.wait_seconds)
            it = iter(loader)  # the next scrape follows the loop
            for _ in range(5):
                next(it)
            assert scrape(port)[("ndp_batches_total", r)] == 35
        finally:
            server.shutdown()


def test_no_prometheus_client_is_a_named_error(datasets, monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with ran(datasets, steps=1) as loader, pytest.raises(ndp.ConfigError, match="metrics"):
        ndp.serve_metrics(loader, port=0)


GATHER = """
import datetime, json, os, sys, time
import torch.distributed as dist
import ndp
from ndp.loader.telemetry import gather, slowest

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
loader = ndp.Loader(sys.argv[1], mode="packed", batch_size=2, seq_len=16, backend="cpu",
                    output="arrays", seed=7)       # RANK / WORLD_SIZE from the environment
it = iter(loader)
for _ in range(5 + rank):
    next(it)
if rank == 1:
    loader._waits.add(2.0)                      # rank 1 is made the slow one
    loader.stats.wait_seconds += 2.0
everyone = gather(loader)                       # a collective: every rank calls it
print("GATHERED", json.dumps({"ranks": [f["rank"] for f in everyone],
                              "batches": [f["batches"] for f in everyone],
                              "slowest": slowest(everyone)["rank"]}), flush=True)
loader.close()
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.slow
def test_gather_collects_every_ranks_figures_over_gloo(datasets, tmp_path):
    pytest.importorskip("torch.distributed")
    import json
    import os
    import socket
    import subprocess

    script = tmp_path / "gather.py"
    script.write_text(GATHER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, str(script), str(datasets["main"])],
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE="2",
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                       OMP_NUM_THREADS="1"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            p.kill()
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-3000:]
    got = [json.loads(out.split("GATHERED", 1)[1]) for out in outs]
    assert got[0] == got[1] == {"ranks": [0, 1], "batches": [5, 6], "slowest": 1}
