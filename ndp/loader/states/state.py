"""Resume states checked field by field before a ``Loader`` trusts them.

A state is the epoch and a (packet, token) position in this rank's order of that epoch, plus
the dataset fingerprint and settings it is only valid for (``Loader.state_dict``). A state from
another dataset or configuration, or with positions outside its epoch, would make the loader
deliver other batches than the run it came from (or none, or loop on empty ones), so it is
refused with a ``LoaderStateError`` that names the field.

A state also carries ``check``, the crc32 of its other fields: a state damaged in storage into
another *valid* position (which no field check can tell from a real one) is refused too. A
state edited on purpose (say, back to the start of its epoch) without its ``check`` is accepted
with a warning, its fields still checked one by one.
"""

from __future__ import annotations

import json
import numbers
import warnings
import zlib
from typing import Any

import numpy as np

from ndp.errors import LoaderStateError
from ndp.loader.ordering import units
from ndp.loader.ordering.order import OLD_ORDERS
from ndp.loader.planning.plan import Plan

#: the settings a state must have been made with, besides the dataset
SETTINGS = ("mode", "seed", "shuffle", "rank", "world_size", "batch_size", "seq_len",
            "batch_tokens",
            "crc_drop_rate", "n_packets", "mix", "vocab_size", "mix_size", "order",
            "shuffle_window", "align")
#: state versions before the current one that are still read (see ``check_state``)
OLDER = (1, 2, 3)
#: versions with the current order that are still read: 4, written before states had ``step``
NO_STEP = (4,)


def checksum(state: dict) -> int:
    """crc32 of ``state``'s fields but ``check``, as canonical JSON."""
    fields = {k: v for k, v in state.items() if k != "check"}
    return zlib.crc32(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode())


def seal(state: dict) -> dict:
    """``state`` with its ``check``."""
    return {**state, "check": checksum(state)}


def _int(state: dict, key: str) -> int:
    value = state.get(key)
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise LoaderStateError(f"loader state field {key!r} is {value!r}; expected an integer "
                               f"(the state is damaged or not a Loader's)")
    return int(value)


def state_start(state: dict) -> int:
    """The run step of the first batch of ``state``'s epoch (its ``step`` less its ``batch``;
    states before version 5 did not record the step: 0, the step counted from the resume)."""
    if "step" not in state or state.get("version") in OLDER + NO_STEP:
        return 0
    step, batch = _int(state, "step"), _int(state, "batch")
    if not 0 <= batch <= step:
        raise LoaderStateError(f"loader state step {step} is before its batch {batch} of its "
                               f"epoch: a run's step counts every batch since its start")
    return step - batch


