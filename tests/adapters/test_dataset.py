"""NDPDataset: items equal the ramp data (padding, truncation, masks), DataLoader in the main
process and in workers, shard order, corrupt packets left out and counted, CRC-Drop per epoch,
cheap pickling, argument checks.

RAMP data: packet k holds tokens k*1000 + arange(n), so a row's first token names its packet.
"""

from __future__ import annotations

import pickle
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

from ndp.store.corpus import Corpus
from ndp.adapters.dataset import NDPDataset, QubGPUDataset
from ndp.engine.reference import decode_padded
from ndp.errors import ConfigError, IndexMismatchError, NDPError, ShardFormatError
from ndp.wire.format import Typ
from ndp.wire.packet import encode_packet, encode_tokens

from ndp_test_helpers import flip_bit, ramp, ramp_specs, write_shards

LENGTHS = [5, 3, 17, 1, 64, 33, 8, 9, 100, 2, 40, 7]  # no empty packet: dropped (test_loader_rules)
WIDTHS = [4, 2] * 6
MASKED = [False, False, True, True, False, True, False, False, True, False, False, True]
SEQ = 20
PAD = 7


def expected_row(spec, seq: int = SEQ, pad: int = PAD) -> dict[str, np.ndarray]:
    """What one spec should decode to, built independently of ndp."""
    m = min(len(spec.tokens), seq)
    ids = np.full(seq, pad, np.int64)
    labels = np.full(seq, -100, np.int64)
    mask = np.zeros(seq, np.int64)
    ids[:m], labels[:m], mask[:m] = spec.tokens[:m], spec.labels()[:m], 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def assert_item(item: dict, want: dict) -> None:
    assert set(item) == {"input_ids", "labels", "attention_mask"}
    for key, value in want.items():
        assert item[key].dtype == np.int64 and item[key].shape == value.shape, key
        np.testing.assert_array_equal(item[key], value, err_msg=key)


@pytest.fixture
def ramp_dir(tmp_path):
    """One shard of 12 ramp packets (mixed widths and masks, lengths around SEQ); its specs."""
    specs = ramp_specs(LENGTHS, width=WIDTHS, masked=MASKED)
    write_shards(tmp_path, [s.encode() for s in specs])
    return tmp_path, specs


def test_items_equal_ramp_data(ramp_dir):
    path, specs = ramp_dir
    ds = NDPDataset(path, seq_len=SEQ, pad_token_id=PAD)
    assert len(ds) == len(specs)
    for k, spec in enumerate(specs):
        assert_item(ds[k], expected_row(spec))
    assert_item(ds[-1], expected_row(specs[-1]))
    assert_item(ds[-len(specs)], expected_row(specs[0]))
    for bad in (len(specs), -len(specs) - 1):
        with pytest.raises(IndexError):
            ds[bad]
    assert ds.stats == {"packets": 12, "valid": 12, "corrupt": {}, "dropped_on_purpose": 0,
                        "kept": 12, "corrupt_regions": 0, "corrupt_bytes": 0}


@pytest.mark.parametrize("seq,pad", [(1, 0), (SEQ, PAD), (150, -1)])
def test_items_equal_decode_padded(ramp_dir, seq, pad):
    """Items are the rows the CPU reference decoder builds from the same packets."""
    path, specs = ramp_dir
    ds = NDPDataset(path, seq_len=seq, pad_token_id=pad)
    corpus = Corpus(path)
    ref = decode_padded(corpus.shards[0].data, corpus.offsets, seq_len=seq,
                        pad_token_id=pad)
    assert ref.input_ids.shape[0] == len(ds)
    for k in range(len(ds)):
        assert_item(ds[k], {"input_ids": ref.input_ids[k], "labels": ref.labels[k],
                            "attention_mask": ref.attention_mask[k]})


def test_shard_changed_after_construction(ramp_dir):
    path, specs = ramp_dir
    ds = NDPDataset(path, seq_len=SEQ)
    ds[4]
    shard = ds.corpus.paths[0]
    at = shard.read_bytes().index(specs[4].encode()) + 10
    with open(shard, "r+b") as f:  # in place: the dataset's memory map sees it
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(IndexMismatchError, match="BAD_CRC"):
        ds[4]
    assert_item(ds[5], expected_row(specs[5]))


