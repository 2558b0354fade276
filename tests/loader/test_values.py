"""Values the format allows but a model cannot take: a packet with no tokens (its row would be
all padding, a loss of 0/0) and a token id at or past the vocabulary size (the manifest's, or
``vocab_size=``, else 2**31) are dropped and counted (EMPTY, TOKEN_RANGE) by the Loader on
both backends and by NDPDataset, never delivered.
"""

from __future__ import annotations

import numpy as np
import pytest

from ndp.adapters.dataset import NDPDataset
from ndp.errors import ConfigError
from ndp.loader.loader import Loader
from ndp.wire.format import Typ
from ndp.wire.packet import encode_packet, encode_tokens
from ndp.store.writer import ShardWriter

from ndp_test_helpers import ramp


def host(a) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    return a.copy_to_host() if hasattr(a, "copy_to_host") else a.numpy()


def write(directory, packets, vocab_size=None) -> None:
    with ShardWriter(directory) as writer:
        for p in packets:
            writer.write(p)
        extra = {} if vocab_size is None else {"tokenizer": {"vocab_size": vocab_size}}
        writer.commit(extra)


def dataset(directory, vocab_size=None):
    """Ramp packets 0..9 (tokens k*1000 + i); packet 3 empty, packet 5 holds an int32 id with
    its top bit set, packet 7 (uint16) holds 65535, packet 8 ids up to 8004."""
    packets = []
    for k in range(10):
        tokens = ramp(k, 5)
        if k == 3:
            tokens = tokens[:0]
        if k == 5:  # the encoder refuses it; a foreign writer's packet, valid CRC and all
            tokens = tokens.astype(">u4")
            tokens[2] = 2**32 - 1
            packets.append(encode_packet(tokens.tobytes(), typ=Typ.TOKEN_IDS))
            continue
        if k == 7:
            tokens = np.array([7000, 65535], np.int64)
        packets.append(encode_tokens(tokens, width=2 if k == 7 else 4))
    write(directory, packets, vocab_size)
    return directory


def rows(loader) -> list[int]:
    """The packets of one epoch's rows; the loader is closed after it (under the CUDA
    simulator a producer still decoding the next epoch would share its one kernel context
    with the next test's)."""
    out = []
    for batch in loader:
        ids = host(batch["input_ids"])
        out += [int(r[0]) // 1000 for r in ids]
    loader.close()
    return out


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_empty_and_top_bit_packets_are_dropped_and_counted(tmp_path, backend):
    loader = Loader(dataset(tmp_path), batch_size=3, seq_len=8, shuffle=False, backend=backend,
                    output="arrays")
    assert loader.vocab_size == 2**31  # no vocabulary in the manifest: ids must fit int32
    assert rows(loader) == [0, 1, 2, 4, 6, 7, 8, 9]
    assert loader.stats.corrupt == {"EMPTY": 1, "TOKEN_RANGE": 1}
    assert loader.stats.packets == 10 and loader.stats.valid == 8


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_ids_past_the_manifests_vocabulary_are_dropped(tmp_path, backend):
    loader = Loader(dataset(tmp_path, vocab_size=8004), batch_size=4, seq_len=8, shuffle=False,
                    backend=backend, output="arrays")
    assert loader.vocab_size == 8004
    assert rows(loader) == [0, 1, 2, 4, 6]  # 7 (65535), 8 (8004), 9 (9000..) are past it
    assert loader.stats.corrupt == {"EMPTY": 1, "TOKEN_RANGE": 4}
    # vocab_size= says what the model takes, over the manifest
    wide = Loader(tmp_path, batch_size=4, seq_len=8, shuffle=False, backend=backend,
                  output="arrays", vocab_size=70000)
    assert rows(wide) == [0, 1, 2, 4, 6, 7, 8, 9]


def test_packed_windows_never_hold_a_dropped_value(tmp_path):
    loader = Loader(dataset(tmp_path, vocab_size=9000), mode="packed", batch_size=1,
                    seq_len=4, shuffle=False, backend="cpu", output="arrays")
    seen = np.concatenate([host(b["x"]).ravel() for b in loader])
    assert seen.max() < 9000 and not np.isin(seen, [2**32 - 1, 65535]).any()
    assert loader.stats.corrupt == {"EMPTY": 1, "TOKEN_RANGE": 3}


def test_ndpdataset_leaves_out_the_same_packets(tmp_path):
    ds = NDPDataset(dataset(tmp_path, vocab_size=8004), seq_len=8)
    assert [int(ds[i]["input_ids"][0]) // 1000 for i in range(len(ds))] == [0, 1, 2, 4, 6]
    assert ds.stats["corrupt"] == {"EMPTY": 1, "TOKEN_RANGE": 4}


def test_vocab_size_is_checked(tmp_path):
    with pytest.raises(ConfigError, match="vocab_size"):
        Loader(dataset(tmp_path), batch_size=2, seq_len=4, vocab_size=0)
