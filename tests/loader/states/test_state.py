"""Resume states are checked field by field (ndp.loader.states.state): a damaged state, one from another
dataset or configuration, or positions outside its epoch are refused with a LoaderStateError that
names the field; a sound one resumes exactly (tests/loader/test_loader.py,
tests/loader/pipeline/test_chunks.py)."""

from __future__ import annotations

import json
import shutil
import warnings

import pytest

from ndp.errors import ConfigError, LoaderStateError
from ndp.loader.loader import Loader
from ndp.loader.states.state import seal

from ndp_test_helpers import ramp_specs, write_shards


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    d = tmp_path_factory.mktemp("state")
    packets = [s.encode() for s in ramp_specs([5 + k % 7 for k in range(30)])]
    write_shards(d, packets[:14], prefix="a")
    write_shards(d, packets[14:], prefix="b")
    return d


def make(path, **kw) -> Loader:
    kw.setdefault("batch_size", 3)
    kw.setdefault("seq_len", 4)
    return Loader(path, backend="cpu", output="arrays", seed=2, **kw)


def midway(path, mode="packed", **kw) -> dict:
    loader = make(path, mode=mode, **kw)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(loader.state_dict()))
    loader.close()
    return state


@pytest.mark.parametrize("field,value,match", [
    ("pos", -5, "outside epoch"),
    ("pos", 10**9, "outside epoch"),
    ("tok", -1, "token offset"),
    ("tok", 10**6, "past the end of packet"),
    ("epoch", -1, "negative"),
    ("batch", 10**6, "batch .* outside epoch"),
    ("batch", -1, "batch .* outside epoch"),
    ("epoch", "1", "integer"),
    ("pos", 2.5, "integer"),
    ("pos", True, "integer"),
    ("fingerprint", "0123456789abcdef", "made on dataset"),
    ("version", 7, "version"),
    ("seed", 99, "seed"),
    ("crc_drop_rate", 0.5, "crc_drop_rate"),
])
def test_a_wrong_field_is_refused_and_named(dataset, field, value, match):
    """Each field is checked on its own, also in a state whose 'check' was recomputed."""
    state = midway(dataset)
    state[field] = value
    loader = make(dataset, mode="packed")
    with pytest.raises(LoaderStateError, match="damaged.*'check'" if field != "version"
                       else match):
        loader.load_state_dict(state)  # as damaged in storage: its check no longer matches
    with pytest.raises(LoaderStateError, match=match):
        loader.load_state_dict(seal(state))
    assert isinstance(LoaderStateError("x"), ConfigError)
    assert loader.state_dict()["pos"] == 0  # nothing was taken from the refused state


def test_a_token_offset_outside_packed_mode_is_refused(dataset):
    state = midway(dataset, mode="padded")
    state["tok"] = 3
    with pytest.raises(LoaderStateError, match="padded mode"):
        make(dataset, mode="padded").load_state_dict(seal(state))


def test_a_state_moved_to_another_valid_position_is_refused_by_its_check(dataset):
    state = midway(dataset, mode="padded")
    state["pos"] -= 1  # still a position of the epoch: only the check tells
    with pytest.raises(LoaderStateError, match="damaged"):
        make(dataset, mode="padded").load_state_dict(state)
    del state["check"]  # edited on purpose: accepted, with a warning
    loader = make(dataset, mode="padded")
    with pytest.warns(UserWarning, match="no 'check'"):
        loader.load_state_dict(state)
    assert loader.state_dict()["pos"] == state["pos"]


def test_a_state_from_another_dataset_with_as_many_packets_is_refused(dataset, tmp_path):
    other = tmp_path / "other"
    packets = [s.encode() for s in ramp_specs([5 + k % 5 for k in range(30)], stride=77)]
    write_shards(other, packets[:14], prefix="a")
    write_shards(other, packets[14:], prefix="b")
    state = midway(dataset)
    assert make(other).corpus.n_packets == state["n_packets"]
    with pytest.raises(LoaderStateError, match="made on dataset"):
        make(other, mode="packed").load_state_dict(state)


def test_the_same_dataset_elsewhere_resumes(dataset, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(dataset, moved)
    state = midway(dataset)
    loader = make(moved, mode="packed")
    loader.load_state_dict(state)
    assert loader.state_dict()["pos"] == state["pos"] and next(iter(loader))


def test_a_version_1_state_is_accepted_with_a_warning(dataset):
    state = midway(dataset, shuffle=False)  # the order of an unshuffled epoch never changed
    state["version"] = 1
    del state["fingerprint"]
    loader = make(dataset, mode="packed", shuffle=False)
    with pytest.warns(UserWarning, match="no dataset fingerprint"):
        loader.load_state_dict(state)
    assert loader.state_dict()["tok"] == state["tok"]
    with pytest.raises(LoaderStateError, match="dict"):
        loader.load_state_dict("a state")


@pytest.mark.parametrize("version", [1, 2, 3])
def test_an_older_state_mid_epoch_in_a_shuffled_order_is_refused_at_an_epoch_start_accepted(
        dataset, version):
    """States before version 4 were made in the rotation order ndp no longer uses."""
    state = midway(dataset)
    state["version"] = version
    for key in ("order", "check", "mix_size") + (("batch", "vocab_size") if version < 3 else ()):
        state.pop(key, None)
    with pytest.raises(LoaderStateError, match="order this ndp no longer makes"):
        make(dataset, mode="packed").load_state_dict(state)
    state.update(pos=0, tok=0, epoch=1)
    state.pop("batch", None) if version < 3 else state.update(batch=0)
    loader = make(dataset, mode="packed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # version 1: no fingerprint; 3: no check
        loader.load_state_dict(state)
    assert loader.epoch == 1 and loader.state_dict()["pos"] == 0


def test_a_state_mid_epoch_in_the_window_order_before_windows_v2_is_refused_at_its_start_taken(
        dataset):
    """Version 4 states made when each window's permutation was drawn whole ("windows-v1"):
    their positions name other packets of a shuffled epoch now; an epoch's start does not."""
    state = midway(dataset)
    state["order"] = "windows-v1"
    with pytest.raises(LoaderStateError, match="'windows-v1', which this ndp no longer makes"):
        make(dataset, mode="packed").load_state_dict(seal(state))
    start = seal({**state, "pos": 0, "tok": 0, "batch": 0, "epoch": 1})
    loader = make(dataset, mode="packed")
    loader.load_state_dict(start)
    assert loader.epoch == 1 and loader.state_dict()["order"] == "windows-v2"
    assert next(iter(loader)) is not None
    plain = midway(dataset, shuffle=False)  # an unshuffled order did not change
    loader = make(dataset, mode="packed", shuffle=False)
    loader.load_state_dict(seal({**plain, "order": "windows-v1"}))
    assert loader.state_dict()["pos"] == plain["pos"]
