"""Batch shapes that change with the run's step (``ndp.Schedule`` for ``batch_size`` and
``seq_len``; ``ndp.loader.planning.shapes``): every batch has its step's shape, ``len(loader)``
counts
with the schedule, a packed stream goes on across a change with no token lost or repeated, and
a resume at every boundary (and one step either side) gives the uninterrupted run's batches,
on the CPU and on the CUDA simulator, on one rank and on three.

RAMP data: packet k holds tokens k*1000 + arange(n), so a token names its packet and place.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import ndp
from ndp.errors import ConfigError, LoaderStateError
from ndp.loader.loader import Loader
from ndp.loader.planning.schedule import Schedule
from ndp.loader.planning.shapes import Shapes
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp, ramp_specs, write_shards

MODES = ["padded", "packed", "packing"]
BATCH = Schedule([(0, 2), (5, 3), (11, 1)])
SEQ = Schedule([(0, 8), (8, 16), (14, 4)])
BOUNDARIES = sorted(set(BATCH.steps[1:]) | set(SEQ.steps[1:]))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """160 packets of 1-30 tokens in 4 shards of uneven sizes, some masked."""
    d = tmp_path_factory.mktemp("schedule")
    lengths = [int(x) for x in np.random.default_rng(7).integers(1, 31, 160)]
    packets = [s.encode() for s in ramp_specs(lengths, masked=[k % 5 == 2 for k in
                                                              range(160)])]
    for i, (a, b) in enumerate([(0, 20), (20, 70), (70, 95), (95, 160)]):
        write_shards(d, packets[a:b], prefix=f"s{i}")
    return d


def make(data, mode, **kw) -> Loader:
    kw.setdefault("batch_size", BATCH)
    kw.setdefault("seq_len", SEQ)
    kw.setdefault("backend", "cpu")
    kw.setdefault("seed", 3)
    kw.setdefault("chunk_batches", 4)
    return Loader(data, mode=mode, output="arrays", manifest="ignore", **kw)


def host(batch: dict) -> dict:
    return {k: np.array(v.copy_to_host() if hasattr(v, "copy_to_host") else v)
            for k, v in batch.items()}


def run(loader: Loader, epochs: int = 2, *, close: bool = True) -> list[dict]:
    """``epochs`` epochs' batches (then the loader is closed: its producer, already in the
    next epoch, must not run the simulator beside the next loader's)."""
    out = []
    for _ in range(epochs):
        out.extend(host(b) for b in loader)
    if close:
        loader.close()
    return out


def same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert np.array_equal(x[k], y[k]), k


# ------------------------------------------------------------------------------- Schedule
@pytest.mark.parametrize("phases,kw,match", [
    ([(0, 8), (5, 16), (5, 32)], {}, "phase 2 starts at step 5, not after phase 1"),
    ([(0, 8), (9, 16), (3, 32)], {}, "phase 2 starts at step 3"),
    ([(4, 8)], {}, "phase 0 starts at step 4"),
    ([], {}, "no phase"),
    ([(0, 8), (2.5, 16)], {}, "phase 1: its step must be an integer"),
    ([(0, 8), (True, 16)], {}, "phase 1: its step must be an integer"),
    ([(0, 8, 1)], {}, "phase 0 is"),
    ([(0, 1.0), (5, float("nan"))], {"interpolate": "linear"}, "phase 1: its value is nan"),
    ([(0, {"a": 1}), (5, {"b": 1})], {"interpolate": "linear"}, "phase 1 has keys"),
    ([(0, 1)], {"interpolate": "cosine"}, "interpolate must be one of"),
])
def test_a_hostile_schedule_is_refused_naming_the_phase(phases, kw, match):
    with pytest.raises(ConfigError, match=match):
        Schedule(phases, **kw)


@pytest.mark.parametrize("option,value,match", [
    ("seq_len", Schedule([(0, 8), (4, 0)]), r"seq_len phase 1 \(from step 4\) must be >= 1"),
    ("batch_size", Schedule([(0, 2), (3, -1)]), r"batch_size phase 1 \(from step 3\)"),
    ("seq_len", Schedule([(0, 8), (4, 8.5)]), r"seq_len phase 1 .* must be an integer"),
    ("batch_size", Schedule([(0, 2), (3, "4")]), r"batch_size phase 1 .* must be an integer"),
    ("seq_len", Schedule([(0, 8), (4, 16)], interpolate="linear"), "not interpolated"),
])
def test_a_shape_schedule_with_a_bad_phase_is_refused_by_the_loader(data, option, value, match):
    with pytest.raises(ConfigError, match=match):
        make(data, "packed", **{option: value})


