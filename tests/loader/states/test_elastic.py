"""Elastic resume (ndp.loader.states.elastic): a run stopped mid-epoch on W ranks continues on W' ranks (or
another batch shape) from its ranks' states, each remaining packet of the epoch once across the
new ranks; the next epochs are the new run's own; a state saved during the rest resumes too."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from ndp.errors import LoaderStateError
from ndp.loader.loader import Loader

from ndp_test_helpers import ramp_specs, write_shards

MODES = ["padded", "packed", "packing"]
N = 90


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("elastic")
    lengths = [3 + (k * 7) % 13 for k in range(N)]
    packets = [s.encode() for s in ramp_specs(lengths)]
    write_shards(d, packets[:40], prefix="a")
    write_shards(d, packets[40:], prefix="b")
    return d


def make(data, mode, rank, world, batch=3, seq_len=8, **kw) -> Loader:
    return Loader(data, mode=mode, batch_size=batch, seq_len=seq_len, backend="cpu",
                  output="arrays", seed=5, rank=rank, world_size=world, **kw)


def tokens(batch: dict, mode: str) -> list[int]:
    """Every real token of a batch (ramp ids are unique: 1000 * packet + position)."""
    if mode == "packed":
        return batch["x"].ravel().tolist()
    ids, attn = batch["input_ids"], batch["attention_mask"]
    return ids[attn.astype(bool)].tolist()


def run(loader: Loader, mode: str, n: int | None = None) -> list[int]:
    out: list[int] = []
    for k, batch in enumerate(loader):
        out += tokens(batch, mode)
        if n is not None and k + 1 == n:
            break
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("old,new", [(3, 2), (2, 3), (4, 1), (1, 2)])
def test_the_rest_of_the_epoch_is_delivered_once_across_the_new_ranks(data, mode, old, new):
    # what the whole epoch delivers on the old ranks, run to its end
    whole = Counter(t for r in range(old) for t in run(make(data, mode, r, old), mode))
    # stop after 4 batches, save every rank's state
    olds = [make(data, mode, r, old) for r in range(old)]
    before = Counter(t for ld in olds for t in run(ld, mode, 4))
    states = [json.loads(json.dumps(ld.state_dict())) for ld in olds]
    for ld in olds:
        ld.close()
    news = [make(data, mode, r, new, batch=2) for r in range(new)]
    for ld in news:
        ld.load_state_dict(states)
    promised = {len(ld) for ld in news}
    assert len(promised) == 1  # every new rank delivers as many batches, known beforehand
    after = [run(ld, mode) for ld in news]
    assert {ld.stats.batches for ld in news} == promised
    got = before + Counter(t for part in after for t in part)
    repeated = sum(ld.stats.repeated for ld in news)
    cut = sum(ld.stats.rank_balance for ld in news)
    assert repeated <= old  # packed: at most the packet each old rank was inside of
    assert sum(c - 1 for c in got.values() if c > 1) <= repeated * 15  # ... and only those
    if mode != "packed":
        assert all(c == 1 for c in got.values())  # no packet twice
        # what the old run would still have delivered, the new ranks deliver (but what the
        # new split cuts to equal shares, counted)
        missing = set(whole) - set(got)
        assert len({t // 1000 for t in missing}) <= cut
        assert repeated == 0
    # the epoch after is the new run's own epoch, as a fresh run on the new ranks gives it
    fresh = [make(data, mode, r, new, batch=2) for r in range(new)]
    for ld in fresh:
        run(ld, mode)
    for a, b in zip(news, fresh):
        assert run(a, mode) == run(b, mode)


@pytest.mark.parametrize("mode", ["padded", "packing"])
def test_one_state_is_enough_where_the_index_tells_the_other_ranks_positions(data, mode):
    olds = [make(data, mode, r, 3) for r in range(3)]
    for ld in olds:
        run(ld, mode, 5)
    states = [ld.state_dict() for ld in olds]
    from_all = make(data, mode, 0, 2)
    from_all.load_state_dict(states)
    from_one = make(data, mode, 0, 2)
    with pytest.raises(LoaderStateError, match="elastic=True"):
        from_one.load_state_dict(states[1])  # another world size needs saying so
    from_one.load_state_dict(states[1], elastic=True)
    assert run(from_all, mode) == run(from_one, mode)


def test_packed_needs_every_rank_and_one_step(data):
    olds = [make(data, "packed", r, 2) for r in range(2)]
    run(olds[0], "packed", 3)
    run(olds[1], "packed", 2)
    states = [ld.state_dict() for ld in olds]
    new = make(data, "packed", 0, 3)
    with pytest.raises(LoaderStateError, match="states of all 2"):
        new.load_state_dict(states[0], elastic=True)
    with pytest.raises(LoaderStateError, match="every rank of the earlier run"):
        new.load_state_dict(states[:1] + states[:1])
    with pytest.raises(LoaderStateError, match="different steps"):
        new.load_state_dict(states)


@pytest.mark.parametrize("mode", MODES)
def test_a_state_saved_during_the_rest_resumes_exactly(data, mode):
    olds = [make(data, mode, r, 3) for r in range(3)]
    for ld in olds:
        run(ld, mode, 2)
    states = [ld.state_dict() for ld in olds]
    full = make(data, mode, 1, 2)
    full.load_state_dict(states)
    want = run(full, mode) + run(full, mode)
    part = make(data, mode, 1, 2)
    part.load_state_dict(states)
    head = run(part, mode, 2)
    saved = json.loads(json.dumps(part.state_dict()))
    assert saved["elastic"]["world_size"] == 3
    part.close()
    again = make(data, mode, 1, 2)
    again.load_state_dict(saved)
    assert head + run(again, mode) + run(again, mode) == want
    assert "elastic" not in again.state_dict()  # the next epoch is an ordinary one


def test_a_resume_that_shrinks_twice_within_one_epoch(data):
    mode = "padded"
    olds = [make(data, mode, r, 4) for r in range(4)]
    before = Counter(t for ld in olds for t in run(ld, mode, 2))
    mids = [make(data, mode, r, 3) for r in range(3)]
    for ld in mids:
        ld.load_state_dict([o.state_dict() for o in olds])
    before += Counter(t for ld in mids for t in run(ld, mode, 2))
    lasts = [make(data, mode, r, 2) for r in range(2)]
    for ld in lasts:
        ld.load_state_dict([m.state_dict() for m in mids])
    got = before + Counter(t for ld in lasts for t in run(ld, mode))
    assert all(c == 1 for c in got.values())
    cut = sum(ld.stats.rank_balance for ld in mids + lasts)
    everything = {t // 1000 for t in got}
    assert N - len(everything) <= cut + 4 * 2  # the first run's balance cut at most
    assert np.all(np.array(sorted(everything)) < N)


#: rows long enough for packing mode to put several packets in one (3 to 15 tokens each), so
#: its old ranks stop at different positions of their shares, as packed mode's do
LONG = 16


def saved(data, mode, world, n=2) -> tuple[list[dict], Counter]:
    """Every rank's state of a ``world``-rank run stopped after ``n`` batches, in rank order,
    and the tokens it delivered before."""
    olds = [make(data, mode, r, world, seq_len=LONG) for r in range(world)]
    before = Counter(t for ld in olds for t in run(ld, mode, n))
    states = [json.loads(json.dumps(ld.state_dict())) for ld in olds]
    for ld in olds:
        ld.close()
    return states, before


def resumed(data, mode, states, new) -> list[list[list[int]]]:
    """Every new rank's batches (each as its tokens) after resuming from ``states``."""
    out = []
    for r in range(new):
        ld = make(data, mode, r, new, batch=2, seq_len=LONG)
        ld.load_state_dict(states)
        out.append([tokens(b, mode) for b in ld])
        ld.close()
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("old,new,orders", [
    (3, 2, [(2, 0, 1), (1, 2, 0), (2, 1, 0)]),
    (2, 3, [(1, 0)]),
])
def test_the_order_of_the_states_list_does_not_matter(data, mode, old, new, orders):
    # state files listed by name put rank_10 before rank_2: the list's order is no rank order
    states, before = saved(data, mode, old)
    if mode != "padded":  # else every order gives the same positions, and the test shows nothing
        assert len({(s["pos"], s["tok"]) for s in states}) > 1
    want = resumed(data, mode, states, new)
    got = before + Counter(t for rank in want for batch in rank for t in batch)
    if mode != "packed":  # every document once across the old ranks and then the new ones
        assert all(c == 1 for c in got.values())
    else:  # a packet an old rank was inside of is delivered again whole, no other
        assert len({t // 1000 for t, c in got.items() if c > 1}) <= old
    for order in orders:
        assert resumed(data, mode, [states[k] for k in order], new) == want, order


@pytest.mark.parametrize("mode", MODES)
def test_a_states_list_with_a_rank_twice_or_a_rank_missing_is_refused(data, mode):
    states, _ = saved(data, mode, 3)
    new = make(data, mode, 0, 2)
    with pytest.raises(LoaderStateError, match=r"rank 1 twice"):
        new.load_state_dict([states[1], states[0], states[1]])
    with pytest.raises(LoaderStateError, match=r"rank 2 twice"):
        new.load_state_dict([states[2], states[0], states[1], states[2]])
    with pytest.raises(LoaderStateError, match=r"missing rank 1"):
        new.load_state_dict([states[2], states[0]])
    with pytest.raises(LoaderStateError, match=r"missing rank 0"):
        new.load_state_dict([states[2], states[1]])
    # a rank the earlier run did not have
    with pytest.raises(LoaderStateError, match=r"rank 3 .*world_size 3"):
        new.load_state_dict([states[0], states[1], states[2],
                             {**states[2], "rank": 3}])
    # ... and one whose rank is no rank at all
    bad = {k: v for k, v in states[1].items() if k != "rank"}
    with pytest.raises(LoaderStateError, match=r"rank"):
        new.load_state_dict([states[0], bad, states[2]])
    new.close()


@pytest.mark.parametrize("mode", MODES)
def test_states_of_different_runs_or_steps_are_refused_whatever_their_order(data, mode,
                                                                            tmp_path):
    (three, _), (two, _) = saved(data, mode, 3), saved(data, mode, 2)
    new = make(data, mode, 0, 4)
    # ranks 0 and 1 of a 2-rank run, one of them from a 3-rank run: not one run
    with pytest.raises(LoaderStateError, match="world_size"):
        new.load_state_dict([three[1], two[0]])
    with pytest.raises(LoaderStateError, match="world_size"):
        new.load_state_dict([two[1], three[0]])
    # one rank saved at another step
    later, _ = saved(data, mode, 2, n=3)
    with pytest.raises(LoaderStateError, match="different steps"):
        new.load_state_dict([later[1], two[0]])
    # one rank from a run with another seed (its batches are another order)
    other = [Loader(data, mode=mode, batch_size=3, seq_len=LONG, backend="cpu",
                    output="arrays", seed=6, rank=r, world_size=2).state_dict() for r in range(2)]
    with pytest.raises(LoaderStateError, match="seed"):
        new.load_state_dict([other[1], two[0]])
    # one rank from a run on another dataset
    lengths = [3 + (k * 7) % 13 for k in range(N)]
    write_shards(tmp_path, [s.encode() for s in ramp_specs(lengths)][:60], prefix="a")
    elsewhere = make(tmp_path, mode, 1, 2, seq_len=LONG)
    run(elsewhere, mode, 2)
    with pytest.raises(LoaderStateError, match="dataset"):
        new.load_state_dict([elsewhere.state_dict(), two[0]])
    elsewhere.close()
    new.close()
