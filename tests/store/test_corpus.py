"""ndp.store.corpus: a file that is not an NDP shard (a JSONL, a CSV renamed), or a shard with no
valid packet, is refused by name: a Loader would otherwise accept it with a warning and deliver
0 batches, and a training loop would train on nothing. ``manifest="ignore"`` reads such files
as they are, on purpose; a shard with some valid packets and some damage is read, its damage
counted (``tests/loader/test_loader.py``).

RAMP data: packet k holds tokens k*1000 + arange(n).
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from ndp.store.corpus import Corpus
from ndp.errors import DataError, ShardFormatError
from ndp.loader.loader import Loader
from ndp.wire.format import INDEX_ENTRY_DTYPE
from ndp.wire.packet import encode_tokens
from ndp.store.shard import encode_shard_header

from ndp_test_helpers import ramp, ramp_specs, write_shards

NOT_SHARDS = {
    "train.jsonl": b'{"text": "hello world"}\n{"text": "more text"}\n',
    "train.csv": b"text,label\nhello,1\nworld,0\n",
    "renamed.ndp": b"text,label\nhello,1\nworld,0\n",  # a CSV renamed to look like a shard
    "empty.ndp": b"",
}


def make(data, **kw) -> Loader:
    return Loader(data, batch_size=2, seq_len=8, backend="cpu", output="arrays", **kw)


def quietly(build):
    """``build()`` with the missing index's warning ("scanning the shard instead") silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build()


