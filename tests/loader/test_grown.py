"""A dataset that grew under a saved state (``ndp.store.growth``, ``ndp.loader.states.resume``): a
state made before shards were appended resumes exactly, its epoch over the shards it began
with, and the new shards join at the next epoch (the Loader says so); a source added last to
a mix joins the same way; a shard removed or rewritten under a state is refused by name.

RAMP data: packet ``k`` holds ``1000 k + i``, so a token names its packet.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from ndp.errors import LoaderStateError
from ndp.loader.loader import Loader
from ndp.store.writer import ShardWriter
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp

MODES = ["padded", "packed", "packing"]
PER_SHARD = 60
STOP = 5


def append(directory, shards: int, *, first: int) -> None:
    """``shards`` shards of ramp packets after shard ``first - 1``, committed one by one."""
    for s in range(first, first + shards):
        with ShardWriter(directory, first=s) as writer:
            for k in range(s * PER_SHARD, (s + 1) * PER_SHARD):
                writer.write(encode_tokens(ramp(k, 3 + (k * 7) % 11)))


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "data"
    append(d, 3, first=0)
    return d


def make(data, mode, **kw) -> Loader:
    kw.setdefault("backend", "cpu")
    return Loader(data, mode=mode, batch_size=3, seq_len=16, seed=2, output="arrays", **kw)


def host(batch: dict) -> dict:
    return {k: np.array(v if isinstance(v, np.ndarray) else v.copy_to_host())
            for k, v in batch.items()}


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b))


def saved(loader: Loader, n: int) -> dict:
    it = iter(loader)
    for _ in range(n):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    return state


def packets(batches: list[dict], mode: str) -> set[int]:
    key = "x" if mode == "packed" else "input_ids"
    return {int(t) // 1000 for b in batches for t in b[key].ravel() if t > 0}


@pytest.mark.parametrize("mode", MODES)
def test_a_state_from_before_an_append_goes_on_exactly_and_the_new_shards_join_next_epoch(
        data, mode):
    whole = make(data, mode)
    want = [host(b) for b in whole]  # epoch 0 on the three shards, uninterrupted
    state = saved(make(data, mode), STOP)
    append(data, 2, first=3)
    grown = make(data, mode)
    with pytest.warns(UserWarning, match=r"first 3 of the 5 shards .* 2 shards \(120 packets\) "
                                         r"were added .* the new ones join at epoch 1"):
        grown.load_state_dict(state)
    assert len(grown) == len(want)  # this epoch's count: the shards it began with
    rest = [host(b) for b in grown]
    assert same(rest, want[STOP:])
    after = [host(b) for b in grown]  # epoch 1: the new run's own, with the new shards
    fresh = make(data, mode)
    [host(b) for b in fresh]
    assert same(after, [host(b) for b in fresh])
    assert packets(after, mode) & set(range(180, 300))


@pytest.mark.parametrize("mode", MODES)
def test_a_state_saved_in_the_epoch_that_began_before_the_append_resumes_exactly(data, mode):
    state = saved(make(data, mode), STOP)
    append(data, 1, first=3)
    grown = make(data, mode)
    with pytest.warns(UserWarning, match="first 3 of the 4 shards"):
        grown.load_state_dict(state)
    middle = saved(grown, 2)
    assert middle["fingerprint"] == state["fingerprint"]  # the dataset the epoch reads
    grown = make(data, mode)
    with pytest.warns(UserWarning, match="first 3 of the 4 shards"):
        grown.load_state_dict(state)
    want = [host(b) for b in grown][2:]
    again = make(data, mode)
    with pytest.warns(UserWarning, match="first 3 of the 4 shards"):
        again.load_state_dict(middle)
    assert same([host(b) for b in again], want)


def test_each_rank_resumes_its_own_packed_state_after_an_append(data):
    states = [saved(make(data, "packed", rank=r, world_size=2), STOP) for r in range(2)]
    wants = [[host(b) for b in make(data, "packed", rank=r, world_size=2)][STOP:]
             for r in range(2)]
    append(data, 2, first=3)
    for r in range(2):
        grown = make(data, "packed", rank=r, world_size=2)
        with pytest.warns(UserWarning, match="first 3 of the 5"):
            grown.load_state_dict(states[r])
        assert same([host(b) for b in grown], wants[r])


def test_a_source_added_last_to_a_mix_joins_at_the_next_epoch(tmp_path):
    web, code = tmp_path / "web", tmp_path / "code"
    append(web, 2, first=0)
    with ShardWriter(code) as writer:
        for k in range(5000, 5000 + PER_SHARD):
            writer.write(encode_tokens(ramp(k, 5)))
    old = Loader({"web": web}, mode="padded", batch_size=3, seq_len=16, seed=2,
                 output="arrays", mix={"web": 1.0}, backend="cpu")
    before = [host(b) for b in old][:STOP]
    state = saved(Loader({"web": web}, mode="padded", batch_size=3, seq_len=16, seed=2,
                         output="arrays", mix={"web": 1.0}, backend="cpu"), STOP)
    both = Loader({"web": web, "code": code}, mode="padded", batch_size=3, seq_len=16, seed=2,
                  output="arrays", mix={"web": 0.5, "code": 0.5}, backend="cpu")
    with pytest.warns(UserWarning) as said:
        both.load_state_dict(state)
    said = " ".join(str(w.message) for w in said)
    assert "first 2 of the 3 shards" in said and "mix={'web': 1}" in said
    rest = [host(b) for b in both]
    assert not packets(rest, "padded") & set(range(5000, 5100))  # epoch 0: web's shards
    assert not packets(before, "padded") & packets(rest, "padded")  # and none twice
    assert packets(before + rest, "padded") == set(range(2 * PER_SHARD))
    after = [host(b) for b in both]
    assert packets(after, "padded") & set(range(5000, 5100))  # epoch 1 mixes in "code"


@pytest.mark.parametrize("change", ["removed", "rewritten"])
def test_a_shard_removed_or_rewritten_under_a_state_is_refused_by_name(data, change):
    state = saved(make(data, "padded"), STOP)
    if change == "removed":
        for suffix in ("", ".idx"):
            (data / f"shard-00001.ndp{suffix}").unlink()
    else:
        shutil.rmtree(data)
        append(data, 1, first=0)
        with ShardWriter(data, first=1) as writer:  # shard 1 with other packets
            for k in range(900, 900 + PER_SHARD):
                writer.write(encode_tokens(ramp(k, 4)))
        append(data, 1, first=2)
    loader = make(data, "padded", manifest="ignore")
    with pytest.raises(LoaderStateError, match="removed, renamed or rewritten"):
        loader.load_state_dict(state)


def test_the_simulator_gives_the_cpus_batches_after_an_append(data):
    state = saved(make(data, "packing"), STOP)
    append(data, 1, first=3)
    out = []
    for backend in ("cpu", "cuda"):
        loader = make(data, "packing", backend=backend)
        with pytest.warns(UserWarning):
            loader.load_state_dict(state)
        out.append([host(b) for b in loader])
        loader.close()
    assert len(out[0]) > 0 and same(*out)


def test_closing_a_loader_resumed_on_a_grown_dataset_leaves_no_plan_thread(data,
                                                                          monkeypatch):
    """The epoch begun before the append is planned (and counted, on its own thread) by the
    plan of the dataset as it was: closing the Loader stops that thread too."""
    import threading

    import ndp.loader.planning.count as count_module
    from ndp.loader.planning.epoch import Stopped

    monkeypatch.setenv("NDP_COUNT_CACHE", "off")  # counted here, not found written
    state = saved(make(data, "packed"), STOP)
    append(data, 1, first=3)
    gate, real = threading.Event(), count_module.count_pass

    def held(*args, **kwargs):  # a long count: it ends when told to stop
        out = real(*args, **kwargs)
        stop = kwargs.get("stop")
        while not gate.wait(0.01):
            if stop is not None and stop():
                raise Stopped("the count was stopped")  # as a real pass is, part way
        return out

    monkeypatch.setattr(count_module, "count_pass", held)
    grown = make(data, "packed")
    with pytest.warns(UserWarning, match="first 3 of the 4 shards"):
        grown.load_state_dict(state)
    try:
        loop = iter(grown)
        next(loop)
        assert [t for t in threading.enumerate() if t.name == "ndp-plan"]  # counting
        grown.close()
        assert not [t for t in threading.enumerate() if t.name == "ndp-plan" and t.is_alive()]
    finally:
        gate.set()