def check_state(state: Any, mine: dict, plan: Plan) -> dict[str, int]:
    """The (epoch, pos, tok, batch) of ``state`` if it belongs to the loader whose own state
    is ``mine``; ``LoaderStateError`` otherwise."""
    if not isinstance(state, dict):
        raise LoaderStateError(f"a loader state is a dict (from Loader.state_dict()), got "
                               f"{type(state).__name__}")
    version = state.get("version")
    if version not in (*OLDER, *NO_STEP, mine["version"]):
        raise LoaderStateError(f"loader state version {version!r} is not {mine['version']} "
                               f"(nor {', '.join(map(str, OLDER + NO_STEP))}): it was not written by "
                               f"this ndp's Loader.state_dict()")
    if version in OLDER and state.get("shuffle") and (state.get("pos") or state.get("tok")
                                                       or state.get("batch")):
        raise LoaderStateError(
            f"loader state version {version} is mid-epoch in a shuffled order this ndp no "
            f"longer makes (it now shuffles documents across windows of shards, "
            f"{mine['order']!r}): its position would name other packets. Resume from the start "
            f"of its epoch (set 'pos', 'tok' and 'batch' to 0, and delete 'check')")
    old_order = state.get("order") in OLD_ORDERS and version not in OLDER
    if old_order and state.get("shuffle") and (state.get("pos") or state.get("tok")
                                               or state.get("batch")):
        raise LoaderStateError(
            f"loader state is mid-epoch in the shuffled order {state.get('order')!r}, which "
            f"this ndp no longer makes (it now permutes each window place by place, "
            f"{mine['order']!r}): its position would name other packets. Resume from the start "
            f"of its epoch (set 'pos', 'tok' and 'batch' to 0, and delete 'check')")
    if version in (1, 2) and mine["world_size"] > 1 and (state.get("pos") or state.get("tok")):
        raise LoaderStateError(
            f"loader state version {version} was written before every rank delivered the same "
            f"number of batches per epoch: with {mine['world_size']} ranks its position is not "
            f"one this ndp reaches; resume from the start of its epoch (set 'pos' and 'tok' to "
            f"0) or from a newer state")
    if version == mine["version"] and "step" not in state:
        raise LoaderStateError(f"loader state version {version} has no 'step' (the run's "
                               f"batch number): it is damaged or not a Loader's")
    if version not in (1, 2):  # states since version 3 carry a checksum
        if "check" not in state:
            warnings.warn("loader state has no 'check' (edited by hand?): its fields are "
                          "checked one by one, but a damaged position cannot be told from a "
                          "real one", stacklevel=3)
        else:
            try:
                ok = state["check"] == checksum(state)
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise LoaderStateError(
                    "loader state is damaged: its 'check' does not match its fields (changed "
                    "after Loader.state_dict() wrote it); resume from an intact copy")
    if version == 1:  # written before states carried the dataset's fingerprint
        warnings.warn("loader state version 1 has no dataset fingerprint: it is checked against "
                      "the settings and packet count only", stacklevel=3)
    elif state.get("fingerprint") != mine["fingerprint"]:
        raise LoaderStateError(
            f"loader state was made on dataset {state.get('fingerprint')!r}, this loader reads "
            f"{mine['fingerprint']!r} (other shards, sizes or contents): its positions would "
            f"mean other packets. A shard it was made on was removed, renamed or rewritten "
            f"since (only shards added after its last keep a state valid: ndp convert "
            f"--append), or this is another dataset; resume on the dataset it was made on")
    for key in SETTINGS:
        if key == "vocab_size" and version in (1, 2):
            continue  # older states did not record it
        if key == "mix_size" and key not in state and mine.get(key) == "shortest":
            continue  # states before mix_size existed mixed this way
        if key in ("order", "shuffle_window") and version in OLDER or (
                key == "order" and old_order):
            continue  # refused above where the order matters
        if state.get(key) != mine.get(key):
            elastic = (" (to continue its epoch on another number of ranks or another batch "
                       "shape, pass the states of all its ranks as a list, or this one with "
                       "elastic=True in padded and packing mode: ndp.loader.states.elastic)"
                       if key in ("world_size", "batch_size", "seq_len") or (
                           key == "rank" and state.get("world_size") != mine["world_size"])
                       else "")
            raise LoaderStateError(f"loader state has {key}={state.get(key)!r}, this loader "
                                   f"{mine.get(key)!r}; resume with the same settings and "
                                   f"shards{elastic}")
    epoch, pos, tok = _int(state, "epoch"), _int(state, "pos"), _int(state, "tok")
    if epoch < 0:
        raise LoaderStateError(f"loader state epoch {epoch} is negative")
    sh = plan.share(epoch)
    share, n = sh.packets, sh.packets.shape[0]
    if version not in (1, 2):  # states since version 3 carry the batch number
        batch = _int(state, "batch")
    else:  # one rank (above): the batches before the position, by the index
        batch = _batches_before(plan, share, min(_int(state, "pos"), sh.length),
                                _int(state, "tok"))
    # batches every rank delivers, at least: the count, or (while the plan's thread counts
    # it) a bound past ``batch``, so that a resume does not wait for the epoch's count
    cap = sh.count.bound(batch - 1)[0] if batch > 0 else 0
    if batch < 0 or batch > cap:
        raise LoaderStateError(f"loader state batch {batch} is outside epoch {epoch}, in which "
                               f"every rank delivers {sh.batches} batches")
    if not 0 <= pos <= n:
        raise LoaderStateError(f"loader state position {pos} is outside epoch {epoch}, whose "
                               f"share holds {n} packets on this rank")
    if tok < 0 or (tok and plan.mode != "packed"):
        raise LoaderStateError(f"loader state token offset {tok} is impossible in "
                               f"{plan.mode} mode (0 outside packed mode, never negative)")
    if tok and (pos >= n or tok >= place_tokens(plan, share[pos:pos + 1])):
        raise LoaderStateError(
            f"loader state token offset {tok} lies past the end of packet {pos} of epoch "
            f"{epoch} (a state points inside the packet the next window starts in)")
    return {"epoch": epoch, "pos": pos, "tok": tok, "batch": batch}


def _batches_before(plan: Plan, share: Any, pos: int, tok: int) -> int:
    """Batches delivered before share position ``pos`` (and token ``tok``) by the index: exact
    for padded and packing batches; in packed mode exact unless packets before it were
    corrupt (then the epoch ends that many batches early)."""
    if plan.mode == "padded":
        return -(-pos // plan.batch_size)
    if plan.mode == "packing":
        return plan.batches_of(share[:pos]) if pos else 0
    tokens = place_tokens(plan, share[:pos]) + max(tok, 0)
    return tokens // (plan.batch_size * plan.seq_len)


def place_tokens(plan: Plan, places: np.ndarray) -> int:
    """The tokens of the share's places ``places`` by the index (packed mode: each place's
    document, ``ndp.loader.ordering.units``)."""
    tokens = plan.corpus.tokens[places]
    if units.active(plan.corpus, plan.mode):
        tokens = units.place_tokens(plan.corpus, np.asarray(places, np.int64), tokens)
    return int(np.asarray(tokens).sum())