def test_positional_arguments_and_alias(ramp_dir):
    path, specs = ramp_dir
    assert QubGPUDataset is NDPDataset
    ds = QubGPUDataset(str(path), 3, 9, 0.0)  # path, seq_len, pad_token_id, crc_drop_rate
    assert (ds.seq_len, ds.pad_token_id, ds.crc_drop_rate) == (3, 9, 0.0)
    assert_item(ds[8], expected_row(specs[8], 3, 9))  # 100 tokens cut to 3
    assert_item(ds[1], expected_row(specs[1], 3, 9))  # an empty packet: all padding


def test_old_name_max_seq_length(ramp_dir):
    """``max_seq_length``, the old name of ``seq_len``: a DeprecationWarning naming the new one
    at the caller's line, the same items; the old attribute still reads; both names refused."""
    path, specs = ramp_dir
    with pytest.warns(DeprecationWarning, match=r"`max_seq_length` is deprecated.*`seq_len`") as w:
        ds = NDPDataset(path, max_seq_length=3, pad_token_id=9)
    assert [x.filename for x in w if x.category is DeprecationWarning] == [__file__]
    new = NDPDataset(path, seq_len=3, pad_token_id=9)
    assert ds.seq_len == 3 and repr(ds) == repr(new) and len(ds) == len(new) == len(specs)
    for i, spec in enumerate(specs):
        assert_item(ds[i], new[i])
        assert_item(ds[i], expected_row(spec, 3, 9))
    with pytest.warns(DeprecationWarning, match=r"`max_seq_length` is deprecated.*`seq_len`"):
        assert ds.max_seq_length == 3  # the old attribute still reads
    with pytest.raises(ConfigError, match=r"`seq_len`.*`max_seq_length`"):
        NDPDataset(path, seq_len=3, max_seq_length=3)
    with pytest.raises(ConfigError, match=r"`seq_len`.*`max_seq_length`"):
        NDPDataset(path, 3, max_seq_length=3)  # seq_len by position


def _loader_batches(ds, **kw) -> list[dict]:
    import torch

    with warnings.catch_warnings():  # pin_memory warns on a torch without an accelerator
        warnings.simplefilter("ignore")
        return list(torch.utils.data.DataLoader(ds, batch_size=2, shuffle=False, **kw))


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader(ramp_dir, workers):
    import torch

    path, specs = ramp_dir
    ds = NDPDataset(path, seq_len=SEQ, pad_token_id=PAD)
    kw = {"num_workers": workers, "pin_memory": True} if workers else {"num_workers": 0}
    batches = _loader_batches(ds, **kw)
    assert len(batches) == len(specs) // 2
    for b in batches:
        assert set(b) == {"input_ids", "labels", "attention_mask"}
        for t in b.values():
            assert isinstance(t, torch.Tensor)
            assert t.dtype == torch.int64 and t.shape == (2, SEQ)
    for key in ("input_ids", "labels", "attention_mask"):
        got = torch.cat([b[key] for b in batches]).numpy()
        np.testing.assert_array_equal(got, np.stack([ds[k][key] for k in range(len(ds))]))
        np.testing.assert_array_equal(got, np.stack([expected_row(s)[key] for s in specs]))


def test_several_shards_read_in_shard_order(tmp_path):
    specs = ramp_specs([400] * 100, masked=[k % 3 == 0 for k in range(100)])
    infos = write_shards(tmp_path, [s.encode() for s in specs], max_shard_bytes=65575)
    assert len(infos) >= 3
    # a second writer's shards sort after the first's by name
    extra = ramp_specs([401] * 103)[100:]
    write_shards(tmp_path, [s.encode() for s in extra], prefix="zz")
    ds = NDPDataset(tmp_path, seq_len=SEQ, pad_token_id=PAD)
    assert len(ds.corpus.shards) == len(infos) + 1
    assert len(ds) == 103
    for k, spec in enumerate(specs + extra):
        assert_item(ds[k], expected_row(spec))


def _with_bad_packets(good: list[bytes]) -> tuple[list[bytes], dict[str, int]]:
    """``good`` interleaved with packets that frame (CRC ok) but do not validate as tokens."""
    bad = [("BAD_LENGTH", encode_packet(b"\x00" * 7, typ=Typ.TOKEN_IDS)),
           ("BAD_LENGTH", encode_packet(b"\x00" * 5, typ=Typ.TOKEN_IDS_U16)),
           ("NOT_TOKENS", encode_packet(np.ones(4, ">f2").tobytes(), typ=Typ.FLOAT16)),
           ("UNKNOWN_TYPE", encode_packet(b"\x00\x00\x00\x01", typ=0x7E))]
    out = []
    for k, p in enumerate(good):
        out.append(p)
        if k < len(bad):
            out.append(bad[k][1])
    counts: dict[str, int] = {}
    for name, _ in bad[: len(good)]:
        counts[name] = counts.get(name, 0) + 1
    return out, counts


