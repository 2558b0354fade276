"""``max_steps``: the run's end. A loop stops at it (mid-epoch or at an epoch's end), ``len``
and ``remaining`` count to it, a loop started past it is refused by name, a saved state resumes
into a longer run, and a schedule's phase at or past it is refused naming the phase (issue 35:
a phase past the run's end would never be used).

RAMP data: packet k holds tokens k*1000 + arange(n), so a token names its packet and place.
"""

from __future__ import annotations

import numpy as np
import pytest

from ndp.errors import ConfigError, LoaderUsageError
from ndp.loader.loader import Loader
from ndp.loader.planning.schedule import Schedule

from ndp_test_helpers import ramp_specs, write_shards

MODES = ["padded", "packed", "packing"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("max-steps")
    lengths = [int(x) for x in np.random.default_rng(2).integers(1, 25, 90)]
    write_shards(d, [s.encode() for s in ramp_specs(lengths)])
    return d


def make(data, mode, **kw) -> Loader:
    kw.setdefault("batch_size", 2)
    kw.setdefault("seq_len", 24)
    return Loader(data, mode=mode, output="arrays", seed=4, backend="cpu", chunk_batches=3,
                  **kw)


def flat(batches: list[dict]) -> list[np.ndarray]:
    return [np.concatenate([np.asarray(v).ravel() for _, v in sorted(b.items())])
            for b in batches]


def epochs_of(loader: Loader) -> list[list[dict]]:
    """Every epoch's batches until the run ends (a loop over epochs that asks ``step``)."""
    out = []
    while loader.max_steps is None or loader.step < loader.max_steps:
        out.append([{k: np.array(v) for k, v in b.items()} for b in loader])
    return out


@pytest.mark.parametrize("mode", MODES)
def test_a_run_ends_at_its_step_mid_epoch_with_the_batches_of_the_unbounded_run(data, mode):
    with make(data, mode) as free:
        first = len(free)
        whole = [{k: np.array(v) for k, v in b.items()} for b in free]
        whole += [{k: np.array(v) for k, v in b.items()} for b in free]
    end = first + first // 2  # half way through the second epoch
    with make(data, mode, max_steps=end) as bounded:
        assert len(bounded) == first and bounded.remaining == first
        got = epochs_of(bounded)
        assert [len(e) for e in got] == [first, end - first]
        assert bounded.step == end and bounded.epoch == 1
        assert len(bounded) == end - first and bounded.remaining == 0
        for a, b in zip(flat(got[0] + got[1]), flat(whole[:end])):
            np.testing.assert_array_equal(a, b)
        with pytest.raises(LoaderUsageError, match=rf"ended at step {end} \(max_steps"):
            next(iter(bounded))
        state = bounded.state_dict()
    with make(data, mode, max_steps=end + 2) as longer:  # the run made longer goes on
        longer.load_state_dict(state)
        assert longer.remaining == 2
        rest = [{k: np.array(v) for k, v in b.items()} for b in longer]
        for a, b in zip(flat(rest), flat(whole[end:end + 2])):
            np.testing.assert_array_equal(a, b)


def test_a_run_that_ends_with_an_epoch_ends_there(data):
    with make(data, "packed") as free:
        first = len(free)
    with make(data, "packed", max_steps=first) as bounded:
        got = epochs_of(bounded)
        assert [len(e) for e in got] == [first] and bounded.step == first
        assert bounded.epoch == 1 and len(bounded) == 0 and bounded.remaining == 0


@pytest.mark.parametrize("option,value,match", [
    ("seq_len", Schedule([(0, 8), (20, 16)]), r"seq_len phase 1 \(from step 20\) begins at or "
                                             r"after the run's end \(max_steps=20\)"),
    ("batch_size", Schedule([(0, 2), (5, 3), (25, 1)]), r"batch_size phase 2 \(from step 25\)"),
])
def test_a_phase_past_the_runs_end_is_refused_naming_it(data, option, value, match):
    with pytest.raises(ConfigError, match=match):
        make(data, "packed", max_steps=20, **{option: value})
    make(data, "packed", max_steps=26, **{option: value}).close()  # within the run: taken


def test_a_mix_phase_past_the_runs_end_is_refused(tmp_path):
    for name in ("a", "b"):
        write_shards(tmp_path / name, [s.encode() for s in ramp_specs([5] * 20)])
    mix = Schedule([(0, {"a": 0.5, "b": 0.5}), (100, {"a": 0.9, "b": 0.1})])
    with pytest.raises(ConfigError, match=r"mix phase 1 \(from step 100\) begins at or after"):
        Loader({"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}, mix=mix, mode="packed",
               batch_size=2, seq_len=4, output="arrays", backend="cpu", max_steps=50)


@pytest.mark.parametrize("value", [0, -3, 2.5, True, "10"])
def test_max_steps_must_be_a_positive_int(data, value):
    with pytest.raises(ConfigError, match="max_steps"):
        make(data, "packed", max_steps=value)
