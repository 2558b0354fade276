"""The Loader's options (``ndp.loader.options``, ``ndp.checks``): every option of a wrong type
or value is a ``ConfigError`` naming it before anything is read, never a raw ``TypeError`` or
a NaN that fails at the first batch; and an epoch of no batch is an error, never a silent empty
loop (a ``while step < max_steps: for batch in loader:`` loop over such a Loader would spin
forever). Settings that leave every rank no packet are refused when the Loader is made; an
epoch whose shares make no batch (too few tokens for one) when the loop reaches its end."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ndp.adapters.dataset import NDPDataset
from ndp.errors import ConfigError, DataError
from ndp.loader.loader import Loader
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp, write_shards

KW = dict(backend="cpu", output="arrays", seed=3, prefetch=0)


@pytest.fixture
def data(tmp_path):
    write_shards(tmp_path, [encode_tokens(ramp(k, 10)) for k in range(12)])  # 120 tokens
    return tmp_path


def steps(loader, max_steps=50):
    """The training loop the held-out trial ran: epochs until ``max_steps``."""
    step = epochs = 0
    while step < max_steps:
        epochs += 1
        assert epochs <= max_steps, "the loop spins over empty epochs"
        for _ in loader:
            step += 1
    return step


@pytest.mark.parametrize("mode, batch_size, seq_len", [
    ("packed", 4, 32),     # 129 tokens a batch, 120 in the data
    ("packed", 1, 200),
])
def test_an_epoch_too_small_for_one_batch_is_an_error_not_an_empty_loop(data, mode,
                                                                         batch_size, seq_len):
    loader = Loader(data, mode=mode, batch_size=batch_size, seq_len=seq_len, **KW)
    with pytest.raises(DataError, match=r"epoch 0 makes no batch.*lower `batch_size` or "
                                        r"`seq_len`") as err:
        steps(loader)
    assert str(data) in str(err.value) and f"{batch_size * seq_len + 1:,} tokens" in \
        str(err.value)
    assert len(loader) == 0  # said, not hidden: the count is there too
    loader.close()


def test_more_ranks_than_packets_is_refused_when_the_loader_is_made(data):
    with pytest.raises(DataError, match="12 packets for world_size=13.*at most 12 ranks"):
        Loader(data, mode="padded", batch_size=1, seq_len=8, rank=0, world_size=13, **KW)
    loader = Loader(data, mode="padded", batch_size=1, seq_len=8, rank=11, world_size=12, **KW)
    assert steps(loader, 3) == 3  # one packet a rank: a batch an epoch


@pytest.mark.parametrize("mode", ["padded", "packed", "packing"])
def test_an_epoch_with_a_batch_is_no_error(data, mode):
    loader = Loader(data, mode=mode, batch_size=2, seq_len=16, **KW)
    assert steps(loader, 20) >= 20
    loader.close()


# the held-out trial's raw exceptions, and their kin
MISTAKES = [
    ({"crc_drop_rate": "0.1"}, r"crc_drop_rate must be a number, got '0.1' \(str\)"),
    ({"crc_drop_rate": None}, r"crc_drop_rate must be a number, got None"),
    ({"crc_drop_rate": math.nan}, r"crc_drop_rate must be a finite number >= 0 and < 1"),
    ({"crc_drop_rate": 1.0}, r"crc_drop_rate must be a finite number >= 0 and < 1, got 1.0"),
    ({"mix": {"all": math.nan}}, r"the mix weight of 'all' must be a finite number >= 0"),
    ({"mix": {"all": math.inf}}, r"the mix weight of 'all' must be a finite number >= 0"),
    ({"mix": {"all": "1"}}, r"the mix weight of 'all' must be a number, got '1' \(str\)"),
    ({"mix": {"all": None}}, r"the mix weight of 'all' must be a number, got None"),
    ({"mix": [("all", 1.0)]}, r"mix must be a dict"),
    ({"rank": 1.0, "world_size": 2}, r"rank must be an integer, got 1.0 \(float\)"),
    ({"world_size": "2"}, r"world_size must be an integer, got '2' \(str\)"),
    ({"verify": "bogus"}, r"verify must be one of 'size', 'full', got 'bogus'"),
    ({"manifest": None}, r"manifest must be one of 'check', 'ignore', got None"),
    ({"pad_token_id": 2**63}, r"pad_token_id must be in \[-2,147,483,648, 2,147,483,647\]"),
    ({"batch_size": 2.0}, r"batch_size must be an integer, got 2.0 \(float\)"),
    ({"batch_size": True}, r"batch_size must be an integer, got True \(bool\)"),
    ({"shuffle": "yes"}, r"shuffle must be True or False, got 'yes' \(str\)"),
    ({"device_budget": 1.5}, r"device_budget must be an integer or None"),
    ({"vocab_size": 2**40}, r"vocab_size must be in \[1, 2,147,483,648\]"),
]


@pytest.mark.parametrize("kw, match", MISTAKES)
def test_an_option_of_a_wrong_type_or_value_is_a_config_error_naming_it(data, kw, match):
    with pytest.raises(ConfigError, match=match):
        Loader(data, **{"mode": "packed", "batch_size": 2, "seq_len": 8, **KW, **kw})


def test_numpy_values_are_taken_as_their_python_kin(data):
    loader = Loader(data, mode="packed", batch_size=np.int64(2), seq_len=np.int32(8),
                    crc_drop_rate=np.float64(0.0), shuffle=np.bool_(True), **KW)
    assert steps(loader, 2) >= 2
    loader.close()


def test_a_launchers_rank_that_is_no_integer_is_named(data, monkeypatch):
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ConfigError, match=r"RANK='zero' is not an integer.*`rank=`"):
        Loader(data, mode="packed", batch_size=2, seq_len=8, **KW)


@pytest.mark.parametrize("kw, match", [
    ({"seq_len": "8"}, r"seq_len must be an integer, got '8'"),
    ({"crc_drop_rate": "0.1"}, r"crc_drop_rate must be a number"),
    ({"pad_token_id": 2**63}, r"pad_token_id must be in"),
    ({"on_stale": 1}, r"on_stale must be one of 'rebuild', 'error', got 1"),
])
def test_ndpdataset_checks_its_options_the_same_way(data, kw, match):
    with pytest.raises(ConfigError, match=match):
        NDPDataset(data, **kw)


def test_padding_defaults_to_the_pad_id_the_manifest_records(tmp_path):
    """``pad_token_id`` not given: the dataset's tokenizer's padding id (its manifest), not 0,
    which is a real token (EOS in the quick start's tokenizer); given: that one; a dataset
    whose manifest records none pads with 0. NDPDataset the same."""
    import numpy as np

    from ndp.adapters.dataset import NDPDataset
    from ndp.loader.loader import Loader
    from ndp.store.writer import ShardWriter
    from ndp.wire.packet import encode_tokens

    for name, tokenizer in (("with", {"vocab_size": 8000, "eos_token_id": 0,
                                      "pad_token_id": 7}), ("without", None)):
        with ShardWriter(tmp_path / name) as writer:
            for k in range(4):
                writer.write(encode_tokens(np.arange(10 * k + 1, 10 * k + 3)))
            writer.commit({"tokenizer": tokenizer} if tokenizer else None)

    def pads(path, **kw):
        with Loader(path, mode="padded", batch_size=2, seq_len=5, backend="cpu",
                    output="arrays", shuffle=False, **kw) as loader:
            batch = next(iter(loader))
        return set(np.unique(batch["input_ids"][batch["attention_mask"] == 0]).tolist())

    assert pads(tmp_path / "with") == {7}
    assert pads(tmp_path / "with", pad_token_id=3) == {3}
    assert pads(tmp_path / "without") == {0}
    ds = NDPDataset(str(tmp_path / "with"), seq_len=5)
    assert ds.pad_token_id == 7 and ds[0]["input_ids"].tolist()[-3:] == [7, 7, 7]