def test_corrupt_packets_left_out_and_counted(tmp_path):
    specs = ramp_specs(LENGTHS, width=WIDTHS, masked=MASKED)
    packets, counts = _with_bad_packets([s.encode() for s in specs])
    write_shards(tmp_path, packets)
    ds = NDPDataset(tmp_path, seq_len=SEQ, pad_token_id=PAD)
    assert counts == {"BAD_LENGTH": 2, "NOT_TOKENS": 1, "UNKNOWN_TYPE": 1}
    assert ds.stats["corrupt"] == counts
    assert ds.stats["packets"] == len(packets)
    assert ds.stats["valid"] == ds.stats["kept"] == len(ds) == len(specs)
    for k, spec in enumerate(specs):
        assert_item(ds[k], expected_row(spec))


def test_damaged_shard_is_rescanned(tmp_path):
    """A bit flipped in a payload after writing: the stale index is rebuilt by a rescan, which
    skips the damaged packet (a corrupt region); on_stale="error" refuses the shard."""
    specs = ramp_specs(LENGTHS, width=WIDTHS, masked=MASKED)
    (info,) = write_shards(tmp_path, [s.encode() for s in specs])
    data = info.path.read_bytes()
    at = data.index(specs[4].encode()) + 20  # inside packet 4's payload
    info.path.write_bytes(flip_bit(data, 8 * at + 3))
    with pytest.raises(Exception, match="stale"):
        NDPDataset(tmp_path, on_stale="error")
    with pytest.warns(UserWarning, match="scanning") as caught:
        ds = NDPDataset(tmp_path, seq_len=SEQ, pad_token_id=PAD)
    assert [w.filename for w in caught if "damaged after" in str(w.message)] == [__file__]
    kept = [s for k, s in enumerate(specs) if k != 4]
    assert len(ds) == len(kept)
    for k, spec in enumerate(kept):
        assert_item(ds[k], expected_row(spec))
    assert ds.stats["corrupt_regions"] == 1 and ds.stats["corrupt_bytes"] > 0


N_DROP = 2000


@pytest.fixture(scope="module")
def drop_dir(tmp_path_factory):
    """2000 packets: packet k holds ramp(k, 2), except every 100th (k % 100 == 7) is corrupt."""
    d = tmp_path_factory.mktemp("drop")
    bad = encode_packet(b"\x00" * 7, typ=Typ.TOKEN_IDS)
    write_shards(d, [bad if k % 100 == 7 else encode_tokens(ramp(k, 2)) for k in range(N_DROP)])
    return d


