"""A dataset exists only once its manifest is written (ndp.store.manifest): ``ndp convert`` killed
with SIGKILL at random moments never leaves something a reader accepts as a dataset unless it
is the whole one, and ``--overwrite`` killed leaves the old dataset whole; ``ndp verify`` and
the Loader refuse a directory that is not the dataset its manifest lists.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ndp.cli.main import main
from ndp.cli.demo import stdlib_files
from ndp.errors import ConfigError, ManifestError
from ndp.loader.loader import Loader
from ndp.store.manifest import MANIFEST, read_manifest

CLI = "import sys; from ndp.cli.main import main; sys.exit(main(sys.argv[1:]))"


def _jsonl(path: Path, files: int, offset: int = 0) -> Path:
    with open(path, "w") as f:
        for p in stdlib_files(offset + files)[offset:]:
            f.write(json.dumps({"text": p.read_text(encoding="utf-8")}) + "\n")
    return path


def _convert(src: Path, out: Path, tokenizer: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CLI, "convert", str(src), str(out), "--tokenizer", tokenizer,
         "--overflow", "split", "--shard-size-mb", "0.07", "--no-progress", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _convert_here(src: Path, out: Path, tokenizer: str) -> None:
    assert main(["convert", str(src), str(out), "--tokenizer", tokenizer, "--overflow", "split",
                 "--shard-size-mb", "0.07", "--no-progress"]) == 0


def _fingerprint(out: Path) -> list | None:
    """The dataset a reader accepts in ``out`` (its shards' names and crc32s), or None when a
    Loader refuses it."""
    try:
        loader = Loader(out, batch_size=2, seq_len=16, backend="cpu", output="arrays")
    except ConfigError:  # ManifestError, or no such directory / no shards
        return None
    n = sum(1 for _ in loader)
    assert n > 0
    loader.close()
    return [(e["name"], e["crc32"]) for e in read_manifest(out)["shards"]]


@pytest.mark.slow
def test_convert_killed_at_random_moments_never_leaves_a_partial_dataset(tmp_path,
                                                                          tokenizer_dir):
    old_src = _jsonl(tmp_path / "old.jsonl", 6)
    new_src = _jsonl(tmp_path / "new.jsonl", 60, offset=6)
    ref_old, ref_new = tmp_path / "ref-old", tmp_path / "ref-new"
    assert _convert(old_src, ref_old, tokenizer_dir).wait() == 0
    started = time.perf_counter()
    assert _convert(new_src, ref_new, tokenizer_dir).wait() == 0
    full = time.perf_counter() - started
    old, new = _fingerprint(ref_old), _fingerprint(ref_new)
    assert old and new and len(new) >= 8  # many shards: a kill lands between them
    rng = np.random.default_rng(7)
    outcomes = {"fresh": [], "overwrite": []}
    for run in range(6):
        overwrite = run % 2 == 1
        out = tmp_path / f"out{run}"
        if overwrite:
            shutil.copytree(ref_old, out)
        proc = _convert(new_src, out, tokenizer_dir, *(["--overwrite"] if overwrite else []))
        time.sleep(float(rng.uniform(0.3, full)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        got = _fingerprint(out)
        if overwrite:  # the old dataset whole, or the new one whole: never a mix, never less
            assert got in (old, new), run
            outcomes["overwrite"].append("new" if got == new else "old")
        else:  # nothing a reader accepts, or the whole new dataset
            assert got in (None, new), run
            outcomes["fresh"].append("new" if got == new else "none")
            status = main(["verify", str(out)]) if out.exists() else 2
            assert (status == 0) == (got == new)
    # what the killed runs left beside their outputs is never read, and a next run clears it
    assert _convert(new_src, out, tokenizer_dir, "--overwrite").wait() == 0
    assert _fingerprint(out) == new
    assert [p.name for p in tmp_path.iterdir() if f".{out.name}.ndp-" in p.name] == [
        f".{out.name}.ndp-lock"]  # the writers' lock file stays (ndp.store.manifest)
    # the kills landed at different moments (at least some before the end)
    assert "none" in outcomes["fresh"] and "old" in outcomes["overwrite"], outcomes


def test_a_directory_that_is_not_its_manifests_dataset_is_refused_and_verify_fails(
        tmp_path, tokenizer_dir, capsys):
    out = tmp_path / "out"
    _convert_here(_jsonl(tmp_path / "in.jsonl", 12), out, tokenizer_dir)
    shards = sorted(out.glob("*.ndp"))
    assert len(shards) >= 2 and main(["verify", str(out)]) == 0
    capsys.readouterr()

    def refused(match: str) -> None:
        with pytest.raises(ManifestError, match=match):
            Loader(out, batch_size=2, seq_len=8, backend="cpu", output="arrays")
        assert main(["verify", str(out)]) == 1
        assert "FAIL" in capsys.readouterr().out

    manifest = (out / MANIFEST).read_bytes()
    (out / MANIFEST).unlink()  # what a killed conversion left before this ndp
    refused("no ndp.json.*never committed.*manifest='ignore'")
    assert main(["verify", str(out), "--no-manifest"]) == 0
    Loader(out, batch_size=2, seq_len=8, backend="cpu", output="arrays", manifest="ignore")
    (out / MANIFEST).write_bytes(manifest)

    moved = shards[1].rename(tmp_path / shards[1].name)  # a shard missing
    refused("lists 1 shard.*not there.*incomplete")
    moved.rename(shards[1])

    shutil.copy(shards[0], out / "zz-extra.ndp")  # a shard it does not list
    refused("does not list.*zz-extra.ndp")
    (out / "zz-extra.ndp").unlink()

    data = shards[0].read_bytes()
    shards[0].write_bytes(data[:-100])  # cut
    refused("bytes where the dataset's manifest recorded")
    flipped = bytearray(data)
    flipped[-3] ^= 1
    shards[0].write_bytes(bytes(flipped))  # same size, other bytes: damage, dropped as decoded
    with pytest.warns(UserWarning, match="damaged after it was written"):
        Loader(out, batch_size=2, seq_len=8, backend="cpu", output="arrays", verify="full")
    assert main(["verify", str(out)]) == 1
    assert "crc32 differs from the manifest" in capsys.readouterr().out
    shards[0].write_bytes(data)

    (out / MANIFEST).write_text("{not json")
    refused("not valid JSON")


def test_index_write_manifest_commits_a_directory_of_shards(tmp_path, tokenizer_dir, capsys):
    out = tmp_path / "out"
    _convert_here(_jsonl(tmp_path / "in.jsonl", 4), out, tokenizer_dir)
    before = read_manifest(out)
    (out / MANIFEST).unlink()
    assert main(["index", str(out), "--write-manifest"]) == 0
    assert "committed" in capsys.readouterr().out
    assert read_manifest(out)["shards"] == before["shards"]
    Loader(out, batch_size=2, seq_len=8, backend="cpu", output="arrays")


def test_convert_refuses_an_output_holding_other_files(tmp_path, tokenizer_dir, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    src = _jsonl(tmp_path / "in.jsonl", 2)
    assert main(["convert", str(src), str(out), "--tokenizer", tokenizer_dir,
                 "--no-progress", "--overwrite"]) == 2
    assert "not a dataset's (notes.txt)" in capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["notes.txt"]
    assert not [p for p in tmp_path.iterdir() if ".ndp-" in p.name]