def test_a_schedule_is_data_that_reads_back():
    s = Schedule([(0, {"web": 0.9, "code": 0.1}), (10, {"web": 0.5, "code": 0.5})],
                 interpolate="linear")
    back = Schedule.from_record(json.loads(json.dumps(s.record())))
    assert back == s and back.at(5) == pytest.approx({"web": 0.7, "code": 0.3})
    assert back.at(0) == {"web": 0.9, "code": 0.1} and back.at(99) == {"web": 0.5, "code": 0.5}
    held = Schedule([(0, 256), (100, 1024)])
    assert [held.at(s) for s in (0, 99, 100, 10**9)] == [256, 256, 1024, 1024]
    assert Schedule.of(7) == Schedule([(0, 7)]) and Schedule.of(held) is held


# ------------------------------------------------------------------------------ Shapes
def test_shape_counts_equal_a_step_by_step_walk():
    rng = np.random.default_rng(1)
    for _ in range(200):
        k = int(rng.integers(1, 5))
        starts = [0] + sorted(rng.choice(np.arange(1, 30), k - 1, replace=False).tolist())
        shapes = Shapes(starts, rng.integers(1, 5, k).tolist(), rng.integers(1, 9, k).tolist())
        per = [shapes.at(s) for s in range(400)]
        rows = np.cumsum([0] + [b for b, _ in per])
        toks = np.cumsum([0] + [b * t for b, t in per])
        for n in rng.integers(0, 300, 10).tolist():
            assert shapes.padded_batches(n) == int(np.searchsorted(rows, n, side="left"))
            assert shapes.packed_batches(n) == max(0, int(np.searchsorted(toks, n - 1,
                                                                         side="right")) - 1)
        step = int(rng.integers(0, 40))
        assert shapes.rows_before(step) == rows[step] and shapes.tokens_before(step) == toks[step]
        lens = shapes.row_lens(int(rows[40]))
        assert lens.tolist() == [t for b, t in per[:40] for _ in range(b)]
        start = int(rng.integers(0, 40))
        later = shapes.after(start)
        assert [later.at(s) for s in range(50)] == per[start:start + 50]


# ------------------------------------------------------------------------------ Loader
@pytest.mark.parametrize("mode", MODES)
def test_every_batch_has_its_steps_shape_and_len_counts_with_the_schedule(data, mode):
    loader = make(data, mode)
    step = 0
    for epoch in range(3):
        assert loader.step == step
        n = len(loader)
        got = 0
        for batch in loader:
            b, t = BATCH.at(step), SEQ.at(step)
            first = batch["x" if mode == "packed" else "input_ids"]
            if mode == "padded":  # a batch of b packets: fewer rows where one was dropped
                assert first.shape[0] <= b and first.shape[1] == t
            else:
                assert first.shape == (b, t)
            step += 1
            got += 1
        assert got == n and loader.step == step
    assert step > BOUNDARIES[-1]  # the run went through every change


def test_a_packed_stream_goes_on_across_every_change_with_no_token_lost_or_repeated(data):
    """Unshuffled, the packed stream is the packets' tokens in file order: the windows of the
    whole run, laid end to end (each window's last target is the next one's first token),
    are that stream's first tokens, whatever the batch shape."""
    loader = make(data, "packed", shuffle=False)
    batches = [host(b) for b in loader]
    stream = np.concatenate([ramp(k, n) for k, n in enumerate(
        int(x) for x in np.random.default_rng(7).integers(1, 31, 160))])
    xs = np.concatenate([b["x"].ravel() for b in batches])
    assert np.array_equal(xs, stream[: xs.shape[0]])
    used = sum(BATCH.at(s) * SEQ.at(s) for s in range(len(batches)))
    assert xs.shape[0] == used
    for a, b in zip(batches, batches[1:]):  # the last target of a batch is the next's first
        assert b["x"][0, 0] == stream[np.flatnonzero(stream == a["x"][-1, -1])[0] + 1]
    left = loader.stats.unused_tokens
    assert left == stream.shape[0] - used  # what the epoch's end leaves, counted
    assert left < BATCH.at(len(batches)) * SEQ.at(len(batches)) + 1


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("mode", MODES)
def test_a_resume_at_every_boundary_and_either_side_gives_the_uninterrupted_run(data, mode,
                                                                                backend):
    kw = dict(crc_drop_rate=0.1) if mode != "packing" else {}
    want = run(make(data, mode, **kw), 2)
    first_len = len(make(data, mode, **kw))
    # every change in epoch 0, and the same steps into epoch 1 (its first step is first_len)
    at = sorted({s + d for s in BOUNDARIES for d in (-1, 0, 1)}
                | {first_len + s for s in (0, 1, 6)})
    if backend == "cuda":  # the simulator runs ~0.5 ms a thread: the whole run once, then
        same(run(make(data, mode, backend=backend, **kw), 2), want)  # a resume at each change
        at = BOUNDARIES
    for step in at:
        loader = make(data, mode, backend=backend, **kw)
        taken = 0
        for _ in range(2):
            for _ in loader:
                taken += 1
                if taken == step:
                    break
            if taken == step:
                break
        state = json.loads(json.dumps(loader.state_dict()))
        assert state["step"] == step
        loader.close()
        again = make(data, mode, backend=backend, **kw)
        again.load_state_dict(state)
        assert again.step == step
        got = run(again, 1, close=False)  # the rest of the state's epoch
        if state["epoch"] == 0 and backend == "cpu":
            got += run(again, 1, close=False)
        again.close()
        same(got, want[step: step + len(got)])
        assert step + len(got) == (first_len if state["epoch"] == 0 and backend == "cuda"
                                   else len(want))


