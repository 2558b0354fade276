"""ndp.store.upload: ``ndp convert ... s3://bucket/prefix/`` (moto's S3 server on 127.0.0.1): the
shards uploaded as they are finished and the manifest last, the dataset read back from the URL
equal to the same conversion on disk; an existing dataset kept unless --overwrite; a failed
upload commits nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from ndp.cli.demo import stdlib_files
from ndp.errors import ManifestError
from ndp.loader.loader import Loader

SHARD_MB = "0.07"  # shards of ~73 KB: several of them


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("in") / "docs.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for p in stdlib_files(30):
            f.write(json.dumps({"text": p.read_text(encoding="utf-8")}) + "\n")
    return path


def ndp_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ndp.cli", *map(str, args)],
                          capture_output=True, text=True)


def convert(corpus, output, tokenizer_dir, *extra):
    return ndp_cli("convert", corpus, output, "--tokenizer", tokenizer_dir, "--shard-size-mb",
                   SHARD_MB, "--overflow", "split", "--no-progress", *extra)


def read_all(data, **kw):
    with Loader(data, mode="packed", batch_size=2, seq_len=64, output="arrays", seed=3,
                **kw) as loader:
        return [b["x"].copy() for b in loader]


def test_convert_to_a_url_uploads_the_manifest_last(corpus, tokenizer_dir, s3_server, tmp_path):
    bucket = s3_server.bucket("ndp-convert-out")
    url = f"s3://{bucket}/tok"
    opts = json.dumps(s3_server.options)
    local = convert(corpus, tmp_path / "local", tokenizer_dir)
    assert local.returncode == 0, local.stderr
    before = len(s3_server.requests)
    proc = convert(corpus, url, tokenizer_dir, "--storage-options", opts)
    assert proc.returncode == 0, proc.stderr
    puts = [p for m, p in s3_server.requests[before:] if m == "PUT"]
    shards = sorted(p.name for p in (tmp_path / "local").glob("*.ndp"))
    assert len(shards) >= 3
    assert puts[-1] == f"/{bucket}/tok/ndp.json" and puts.count(f"/{bucket}/tok/ndp.json") == 1
    assert sorted(p.rsplit("/", 1)[1] for p in puts if p.endswith(".ndp")) == shards
    want = read_all(tmp_path / "local")
    got = read_all(url, storage_options=s3_server.options, cache_dir=tmp_path / "cache")
    assert len(got) == len(want) > 0 and all(np.array_equal(a, b) for a, b in zip(got, want))
    inspect = ndp_cli("inspect", "--json", url, "--storage-options", opts, "--cache-dir",
                      tmp_path / "cache")
    local_inspect = ndp_cli("inspect", "--json", tmp_path / "local")
    totals = [sum(r["tokens"] for r in json.loads(p.stdout)) for p in (inspect, local_inspect)]
    assert totals[0] == totals[1] > 0
    # an existing dataset is kept unless --overwrite
    again = convert(corpus, url, tokenizer_dir, "--storage-options", opts)
    assert again.returncode == 2 and "already holds a dataset" in again.stderr
    fewer = tmp_path / "fewer.jsonl"
    fewer.write_text(corpus.read_text().splitlines()[0] + "\n")
    proc = convert(fewer, url, tokenizer_dir, "--storage-options", opts, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    left = sorted(p.rsplit("/", 1)[1] for p in s3_server.fs().ls(f"{bucket}/tok"))
    manifest = json.loads(s3_server.fs().cat_file(f"{bucket}/tok/ndp.json"))
    names = [e["name"] for e in manifest["shards"]]
    assert left == sorted(["ndp.json", *names, *(n + ".idx" for n in names)])  # stale ones gone


def test_a_failed_upload_commits_nothing(corpus, tokenizer_dir, s3_server, tmp_path):
    bucket = s3_server.bucket("ndp-convert-fail")
    s3_server.fail(f"/{bucket}/tok/shard-00001.ndp", "403", times=10, method="PUT")
    proc = convert(corpus, f"s3://{bucket}/tok", tokenizer_dir, "--storage-options",
                   json.dumps(s3_server.options))
    assert proc.returncode == 2 and f"s3://{bucket}/tok/shard-00001.ndp" in proc.stderr
    assert not s3_server.fs().exists(f"{bucket}/tok/ndp.json")
    with pytest.raises(ManifestError, match="not there"):
        Loader(f"s3://{bucket}/tok", batch_size=1, seq_len=8,
               storage_options=s3_server.options, cache_dir=tmp_path)


def test_inputs_in_object_storage_convert_as_local_ones(corpus, tokenizer_dir, s3_server,
                                                        tmp_path):
    bucket = s3_server.bucket("ndp-convert-in")
    fs = s3_server.fs()
    text = corpus.read_text().splitlines()
    fs.pipe(f"{bucket}/in/a.jsonl", ("\n".join(text[:5]) + "\nnot json\n").encode())
    fs.pipe(f"{bucket}/in/b.jsonl", ("\n".join(text[5:]) + "\n").encode())
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(fs.cat_file(f"{bucket}/in/a.jsonl"))
    (tmp_path / "in" / "b.jsonl").write_bytes(fs.cat_file(f"{bucket}/in/b.jsonl"))
    opts = json.dumps(s3_server.options)
    remote = convert(f"s3://{bucket}/in/", tmp_path / "from-s3", tokenizer_dir,
                     "--storage-options", opts, "--max-skipped", "0.5")
    local = convert(tmp_path / "in", tmp_path / "from-disk", tokenizer_dir, "--max-skipped",
                    "0.5")
    assert remote.returncode == local.returncode == 0, remote.stderr + local.stderr
    assert f"skipped s3://{bucket}/in/a.jsonl:6: bad JSON" in remote.stderr
    assert remote.stdout.splitlines()[:2] == local.stdout.splitlines()[:2]  # the same counts
    got, want = read_all(tmp_path / "from-s3"), read_all(tmp_path / "from-disk")
    assert len(got) == len(want) > 0 and all(np.array_equal(a, b) for a, b in zip(got, want))
    missing = convert(f"s3://{bucket}/nothing/", tmp_path / "x", tokenizer_dir,
                      "--storage-options", opts)
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_an_overwrite_that_fails_before_its_commit_leaves_the_old_dataset_whole(
        corpus, tokenizer_dir, s3_server, tmp_path):
    """Issue 28 item 3: the new shards go up under names of their own and the old dataset is
    left alone until the new manifest replaces it, so an overwrite that fails (or is killed)
    at its last step, its shards all up, leaves the old dataset readable and the same; a later
    overwrite that succeeds replaces it and deletes every shard the old manifest listed."""
    bucket = s3_server.bucket("ndp-convert-overwrite")
    url = f"s3://{bucket}/tok"
    opts = json.dumps(s3_server.options)
    first = tmp_path / "first.jsonl"
    first.write_text("".join(corpus.read_text().splitlines(keepends=True)[:12]))
    assert convert(first, url, tokenizer_dir, "--storage-options", opts).returncode == 0
    before = read_all(url, storage_options=s3_server.options, cache_dir=tmp_path / "c1")
    old = json.loads(s3_server.fs().cat_file(f"{bucket}/tok/ndp.json"))
    s3_server.fail(f"/{bucket}/tok/ndp.json", "403", times=1, method="PUT")  # the commit
    proc = convert(corpus, url, tokenizer_dir, "--storage-options", opts, "--overwrite")
    assert proc.returncode == 2 and "ndp.json" in proc.stderr
    assert json.loads(s3_server.fs().cat_file(f"{bucket}/tok/ndp.json")) == old
    after = read_all(url, storage_options=s3_server.options, cache_dir=tmp_path / "c2")
    assert len(after) == len(before) > 0 and all(np.array_equal(a, b)
                                                 for a, b in zip(after, before))
    proc = convert(corpus, url, tokenizer_dir, "--storage-options", opts, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    new = json.loads(s3_server.fs().cat_file(f"{bucket}/tok/ndp.json"))
    names = [e["name"] for e in new["shards"]]
    assert names == sorted(names) and not {e["name"] for e in old["shards"]} & set(names)
    left = {p.rsplit("/", 1)[1] for p in s3_server.fs().ls(f"{bucket}/tok")}
    assert not {e["name"] for e in old["shards"]} & left  # the old shards are gone
    assert convert(corpus, tmp_path / "local", tokenizer_dir).returncode == 0
    want = read_all(tmp_path / "local")
    got = read_all(url, storage_options=s3_server.options, cache_dir=tmp_path / "c3")
    assert len(got) == len(want) > len(before) and all(np.array_equal(a, b)
                                                        for a, b in zip(got, want))
