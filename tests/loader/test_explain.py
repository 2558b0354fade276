"""``loader.explain(step)`` (``ndp.loader.explain``) equals what the Loader delivered, row for
row, in every mode: with CRC-Drop and damaged packets (``tests/loader/golden.py``'s datasets),
3 ranks, a mix of two sources, after an elastic resume, on split documents, with batch-shape
schedules and token budgets, for steps asked before they are delivered and after; the drops it
names add up to ``stats.corrupt``; a step the run has not is a ``StepError``."""

from __future__ import annotations

import collections
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import golden  # noqa: E402
from test_units import documents, write  # noqa: E402

import ndp  # noqa: E402
from ndp.errors import StepError  # noqa: E402

#: "lazy": no CRC-Drop, so the share is read place by place (a ``RankOrder``), as at scale
RUNS = ("rank1of3", "mix", "elastic3", "lazy")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    return golden.write_datasets(tmp_path_factory.mktemp("explain"))


def make(datasets, mode, name, backend="cpu", **over):
    kw = dict(mode=mode, seed=7, crc_drop_rate=0.1, backend=backend, output="arrays",
              **golden.SHAPES[mode]) | over
    if name == "mix":
        return ndp.Loader({"main": str(datasets["main"]), "extra": str(datasets["extra"])},
                          mix={"main": 0.7, "extra": 0.3}, **kw)
    if name == "elastic3":
        saved = []
        for r in range(2):
            with ndp.Loader(datasets["main"], rank=r, world_size=2, **kw) as old, \
                    warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # padded rows cut: counted
                it = iter(old)
                for _ in range(3):
                    next(it)
                saved.append(json.loads(json.dumps(old.state_dict())))
        loader = ndp.Loader(datasets["main"], rank=0, world_size=3, **kw)
        loader.load_state_dict(saved)
        return loader
    if name == "lazy":
        return ndp.Loader(datasets["main"], rank=2, world_size=3, **(kw | {"crc_drop_rate": 0}))
    return ndp.Loader(datasets["main"], rank=int(name[4]), world_size=int(name[-1]), **kw)


def host(array):
    return array if isinstance(array, np.ndarray) else array.copy_to_host()


def check_batch(ex, batch, mode):
    """Every row of ``batch`` is the pieces ``ex`` names, read from their shards, and nothing
    else: in padded and packing rows the attention mask covers exactly the pieces; a packed
    window's pieces are its ``seq_len + 1`` tokens."""
    key = "x" if mode == "packed" else "input_ids"
    rows = host(batch[key])
    T = rows.shape[1]
    assert ex.rows == rows.shape[0] and ex.seq_len == T
    mask = None if mode == "packed" else host(batch["attention_mask"])
    for r in range(ex.rows):
        col = 0
        for p in ex.row(r):
            tokens = ex.tokens(p)
            assert p.col == col and tokens.shape[0] == p.stop - p.start > 0
            end = min(p.col + tokens.shape[0], T)
            np.testing.assert_array_equal(rows[r, p.col:end], tokens[:end - p.col])
            if mode == "packed" and p.col + tokens.shape[0] > T:
                y = host(batch["y"])[r, -1]
                assert y in (tokens[-1], -100)  # the window's last target (or masked)
            col += tokens.shape[0]
        if mode == "packed":
            assert col == T + 1
        elif mode == "padded":
            assert col == mask[r].sum()
        else:  # packing: the documents lie end to end from column 0, then padding
            assert col == mask[r].sum() or mask[r, col:].sum() == 0


def check_epoch(loader, mode):
    """Explain every step as it is delivered; returns the drops named, by reason."""
    drops: collections.Counter = collections.Counter()
    n, want = 0, loader.remaining
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # padded rows cut at seq_len: counted
        for batch in loader:
            ex = loader.explain(loader.step - 1)
            assert (ex.epoch, ex.step, ex.rank) == (loader.epoch, loader.step - 1, loader.rank)
            check_batch(ex, batch, mode)
            drops.update(d.reason for d in ex.dropped)
            n += 1
    assert n == want > 0
    return drops


@pytest.mark.parametrize("name", RUNS)
@pytest.mark.parametrize("mode", golden.MODES)
def test_explain_equals_every_delivered_row(datasets, mode, name):
    with make(datasets, mode, name) as loader:
        assert (type(loader.plan.share(0).packets).__name__ == "RankOrder") == (name == "lazy")
        drops = check_epoch(loader, mode)
        corrupt = loader.stats.corrupt
    assert sum(corrupt.values()) > 0  # the damaged packets were met
    assert dict(drops) == dict(corrupt)  # every drop named by the batch that counted it


@pytest.mark.parametrize("mode", golden.MODES)
def test_explain_equals_the_rows_the_cuda_kernels_build(datasets, mode):
    """The simulator without a GPU; explain itself runs on the CPU whatever the backend."""
    with make(datasets, mode, "rank1of3", backend="cuda") as loader:
        drops = check_epoch(loader, mode)
        assert dict(drops) == dict(loader.stats.corrupt)


