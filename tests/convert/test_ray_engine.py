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
from ndp.errors import ConfigError
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


def test_num_cpus_for_a_ray_ndp_does_not_start_is_refused(local_ray, inputs, tokenizer_dir,
                                                          tmp_path):
    """`num_cpus` sizes the local Ray that ndp starts; on a Ray already running it would be
    ignored without a word: refused, before anything is written."""
    with pytest.raises(ConfigError, match=r"`num_cpus=3` sizes a local Ray .* already running"):
        convert_ray(inputs, tmp_path / "out", tokenizer=tokenizer_dir, num_cpus=3,
                    options=ConvertOptions(**OPTS))
    assert [p.name for p in tmp_path.iterdir()] == [".out.ndp-lock"]
