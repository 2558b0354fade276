"""Skip ranges (``ndp.loader.planning.skips``): a resume that skips run steps ``a .. b-1`` delivers
every other step's batch as the uninterrupted run did, and none of the skipped steps' tokens
in their epoch, on both backends and in every mode; each epoch is shorter by the steps it
skips on every rank; the skip is counted in ``stats`` and kept by every later state; bad
ranges are named errors."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest


import golden  # noqa: E402

import ndp  # noqa: E402
from ndp.errors import ConfigError  # noqa: E402
from test_explain import check_batch  # noqa: E402


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    return golden.write_datasets(tmp_path_factory.mktemp("skips"))


def make(datasets, mode, backend="cpu", **over):
    kw = dict(mode=mode, seed=7, crc_drop_rate=0.1, backend=backend, output="arrays",
              rank=1, world_size=2, **golden.SHAPES[mode]) | over
    return ndp.Loader(datasets["main"], **kw)


def host(value):
    return np.array(value if isinstance(value, np.ndarray) else value.copy_to_host())


def run(loader, epochs):
    """``{run step: batch}`` of ``epochs`` loops, and each epoch's ``len`` before its loop."""
    out, lens = {}, []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # padded rows cut at seq_len: counted
        for _ in range(epochs):
            lens.append(len(loader))
            for batch in loader:
                out[loader.step - 1] = {k: host(v) for k, v in batch.items()}
    return out, lens


def x_tokens(ex):
    """(packet, token) of each token a step hands the model as input (a packed window's last
    target aside: it is the next window's first input)."""
    T = ex.seq_len
    return {(p.packet, t) for p in ex.pieces
            for t in range(p.start, p.start + min(p.stop - p.start, T - p.col))}


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("mode", golden.MODES)
def test_a_resume_that_skips_delivers_the_rest_as_the_run_did(datasets, mode, backend):
    with make(datasets, mode, backend) as full:
        want, lens = run(full, 2)
    n0 = lens[0]
    ranges = [(5, 9), (n0 - 2, n0 + 3)]  # one inside epoch 0, one across its end
    gone = {s for a, b in ranges for s in range(a, b)}
    with make(datasets, mode, backend) as first:
        it = iter(first)
        for _ in range(3):
            next(it)
        state = json.loads(json.dumps(first.state_dict()))
    with make(datasets, mode, backend) as loader:
        loader.load_state_dict(state, skip=ranges)
        assert loader.remaining == n0 - 3 - 4 - 2
        got, lens_after = run(loader, 2)
        stats = loader.stats
        assert state["step"] == 3 and loader.state_dict()["skip"] == [list(r) for r in ranges]
        explained = {s: loader.explain(s) for s in sorted(gone)}
    assert lens_after == [n0 - 6, lens[1] - 3]  # every rank as many: the steps skipped less
    assert sorted(got) == [s for s in range(3, n0 + lens[1]) if s not in gone]
    for step, batch in got.items():
        assert batch.keys() == want[step].keys()
        for name in batch:
            np.testing.assert_array_equal(batch[name], want[step][name], err_msg=f"{step}")
    assert all(e.skipped for e in explained.values())
    assert stats.skipped_batches == len(gone)
    assert stats.skipped_tokens == sum(e.rows * e.seq_len if mode == "packed" else
                                       sum(p.stop - p.start for p in e.pieces)
                                       for e in explained.values())
    with make(datasets, mode) as loader:  # none of a skipped step's tokens in its epoch
        delivered = set()
        for s in range(3, n0):
            if s not in gone:
                delivered |= x_tokens(loader.explain(s))
        # steps 5-8 (packed mode may deliver its first packets again at the epoch's end: a
        # rank left short of tokens by corrupt packets repeats its share, counted)
        skipped = set().union(*(x_tokens(explained[s]) for s in range(5, 9)))
    assert skipped and not (skipped & delivered)


def test_every_later_state_keeps_the_skip(datasets):
    with make(datasets, "padded", skip=[(2, 4)]) as loader:
        it = iter(loader)
        steps = [(next(it), loader.step - 1)[1] for _ in range(3)]
        state = loader.state_dict()
    assert steps == [0, 1, 4] and state["skip"] == [[2, 4]]
    with make(datasets, "padded") as later:
        later.load_state_dict(state, skip=[(2, 4), (6, 7)])  # given again: one range
        it = iter(later)
        assert [(next(it), later.step - 1)[1] for _ in range(3)] == [5, 7, 8]
        assert later.state_dict()["skip"] == [[2, 4], [6, 7]]
        assert later.stats.skipped_batches == 1