def quietly_but(build):
    """``build()`` with only the missing index's warning silenced (pytest.warns sees the rest)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*scanning the shard instead")
        return build()


def good_shard(directory) -> list:
    """Four intact ramp packets in one shard of ``directory`` (its paths)."""
    return [i.path for i in write_shards(directory, [s.encode() for s in ramp_specs([5] * 4)],
                                         prefix="good")]


@pytest.mark.parametrize("name", sorted(NOT_SHARDS))
def test_a_file_that_is_not_a_shard_is_refused_by_name(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(NOT_SHARDS[name])
    for data in (path, [*good_shard(tmp_path), path]):  # alone, or among real shards
        with pytest.raises(ShardFormatError,
                           match=rf"{re.escape(str(path))}: not an NDP shard") as err:
            quietly(lambda: make(data))
        text = str(err.value)
        assert "ndp convert" in text and "manifest='ignore'" in text
        if name == "empty.ndp":
            assert "empty file" in text
        else:
            assert repr(NOT_SHARDS[name][:8])[2:-1] in text  # says what the file begins with


def test_text_with_a_packet_found_by_chance_is_still_not_a_shard(tmp_path):
    """Text bytes can hold a 0xAA byte followed by a CRC that happens to match (UTF-8 has
    them); a file with no shard header whose first bytes are no packet is no shard, whatever a
    scan finds further on."""
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"text": "hello"}\n' + encode_tokens(ramp(0, 5)) + b'{"text": "x"}\n')
    assert len(quietly(lambda: Corpus(path, manifest="ignore"))) == 1  # the scan finds one
    with pytest.raises(ShardFormatError, match="not an NDP shard"):
        quietly(lambda: make(path))


def test_a_shard_whose_every_packet_is_damaged_is_refused(tmp_path):
    (info,) = write_shards(tmp_path, [s.encode() for s in ramp_specs([5, 6, 7])])
    raw = bytearray(info.path.read_bytes())
    raw[40:] = bytes(b ^ 0x5A for b in raw[40:])  # every packet after the header damaged
    info.path.write_bytes(bytes(raw))
    info.path.with_name(info.path.name + ".idx").unlink()  # its index is rebuilt by a scan
    with pytest.raises(ShardFormatError, match=rf"{re.escape(str(info.path))}: .*no valid "
                                               rf"packet") as err:
        quietly(lambda: make(info.path))
    assert "ndp verify" in str(err.value) and "manifest='ignore'" in str(err.value)
    # on purpose: read as it is, with a warning; the good shard beside it is read
    good = good_shard(tmp_path)
    with pytest.warns(UserWarning, match=r"no valid packet.*manifest='ignore'"):
        loader = quietly_but(lambda: make([info.path, *good], manifest="ignore", shuffle=False))
    rows = [int(r[0]) // 1000 for b in loader for r in b["input_ids"]]
    assert rows == [0, 1, 2, 3]
    assert loader.stats.corrupt_regions == 1


def test_a_file_that_is_not_a_shard_is_read_as_empty_on_purpose(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(NOT_SHARDS["train.jsonl"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = make(path, manifest="ignore")
    said = [str(w.message) for w in caught]
    assert any(re.search(r"train.jsonl: not an NDP shard.*read as it is", m) for m in said)
    assert any("no packet in the data" in m for m in said)
    assert len(loader) == 0
    with pytest.raises(DataError, match="makes no batch"):  # said, not an empty loop
        list(loader)


def test_shards_that_hold_no_packet_at_all_are_no_dataset(tmp_path):
    """A shard of a header and nothing else is no damage (it is read beside others), but data
    whose shards hold no packet at all gives nothing to train on."""
    empty = tmp_path / "empty.ndp"
    empty.write_bytes(encode_shard_header())
    with pytest.raises(DataError, match="no packet"):
        quietly(lambda: make(empty))
    loader = quietly(lambda: make([empty, *good_shard(tmp_path)], shuffle=False))
    assert [int(r[0]) // 1000 for b in loader for r in b["input_ids"]] == [0, 1, 2, 3]
    with pytest.warns(UserWarning, match="no packet"):
        assert len(quietly_but(lambda: make(empty, manifest="ignore"))) == 0


def test_some_damage_is_read_and_counted_not_refused(tmp_path):
    """The damage rule is for a shard with no valid packet; one damaged packet among good ones
    is dropped and counted as before."""
    (info,) = write_shards(tmp_path, [s.encode() for s in ramp_specs([5, 6, 7])])
    raw = bytearray(info.path.read_bytes())
    at = raw.index(encode_tokens(ramp(1, 6)))
    raw[at + 9] ^= 0x10
    info.path.write_bytes(bytes(raw))
    info.path.with_name(info.path.name + ".idx").unlink()
    loader = quietly(lambda: make(info.path, shuffle=False))
    assert [int(r[0]) // 1000 for b in loader for r in b["input_ids"]] == [0, 2]
    assert loader.stats.corrupt_regions == 1
    assert np.array_equal(loader.corpus.tokens, [5, 7])


def test_a_shard_cut_inside_its_header_is_refused(tmp_path):
    """A shard cut in its first 32 bytes (a copy or a write cut short) is damage, not an empty
    shard, even beside intact ones."""
    path = tmp_path / "cut.ndp"
    path.write_bytes(encode_shard_header()[:20])
    with pytest.raises(ShardFormatError, match=r"cut.ndp: holds no valid packet.*truncated header"):
        quietly(lambda: make([*good_shard(tmp_path), path]))


# --- opening costs O(shards): index entries are read when their shard is (issue 25) ---------------
@pytest.fixture
def twelve_shards(tmp_path):
    """12 shards of 10 ramp packets each (packet k: 3 + k % 5 tokens), indexed."""
    specs = ramp_specs([3 + k % 5 for k in range(120)])
    for i in range(0, 120, 10):
        write_shards(tmp_path, [s.encode() for s in specs[i: i + 10]], prefix=f"s{i:03d}")
    return tmp_path, specs


def test_opening_reads_no_index_entry_and_a_read_only_its_own_shards(twelve_shards):
    path, specs = twelve_shards
    corpus = Corpus(path)
    assert len(corpus.indexes) == 12 and len(corpus) == 120
    assert not any(index.loaded for index in corpus.indexes)  # headers only
    assert corpus.tokens[np.array([34, 31])].tolist() == [len(specs[34].tokens),
                                                          len(specs[31].tokens)]
    assert [index.loaded for index in corpus.indexes] == [s == 3 for s in range(12)]
    # packets of three shards out of shard order, a slice across two, an int, a mask
    want = [len(s.tokens) for s in specs]
    pick = np.array([95, 12, 96, 13, 0])
    assert corpus.tokens[pick].tolist() == [want[g] for g in pick]
    assert corpus.tokens[58:63].tolist() == want[58:63]
    assert corpus.tokens[-1] == want[-1]
    assert np.array_equal(corpus.tokens, want)  # every packet (tools and tests only)
    assert corpus.offsets[np.array([10, 0])].tolist() == [
        corpus.indexes[1].entries["offset"][0], corpus.indexes[0].entries["offset"][0]]
    assert corpus.group[5:7].tolist() == [0, 0]
    with pytest.raises(IndexError):
        corpus.tokens[np.array([120])]


def test_the_entries_held_are_bounded_in_bytes_and_read_again_when_asked(twelve_shards):
    """A corpus holds at most its cache's budget of index entries (at least the shard in use):
    a data set of 1e8 packets would otherwise keep every entry it ever read, 1.6 GB."""
    path, specs = twelve_shards
    corpus = Corpus(path)
    cache = corpus.entry_cache
    one = 10 * INDEX_ENTRY_DTYPE.itemsize  # a shard's entries
    cache.budget = 3 * one
    assert np.array_equal(corpus.tokens, [len(s.tokens) for s in specs])
    assert cache.reads == 12 and cache.held_bytes <= 3 * one
    corpus.tokens[np.arange(110, 120)]  # the last shard: still held
    assert cache.reads == 12
    corpus.tokens[np.arange(0, 10)]  # the first: dropped, read again
    assert cache.reads == 13 and cache.held_bytes <= 3 * one


def test_a_pass_through_every_shard_does_not_push_out_the_entries_in_use(twelve_shards):
    """The plan's pass over an epoch reads every shard's entries (``Column.passing``); once a
    shard was checked, the pass reads it without holding it, so the decoder's shards stay."""
    path, specs = twelve_shards
    corpus = Corpus(path)
    cache = corpus.entry_cache
    cache.budget = 3 * 10 * INDEX_ENTRY_DTYPE.itemsize
    want = [len(s.tokens) for s in specs]
    assert corpus.tokens.passing(0, 120).tolist() == want  # first reads: checked, held
    corpus.tokens[np.arange(0, 30)]  # the decoder's three shards
    reads = cache.reads
    assert corpus.tokens.passing(0, 120).tolist() == want
    assert cache.reads == reads  # read in passing: not through the cache
    corpus.tokens[np.arange(0, 30)]
    assert cache.reads == reads  # still held
    for a, b in [(5, 27), (31, 32), (44, 119), (0, 0)]:  # parts of shards, held or not
        assert corpus.tokens.passing(a, b).tolist() == want[a:b]
    assert cache.reads == reads


