"""ndp.convert.ray_engine: ``convert_ray`` on a local Ray (num_cpus=2) writes the local
converter's packets in the same order (only the shard boundaries differ), counts the same bad
records by reason, and reads from and writes to object storage (moto's S3 on 127.0.0.1) as the
local converter does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ndp.convert import ConvertOptions, convert
from ndp.store.corpus import Corpus
from ndp.cli.demo import stdlib_files
from ndp.loader.loader import Loader

ray = pytest.importorskip("ray")
from ndp.convert.ray_engine import convert_ray  # noqa: E402

OPTS = dict(max_shard_bytes=72 << 10, overflow="split", progress=False, max_skipped=0.1)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[Path]:
    """Three JSONL files of documents; the second holds a line that is not JSON."""
    d = tmp_path_factory.mktemp("in")
    docs = stdlib_files(30)
    out = []
    for j in range(3):
        path = d / f"part{j}.jsonl"
        with open(path, "w", encoding="utf-8") as f:
            for p in docs[j::3]:
                f.write(json.dumps({"text": p.read_text(encoding="utf-8")}) + "\n")
            if j == 1:
                f.write("not json\n")
        out.append(path)
    return out


def packet_stream(directory: Path) -> list[bytes]:
    """Every packet of the dataset in corpus order (shards by name), as its bytes."""
    corpus = Corpus(directory)
    out = []
    for s, shard in enumerate(corpus.shards):
        for g in range(int(corpus.base[s]), int(corpus.base[s + 1])):
            out.append(shard.read(int(corpus.offsets[g]), int(corpus.frame_bytes[g])).tobytes())
    corpus.close()
    return out


def test_ray_writes_the_local_converters_packets(local_ray, inputs, tokenizer_dir, tmp_path):
    local = convert(inputs, tmp_path / "local", tokenizer=tokenizer_dir,
                    options=ConvertOptions(**OPTS))
    spread = convert_ray(inputs, tmp_path / "ray", tokenizer=tokenizer_dir,
                         options=ConvertOptions(**OPTS))
    for field in ("examples", "packets", "tokens", "split", "truncated", "skipped",
                  "input_bytes"):
        assert getattr(spread, field) == getattr(local, field), field
    assert spread.skipped == {"bad_json": 1}
    assert packet_stream(tmp_path / "ray") == packet_stream(tmp_path / "local")
    names = sorted(p.name for p in (tmp_path / "ray").glob("*.ndp"))
    assert names[0] == "shard-00000-00000.ndp" and len(names) > len(local.shards)
    manifest = json.loads((tmp_path / "ray" / "ndp.json").read_text())
    assert manifest["engine"] == "ray" and [e["name"] for e in manifest["shards"]] == names


def test_ray_converts_to_object_storage(local_ray, inputs, tokenizer_dir, s3_server, tmp_path):
    bucket = s3_server.bucket("ndp-ray-out")
    url = f"s3://{bucket}/tok"
    for path in inputs:  # the inputs in the bucket too: each task fetches its own file
        s3_server.fs().pipe(f"{bucket}/in/{path.name}", path.read_bytes())
    summary = convert_ray([f"s3://{bucket}/in/"], url, tokenizer=tokenizer_dir,
                          options=ConvertOptions(**OPTS, storage_options=s3_server.options))
    assert summary.skipped == {"bad_json": 1}
    convert(inputs, tmp_path / "local", tokenizer=tokenizer_dir, options=ConvertOptions(**OPTS))
    puts = [p for m, p in s3_server.requests if m == "PUT" and p.startswith(f"/{bucket}/")]
    assert puts[-1] == f"/{bucket}/tok/ndp.json"
    kw = dict(mode="packed", batch_size=2, seq_len=64, shuffle=False, output="arrays")
    with Loader(url, storage_options=s3_server.options, cache_dir=tmp_path / "c", **kw) as a, \
            Loader(tmp_path / "local", **kw) as b:
        got, want = [x["x"].copy() for x in a], [x["x"].copy() for x in b]
    assert len(got) == len(want) > 0 and all(np.array_equal(x, y) for x, y in zip(got, want))


def _processes() -> dict[int, tuple[int, bytes, str]]:
    """pid -> (parent pid, start time, command line) of every process (Linux /proc)."""
    import os

    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            out[int(name)] = (int(fields[1]), fields[19], cmd)
        except (OSError, IndexError, ValueError):
            pass
    return out


def _descendants(root: int, procs: dict) -> set[tuple[int, bytes, str]]:
    kids: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    found, todo = set(), list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        found.add((pid, procs[pid][1], procs[pid][2]))
        todo.extend(kids.get(pid, []))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_local_ray_dies_with_a_command_killed_by_sigkill(tokenizer_dir, tmp_path):
    """Issue 28 item 9: `ndp convert --engine ray` starts a local Ray; killed with SIGKILL once
    Ray's agents and workers run, it leaves none of the processes it started behind (Ray's
    GCS and raylet died with it, but its agents ran on: ndp.convert.reaper)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    text = "".join(p.read_text(encoding="utf-8") for p in stdlib_files(40))
    for j in range(4):  # enough input to outlast Ray's start by many seconds
        with open(tmp_path / f"in{j}.jsonl", "w", encoding="utf-8") as f:
            for k in range(60):
                f.write(json.dumps({"text": text[k * 97 % 5000:]}) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    child = subprocess.Popen(
        [sys.executable, "-m", "ndp.cli", "convert", *sorted(map(str, tmp_path.glob("*.jsonl"))),
         str(tmp_path / "out"), "--tokenizer", tokenizer_dir, "--engine", "ray",
         "--no-progress"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started: set = set()
    try:
        deadline = time.time() + 120
        while time.time() < deadline and child.poll() is None:
            started = _descendants(child.pid, _processes())
            if any("ray::" in cmd for _, _, cmd in started) and len(started) >= 4:
                break
            time.sleep(0.5)
        assert child.poll() is None, "the conversion ended before Ray's workers were seen"
        time.sleep(1.0)
        started = _descendants(child.pid, _processes())
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        deadline = time.time() + 30
        left = started
        while time.time() < deadline:
            now = _processes()
            left = {(pid, t, cmd) for pid, t, cmd in started
                    if pid in now and now[pid][1] == t}
            if not left:
                break
            time.sleep(0.5)
        assert not left, sorted(cmd[:60] for _, _, cmd in left)
    finally:
        if child.poll() is None:
            child.kill()
        for pid, _, _ in started:  # whatever this test made, even where it failed
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