@pytest.mark.parametrize("mode", golden.MODES)
def test_future_steps_and_later_epochs_are_explained_before_they_come(datasets, mode):
    """Every step of two epochs, explained before the loop starts, then delivered; with a
    batch-shape schedule (padded, packed) or a token budget (packing) across the epochs."""
    over = ({"batch_tokens": 96, "batch_size": None} if mode == "packing" else
            {"seq_len": ndp.Schedule([(0, 16), (20, 24)])})
    if mode != "padded":  # a share read place by place (``RankOrder``) across two epochs
        over["crc_drop_rate"] = 0
    with make(datasets, mode, "rank0of2", **over) as loader:
        total = len(loader)
        ahead = [loader.explain(s) for s in range(total + 5)]
        assert [e.epoch for e in ahead] == [0] * total + [1] * 5
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            for epoch in range(2):
                for i, batch in enumerate(loader):
                    step = loader.step - 1
                    if step >= len(ahead):
                        break
                    assert ahead[step].batch == i
                    check_batch(ahead[step], batch, mode)
                    assert loader.explain(i, epoch=epoch).to_dict() == ahead[step].to_dict()


def test_split_documents_are_explained_as_they_reach_the_stream(tmp_path):
    """Packed mode over documents split into pieces (``ndp.loader.ordering.units``): a row's pieces
    are each document's packets in order."""
    d, _ = write(tmp_path, documents(np.random.default_rng(5)))
    with ndp.Loader(d, mode="packed", batch_size=2, seq_len=12, backend="cpu",
                    output="arrays", seed=3, shuffle_window=1 << 17, rank=1,
                    world_size=2) as loader:
        check_epoch(loader, "packed")
        ex = loader.explain(3)
    places = [p.position for p in ex.pieces]
    assert places == sorted(places)  # a document's pieces share its place


def test_steps_the_run_has_not_are_named_errors(datasets):
    with make(datasets, "padded", "rank0of2") as loader:
        n = len(loader)
    with make(datasets, "padded", "rank0of2", max_steps=n + 5) as loader:
        loader.explain(n + 4)
        with pytest.raises(StepError, match="past the run's end"):
            loader.explain(n + 5)
        with pytest.raises(StepError, match="past its end"):
            loader.explain(n, epoch=0)
        with pytest.raises(StepError, match="negative"):
            loader.explain(-1)
        first = loader.explain(n + 2).to_dict()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            for _ in loader:
                pass
            it = iter(loader)
            for _ in range(2):
                next(it)
        state = loader.state_dict()
    with make(datasets, "padded", "rank0of2", max_steps=n + 5) as later:
        later.load_state_dict(state)  # resumed in epoch 1: its steps are known from n on
        assert later.explain(n + 2).to_dict() == first
        with pytest.raises(StepError, match="before the epoch this run resumed in"):
            later.explain(n - 1)


def test_the_explanation_is_plain_data(datasets):
    with make(datasets, "packing", "rank0of2") as loader:
        ex = loader.explain(2)
    back = json.loads(ex.to_json())
    assert back["step"] == 2 and back["mode"] == "packing"
    assert {"shard", "offset", "src", "dst", "typ", "start", "stop", "row", "col"} <= set(
        back["pieces"][0])
    assert ex.packets() == list(dict.fromkeys((p.shard, p.packet) for p in ex.pieces))


@pytest.mark.parametrize("name", ["rank1of3", "lazy"])
def test_a_resumed_loader_explains_from_its_state(datasets, name):
    """A packed step after a resumed state is found from the state (the packets before it
    are not read again) and equals what the resumed loop delivers."""
    with make(datasets, "packed", name) as first:
        it = iter(first)
        for _ in range(20):
            next(it)
        state = first.state_dict()
    with make(datasets, "packed", name) as loader:
        loader.load_state_dict(state)
        ahead = loader.explain(25)
        assert loader._explainer.engine.counters.chunks <= 2  # from step 20, not from 0
        for batch in loader:
            if loader.step - 1 == 25:
                check_batch(ahead, batch, "packed")
                break


@pytest.mark.parametrize("mixed", [False, True], ids=["one source", "mix schedule"])
def test_padded_batches_cut_by_a_token_budget_are_explained_ahead(datasets, mixed):
    """Padded batches cut by ``batch_tokens`` (their ends by the index), alone and drawn by
    a linear mix schedule: every step explained before the loop equals the batch delivered."""
    data = ({"main": str(datasets["main"]), "extra": str(datasets["extra"])} if mixed
            else datasets["main"])
    kw = dict(mode="padded", batch_tokens=100, seq_len=32, seed=7, crc_drop_rate=0.1,
              backend="cpu", output="arrays")
    if mixed:
        kw["mix"] = ndp.Schedule([(0, {"main": 0.8, "extra": 0.2}),
                                  (30, {"main": 0.3, "extra": 0.7})], interpolate="linear")
    with ndp.Loader(data, **kw) as loader, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ahead = [loader.explain(s) for s in range(len(loader))]
        n = 0
        for batch in loader:
            check_batch(ahead[loader.step - 1], batch, "padded")
            n += 1
    assert n == len(ahead) > 40
