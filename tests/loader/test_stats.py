"""What a batch counted, added to ``loader.stats`` (ndp.loader.stats.LoaderStats.add)."""

from __future__ import annotations

import pytest

from ndp.loader.stats import LoaderStats


def test_every_count_a_batch_or_an_epoch_end_makes_is_added():
    stats = LoaderStats()
    counted = {"packets": 7, "valid": 5, "tokens": 900, "truncated_tokens": 12,
               "dropped_on_purpose": 1, "unused_tokens": 30, "rank_balance": 2, "repeated": 3,
               "corrupt": {"crc": 1, "length": 1}, "sources": {"web": 4, "code": 3},
               "mix_unused": {"web": 2}, "mix_repeated": {"code": 1},
               "_range": (0, 7)}  # the producer's own note: not a count
    stats.add(counted)
    stats.add(dict(counted, corrupt={"crc": 2}, sources={}))
    got = stats.as_dict()
    assert {k: got[k] for k in ("packets", "valid", "tokens", "truncated_tokens",
                                "dropped_on_purpose", "unused_tokens", "rank_balance",
                                "repeated")} == {
        "packets": 14, "valid": 10, "tokens": 1800, "truncated_tokens": 24,
        "dropped_on_purpose": 2, "unused_tokens": 60, "rank_balance": 4, "repeated": 6}
    assert got["corrupt"] == {"crc": 3, "length": 1}
    assert got["sources"] == {"web": 4, "code": 3}
    assert got["mix_unused"] == {"web": 4} and got["mix_repeated"] == {"code": 2}
    assert got["batches"] == 0 and got["empty_batches"] == 0


def test_a_batch_with_no_row_is_counted_and_warned_about_once():
    stats = LoaderStats()
    with pytest.warns(UserWarning, match="has no rows"):
        stats.add({"packets": 4, "valid": 0, "empty_batches": 1})
    stats.add({"packets": 4, "valid": 0, "empty_batches": 1})  # no second warning (-W error)
    stats.add({"empty_batches": 0})
    assert stats.empty_batches == 2 and stats.packets == 8