def test_no_skip_no_new_fields(datasets):
    with make(datasets, "packed") as loader:
        next(iter(loader))
        assert "skip" not in loader.state_dict()
        assert "skipped_batches" not in loader.stats.as_dict()


@pytest.mark.parametrize("skip, message", [
    ([(9, 5)], "reversed"),
    ([(5, 5)], "empty"),
    ([(-1, 5)], "negative"),
    ([(1, 6), (5, 9)], "overlap"),
    ([(1, 2, 3)], "not \\(first, end\\)"),
    ([(1.0, 2)], "not \\(first, end\\)"),
    ("1-5", "list of \\(first, end\\)"),
])
def test_bad_ranges_are_named_errors(datasets, skip, message):
    with pytest.raises(ConfigError, match=message):
        make(datasets, "padded", skip=skip)
    with make(datasets, "padded") as loader:
        state = loader.state_dict()
        with pytest.raises(ConfigError, match=message):
            loader.load_state_dict(state, skip=skip)


def test_a_range_overlapping_the_states_is_refused(datasets):
    with make(datasets, "padded", skip=[(2, 6)]) as loader:
        state = loader.state_dict()
    with make(datasets, "padded") as loader, pytest.raises(ConfigError, match="overlap"):
        loader.load_state_dict(state, skip=[(4, 8)])


@pytest.mark.parametrize("mode", golden.MODES)
def test_packets_found_bad_are_left_out_wherever_they_come(datasets, mode):
    """The packets of two steps, named by ``explain`` after the fact, left out by number: no
    batch holds them, every batch is what ``explain`` says (the CPU and the CUDA kernels
    alike), they are counted as skipped, not corrupt, and a state keeps them."""
    with make(datasets, mode) as loader:
        bad = sorted({p.packet for s in (3, 4) for p in loader.explain(s).pieces})
    runs = {}
    for backend in ("cpu", "cuda"):
        with make(datasets, mode, backend, skip_packets=bad) as loader:
            runs[backend], lens = run(loader, 1)
            stats = loader.stats
            state = loader.state_dict()
            explained = {s: loader.explain(s, epoch=0) for s in range(lens[0])}
    assert runs["cpu"].keys() == runs["cuda"].keys()
    for step, batch in runs["cpu"].items():
        for name in batch:
            np.testing.assert_array_equal(batch[name], runs["cuda"][step][name])
    named = 0
    for step, ex in explained.items():
        assert not {p.packet for p in ex.pieces} & set(bad), step
        check_batch(ex, runs["cpu"][step], mode)
        named += sum(d.reason == "SKIPPED" for d in ex.dropped)
    assert stats.skipped_packets >= len(bad) and named >= len(bad) - 1
    assert "SKIPPED" not in stats.corrupt and sum(stats.corrupt.values()) > 0
    assert state["skip_packets"] == bad
    with make(datasets, mode) as later:  # a resume keeps them
        later.load_state_dict(state)
        assert later.state_dict()["skip_packets"] == bad


def test_bad_packet_numbers_are_named_errors(datasets):
    n = ndp.Corpus(datasets["main"]).n_packets
    for value, message in (([n], f"outside this dataset's {n:,} packets"), ([-1], "outside"),
                           (["7"], "packet numbers are ints"), (7, "a list of packet")):
        with pytest.raises(ConfigError, match=message):
            make(datasets, "padded", skip_packets=value)


def test_the_progress_bar_counts_the_batches_a_loop_yields(datasets, capsys):
    """A resume at step 3 with steps 5-8 skipped: the bar goes from 3 to len(loader), the
    epoch's batches less the 4 skipped."""
    with make(datasets, "padded") as first:
        it = iter(first)
        for _ in range(3):
            next(it)
        state = first.state_dict()
    capsys.readouterr()
    with make(datasets, "padded", progress=True) as loader:
        loader.load_state_dict(state, skip=[(1, 2), (5, 9)])  # step 1: before the state
        n = len(loader)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            assert sum(1 for _ in loader) == n - 2
    err = capsys.readouterr().err
    assert re.search(rf"(?<!\d)2/{n}\b", err) and f"{n}/{n}" in err  # from 2 taken (steps
    # 0 and 2; step 1 counts as skipped) to the end
