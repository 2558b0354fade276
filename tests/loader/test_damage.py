"""Random damage to what surrounds the packets (indexes, manifests, resume states), one
invariant: every batch the Loader delivers is the batch it delivers from the intact dataset, or
the damage is counted or refused with a named error (ndp.errors). Never anything else.
"""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings, strategies as st

from ndp.errors import NDPError
from ndp.loader.loader import Loader

from ndp_test_helpers import ramp_specs, write_shards

LENGTHS = [int(x) for x in np.random.default_rng(5).integers(1, 40, 60)]
MODES = ("padded", "packed", "packing")
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def intact(tmp_path_factory):
    """60 ramp packets in 3 shards, and every mode's batches over two epochs from them."""
    d = tmp_path_factory.mktemp("intact")
    packets = [s.encode() for s in ramp_specs(LENGTHS, masked=[k % 3 == 0 for k in range(60)])]
    for i in range(3):
        write_shards(d, packets[20 * i: 20 * (i + 1)], prefix=f"s{i}")
    return d, {mode: epochs(make(d, mode)) for mode in MODES}


def make(d, mode, **kw) -> Loader:
    return Loader(d, mode=mode, batch_size=3, seq_len=16, backend="cpu", output="arrays",
                  seed=4, prefetch=0, **kw)


def epochs(loader: Loader, n: int = 2) -> list[dict]:
    out = []
    for _ in range(n):
        out += [{k: np.array(v) for k, v in b.items()} for b in loader]
    loader.close()
    return out


def same(a: list[dict], b: list[dict]) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


def outcome(build) -> list[dict] | None:
    """The batches of ``build()``'s loader, or None if it was refused with a named error."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # a rebuilt index warns; what it delivers counts
            got = epochs(build())
        event("delivered, with a warning" if caught else "delivered")
        return got
    except NDPError as exc:
        event(f"refused: {type(exc).__name__}")
        return None


def copy(intact_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("damaged")
    shutil.rmtree(d)
    shutil.copytree(intact_dir, d)
    return d


@SETTINGS
@given(shard=st.integers(0, 2), edits=st.lists(
    st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=4),
    mode=st.sampled_from(MODES), verify=st.sampled_from(["size", "full"]))
def test_a_damaged_index_is_rebuilt_or_refused_never_believed(intact, tmp_path_factory, shard,
                                                              edits, mode, verify):
    src, reference = intact
    d = copy(src, tmp_path_factory)
    idx = sorted(d.glob("*.ndp.idx"))[shard]
    raw = bytearray(idx.read_bytes())
    for at, xor in edits:
        raw[at % len(raw)] ^= xor
    idx.write_bytes(bytes(raw))
    got = outcome(lambda: make(d, mode, verify=verify))
    assert got is None or same(got, reference[mode])


@SETTINGS
@given(cut=st.integers(0, 400), mode=st.sampled_from(MODES))
def test_a_cut_index_is_rebuilt_or_refused(intact, tmp_path_factory, cut, mode):
    src, reference = intact
    d = copy(src, tmp_path_factory)
    idx = sorted(d.glob("*.ndp.idx"))[1]
    idx.write_bytes(idx.read_bytes()[:cut])
    got = outcome(lambda: make(d, mode))
    assert got is None or same(got, reference[mode])


@SETTINGS
@given(data=st.data(), mode=st.sampled_from(MODES))
def test_a_damaged_manifest_is_refused_or_harmless(intact, tmp_path_factory, data, mode):
    src, reference = intact
    d = copy(src, tmp_path_factory)
    manifest = json.loads((d / "ndp.json").read_text())
    entries = manifest["shards"]
    kind = data.draw(st.sampled_from(["drop", "size", "crc", "name", "bytes", "extra"]))
    k = data.draw(st.integers(0, len(entries) - 1))
    if kind == "drop":
        del entries[k]
    elif kind == "size":
        entries[k]["bytes"] += data.draw(st.integers(-100, 100).filter(bool))
    elif kind == "crc":
        entries[k]["crc32"] ^= data.draw(st.integers(1, 2**32 - 1))
    elif kind == "name":
        entries[k]["name"] = data.draw(st.sampled_from(["x.ndp", "../s0-00000.ndp", ""]))
    elif kind == "extra":
        entries.append(dict(entries[k], name="more-00000.ndp"))
    text = json.dumps(manifest)
    if kind == "bytes":
        at = data.draw(st.integers(0, len(text) - 1))
        text = text[:at] + data.draw(st.sampled_from(["", "}", "\x00", "9"])) + text[at + 1:]
    (d / "ndp.json").write_text(text)
    got = outcome(lambda: make(d, mode))
    assert got is None or same(got, reference[mode])
    if kind in ("drop", "size", "name", "extra"):
        assert got is None  # not the dataset the manifest lists: refused


def take(loader: Loader, n: int) -> list[dict]:
    """``n`` batches from where ``loader`` is, across epochs (fewer if an epoch is empty)."""
    out: list[dict] = []
    while len(out) < n:
        before = len(out)
        for batch in loader:
            out.append({k: np.array(v) for k, v in batch.items()})
            if len(out) == n:
                break
        if len(out) == before:
            break
    return out


@SETTINGS
@given(data=st.data(), mode=st.sampled_from(MODES), world=st.sampled_from([1, 2]))
def test_a_damaged_state_resumes_exactly_or_is_refused(intact, data, mode, world):
    src, _ = intact
    full = epochs(make(src, mode, rank=0, world_size=world), 2)
    cut = data.draw(st.integers(0, len(full)))
    first = make(src, mode, rank=0, world_size=world)
    head = take(first, cut)
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    key = data.draw(st.sampled_from(sorted(state)))
    value = data.draw(st.one_of(st.integers(-10, 10**6), st.none(), st.text(max_size=3),
                                st.booleans(), st.floats(allow_nan=False)))
    resumed = make(src, mode, rank=0, world_size=world)
    try:
        resumed.load_state_dict(dict(state, **{key: value}))
    except NDPError as exc:
        event(f"refused: {type(exc).__name__}")
        return  # refused with a named error
    event("accepted")
    # accepted: the damage left the state as it was
    assert same(head + take(resumed, len(full) - cut), full)
    resumed.close()
