"""Batches cut by a token budget (``batch_tokens=``, padded and packing mode;
``ndp.loader.planning.shapes``): each batch takes whole examples while their tokens (each cut to
``seq_len``) fit the budget, so rows per batch vary while every rank takes the same number of
steps; the budget may be a schedule; resumes, ranks and the simulator agree.

RAMP data: packet k holds tokens k*1000 + arange(n).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from ndp.errors import ConfigError, LoaderStateError
from ndp.loader.loader import Loader
from ndp.loader.planning.schedule import Schedule
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp, write_shards

LENGTHS = [int(x) for x in np.random.default_rng(11).integers(1, 30, 150)]
BUDGET = Schedule([(0, 40), (9, 100)])
SEQ = Schedule([(0, 8), (5, 16)])


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("budget")
    packets = [encode_tokens(ramp(k, n)) for k, n in enumerate(LENGTHS)]
    for i, (a, b) in enumerate([(0, 40), (40, 110), (110, 150)]):
        write_shards(d, packets[a:b], prefix=f"s{i}")
    return d


def make(data, mode, **kw) -> Loader:
    kw.setdefault("batch_tokens", BUDGET)
    kw.setdefault("seq_len", SEQ)
    kw.setdefault("backend", "cpu")
    kw.setdefault("chunk_batches", 3)
    kw.setdefault("seed", 4)
    return Loader(data, mode=mode, output="arrays", manifest="ignore", **kw)


def host(batch: dict) -> dict:
    return {k: np.array(v.copy_to_host() if hasattr(v, "copy_to_host") else v)
            for k, v in batch.items()}


def run(loader: Loader, epochs: int = 1) -> list[dict]:
    out = [host(b) for _ in range(epochs) for b in loader]
    loader.close()
    return out


@pytest.mark.parametrize("mode", ["padded", "packing"])
def test_each_batch_is_the_examples_that_fit_its_budget(data, mode):
    loader = make(data, mode, shuffle=False)
    batches = run(loader)
    assert len(batches) > 12
    rows = {b["input_ids"].shape[0] for b in batches}
    assert len(rows) > 2  # rows per batch vary
    # unshuffled: the examples in file order, each cut to its batch's seq_len
    at = 0
    for step, batch in enumerate(batches):
        budget, t = BUDGET.at(step), SEQ.at(step)
        assert batch["input_ids"].shape[1] == t
        taken, used = 0, 0
        while at + taken < len(LENGTHS):
            m = min(LENGTHS[at + taken], t)
            if taken and used + m > budget:
                break
            used, taken = used + m, taken + 1
        assert int(batch["attention_mask"].sum()) == used <= max(budget, LENGTHS[at])
        if mode == "padded":
            assert batch["input_ids"].shape[0] == taken
            assert batch["input_ids"][0, 0] == at * 1000
        at += taken
    assert at == len(LENGTHS)  # one rank, unshuffled: every example once


@pytest.mark.parametrize("mode", ["padded", "packing"])
def test_ranks_take_the_same_number_of_steps(data, mode):
    loaders = [make(data, mode, rank=r, world_size=3) for r in range(3)]
    for _ in range(2):
        n = {len(x) for x in loaders}
        assert len(n) == 1
        assert [sum(1 for _ in x) for x in loaders] == [n.pop()] * 3


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("mode", ["padded", "packing"])
def test_a_resume_at_and_around_the_budgets_change_gives_the_uninterrupted_run(data, mode,
                                                                               backend):
    want = run(make(data, mode, crc_drop_rate=0.1), 2)
    first = len(make(data, mode, crc_drop_rate=0.1))
    for step in ((8, 9, 10, first + 1) if backend == "cpu" else (9,)):
        loader = make(data, mode, crc_drop_rate=0.1, backend=backend)
        it = iter(loader)
        done = 0
        while done < step:
            try:
                next(it)
                done += 1
            except StopIteration:
                it = iter(loader)
        state = json.loads(json.dumps(loader.state_dict()))
        loader.close()
        again = make(data, mode, crc_drop_rate=0.1, backend=backend)
        again.load_state_dict(state)
        got = [host(b) for b in again]
        again.close()
        assert len(got) == (first - step if step < first else len(want) - step)
        for a, b in zip(got, want[step:]):
            assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("mode", ["padded", "packing"])
def test_one_state_resumes_on_other_ranks_under_a_budget(data, mode):
    old = make(data, mode, rank=1, world_size=2)
    it = iter(old)
    for _ in range(10):
        next(it)
    state = old.state_dict()
    old.close()
    seen = set()
    for r in range(2):
        o = make(data, mode, rank=r, world_size=2)
        for b, _ in zip(o, range(10)):
            seen |= set(b["input_ids"][b["attention_mask"].astype(bool)].tolist())
        o.close()
    rest = set()
    for r in range(3):
        new = make(data, mode, rank=r, world_size=3)
        new.load_state_dict(state, elastic=True)
        assert new.step == 10
        for b in new:
            rest |= set(b["input_ids"][b["attention_mask"].astype(bool)].tolist())
    assert rest and not seen & rest


@pytest.mark.parametrize("kw,match", [
    (dict(mode="packed", batch_tokens=64), "batch_tokens cuts padded and packing batches"),
    (dict(mode="padded", batch_tokens=64, batch_size=4), "one of them"),
    (dict(mode="padded"), "give batch_size .* or batch_tokens"),
    (dict(mode="padded", batch_tokens=0), "batch_tokens must be >= 1"),
    (dict(mode="padded", batch_tokens=Schedule([(0, 64), (5, 0)])),
     r"batch_tokens phase 1 \(from step 5\)"),
])
def test_a_wrong_budget_is_refused_by_name(data, kw, match):
    with pytest.raises(ConfigError, match=match):
        Loader(data, seq_len=8, output="arrays", manifest="ignore", **kw)


def test_a_state_records_the_budget_and_another_budget_goes_on(data):
    loader = make(data, "padded")
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    loader.close()
    assert state["batch_tokens"] == BUDGET.record() and state["batch_size"] is None
    assert loader.batch_tokens == 40 and loader.batch_size is None
    for other in (dict(batch_tokens=64), dict(batch_tokens=None, batch_size=4)):
        again = make(data, "padded", **other)
        with pytest.warns(UserWarning, match="this state was made with"):
            again.load_state_dict(state)
        assert again.step == 5 and again.state_dict()["elastic"]["batch_tokens"] == BUDGET.record()
        rest = len(again)  # the rest of the epoch, in the new budget's batches
        assert sum(1 for _ in again) == rest > 0
    with pytest.raises(LoaderStateError, match="seed="):
        make(data, "padded", batch_tokens=40, seed=9).load_state_dict(state)


def test_a_budgets_count_is_not_taken_for_a_row_counts(data, tmp_path, monkeypatch):
    """A budget of 40 tokens in rows of 8 is sized for 5 rows, as ``batch_size=5`` is: the
    node's count cache must not give one's count for the other (their keys differ)."""
    monkeypatch.setenv("NDP_COUNT_CACHE", str(tmp_path / "counts"))
    rows = make(data, "packing", batch_tokens=None, batch_size=5, seq_len=8)
    n_rows = len(rows)
    assert sum(1 for _ in rows) == n_rows
    rows.close()
    budget = make(data, "packing", batch_tokens=40, seq_len=8)
    n_budget = len(budget)
    assert sum(1 for _ in budget) == n_budget != n_rows
