"""The mix changed by hand mid-epoch (``ndp.loader.states.elastic``, ``Remainder.remix``): a state
loaded into a Loader made with other weights, another mix schedule or another ``mix_size``
goes on in the same epoch, delivering none of what the epoch already delivered, mixed by the
new weights; the change is recorded in the state, so resumes during the rest are exact, and a
second change composes with the first.

RAMP data: two sources, "web" (packets 0..) and "code" (packets 5000..); ramp ids are unique
(1000 * packet + position), so a token delivered twice is a packet delivered twice.
"""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest

from ndp.errors import LoaderStateError
from ndp.loader.loader import Loader
from ndp.loader.planning.schedule import Schedule
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp, write_shards

MODES = ["padded", "packed", "packing"]
OLD = {"web": 0.8, "code": 0.2}
NEW = {"web": 0.2, "code": 0.8}
STOP = 10  # batches the first run delivers


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    base = tmp_path_factory.mktemp("mixchange")
    out = {}
    for name, first in (("web", 0), ("code", 5000)):
        d = base / name
        d.mkdir()
        lengths = np.random.default_rng(first).integers(3, 10, 300).tolist()
        write_shards(d, [encode_tokens(ramp(first + k, n)) for k, n in enumerate(lengths)])
        out[name] = d
    return out


def make(sources, mode, mix, **kw) -> Loader:
    kw.setdefault("backend", "cpu")
    return Loader(sources, mode=mode, batch_size=4, seq_len=10, mix=mix, seed=3,
                  output="arrays", manifest="ignore", **kw)


def tokens(batch: dict, mode: str) -> list[int]:
    if mode == "packed":
        return np.asarray(batch["x"]).ravel().tolist()
    ids, attn = np.asarray(batch["input_ids"]), np.asarray(batch["attention_mask"])
    return ids[attn.astype(bool)].tolist()


def take(loader: Loader, mode: str, n: int | None = None) -> list[list[int]]:
    """The tokens of each batch of the loader's next epoch (its first ``n`` batches)."""
    out = []
    for k, batch in enumerate(loader):
        out.append(tokens(batch, mode))
        if n is not None and k + 1 == n:
            break
    return out


def stopped(sources, mode, mix=OLD, n=STOP, **kw) -> tuple[list[int], dict]:
    """The tokens of a run's first ``n`` batches and its state there (through JSON)."""
    loader = make(sources, mode, mix, **kw)
    before = [t for b in take(loader, mode, n) for t in b]
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    return before, state