def test_crc_drop(drop_dir):
    rate = 0.25
    ds = NDPDataset(drop_dir, seq_len=4, crc_drop_rate=rate, seed=3)
    st = ds.stats
    assert st["packets"] == N_DROP and st["corrupt"] == {"BAD_LENGTH": N_DROP // 100}
    assert st["dropped_on_purpose"] + st["kept"] + sum(st["corrupt"].values()) == N_DROP
    assert st["valid"] == N_DROP - N_DROP // 100
    assert abs(st["dropped_on_purpose"] / st["valid"] - rate) < 0.04
    assert not np.any(ds.kept % 100 == 7)  # corrupt packets are never kept
    assert np.all(np.diff(ds.kept) > 0)  # global order
    for i in (0, 1, len(ds) // 2, -1):
        np.testing.assert_array_equal(ds[i]["input_ids"][:2], ramp(int(ds.kept[i]), 2))

    epoch0 = ds.kept.copy()
    np.testing.assert_array_equal(NDPDataset(drop_dir, 4, 0, rate, seed=3).kept, epoch0)
    assert not np.array_equal(NDPDataset(drop_dir, 4, 0, rate, seed=4).kept, epoch0)
    ds.set_epoch(1)
    assert ds.epoch == 1 and not np.array_equal(ds.kept, epoch0)
    st1 = ds.stats
    assert st1["dropped_on_purpose"] + st1["kept"] + sum(st1["corrupt"].values()) == N_DROP
    np.testing.assert_array_equal(NDPDataset(drop_dir, 4, 0, rate, seed=3, epoch=1).kept, ds.kept)
    ds.set_epoch(0)
    np.testing.assert_array_equal(ds.kept, epoch0)

    plain = NDPDataset(drop_dir, seq_len=4)
    assert plain.stats["dropped_on_purpose"] == 0 and len(plain) == plain.stats["valid"]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_persistent_workers_follow_set_epoch(drop_dir, context):
    """DataLoader workers that outlive an epoch (persistent_workers=True) deliver the new
    epoch's CRC-Drop draw after set_epoch (they once kept the first epoch's)."""
    import torch

    ds = NDPDataset(drop_dir, seq_len=4, crc_drop_rate=0.25, seed=3)
    loader = torch.utils.data.DataLoader(ds, batch_size=50, shuffle=False, num_workers=2,
                                         persistent_workers=True,
                                         multiprocessing_context=context)
    for epoch in range(3):
        ds.set_epoch(epoch)
        first = torch.cat([b["input_ids"][:, 0] for b in loader]).numpy()
        np.testing.assert_array_equal(first, ds.kept * 1000, err_msg=f"epoch {epoch}")
    assert loader._iterator is not None  # the same workers served every epoch


class _FastForward:
    """A batch sampler past its first ``skip`` batches: how torchdata's StatefulDataLoader
    resumes a map-style dataset that has no ``state_dict`` (NDPDataset) under a sampler that
    has none either (``itertools.islice(index_sampler, yielded, None)``); with its own
    ``StatefulDistributedSampler`` it restores the sampler's count instead, to the same
    effect."""

    def __init__(self, batches, skip: int) -> None:
        self.batches, self.skip = batches, skip

    def __iter__(self):
        import itertools

        return itertools.islice(iter(self.batches), self.skip, None)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_resume_as_stateful_dataloader_makes_it_continues_the_epoch(drop_dir, rank):
    """A new process (a pickled dataset, as a spawned worker gets it) that sets the epoch
    before resuming, as NDPDataset's docstring says, delivers the rest of an uninterrupted
    run's epoch on each rank of a DistributedSampler; without the epoch it would not."""
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

    kw = dict(seq_len=4, crc_drop_rate=0.25, seed=3)

    def batches(ds, epoch: int, skip: int = 0) -> list[np.ndarray]:
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=7)
        sampler.set_epoch(epoch)
        plan = _FastForward(BatchSampler(sampler, batch_size=16, drop_last=False), skip)
        return [b["input_ids"].numpy() for b in DataLoader(ds, batch_sampler=plan)]

    ds = NDPDataset(drop_dir, **kw)
    ds.set_epoch(2)
    full = batches(ds, 2)
    assert len(full) > 20
    for skip in (1, 7, len(full) - 1):
        resumed = pickle.loads(pickle.dumps(NDPDataset(drop_dir, **kw)))  # epoch 0
        resumed.set_epoch(2)  # the caller's, before the DataLoader resumes
        rest = batches(resumed, 2, skip)
        assert len(rest) == len(full) - skip
        for got, want in zip(rest, full[skip:]):
            np.testing.assert_array_equal(got, want)
    stale = batches(NDPDataset(drop_dir, **kw), 2, 7)  # the epoch left at 0: other items
    assert not all(np.array_equal(a, b) for a, b in zip(stale, full[7:]))


def test_a_pickled_copy_keeps_its_epoch_apart(drop_dir):
    import pickle

    ds = NDPDataset(drop_dir, seq_len=4, crc_drop_rate=0.25, seed=3, epoch=2)
    copy = pickle.loads(pickle.dumps(ds))
    ds.set_epoch(5)
    assert copy.epoch == 2 and ds.epoch == 5  # outside a worker's start, no shared memory


def test_pickle_is_small_and_reopens(tmp_path):
    specs = ramp_specs([900] * 60, masked=[k % 2 == 1 for k in range(60)])
    (info,) = write_shards(tmp_path, [s.encode() for s in specs])
    ds = NDPDataset(tmp_path, seq_len=SEQ, pad_token_id=PAD, crc_drop_rate=0.3, seed=1)
    ds.set_epoch(2)
    blob = pickle.dumps(ds)
    assert len(blob) < info.size // 20, (len(blob), info.size)
    copy = pickle.loads(blob)
    assert copy._corpus is None  # not reopened until an item is read
    assert (len(copy), copy.epoch) == (len(ds), 2)
    np.testing.assert_array_equal(copy.kept, ds.kept)
    assert copy.stats == ds.stats
    for i in range(len(ds)):
        assert_item(copy[i], ds[i])
        assert_item(copy[i], expected_row(specs[int(ds.kept[i])]))
    assert copy._corpus is not None


@pytest.mark.slow
def test_spawned_workers_unpickle(ramp_dir):
    """Spawned workers (the default outside Linux) get the dataset pickled and reopen it."""
    path, specs = ramp_dir
    ds = NDPDataset(path, seq_len=SEQ, pad_token_id=PAD)
    batches = _loader_batches(ds, num_workers=2, multiprocessing_context="spawn")
    got = np.concatenate([b["labels"].numpy() for b in batches])
    np.testing.assert_array_equal(got, np.stack([expected_row(s)["labels"] for s in specs]))


@pytest.mark.parametrize("kwargs", [
    {"seq_len": 0},
    {"seq_len": -5},
    {"crc_drop_rate": -0.1},
    {"crc_drop_rate": 1.0},
    {"crc_drop_rate": 1.5},
    {"on_stale": "ignore"},
])
def test_bad_arguments(ramp_dir, kwargs):
    with pytest.raises(ConfigError):
        NDPDataset(ramp_dir[0], **kwargs)


def test_missing_path(tmp_path):
    with pytest.raises(ConfigError):
        NDPDataset(tmp_path / "nothing-here")
    with pytest.raises(ConfigError):
        NDPDataset(tmp_path)  # a directory without shards


def test_a_file_that_is_not_a_shard_is_refused(tmp_path):
    """A JSONL given as a dataset made a dataset of 0 items (a DataLoader of nothing); it is
    refused, by name, unless read as it is on purpose (manifest="ignore"), and then a pickled
    copy (a DataLoader worker's) reopens it as its maker did."""
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"text": "hello world"}\n{"text": "more text"}\n')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its missing index is reported first
        with pytest.raises(ShardFormatError, match=r"train.jsonl: not an NDP shard.*ndp convert"):
            NDPDataset(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = NDPDataset(path, manifest="ignore")
        copy = pickle.loads(pickle.dumps(ds))
        assert len(ds) == len(copy) == 0 and copy.corpus.n_packets == 0
    ignored = [w for w in caught if "manifest='ignore'" in str(w.message)]
    assert ignored and {w.filename for w in ignored} == {__file__}  # the caller's line


def test_module_does_not_import_torch():
    code = "import sys, ndp.adapters.dataset; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_an_index_of_an_earlier_epochs_length_names_set_epoch_as_the_fix(drop_dir):
    """A sampler made before ``set_epoch`` (a persistent worker's) asks for an index that the
    new epoch, shorter with CRC-Drop, does not have: a named error that is still an IndexError
    (so iterating ``ds`` itself still stops), saying to make the sampler after set_epoch."""
    ds = NDPDataset(drop_dir, seq_len=4, crc_drop_rate=0.25, seed=3)
    lengths = {}
    for epoch in range(8):
        ds.set_epoch(epoch)
        lengths[epoch] = len(ds)
    longer = max(lengths, key=lengths.get)
    shorter = min(lengths, key=lengths.get)
    assert lengths[longer] > lengths[shorter]
    ds.set_epoch(longer)
    i = lengths[shorter]  # valid in the longer epoch, not in the shorter
    ds[i]
    ds.set_epoch(shorter)
    with pytest.raises(IndexError) as got:
        ds[i]
    assert isinstance(got.value, NDPError)
    assert re.search(rf"index {i} .* {lengths[shorter]} items of epoch {shorter}.*CRC-Drop.*"
                     rf"set_epoch", str(got.value))
    with pytest.raises(IndexError, match=r"index 99999 .* items of epoch") as got:
        ds[99_999]  # past every epoch's length: out of range, nothing of CRC-Drop
    assert "set_epoch" not in str(got.value)
    assert sum(1 for _ in NDPDataset(drop_dir, seq_len=4)) == N_DROP - N_DROP // 100


def test_a_row_no_memory_holds_is_refused_at_construction(ramp_dir, monkeypatch):
    import ndp.loader.options as options

    ramp_dir, _ = ramp_dir
    with pytest.raises(ConfigError, match=r"seq_len=4,611,686,018,427,387,904\).* needs at least "
                                          r"[\d,]+ bytes"):
        NDPDataset(ramp_dir, seq_len=2**62)
    monkeypatch.setattr(options, "memory_bytes", lambda: 10**4)
    with pytest.raises(ConfigError, match=r"needs at least 24,000 bytes.* 10,000 bytes"):
        NDPDataset(ramp_dir, seq_len=1000)
    assert len(NDPDataset(ramp_dir, seq_len=400)) == len(LENGTHS)  # 9,600 bytes: room
