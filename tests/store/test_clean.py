"""``ndp.store.clean``: whether every packet decodes to the tokens its index entry says, per
shard, checked once and kept (keyed by the shard's identity, its index and the vocabulary)."""

from __future__ import annotations

import shutil

import numpy as np

import ndp.store.clean as clean
from ndp.store.corpus import Corpus

from ndp_test_helpers import ramp_specs, write_shards


def dataset(path):
    lengths = [int(x) for x in np.random.default_rng(2).integers(1, 30, 80)]
    packets = [s.encode() for s in ramp_specs(lengths)]
    write_shards(path, packets[:40], prefix="a")
    write_shards(path, packets[40:], prefix="b")
    return path


def test_a_clean_dataset_is_checked_once_and_kept(tmp_path, monkeypatch):
    corpus = Corpus(dataset(tmp_path / "d"))
    keep = tmp_path / "keep"
    assert clean.all_clean(corpus, 1 << 31, keep=keep)
    assert len(list(keep.glob("clean-*.json"))) == 2  # a shard each
    monkeypatch.setattr(clean, "_KNOWN", {})  # a new process: read from the folder
    monkeypatch.setattr(clean, "shard_clean", lambda *a: (_ for _ in ()).throw(AssertionError))
    assert clean.all_clean(Corpus(tmp_path / "d"), 1 << 31, keep=keep)


def test_ids_past_the_vocabulary_and_damage_are_not_clean(tmp_path):
    corpus = Corpus(dataset(tmp_path / "d"))
    assert not clean.all_clean(corpus, 3, keep=None)  # ramp ids reach past 3
    shutil.copytree(tmp_path / "d", tmp_path / "e")
    shard = sorted((tmp_path / "e").glob("a*.ndp"))[0]
    raw = bytearray(shard.read_bytes())
    raw[-5] ^= 0x01  # the last packet's tokens: its CRC fails
    shard.write_bytes(bytes(raw))
    damaged = Corpus(tmp_path / "e", manifest="ignore")
    assert not clean.shard_clean(damaged, 0, 1 << 31)
    assert clean.shard_clean(damaged, 1, 1 << 31)
    assert not clean.all_clean(damaged, 1 << 31, keep=tmp_path / "keep")


def test_a_shard_changed_after_its_answer_was_kept_is_checked_again(tmp_path):
    """Stale: an answer kept for a shard is not taken for it once the shard was written again
    (its identity, modification time included, is in the key)."""
    import os

    corpus = Corpus(dataset(tmp_path / "d"))
    keep = tmp_path / "keep"
    assert clean.all_clean(corpus, 1 << 31, keep=keep)
    shard = sorted((tmp_path / "d").glob("b*.ndp"))[0]
    raw = bytearray(shard.read_bytes())
    raw[-5] ^= 0x01  # same size: only the identity's time tells it apart
    shard.write_bytes(bytes(raw))
    st = os.stat(shard)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # a later write
    assert not clean.all_clean(Corpus(tmp_path / "d", manifest="ignore"), 1 << 31, keep=keep)
    assert len(list(keep.glob("clean-*.json"))) == 3  # the changed shard's answer besides
