"""Where a resumed Loader goes on (``Loader.load_state_dict``): a state of this run's rank,
checked field by field (``ndp.loader.states.state``), or the states of an earlier run's ranks shared
out over this run's (``ndp.loader.states.elastic``); and the run step its epoch began at, which
schedules are keyed by (``ndp.loader.planning.shapes``).

A state made with other batch shapes (another ``batch_size``, ``seq_len`` or ``batch_tokens``
schedule) or another mix (``mix=`` weights or schedule, ``mix_size``): the plan changed by hand
mid-run, goes on the same way, said in a warning: the rest of its epoch, each remaining packet
once (in ``packed`` mode a packet it was inside of is given again whole, counted as
``repeated``), cut into this Loader's batches and mixed by its weights from the state's step
on; the change is kept in the state's ``elastic`` record, so later resumes keep it. In
``packed`` mode with several ranks that needs every rank's state (a list). Another dataset or
seed cannot be exact and stays refused (``ndp.loader.states.state``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from ndp.errors import LoaderStateError
from ndp.loader.states.elastic import MIX, SHAPE, Remainder, from_record, from_states
from ndp.loader.planning.plan import Plan
from ndp.loader.ordering.share import Share
from ndp.loader.states.state import check_state, state_start
from ndp.store.growth import first, grown_from


@dataclass(frozen=True)
class Resumed:
    """Where a resumed Loader goes on (``resume``; ``Plan.go_on`` takes it)."""

    position: dict[str, int]  #: the (epoch, pos, tok, batch) to go on from
    start: int  #: the run step of that epoch's first batch
    rest: Remainder | None  #: the elastic remainder the epoch is, or None
    grown: Plan | None  #: the plan of the dataset as it was where it grew since, or None
    planned: Share | None  #: the epoch's share as checking the state planned it, or None


def resume(plan: Plan, state: Any, mine: dict, *, elastic: bool) -> Resumed:
    """Where a Loader resumed from ``state`` goes on. ``mine``: the resuming Loader's own
    state (its settings). Raises ``LoaderStateError`` naming what does not fit."""
    mine = {**mine, "fingerprint": plan.corpus.fingerprint, "n_packets": plan.corpus.n_packets}
    grown = _grown(plan, state, mine)
    if grown is not None:  # the state's epoch is read from the dataset as it was
        plan = grown
        mine = {**mine, **grown.dataset_of(0)}
    with plan.memo():  # the old ranks' shares of one epoch: its order built once
        checked, start, rest, planned = _resume(plan, state, mine, elastic=elastic)
    if grown is not None:
        grown.set_elastic(rest)
        grown.set_start(checked["epoch"], start)
        grown.resumed = checked["epoch"]
    return Resumed(checked, start, rest, grown, planned)


def _resume(plan: Plan, state: Any, mine: dict, *, elastic: bool
            ) -> tuple[dict[str, int], int, Remainder | None, Share | None]:
    """``resume`` on the dataset the state was made on: position, start, remainder, and the
    share checking the state planned (the plan's own, made once: at 1e8 packets a mixed
    epoch's plan takes half a minute)."""
    if isinstance(state, dict) and not elastic and _other_shape(state, mine):
        elastic = True  # the plan changed by hand: the rest of the epoch in the new shapes
        warnings.warn(
            f"ndp.Loader: this state was made with {_shapes(state, mine)}, this Loader has "
            f"{_shapes(mine, state)}: the rest of epoch {state.get('epoch')} is shared out in "
            f"this Loader's batches{_mixed(state, mine)} (ndp.loader.states.elastic), each "
            f"remaining packet once, from step {state.get('step')} on; the change is recorded in the "
            f"state ('elastic')",
            stacklevel=4)
    if isinstance(state, (list, tuple)) or (elastic and isinstance(state, dict)):
        rest = from_states(list(state) if not isinstance(state, dict) else [state], mine, plan)
        # the rest of the epoch begins at the step the earlier run stopped at
        return {"epoch": rest.epoch, "pos": 0, "tok": 0, "batch": 0}, rest.step, rest, None
    record = state.get("elastic") if isinstance(state, dict) else None
    rest = None if record is None else from_record(record, plan)
    try:  # checked after its other fields (below): a damaged state is said so first
        start = state_start(state) if isinstance(state, dict) else 0
    except LoaderStateError:
        start = 0
    trial = plan.variant(rank=plan.rank, world_size=plan.world_size,
                         batch_size=plan.batch_setting, seq_len=plan.len_setting, start=start,
                         epoch=state.get("epoch") if isinstance(state, dict) else 0)
    trial.set_elastic(rest)  # checked against the epoch it resumes in
    checked = check_state(state, mine, trial)
    trial.stop_ahead()  # a count it began is the resuming plan's to make: not made twice
    planned = trial.planned_share(checked["epoch"])
    # a share planned whole (mixing, CRC-Drop, a remainder) is counted; one read place by
    # place is made at once, and counted on its plan's thread: made again, not taken over
    taken = planned if planned is not None and planned.count.final else None
    return checked, state_start(state), rest, taken


def _grown(plan: Plan, state: Any, mine: dict) -> Plan | None:
    """``plan`` on the first shards of its dataset, if ``state`` (or the first of a list) was
    made on them: the dataset grew by the shards after them since (``ndp.store.growth``),
    which join at the next epoch; ``None`` if it did not grow."""
    first_state = state if isinstance(state, dict) else (
        state[0] if isinstance(state, (list, tuple)) and state else None)
    made_on = first_state.get("fingerprint") if isinstance(first_state, dict) else None
    if made_on is None or made_on == mine["fingerprint"]:
        return None
    k = grown_from(plan.corpus, made_on)
    if k is None:
        return None  # another dataset: refused by ndp.loader.states.state
    before = first(plan.corpus, k)
    epoch = first_state.get("epoch")
    warnings.warn(
        f"ndp.Loader: this state was made on the first {k:,} of the {len(plan.corpus.shards):,} "
        f"shards this dataset has now: {len(plan.corpus.shards) - k:,} shards "
        f"({plan.corpus.n_packets - before.n_packets:,} packets) were added after them since "
        f"(ndp convert --append, or a source added last). Epoch {epoch} goes on exactly over "
        f"the shards it began with; the new ones join at epoch "
        f"{epoch + 1 if isinstance(epoch, int) else 'after it'}", stacklevel=4)
    return plan.variant(rank=plan.rank, world_size=plan.world_size,
                        batch_size=plan.batch_setting, seq_len=plan.len_setting, corpus=before)


def _other_shape(state: dict, mine: dict) -> bool:
    """``state`` is this run's (same version, world size and rank) but for its batch shapes
    (``batch_size``, ``seq_len``, ``batch_tokens``: ints or schedules) or its mix (``mix``,
    ``mix_size``)."""
    return (state.get("version") == mine["version"]
            and state.get("world_size") == mine["world_size"]
            and state.get("rank") == mine["rank"]
            and any(_setting(state, key) != mine.get(key) for key in SHAPE + MIX))


def _setting(state: dict, key: str) -> Any:
    """``state[key]``; a state from before ``mix_size`` existed mixed by "shortest"."""
    return state.get(key, "shortest" if key == "mix_size" else None)


def _shapes(state: dict, other: dict) -> str:
    """The batch shape and mix settings of ``state`` that ``other`` does not share."""
    return ", ".join(f"{key}={_short(_setting(state, key))}" for key in SHAPE + MIX
                     if _setting(state, key) != _setting(other, key))


def _mixed(state: dict, mine: dict) -> str:
    if all(_setting(state, key) == mine.get(key) for key in MIX):
        return ""
    return (", mixed by its weights from what the epoch has not delivered yet (what the old "
            "weights would have left unused included)")


def _short(value: Any) -> str:
    """A setting as a warning shows it: a mix's weights as ``{source: weight}``."""
    try:
        return "{" + ", ".join(f"{n!r}: {w:g}" for n, w in value) + "}"
    except (TypeError, ValueError):  # not a list of (source, weight): a schedule's record
        return repr(value)
