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


def test_rows_of_layout_counts_are_added_as_their_batches_were():
    """``add_counts``: consecutive batches' rows of ``Layout.counts`` at once, the same sums as
    adding them one by one; the no-row warning names the first such batch."""
    import numpy as np

    from ndp.loader.layouts.layout import COUNTS, EMPTY, N_COUNTS, REASONS

    rows = np.zeros((3, N_COUNTS), np.int64)
    rows[:, :len(COUNTS)] = [[4, 3, 50, 2, 0, 1, 1, 0], [4, 0, 0, 0, 1, 0, 0, 0],
                             [4, 4, 60, 0, 0, 0, 0, 7]]
    rows[0, len(COUNTS) + REASONS.index("BAD_CRC")] = 1
    rows[1, len(COUNTS) + REASONS.index("EMPTY")] = 4
    stats = LoaderStats(batches=10)
    with pytest.warns(UserWarning, match="batch 12 has no rows"):
        stats.add_counts(rows)
    assert rows[:, EMPTY].tolist() == [0, 1, 0]
    got = stats.as_dict()
    assert (got["batches"], got["packets"], got["valid"], got["tokens"],
            got["truncated_tokens"], got["repeated"], got["dropped_on_purpose"],
            got["empty_batches"], got["left_over_tokens"]) == (13, 12, 7, 110, 2, 1, 1, 1, 7)
    assert got["corrupt"] == {"BAD_CRC": 1, "EMPTY": 4}


def test_next_only_counts_and_stats_are_settled_when_read(tmp_path, monkeypatch):
    """The training loop's next() counts the batch it hands out; the stats are added when
    ``loader.stats`` is read (and when the next chunk is taken): a ``LoaderStats`` kept from
    an earlier read is brought up to date by the next read, and its figures are exactly the
    batches taken so far, whatever the chunk."""
    import numpy as np

    from ndp.loader.loader import Loader
    from ndp.wire.packet import encode_tokens

    from ndp_test_helpers import ramp, write_shards

    write_shards(tmp_path, [encode_tokens(ramp(k, 5)) for k in range(40)])
    loader = Loader(tmp_path, mode="padded", batch_size=2, seq_len=8, chunk_batches=4,
                    backend="cpu", output="arrays", seed=3)
    calls = []
    real = LoaderStats.add_counts
    monkeypatch.setattr(LoaderStats, "add_counts",
                        lambda self, rows: calls.append(rows.shape[0]) or real(self, rows))
    it = iter(loader)
    next(it)  # chunks of 1, 2, 4, 4, ... batches after a start
    assert calls == []
    next(it)  # the second chunk's first batch: the first chunk's one batch added
    next(it)
    assert calls == [1]  # nothing added batch by batch within a chunk
    kept = loader.stats
    assert kept.batches == 3 and kept.packets == 6 and kept.tokens == 30
    assert loader.state_dict()["batch"] == 3
    next(it)
    assert kept.batches == 3  # not read again yet
    assert loader.stats is kept and kept.batches == 4 and kept.packets == 8
    rest = sum(1 for _ in it)
    assert loader.stats.batches == 4 + rest == 20 and loader.stats.packets == 40
    assert sum(calls) == 20 and len(calls) < 20  # whole runs of batches at once
    assert np.all(np.array(calls) > 0)
    loader.close()


def test_stats_read_from_another_thread_while_the_loop_runs_count_each_batch_once(tmp_path):
    """A monitor thread reading ``loader.stats`` over and over while the training loop takes
    batches: every read settles under one lock, so no batch is counted twice and the figures
    at the end are the loop's own."""
    import threading

    from ndp.loader.loader import Loader
    from ndp.wire.packet import encode_tokens

    from ndp_test_helpers import ramp, write_shards

    write_shards(tmp_path, [encode_tokens(ramp(k, 3 + k % 7)) for k in range(600)])

    def make():
        return Loader(tmp_path, mode="padded", batch_size=2, seq_len=8, chunk_batches=3,
                      backend="cpu", output="arrays", seed=4)

    alone = make()
    n = sum(1 for _ in alone)
    want = alone.stats.as_dict()
    alone.close()
    loader, stop, reads = make(), threading.Event(), []

    def monitor():
        while not stop.is_set():
            reads.append(loader.stats.batches)

    thread = threading.Thread(target=monitor)
    thread.start()
    try:
        assert sum(1 for _ in loader) == n == 300
    finally:
        stop.set()
        thread.join()
    got = loader.stats.as_dict()
    for d in (got, want):
        d.pop("wait_seconds")
    assert got == want and len(reads) > 10
    assert reads == sorted(reads) and reads[-1] <= n
    loader.close()