@pytest.mark.parametrize("mode", MODES)
def test_ranks_agree_on_the_count_and_split_the_epoch_under_a_schedule(data, mode):
    world = 3
    loaders = [make(data, mode, rank=r, world_size=world) for r in range(world)]
    for epoch in range(2):
        counts = {len(x) for x in loaders}
        assert len(counts) == 1
        count = counts.pop()
        for loader in loaders:
            start = step = loader.step
            for batch in loader:
                key = "x" if mode == "packed" else "input_ids"
                assert batch[key].shape[1] == SEQ.at(step)
                step += 1
            assert step - start == count  # every rank delivers the count it agreed on
            assert loader.step == step
        assert len({loader.step for loader in loaders}) == 1


@pytest.mark.parametrize("mode", ["padded", "packed"])
def test_crc_drop_and_mixing_count_with_the_schedule(tmp_path, mode):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    write_shards(a, [encode_tokens(ramp(k, 5 + k % 17)) for k in range(90)])
    write_shards(b, [encode_tokens(ramp(500 + k, 3 + k % 11)) for k in range(70)])
    for kw in (dict(crc_drop_rate=0.2), dict(mix={"a": 0.7, "b": 0.3})):
        source = {"a": a, "b": b} if "mix" in kw else a
        loader = Loader(source, mode=mode, batch_size=BATCH, seq_len=SEQ, backend="cpu",
                        output="arrays", seed=2, manifest="ignore", **kw)
        for _ in range(2):
            n = len(loader)
            start = step = loader.step
            for batch in loader:
                x = batch["x" if mode == "packed" else "input_ids"]
                assert x.shape[1] == SEQ.at(step)
                step += 1
            assert step - start == n and loader.step == step


def test_a_state_records_its_schedules_and_what_cannot_be_exact_is_refused(data):
    """Another schedule goes on (the test below); another seed, mode or world size with one
    state cannot be exact and is refused by name."""
    loader = make(data, "packed", rank=0, world_size=2)
    it = iter(loader)
    for _ in range(6):
        next(it)
    state = loader.state_dict()
    loader.close()
    assert state["seq_len"] == SEQ.record() and state["batch_size"] == BATCH.record()
    assert state["step"] == 6
    with pytest.raises(LoaderStateError, match="seed=3, this loader 4"):
        make(data, "packed", rank=0, world_size=2, seed=4).load_state_dict(state)
    with pytest.raises(LoaderStateError, match="mode="):
        make(data, "padded", rank=0, world_size=2).load_state_dict(state)
    # packed, two ranks, one state: where the other rank stood is not known
    with pytest.raises(LoaderStateError, match="needs the states of all 2"):
        make(data, "packed", rank=0, world_size=2,
             seq_len=Schedule([(0, 8), (9, 16)])).load_state_dict(state)


def test_one_phase_is_todays_int_in_the_state(data):
    """A schedule of one phase is its value: the state (and a shared count's key) is the one
    an int makes, so states of today's runs resume."""
    plain = make(data, "packed", batch_size=2, seq_len=8)
    as_schedule = make(data, "packed", batch_size=Schedule([(0, 2)]), seq_len=Schedule([(0, 8)]))
    assert plain.state_dict() == as_schedule.state_dict()
    assert plain.state_dict()["seq_len"] == 8 and plain.batch_size == 2
    same(run(plain, 1), run(as_schedule, 1))