def test_a_loader_holds_the_entries_of_two_windows_unless_told(twelve_shards, monkeypatch):
    """``EntryCache.fit``: a Loader's cache holds what a chunk may read among when it gathers
    entries by packet (two windows of the shards with the most packets, two shards
    unshuffled, everything for "all"), at least LEAST_CACHE_BYTES; nothing more when its
    shares are read place by place (they hold their own entries); NDP_INDEX_CACHE_BYTES,
    when set, is kept."""
    from ndp.loader.loader import Loader

    path, _ = twelve_shards
    entry = INDEX_ENTRY_DTYPE.itemsize
    size = Corpus(path).shards[0].size
    monkeypatch.setattr("ndp.store.lazy.LEAST_CACHE_BYTES", 0)
    kw = dict(mode="padded", batch_size=2, seq_len=8, backend="cpu", output="arrays",
              crc_drop_rate=0.1)  # a share built whole: it gathers entries by packet
    assert Loader(path, **{**kw, "crc_drop_rate": 0.0}).corpus.entry_cache.budget == 0
    window = 3 * size - 1  # three shards a window (the third takes it to 3 * size)
    assert Loader(path, shuffle_window=window, **kw).corpus.entry_cache.budget == 60 * entry
    assert Loader(path, shuffle=False, **kw).corpus.entry_cache.budget == 20 * entry
    assert Loader(path, shuffle_window="all", **kw).corpus.entry_cache.budget == 120 * entry
    monkeypatch.setenv("NDP_INDEX_CACHE_BYTES", "1000")
    assert Loader(path, **kw).corpus.entry_cache.budget == 1000


def test_a_bad_index_cache_size_is_a_named_error(twelve_shards, monkeypatch):
    from ndp.errors import ConfigError

    monkeypatch.setenv("NDP_INDEX_CACHE_BYTES", "lots")
    with pytest.raises(ConfigError, match="NDP_INDEX_CACHE_BYTES='lots'"):
        Corpus(twelve_shards[0])
    monkeypatch.setenv("NDP_INDEX_CACHE_BYTES", "1000")
    assert Corpus(twelve_shards[0]).entry_cache.budget == 1000
