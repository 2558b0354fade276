"""``ndp convert ... --append`` (``ndp.convert.append``): new shards join a committed dataset as
the next generation of its manifest, atomically; a resume state saved before the append goes
on exactly and the new shards join at the next epoch; what cannot be appended is refused by
name, and an append that fails or is killed leaves the dataset as it was."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ndp.cli.demo import stdlib_files, train_tokenizer
from ndp.cli.main import main
from ndp.convert import ConvertOptions, convert
from ndp.errors import ConfigError
from ndp.loader.loader import Loader
from ndp.store.manifest import read_manifest

CLI = "import sys; from ndp.cli.main import main; sys.exit(main(sys.argv[1:]))"
SMALL = ["--overflow", "split", "--shard-size-mb", "0.07", "--no-progress"]


def _jsonl(path: Path, files: int, offset: int = 0) -> Path:
    with open(path, "w") as f:
        for p in stdlib_files(offset + files)[offset:]:
            f.write(json.dumps({"text": p.read_text(encoding="utf-8")}) + "\n")
    return path


def _files(out: Path) -> dict[str, tuple[int, int]]:
    """Every file of a dataset directory: (inode, size)."""
    return {p.name: (p.stat().st_ino, p.stat().st_size) for p in sorted(out.iterdir())}


@pytest.fixture
def dataset(tmp_path, tokenizer_dir):
    out = tmp_path / "out"
    assert main(["convert", str(_jsonl(tmp_path / "old.jsonl", 4)), str(out),
                 "--tokenizer", tokenizer_dir, *SMALL]) == 0
    return out


def make(out: Path) -> Loader:
    return Loader(out, mode="packed", batch_size=2, seq_len=64, seed=4, backend="cpu",
                  output="arrays")


def test_append_adds_a_generation_and_a_saved_state_goes_on_exactly(tmp_path, dataset,
                                                                    tokenizer_dir):
    before = read_manifest(dataset)
    old_names = [e["name"] for e in before["shards"]]
    want = [b["x"].copy() for b in make(dataset)]  # epoch 0, uninterrupted
    loader = make(dataset)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    assert main(["convert", str(_jsonl(tmp_path / "new.jsonl", 3, offset=4)), str(dataset),
                 "--tokenizer", tokenizer_dir, "--append", *SMALL]) == 0
    after = read_manifest(dataset)
    names = [e["name"] for e in after["shards"]]
    added = names[len(old_names):]
    assert names[:len(old_names)] == old_names and added and sorted(names) == names
    assert after["shards"][:len(old_names)] == before["shards"]  # the old shards unchanged
    assert after["generation"] == 1 and after["appended"][0]["shards"] == added
    assert after["summary"] == before["summary"]  # what wrote the dataset first
    assert after["appended"][0]["summary"]["examples"] == 3
    assert main(["verify", str(dataset)]) == 0
    grown = make(dataset)
    with pytest.warns(UserWarning, match=rf"first {len(old_names)} of the {len(names)} shards"):
        grown.load_state_dict(state)
    assert all(np.array_equal(a, b["x"]) for a, b in zip(want[3:], grown, strict=True))
    fresh = make(dataset)
    first = sum(b["x"].size for b in fresh)  # a run begun on the grown dataset: epoch 0
    assert first > sum(w.size for w in want)  # the new shards in it
    assert all(np.array_equal(a["x"], b["x"]) for a, b in zip(grown, fresh, strict=True))


def test_what_cannot_be_appended_is_refused_by_name(tmp_path, dataset, tokenizer_dir):
    src = _jsonl(tmp_path / "new.jsonl", 2, offset=4)
    cases = [
        (tmp_path / "none", {}, "no committed dataset to append to"),
        (dataset, {"overwrite": True}, "--overwrite replaces it: choose one"),
        (dataset, {"token_width": 4}, "holds 2-byte tokens"),
        ("s3://bucket/data", {}, "not at a URL"),
    ]
    for out, options, match in cases:
        with pytest.raises(ConfigError, match=match):
            convert([src], out, tokenizer=tokenizer_dir,
                    options=ConvertOptions(append=True, progress=False, **options))
    other = train_tokenizer([p.read_text(encoding="utf-8") for p in stdlib_files(20)],
                            tmp_path / "other-tok", vocab_size=700)
    with pytest.raises(ConfigError, match="--append: .* different tokenizers"):
        convert([src], dataset, tokenizer=str(other),
                options=ConvertOptions(append=True, progress=False))
    tokens = tmp_path / "tokens.bin"
    np.arange(100, dtype=np.uint16).tofile(tokens)
    assert main(["convert", str(tokens), str(dataset), "--format", "raw-u16", "--append",
                 "--no-progress"]) == 2


def test_an_append_that_fails_leaves_the_dataset_as_it_was(tmp_path, dataset, tokenizer_dir,
                                                           monkeypatch):
    from ndp.store.writer import ShardWriter

    files = _files(dataset)
    real = ShardWriter.commit

    def failing(self, extra=None):
        raise OSError("disk full")

    monkeypatch.setattr(ShardWriter, "commit", failing)
    with pytest.raises(OSError, match="disk full"):
        convert([_jsonl(tmp_path / "new.jsonl", 3, offset=4)], dataset,
                tokenizer=tokenizer_dir,
                options=ConvertOptions(append=True, progress=False, overflow="split",
                                       max_shard_bytes=70_000))
    monkeypatch.setattr(ShardWriter, "commit", real)
    assert _files(dataset) == files  # the same files, the same inodes: nothing touched
    assert [p.name for p in tmp_path.iterdir() if ".out.ndp-partial" in p.name] == []


def test_an_append_whose_dataset_changed_after_it_started_is_refused(tmp_path, dataset,
                                                                     tokenizer_dir):
    """Two appends, the second started (its manifest read, its tokenizer loading) before the
    first committed: it would drop the first's shards from the next generation; refused."""
    from ndp.convert.append import dataset_to_grow, grown_output

    stale = dataset_to_grow(dataset, overwrite=False)
    assert main(["convert", str(_jsonl(tmp_path / "a.jsonl", 2, offset=4)), str(dataset),
                 "--tokenizer", tokenizer_dir, "--append", *SMALL]) == 0
    files = _files(dataset)
    with pytest.raises(ConfigError, match="another conversion changed this dataset"):
        with grown_output(dataset, stale):
            pass
    assert _files(dataset) == files  # the first append's generation, whole