@pytest.mark.parametrize("mode", ["padded", "packing"])
def test_an_elastic_resume_across_a_boundary_delivers_the_rest_once_in_its_steps_shapes(
        data, mode):
    old = [make(data, mode, rank=r, world_size=2) for r in range(2)]
    its = [iter(x) for x in old]
    seen = []
    for _ in range(6):  # to step 6: past the first change, before the second
        for it in its:
            seen.extend(_tokens(host(next(it)), mode))
    states = [x.state_dict() for x in old]
    for x in old:
        x.close()
    new = [make(data, mode, rank=r, world_size=3) for r in range(3)]
    for x in new:
        x.load_state_dict(states)
        assert x.step == 6
    rest = []
    for x in new:
        step = 6
        for batch in x:
            b = host(batch)
            assert b["input_ids"].shape[1] == SEQ.at(step)
            step += 1
            rest.extend(_tokens(b, mode))
    assert not set(seen) & set(rest)  # nothing delivered twice across the resume


def _tokens(batch: dict, mode: str) -> list[int]:
    mask = batch["attention_mask"].astype(bool)
    return batch["input_ids"][mask].tolist()


def test_loader_step_batch_size_and_seq_len_follow_the_run(data):
    loader = make(data, "packing")
    assert (loader.step, loader.batch_size, loader.seq_len) == (0, 2, 8)
    it = iter(loader)
    for _ in range(8):
        next(it)
    assert (loader.step, loader.batch_size, loader.seq_len) == (8, 3, 16)
    assert ndp.Schedule is Schedule
    assert math.isfinite(loader.remaining) and loader.remaining == len(loader) - 8


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("mode", MODES)
def test_a_change_of_shape_allocates_no_output(data, mode, backend):
    """The ring's outputs are sized for the largest phase at their first chunk: every later
    shape is a view of the same memory (``Slot.generation`` counts reallocations)."""
    loader = make(data, mode, backend=backend)
    seen = set()
    for batch in loader:
        seen.add(batch["x" if mode == "packed" else "input_ids"].shape[1])
    loader.close()
    assert seen == set(SEQ.values)  # every phase's rows were built
    assert {slot.generation for slot in loader._ring.slots} <= {0, 1}
    assert loader.counters.held_chunks == 0


def test_the_schedules_guide_runs_as_written(tmp_path, monkeypatch):
    """docs/guides/schedules.md's recipes, in order, from an empty directory."""
    from pathlib import Path

    from ndp_test_helpers import markdown_blocks, run_markdown

    page = Path(__file__).resolve().parents[3] / "docs" / "guides" / "schedules.md"
    monkeypatch.chdir(tmp_path)
    blocks = markdown_blocks(page.read_text(encoding="utf-8"))
    assert len(blocks) >= 5
    run_markdown(blocks, {"__name__": "__docs__"}, "docs/guides/schedules.md")


@pytest.mark.parametrize("mode", MODES)
def test_a_state_loaded_into_another_schedule_goes_on_with_each_document_once(data, mode):
    """The plan changed by hand mid-epoch (another seq_len and batch_size schedule): the rest
    of the epoch in the new shapes from the state's step, no packet of the epoch delivered
    twice or left out (packed: the one a window was inside of is given again whole,
    counted), said in a warning and kept in the state."""
    def docs(batch):
        ids = batch["x"] if mode == "packed" else batch["input_ids"][
            batch["attention_mask"].astype(bool)]
        return set((np.asarray(ids).ravel() // 1000).tolist())

    first = make(data, mode, shuffle=False)
    n_all = len(first)
    it = iter(first)
    before = [host(next(it)) for _ in range(7)]
    state = first.state_dict()
    first.close()
    other = dict(batch_size=Schedule([(0, 4), (9, 2)]), seq_len=Schedule([(0, 12), (12, 6)]))
    again = make(data, mode, shuffle=False, **other)
    with pytest.warns(UserWarning, match="this state was made with batch_size=.*the rest of "
                                         "epoch 0 is shared out in this Loader's batches"):
        again.load_state_dict(state)
    assert again.step == 7
    after = []
    for batch in again:
        b = host(batch)
        assert b["x" if mode == "packed" else "input_ids"].shape[1] == other["seq_len"].at(
            again.step - 1)
        after.append(b)
    seen_before = set().union(*(docs(b) for b in before))
    seen_after = set().union(*(docs(b) for b in after))
    both = seen_before & seen_after
    if mode == "packed":  # the packet the last window was inside of, again whole
        assert len(both) <= 1 and again.stats.repeated <= 1
    else:
        assert not both
    if mode == "padded":  # every packet of the epoch, once (unshuffled, one rank)
        assert seen_before | seen_after == set(range(160))
    assert "elastic" in again.state_dict() or again.epoch == 1
    assert n_all > 7