def code_share(tokens_: list[int]) -> tuple[float, int]:
    """The share of a run's packets from "code" (packets 5000..)."""
    packets = {t // 1000 for t in tokens_}
    return sum(p >= 5000 for p in packets) / max(1, len(packets)), len(packets)


def twice(got: Counter) -> int:
    return sum(c - 1 for c in got.values() if c > 1)


@pytest.mark.parametrize("mode", MODES)
def test_a_state_resumed_with_other_weights_delivers_nothing_twice_and_mixes_anew(sources,
                                                                                 mode):
    before, state = stopped(sources, mode)
    loader = make(sources, mode, NEW)
    with pytest.warns(UserWarning, match=r"mix=\{'code': 0.2, 'web': 0.8\}.*mixed by its "
                                          r"weights"):
        loader.load_state_dict(state)
    promised = len(loader)
    after = take(loader, mode)
    assert len(after) == promised == loader.stats.batches
    flat = [t for b in after for t in b]
    got = Counter(before + flat)
    if mode == "packed":  # the packet the old run was inside of, given again whole
        assert loader.stats.repeated <= 1 and twice(got) <= 9 * loader.stats.repeated
    else:
        assert twice(got) == 0 and loader.stats.repeated == 0
    share, n = code_share(flat)  # the new weights, within 4 binomial deviations
    assert n > 50 and abs(share - 0.8) <= 4 * math.sqrt(0.16 / n) + 0.02, (share, n)
    old_share, _ = code_share(before)
    assert old_share < 0.5  # the first run really mixed by the old weights


@pytest.mark.parametrize("mode", MODES)
def test_a_state_saved_during_the_remixed_rest_resumes_exactly(sources, mode):
    _, state = stopped(sources, mode)
    first = make(sources, mode, NEW)
    with pytest.warns(UserWarning, match="mix="):
        first.load_state_dict(state)
    it = iter(first)
    for _ in range(3):
        next(it)
    middle = json.loads(json.dumps(first.state_dict()))
    assert middle["elastic"]["mix"] == [["code", 0.2], ["web", 0.8]]  # the change, recorded
    want = [tokens(b, mode) for b in it]
    first.close()
    again = make(sources, mode, NEW)
    again.load_state_dict(middle)  # the same settings: no warning, the same rest
    assert take(again, mode) == want


@pytest.mark.parametrize("mode", ["padded", "packing"])
def test_a_second_change_within_the_rest_composes_with_the_first(sources, mode):
    before, state = stopped(sources, mode)
    second = make(sources, mode, NEW)
    with pytest.warns(UserWarning):
        second.load_state_dict(state)
    middle_part = [t for b in take(second, mode, 4) for t in b]
    middle = json.loads(json.dumps(second.state_dict()))
    second.close()
    third = make(sources, mode, Schedule([(0, {"web": 0.5, "code": 0.5}),
                                          (STOP + 8, {"web": 0.0, "code": 1.0})]))
    with pytest.warns(UserWarning, match="mix="):
        third.load_state_dict(middle)
    it = iter(third)
    rest = tokens(next(it), mode)
    record = third.state_dict()["elastic"]  # the mixes changed from, the latest first
    assert record["mix"] == [["code", 0.8], ["web", 0.2]]
    assert record["previous"]["mix"] == [["code", 0.2], ["web", 0.8]]
    rest += [t for b in it for t in tokens(b, mode)]
    assert twice(Counter(before + middle_part + rest)) == 0


def test_each_rank_resumes_its_own_state_with_other_weights(sources):
    runs = [stopped(sources, "padded", rank=r, world_size=2) for r in range(2)]
    news = [make(sources, "padded", NEW, rank=r, world_size=2) for r in range(2)]
    for loader, (_, state) in zip(news, runs):
        with pytest.warns(UserWarning, match="mix="):
            loader.load_state_dict(state)
    assert len({len(x) for x in news}) == 1  # every rank delivers as many batches
    after = [t for x in news for b in take(x, "padded") for t in b]
    assert twice(Counter([t for before, _ in runs for t in before] + after)) == 0


def test_another_mix_size_goes_on_with_the_epoch_the_new_size_leaves(sources):
    before, state = stopped(sources, "padded", mix_size=200)
    loader = make(sources, "padded", NEW, mix_size=120)
    with pytest.warns(UserWarning, match="mix_size=200"):
        loader.load_state_dict(state)
    after = [t for b in take(loader, "padded") for t in b]
    # 120 places an epoch, STOP batches of 4 delivered: 80 to go (repeats counted, none here)
    assert len({t // 1000 for t in after}) == 120 - 4 * STOP
    assert twice(Counter(before + after)) == 0


def test_the_simulator_gives_the_cpus_batches_after_a_mix_change(sources):
    _, state = stopped(sources, "packing", n=3, mix_size=40)
    out = []
    for backend in ("cpu", "cuda"):
        loader = make(sources, "packing", NEW, backend=backend, mix_size=40)
        with pytest.warns(UserWarning):
            loader.load_state_dict(state)
        out.append([{k: np.array(v if backend == "cpu" else v.copy_to_host())
                     for k, v in b.items()} for b in loader])
        loader.close()
    cpu, sim = out
    assert len(cpu) == len(sim) > 0
    for a, b in zip(cpu, sim):
        assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("mix", ["web", [["web"]], {"phases": 3}, [["docs", 1.0]]])
def test_a_state_whose_mix_is_not_one_is_refused_by_name(sources, mix):
    _, state = stopped(sources, "padded", n=2)
    state = {**{k: v for k, v in state.items() if k != "check"}, "mix": mix}  # edited
    loader = make(sources, "padded", NEW)
    with pytest.warns(UserWarning), pytest.raises(LoaderStateError, match="mix"):
        loader.load_state_dict(state)


def test_a_resume_plans_its_epoch_once(sources, monkeypatch):
    """Checking a state plans its epoch; the Loader goes on with that plan rather than making
    it again for the first batch (half a minute of a mixed epoch at 1e8 packets)."""
    import ndp.loader.ordering.whole as whole

    _, state = stopped(sources, "padded", mix=NEW)
    built = []
    real = whole._every
    monkeypatch.setattr(whole, "_every", lambda *a: built.append(a[1]) or real(*a))
    loader = make(sources, "padded", NEW)
    loader.load_state_dict(state)
    next(iter(loader))
    assert built.count(0) == 1  # epoch 0, built once (epoch 1 is planned ahead)
    loader.close()