@pytest.mark.slow
def test_an_append_killed_at_random_moments_leaves_the_old_or_the_new_generation(
        tmp_path, dataset, tokenizer_dir):
    src = _jsonl(tmp_path / "new.jsonl", 40, offset=4)
    cmd = [sys.executable, "-c", CLI, "convert", str(src), "", "--tokenizer", tokenizer_dir,
           "--append", *SMALL]
    reference = tmp_path / "reference"
    os.system(f"cp -r {dataset} {reference}")
    started = time.perf_counter()
    assert subprocess.run(cmd[:5] + [str(reference)] + cmd[6:]).returncode == 0
    full = time.perf_counter() - started
    old, new = read_manifest(dataset), read_manifest(reference)
    seen = set()
    for run, at in enumerate(np.random.default_rng(3).uniform(0.3, full, 4)):
        out = tmp_path / f"run{run}"
        os.system(f"cp -r {dataset} {out}")
        proc = subprocess.Popen(cmd[:5] + [str(out)] + cmd[6:], stderr=subprocess.DEVNULL)
        time.sleep(float(at))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        got = read_manifest(out)
        assert got in (old, new) or (got["shards"] == new["shards"]), run
        seen.add("new" if got["shards"] == new["shards"] else "old")
        assert main(["verify", str(out)]) == 0  # whole, whichever generation
    assert "old" in seen
