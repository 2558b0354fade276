"""Issue 35's hostile schedules, as cases of ``bad_inputs.py`` (``bad_inputs.py`` imports this
module: run them with it): steps not increasing, a first phase after step 0, ``seq_len`` 0 in
each mode, a batch size or token budget below 1, negative and NaN mixing weights, a source the
data does not have, a phase past the run's end (``max_steps``), a shape schedule asked to
interpolate, and a state whose mix names a source the data does not have (a state loaded into
a Loader with another mix goes on, in the rest of its epoch: ``tests/loader/test_mix_change.py``).
Each must be refused with a ``ConfigError`` (``LoaderStateError`` for the state) whose message
names the phase (or the option), never accepted.
"""

from __future__ import annotations

import math
import warnings

from inputs.cases import NotHandled, batches, case, dataset, loader, refused
from ndp.loader.loader import Loader
from ndp.loader.planning.schedule import Schedule


def with_seq_len(d, mode: str, seq_len, **kw) -> Loader:
    """``cases.loader`` with a ``seq_len`` of one's own."""
    return Loader(d, mode=mode, batch_size=2, seq_len=seq_len, backend="cpu", output="arrays",
                  seed=3, prefetch=0, **kw)


def naming(fn, *words: str) -> str:
    """``refused(fn)``, and its message must hold ``words`` (the phase, the option)."""
    detail = refused(fn)
    if not detail.startswith(("ConfigError", "LoaderStateError")):
        raise NotHandled(f"refused, but not as a ConfigError: {detail}")
    missing = [w for w in words if w not in detail]
    if missing:
        raise NotHandled(f"the message does not name {missing}: {detail}")
    return detail


def _two(tmp):
    return {"web": str(dataset(tmp / "web")), "code": str(dataset(tmp / "code"))}


@case("schedules", "steps not increasing (seq_len phases at 0, 5, 5)")
def _not_increasing(tmp):
    d = dataset(tmp / "d")
    return naming(lambda: with_seq_len(d, "packed", Schedule([(0, 8), (5, 16), (5, 4)])),
                  "phase 2")


@case("schedules", "a first phase after step 0")
def _late_start(tmp):
    d = dataset(tmp / "d")
    return naming(lambda: loader(d, batch_size=Schedule([(3, 2), (9, 4)])), "phase 0")


for _mode in ("padded", "packed", "packing"):
    case("schedules", f"seq_len 0 in a later phase, {_mode}")(
        lambda tmp, mode=_mode: naming(
            lambda: with_seq_len(dataset(tmp / "d"), mode, Schedule([(0, 8), (4, 0)])),
            "seq_len phase 1", "from step 4"))


@case("schedules", "batch_size -1 in a later phase")
def _negative_batch(tmp):
    d = dataset(tmp / "d")
    return naming(lambda: loader(d, batch_size=Schedule([(0, 2), (3, -1)])),
                  "batch_size phase 1")


@case("schedules", "a token budget of 0 in a later phase")
def _zero_budget(tmp):
    d = dataset(tmp / "d")
    return naming(lambda: loader(d, batch_size=None,
                                 batch_tokens=Schedule([(0, 64), (2, 0)])),
                  "batch_tokens phase 1")


@case("schedules", "a negative mixing weight")
def _negative_weight(tmp):
    data = _two(tmp)
    return naming(lambda: loader(data, "packed", mix=Schedule(
        [(0, {"web": 0.5, "code": 0.5}), (6, {"web": 1.2, "code": -0.2})])), "mix phase 1")


@case("schedules", "a NaN mixing weight")
def _nan_weight(tmp):
    data = _two(tmp)
    return naming(lambda: loader(data, "packed", mix=Schedule(
        [(0, {"web": 0.5, "code": 0.5}), (6, {"web": math.nan, "code": 1.0})])), "phase 1")


@case("schedules", "a mixing phase naming a source the data does not have")
def _unknown_source(tmp):
    data = _two(tmp)
    return naming(lambda: loader(data, "packed", mix=Schedule(
        [(0, {"web": 0.5, "code": 0.5}), (6, {"web": 0.5, "math": 0.5})])), "math")


@case("schedules", "a seq_len phase past the run's end (max_steps)")
def _past_end(tmp):
    d = dataset(tmp / "d")
    return naming(lambda: with_seq_len(d, "packed", Schedule([(0, 8), (12, 16)]),
                                       max_steps=10),
                  "seq_len phase 1", "max_steps=10")


@case("schedules", "a mixing phase past the run's end (max_steps)")
def _mix_past_end(tmp):
    data = _two(tmp)
    return naming(lambda: loader(data, "packed", max_steps=4, mix=Schedule(
        [(0, {"web": 0.5, "code": 0.5}), (4, {"web": 0.9, "code": 0.1})])), "mix phase 1")


@case("schedules", "a batch-size schedule asked to interpolate")
def _interpolated_shape(tmp):
    d = dataset(tmp / "d")
    return naming(lambda: loader(d, batch_size=Schedule([(0, 2), (6, 4)],
                                                        interpolate="linear")), "interpolate")


@case("schedules", "a state whose mix names a source the data does not have")
def _other_mix(tmp):
    data = _two(tmp)
    ld = loader(data, "packed", mix={"web": 0.5, "code": 0.5})
    it = iter(ld)
    next(it)
    state = {k: v for k, v in ld.state_dict().items() if k != "check"}  # edited by hand
    ld.close()
    state["mix"] = [["docs", 0.5], ["web", 0.5]]
    other = loader(data, "packed", mix={"web": 0.8, "code": 0.2})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "no 'check'", "made with mix=...": said, then
            return naming(lambda: other.load_state_dict(state), "mix", "'docs'")
    finally:
        batches(other)
