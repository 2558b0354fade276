"""Padded rows cut at seq_len (ndp.loader.layouts.truncation): each epoch's cut is counted from the index
before its first batch, and is exactly what the rows lose, on both backends and every rank; a
warning, once per epoch, when more than 1% of the epoch's tokens are cut.

RAMP data: packet k holds tokens k*1000 + arange(n).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from ndp.loader.loader import Loader
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp, write_shards

# cut at seq_len 10: 30, 12, 25, 40, 11 and 17 lose 20 + 2 + 15 + 30 + 1 + 7 = 75 of 171 tokens
LENGTHS = [4, 30, 12, 8, 25, 10, 3, 40, 9, 11, 2, 17]


def data(directory, lengths):
    write_shards(directory, [encode_tokens(ramp(k, n)) for k, n in enumerate(lengths)])
    return directory


def make(directory, **kw) -> Loader:
    kw.setdefault("batch_size", 4)
    kw.setdefault("seq_len", 10)
    return Loader(directory, backend=kw.pop("backend", "cpu"), output="arrays", seed=1, **kw)


def cut_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "seq_len=" in str(w.message)]


def test_a_padded_epoch_that_cuts_much_warns_once_before_its_first_batch(tmp_path):
    loader = make(data(tmp_path, LENGTHS))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        it = iter(loader)
        next(it)  # before the first training step, the user has been told
        (text,) = cut_warnings(caught)
        for said in ("75 of the 171 tokens", "(43.9%)", "epoch 0", "seq_len=10",
                     "mode='packed'", "larger `seq_len`", "the longest 40 tokens"):
            assert said in text, said
        assert (loader.stats.epoch_tokens, loader.stats.epoch_truncated_tokens) == (171, 75)
        for _ in it:
            pass
        assert len(cut_warnings(caught)) == 1  # once per epoch, not per batch
        assert loader.stats.truncated_tokens == 75  # what the rows lost, batch by batch
        assert loader.stats.tokens == 171 - 75
        for _ in loader:  # epoch 1, broken off and taken up again: still one warning
            break
        for _ in loader:
            pass
        assert [("epoch 1" in t) for t in cut_warnings(caught)] == [False, True]
        assert loader.stats.epoch_truncated_tokens == 75  # the same packets, another order
    # a resumed run is told too, before its first batch
    state = loader.state_dict()
    again = make(tmp_path)
    again.load_state_dict(state)
    with pytest.warns(UserWarning, match="epoch 2"):
        next(iter(again))


@pytest.mark.parametrize("last,warns", [(20, False), (21, True)])
def test_the_warning_is_for_more_than_one_percent(tmp_path, last, warns):
    """98 packets of 10 tokens and one of ``last``: 10 of 1,000 tokens cut is 1%, no warning;
    11 of 1,001 is more."""
    loader = make(data(tmp_path, [10] * 98 + [last]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in loader:
            pass
    assert len(cut_warnings(caught)) == warns
    assert loader.stats.epoch_truncated_tokens == loader.stats.truncated_tokens == last - 10


def test_packed_windows_cut_nothing_and_say_nothing(tmp_path):
    loader = make(data(tmp_path, LENGTHS), mode="packed")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in loader:
            pass
    assert cut_warnings(caught) == []
    assert loader.stats.epoch_truncated_tokens == loader.stats.truncated_tokens == 0


def test_the_count_is_what_each_rank_s_rows_lose_on_either_backend(tmp_path):
    lengths = np.random.default_rng(8).integers(1, 40, 45).tolist()
    d = data(tmp_path, lengths)
    counts = {}
    for backend in ("cpu", "cuda"):
        for rank in range(2):
            loader = make(d, backend=backend, rank=rank, world_size=2, batch_size=3,
                          seq_len=16, crc_drop_rate=0.2)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for _ in loader:
                    pass
            s = loader.stats
            assert s.epoch_truncated_tokens == s.truncated_tokens > 0
            assert s.epoch_tokens == s.tokens + s.truncated_tokens
            counts[backend, rank] = (s.epoch_tokens, s.epoch_truncated_tokens)
    assert [counts["cpu", r] for r in range(2)] == [counts["cuda", r] for r in range(2)]


def test_an_epoch_the_count_cut_is_reported_without_walking_the_share_again(tmp_path,
                                                                             monkeypatch):
    """The epoch's count made its cut (``share.cut``): the report takes it as it is, and the
    training loop's thread does not read the token count of every packet of the share again
    at each epoch's start (an O(epoch) stall)."""
    loader = make(data(tmp_path, LENGTHS))
    column = type(loader.corpus.tokens)
    whole, real = [], column.__getitem__

    def spying(self, key):
        if np.ndim(key) and np.size(key) == len(LENGTHS):
            whole.append(1)  # every packet's token count at once
        return real(self, key)

    monkeypatch.setattr(column, "__getitem__", spying)
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert sum(1 for _ in loader) == 3
        assert len(cut_warnings(caught)) == 1
        assert loader.stats.epoch_truncated_tokens == 75
    assert whole == []
