"""An epoch of no batch is an error, never a silent empty loop (``ndp.loader.options``): a
``while step < max_steps: for batch in loader:`` loop over such a Loader would spin forever.
Settings that leave every rank no packet are refused when the Loader is made; an epoch whose
shares make no batch (too few tokens for one) when the loop reaches its end."""

from __future__ import annotations

import pytest

from ndp.errors import DataError
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
