"""Mixing weights that change with the run's step (``mix=ndp.Schedule(...)``,
``ndp.loader.ordering.mix_schedule``): the realised mix of each step follows the schedule, held or
interpolated, within a binomial tolerance; a resume at a change and a step either side gives
the uninterrupted run; ranks agree on the count; a bad phase is refused by name.

RAMP data: two sources, "web" (packets 0..) and "code" (packets 5000..): a token names its
source.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ndp.errors import ConfigError, LoaderStateError
from ndp.loader.loader import Loader
from ndp.loader.planning.schedule import Schedule
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp, write_shards

MODES = ["padded", "packed", "packing"]
CHANGE = 40
HELD = Schedule([(0, {"web": 0.9, "code": 0.1}), (CHANGE, {"web": 0.2, "code": 0.8})])
LINEAR = Schedule([(0, {"web": 1.0, "code": 0.0}), (100, {"web": 0.0, "code": 1.0})],
                  interpolate="linear")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    base = tmp_path_factory.mktemp("mix")
    out = {}
    for name, first in (("web", 0), ("code", 5000)):
        d = base / name
        d.mkdir()
        lengths = np.random.default_rng(first).integers(3, 10, 700).tolist()
        write_shards(d, [encode_tokens(ramp(first + k, n)) for k, n in enumerate(lengths)])
        out[name] = d
    return out


def make(sources, mode, mix=HELD, **kw) -> Loader:
    kw.setdefault("backend", "cpu")
    kw.setdefault("seed", 1)
    return Loader(sources, mode=mode, batch_size=4, seq_len=8, mix=mix,
                  output="arrays", manifest="ignore", **kw)


def per_step(loader: Loader) -> list[dict[str, int]]:
    """Packets of each source each step delivered, from the Loader's own counts."""
    out, before = [], {}
    for _ in loader:
        now = dict(loader.stats.sources)
        out.append({k: now.get(k, 0) - before.get(k, 0) for k in ("web", "code")})
        before = now
    return out


def web_share(steps: list[dict[str, int]]) -> tuple[float, int]:
    web, code = sum(s["web"] for s in steps), sum(s["code"] for s in steps)
    return web / (web + code), web + code


def near(share: float, n: int, p: float) -> bool:
    """Within 4 binomial standard deviations (and 0.02) of ``p``."""
    return abs(share - p) <= 4 * math.sqrt(p * (1 - p) / n) + 0.02


@pytest.mark.parametrize("mode", MODES)
def test_the_realised_mix_of_each_phase_follows_a_held_schedule(sources, mode):
    steps = per_step(make(sources, mode))
    assert len(steps) > CHANGE + 20
    before, n0 = web_share(steps[:CHANGE])
    after, n1 = web_share(steps[CHANGE:])
    assert near(before, n0, 0.9) and near(after, n1, 0.2), (before, after)


@pytest.mark.parametrize("mode", MODES)
def test_the_realised_mix_follows_a_linear_schedule_step_by_step(sources, mode):
    steps = per_step(make(sources, mode, mix=LINEAR, mix_size=1000))
    for a in range(0, 100, 20):  # windows of 20 steps: their mean weight is the middle's
        share, n = web_share(steps[a:a + 20])
        assert near(share, n, 1.0 - (a + 9.5) / 100), (a, share)
    late, n = web_share(steps[100:])
    assert late == 0.0 and n > 0  # held at the last phase


def test_a_resume_at_the_change_and_either_side_gives_the_uninterrupted_run(sources):
    want = [{k: v.copy() for k, v in b.items()} for b in make(sources, "packed")]
    for step in (CHANGE - 1, CHANGE, CHANGE + 1):
        loader = make(sources, "packed")
        it = iter(loader)
        for _ in range(step):
            next(it)
        state = json.loads(json.dumps(loader.state_dict()))
        loader.close()
        again = make(sources, "packed")
        again.load_state_dict(state)
        got = [{k: v.copy() for k, v in b.items()} for b in again]
        again.close()
        assert len(got) == len(want) - step
        for a, b in zip(got, want[step:]):
            assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("mode", MODES)
def test_the_simulator_gives_the_cpus_batches_under_a_mix_schedule(sources, mode):
    cpu = [{k: np.array(v) for k, v in b.items()} for b in make(sources, mode, mix_size=60)]
    sim = make(sources, mode, backend="cuda", mix_size=60)
    got = [{k: np.array(v.copy_to_host()) for k, v in b.items()} for b in sim]
    sim.close()
    assert len(got) == len(cpu) > 0
    for a, b in zip(got, cpu):
        assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("mode", MODES)
def test_ranks_agree_on_the_count_under_a_mix_schedule(sources, mode):
    loaders = [make(sources, mode, rank=r, world_size=2) for r in range(2)]
    for _ in range(2):
        n = {len(x) for x in loaders}
        assert len(n) == 1
        assert [sum(1 for _ in x) for x in loaders] == [n.pop()] * 2


@pytest.mark.parametrize("mix,match", [
    (Schedule([(0, {"web": 1, "code": 1}), (5, {"web": 1, "docs": 1})]),
     r"mix phase 1 \(from step 5\) names 'docs'"),
    (Schedule([(0, {"web": 1, "code": 1}), (5, {"web": 1})]),
     r"mix phase 1 \(from step 5\) gives no weight to \['code'\]"),
    (Schedule([(0, {"web": 1, "code": 1}), (5, {"web": -1, "code": 1})]),
     r"mix phase 1 .* weight of 'web' must be a finite number >= 0"),
    (Schedule([(0, {"web": 1, "code": 1}), (5, {"web": math.nan, "code": 1})]),
     r"mix phase 1 .* weight of 'web' must be a finite number"),
    (Schedule([(0, {"web": 1, "code": 1}), (5, {"web": 0, "code": 0})]),
     "positive sum"),
    (Schedule([(0, {"web": 1, "code": 1}), (5, 0.5)]), r"mix phase 1 .* is 0.5"),
])
def test_a_bad_mix_phase_is_refused_by_name(sources, mix, match):
    with pytest.raises(ConfigError, match=match):
        make(sources, "padded", mix=mix)


def test_longest_is_refused_with_a_mix_schedule(sources):
    with pytest.raises(ConfigError, match="mix_size='longest' with a mix schedule"):
        make(sources, "padded", mix_size="longest")


def test_a_state_records_the_mix_schedule_and_another_goes_on_from_it(sources):
    loader = make(sources, "padded")
    state = loader.state_dict()
    assert state["mix"]["phases"][1][0] == CHANGE and state["mix"]["interpolate"] == "step"
    other = make(sources, "padded", mix=LINEAR)  # the mix changed by hand: test_mix_change
    with pytest.warns(UserWarning, match="mix="):
        other.load_state_dict(state)
    assert other.state_dict()["elastic"]["mix"] == state["mix"]
    seeded = make(sources, "padded", mix=LINEAR, **{"seed": 2})  # what cannot be exact
    with pytest.raises(LoaderStateError, match="seed=1"):
        seeded.load_state_dict(state)
    # one phase is a plain dict: today's states
    plain = make(sources, "padded", mix={"web": 0.5, "code": 0.5})
    one = make(sources, "padded", mix=Schedule([(0, {"web": 0.5, "code": 0.5})]))
    assert plain.state_dict() == one.state_dict()
