"""Where a chunk ends in a rank's share by the index's token counts (ndp.loader.planning.reach):
the token counts gathered once a block, a packed share's repeat read only when needed, the
running sum kept for the next chunk's guess, and packing's look-ahead, whose first guess never
changes where a chunk ends."""

from __future__ import annotations

import numpy as np

from test_plan import plan_of, uneven  # noqa: F401  (the fixture, with its corpus)


def test_the_end_of_a_packed_share_does_not_read_its_repeat_for_nothing(uneven, monkeypatch):
    """A packed share is its packets twice over (a rank short of tokens goes on from its
    start): the token counts past its own packets are those of its first ones, and a chunk
    that its own packets fill never reads them (their window's entries would be read for
    nothing at every epoch's end)."""
    import ndp.loader.planning.reach as reach_module
    from ndp.loader.ordering.share import RankOrder

    monkeypatch.setattr(reach_module, "TOKEN_BLOCK", 16)
    kw = dict(mode="packed", world_size=3, batch_size=2, seq_len=4, window=2500)
    held = plan_of(uneven, **kw).share(0).packets  # with its entry tables
    assert isinstance(held, RankOrder) and held.tables is not None and len(held.windows) > 3
    L = held.length
    bare = RankOrder(held.windows, rank=0, world_size=3, length=L, repeat=True)  # none
    want = np.asarray(uneven.tokens[np.asarray(held)])
    assert len(held) == 2 * L and np.array_equal(np.asarray(bare), np.asarray(held))
    tokens = np.cumsum(want[:L][::-1])[::-1]  # tokens from each position to the share's end
    pos = int(np.flatnonzero(tokens > 3 * 2 * 4)[-1])  # 3 batches' tokens before the end
    for share in (held, bare):
        plan = plan_of(uneven, **kw)
        for a, b in ((L - 5, L + 5), (L, L + 20), (L + 3, 2 * L), (0, 2 * L)):
            assert np.array_equal(plan.share_tokens(share, a, b), want[a:b]), (a, b)
        asked = []
        real = RankOrder.__getitem__
        monkeypatch.setattr(RankOrder, "__getitem__",
                            lambda self, k: asked.append(k) or real(self, k))
        plan = plan_of(uneven, **kw)  # nothing remembered
        if share is held:
            share = plan.share(0).packets  # no table built yet
        assert plan.chunk_end(share, pos, 0, 2, plan.shapes.at(0)) <= L
        assert all(k.stop <= L for k in asked if isinstance(k, slice)), asked
        if share.tables is not None:  # only the windows the chunk lies in
            assert share.tables.held() == sorted({share.window_at(p) for p in range(pos, L)})
        monkeypatch.undo()
        monkeypatch.setattr(reach_module, "TOKEN_BLOCK", 16)


def test_share_tokens_are_the_index_counts_gathered_once_a_block(uneven, monkeypatch):
    """The producer asks for a share's token counts a few times a batch (chunk plans, packing
    candidates); each gather from the shards' indexes costs ~100 us, so they are gathered a
    block at a time and remembered."""
    import ndp.loader.planning.reach as reach_module

    monkeypatch.setattr(reach_module, "TOKEN_BLOCK", 16)
    plan = plan_of(uneven, mode="packing", world_size=3)
    share = np.asarray(plan.share(0).packets)  # a share built whole (no entry tables)
    want = np.asarray(uneven.tokens[share])
    gathers = []
    column = type(uneven.tokens)
    real = column.__getitem__
    monkeypatch.setattr(column, "__getitem__", lambda self, k: gathers.append(1) or real(self, k))
    blocks = set()
    for a, b in ((0, 5), (3, 40), (15, 17), (30, 31), (0, 48), (250, 10**6), (7, 7)):
        assert np.array_equal(plan.share_tokens(share, a, b), want[a:b]), (a, b)
        blocks |= set(range(a // 16, (min(b, share.shape[0]) - 1) // 16 + 1))
    assert len(gathers) == len(blocks) < 7  # each block once, however often it was asked


def test_the_running_sum_chunk_end_keeps_is_the_sum_of_the_same_positions(uneven):
    """``Reach.stream_run`` answers from the sum ``chunk_end`` last made where it covers the
    positions asked (the producer's guess of the next chunk's start), and sums afresh where it
    does not (another start, past its end, another share): always ``np.cumsum`` of
    ``share_tokens`` over the same positions."""
    plan = plan_of(uneven, mode="packed", rank=1, world_size=2)
    share, other = plan.share(0).packets, plan.share(1).packets
    n = share.shape[0]
    for pos in (0, 5, n // 2):
        q = plan.chunk_end(share, pos, 3, 4, (3, 24))
        memo = plan._run_memo
        assert memo[0] is share and memo[1] == pos
        for a, b in ((pos, q), (pos, pos + 1), (pos, pos), (pos + 1, q),
                     (pos, pos + memo[2].shape[0] + 7)):
            want = np.cumsum(plan.share_tokens(share, a, b))
            np.testing.assert_array_equal(plan.stream_run(share, a, b), want)
        assert plan.stream_run(share, pos, q).base is not None  # from the kept sum
        np.testing.assert_array_equal(plan.stream_run(other, pos, q),
                                      np.cumsum(plan.share_tokens(other, pos, q)))



def test_packings_first_guess_of_its_look_ahead_never_moves_a_chunks_end(uneven):
    """Packing reads as far ahead as the last chunk's batches read per batch say (the first:
    8 packets a row) and doubles until the candidates are decided: the chunk's end is the same
    whatever the guess, too short, right or far too long."""
    plan = plan_of(uneven, mode="packing", rank=1, world_size=2, batch_size=2, seq_len=16)
    share = plan.share(0).packets
    n = share.shape[0]
    for pos in (0, 3, n // 3, n - 9, n - 1):
        for batches in (1, 3, 8):
            ends = set()
            for per in (0.0, 0.01, 1.0, 5.0, 1e4):
                plan._packing_per_batch = per
                ends.add(plan.chunk_end(share, pos, 0, batches, (2, 16)))
            assert len(ends) == 1, (pos, batches, ends)
    plan._packing_per_batch = 0.0
    q = plan.chunk_end(share, 0, 0, 4, (2, 16))
    assert plan._packing_per_batch == q / 4  # what the next chunk's guess starts from
