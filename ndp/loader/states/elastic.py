"""Elastic resume: the rest of an epoch that a run with another number of ranks (or another
batch shape) began, shared out over this run's ranks.

A job restarted on fewer or more nodes hands its new ranks the states its old ranks saved
(``Loader.load_state_dict([state_0, state_1, ...])``, all of them, in any order: each is put
in the place of the rank it records, and a rank twice or missing is refused; in ``padded`` and
``packing`` mode one is enough, since where every other rank stood follows from the index).
Every old rank's share of the epoch is recomputed (``Plan.variant``: same data, order, mixing
and CRC-Drop), and what each had not reached yet is merged, round robin, into one order of
the remaining packets; the new ranks split that order as they split any epoch (disjoint
shares, cut to the same length, the same batch count). So each remaining packet of the epoch
is delivered once across the new ranks; in ``packed`` mode a packet an old rank was inside of
is delivered again whole (counted in ``stats.repeated``, at most one per old rank). The epochs
after it are ordinary epochs of the new run.

A state made with another mix (``mix=`` or ``mix_size``: the mix changed by hand mid-epoch)
goes on from the same epoch too, exactly once within it: what every old rank had not delivered
yet of the places its mixing drew from (its share after CRC-Drop, before mixing: packets the
old weights would have left unused are still to come) is merged round robin, split over the
new ranks, and each new rank mixes its part with the new weights (``Remainder.remix``).

A state saved during that rest records where it came from (``elastic`` in the state: the old
world size, batch shape, mix where it changed, and every old rank's position), so it resumes
exactly too.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from ndp.errors import ConfigError, LoaderStateError
from ndp.loader.planning.plan import Plan
from ndp.loader.planning.shapes import from_setting
from ndp.loader.ordering.sources import mix_from_spec
from ndp.loader.states.state import check_state, seal, state_start

#: settings an earlier run's states may differ in; every other one must match
#: the settings of a batch's shape (``ndp.loader.planning.shapes``)
SHAPE = ("batch_size", "seq_len", "batch_tokens")
#: the settings of the mix (the weights or their schedule, and the epoch's size)
MIX = ("mix", "mix_size")
MAY_DIFFER = ("rank", "world_size", *SHAPE, *MIX)


@dataclass(frozen=True)
class Remainder:
    """The rest of ``epoch`` (``Plan.set_elastic``)."""

    epoch: int
    packets: np.ndarray  #: the remaining packets, all new ranks together, in order
    partial: np.ndarray  #: positions in ``packets`` of those an old rank was inside of
    record: dict  #: what a state saved during the rest carries to recompute it
    step: int = 0  #: the run step the rest begins at (the old run's next batch)
    #: ``packets`` are places not yet delivered, before mixing: each new rank mixes its part
    #: with its own weights (the mix changed); else they are in the old run's mixed order
    remix: bool = False
    delivered: int = 0  #: places the old ranks delivered of the epoch (``mix_size`` counts them)


def from_states(states: list[dict], mine: dict, plan: Plan) -> Remainder:
    """The ``Remainder`` the earlier run's ``states`` leave (``mine``: this loader's own state,
    for the settings), whatever the list's order (``in_rank_order``). ``LoaderStateError`` when
    they are not one step of one run, or not every rank of it once."""
    if not states or not all(isinstance(s, dict) for s in states):
        raise LoaderStateError("an elastic resume takes the earlier run's states as a list of "
                               "dicts (Loader.state_dict() of each of its ranks)")
    worlds = sorted({repr(s.get("world_size")) for s in states})
    if len(worlds) > 1:
        raise LoaderStateError(f"the states disagree on world_size ({', '.join(worlds)}): they "
                               f"are not from one run; pass the states of one run's ranks")
    first = states[0]
    world = first.get("world_size")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise LoaderStateError(f"loader state world_size is {world!r}")
    if len(states) == 1 and world > 1:
        if plan.mode == "packed":
            raise LoaderStateError(
                f"this state was saved by rank {first.get('rank')} of {world}; in packed mode "
                f"where the other ranks stood depends on which of their packets were corrupt, "
                f"so resuming on {mine['world_size']} ranks needs the states of all {world}: "
                f"pass the list (gather them with torch.distributed.all_gather_object)")
        states = _derive(first, world, mine, _base(plan, first.get("elastic")),
                         _old_mix(first, mine))
    else:
        states = in_rank_order(states, world)
    first = states[0]
    # the earlier run may itself have been resuming an epoch begun by another one
    base = _base(plan, first.get("elastic"))
    old = {key: first.get(key) for key in MAY_DIFFER[1:]}
    positions = []
    for state in states:
        for key in MAY_DIFFER[1:]:
            if state.get(key) != old[key]:
                raise LoaderStateError(f"the states disagree on {key} ({state.get(key)!r} and "
                                       f"{old[key]!r}): they are not from one run")
        if state.get("elastic") != first.get("elastic"):
            raise LoaderStateError("the states disagree on 'elastic': they are not from one run")
        positions.append(_check_one(state, mine, base))
    epochs = {p["epoch"] for p in positions}
    steps = {p["batch"] for p in positions}
    if len(epochs) != 1 or len(steps) != 1:
        raise LoaderStateError(
            f"the states were saved at different steps (epochs {sorted(epochs)}, batches "
            f"{sorted(steps)}); pass the states every rank saved at one step")
    return remainder(base, epoch=epochs.pop(), world_size=world,
                     shape={key: old[key] for key in SHAPE},
                     positions=[(p["pos"], p["tok"]) for p in positions],
                     previous=first.get("elastic"), start=state_start(first),
                     step=state_start(first) + steps.pop(), mixed=_old_mix(first, mine))


def in_rank_order(states: list[dict], world: int) -> list[dict]:
    """``states`` ordered by the rank each records: old rank ``r``'s share is cut by ``r``, so
    a list in another order (state files sorted by name put ``rank_10`` before ``rank_2``)
    would pair shares with other ranks' positions, delivering packets twice and losing others.
    ``LoaderStateError`` unless they are ranks ``0..world-1``, each once."""
    for at, state in enumerate(states):
        rank = state.get("rank")
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise LoaderStateError(f"loader state field 'rank' is {rank!r} in the state at "
                                   f"position {at} of the list: it is damaged or not a "
                                   f"Loader's (Loader.state_dict() records its rank)")
    count = Counter(state["rank"] for state in states)
    wrong = []
    twice = sorted(r for r, n in count.items() if n > 1)
    if twice:
        wrong.append(f"{_ranks(twice)} twice (a state file read twice?)")
    missing = sorted(set(range(world)) - set(count))
    if missing:
        wrong.append(f"missing {_ranks(missing)}")
    outside = sorted(r for r in count if not 0 <= r < world)
    if outside:
        wrong.append(f"{_ranks(outside)} not in world_size {world}")
    if wrong:
        raise LoaderStateError(
            f"an elastic resume needs the state of every rank of the earlier run, each once "
            f"(world_size {world}: ranks 0 to {world - 1}, in any order): {'; '.join(wrong)}")
    return sorted(states, key=lambda state: state["rank"])


def _old_mix(state: dict, mine: dict) -> dict | None:
    """``{"mix": ..., "mix_size": ...}`` as ``state`` records them where they are not this
    Loader's (``mine``), else ``None``."""
    if all(state.get(key, "shortest" if key == "mix_size" else None) == mine.get(key)
           for key in MIX):
        return None
    return {"mix": state.get("mix"), "mix_size": state.get("mix_size", "shortest")}


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _base(plan: Plan, record: Any) -> Plan:
    """``plan`` with the remainder an earlier run was in (``record``), or with none."""
    base = plan.variant(rank=plan.rank, world_size=plan.world_size,
                        batch_size=plan.batch_setting, seq_len=plan.len_setting,
                        batch_tokens=plan.tokens_setting)
    base.set_elastic(None if record is None else from_record(record, plan))
    return base


def remainder(plan: Plan, *, epoch: int, world_size: int, shape: dict,
              positions: list[tuple[int, int]], previous: Any = None, start: int = 0,
              step: int = 0, mixed: dict | None = None) -> Remainder:
    """What old ranks ``0..world_size-1`` at ``positions`` (share position, token) had left of
    ``epoch`` (cut by ``plan``, which carries the remainder they were in, ``previous``),
    merged round robin. ``shape``: the old run's ``batch_size``, ``seq_len`` and
    ``batch_tokens`` as its states record them (an int, a schedule's record, or None);
    ``start``: the run step the old run's epoch began at, ``step``:
    the one it stopped at; ``mixed``: the old run's ``mix`` and ``mix_size`` where they were
    not ``plan``'s (the rest is then mixed again: ``Remainder.remix``)."""
    tails, partial_at = [], []  # partial_at: where in its tail an old rank's partial place is
    if mixed is None:
        for rank, (pos, tok) in enumerate(positions):
            sh = _old(plan, rank, world_size, shape, start, epoch).share(epoch)
            tails.append(sh.packets[min(pos, sh.length): sh.length])
            partial_at.append(0 if tok and pos < sh.length else -1)
    else:  # what each old rank's mixing drew from, less what it delivered
        every = _old(plan, 0, world_size, shape, start, epoch, mixed).every_share(epoch)
        length = min(drawn.shape[0] for _, drawn in every)  # the rank balance's cut
        for (pool, drawn), (pos, tok) in zip(every, positions):
            tail = pool[~np.isin(pool, drawn[:min(pos, length)])]
            tails.append(tail)
            inside = np.flatnonzero(tail == drawn[pos]) if tok and pos < length else []
            partial_at.append(int(inside[0]) if len(inside) else -1)
    lengths = np.array([t.shape[0] for t in tails], np.int64)
    turn = np.concatenate([np.arange(n) for n in lengths]) if lengths.sum() else np.zeros(0, int)
    owner = np.repeat(np.arange(len(tails)), lengths)
    order = np.lexsort((owner, turn))  # by turn, then by old rank
    packets = np.concatenate(tails)[order] if tails else np.zeros(0, np.int64)
    first_of = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    where = np.empty(packets.shape[0], np.int64)
    where[order] = np.arange(packets.shape[0])
    partial = np.array([where[first_of[r] + p] for r, p in enumerate(partial_at) if p >= 0],
                       np.int64)
    record = {"epoch": epoch, "world_size": world_size,
              **{k: v for k, v in shape.items() if v is not None or k != "batch_tokens"},
              "positions": [[int(p), int(t)] for p, t in positions], "previous": previous}
    if (start, step) != (0, 0):  # since states record the run's step (version 5)
        record.update(start=int(start), step=int(step))
    if mixed is not None:
        record.update(mixed)
    return Remainder(epoch, packets.astype(np.int64), partial, record, step,
                     remix=mixed is not None,
                     delivered=sum(int(p) for p, _ in positions) if mixed is not None else 0)


def _old(plan: Plan, rank: int, world_size: int, shape: dict, start: int, epoch: int,
         mixed: dict | None = None) -> Plan:
    """``plan`` as an old run's rank ``rank`` cut its epoch ``epoch``, begun at run step
    ``start``, in batches of ``shape`` (``batch_size``, ``seq_len``, ``batch_tokens`` as its
    states record them), mixed as ``mixed`` records (or as ``plan`` mixes: ``None``)."""
    other = {} if mixed is None else {"mix": mix_from_spec(mixed["mix"]),
                                      "mix_size": mixed["mix_size"]}
    return plan.variant(rank=rank, world_size=world_size,
                        batch_size=from_setting(shape.get("batch_size")),
                        seq_len=from_setting(shape["seq_len"]),
                        batch_tokens=from_setting(shape.get("batch_tokens")),
                        start=start, epoch=epoch, **other)



def from_record(record: Any, plan: Plan) -> Remainder:
    """The ``Remainder`` a state saved during one records (its ``elastic`` field)."""
    try:
        previous = record.get("previous")
        return remainder(_base(plan, previous), epoch=int(record["epoch"]),
                         world_size=int(record["world_size"]),
                         shape={key: _shape_field(record.get(key)) for key in SHAPE},
                         positions=[(int(p), int(t)) for p, t in record["positions"]],
                         previous=previous, start=int(record.get("start", 0)),
                         step=int(record.get("step", 0)),
                         mixed={key: record[key] for key in MIX} if "mix" in record else None)
    except (AttributeError, KeyError, TypeError, ValueError, ConfigError) as err:
        raise LoaderStateError(f"loader state field 'elastic' is damaged ({err!r})") from None


def _shape_field(value: Any) -> Any:
    """A recorded ``batch_size``, ``seq_len`` or ``batch_tokens``: an int, a schedule's
    record (a dict), or None."""
    return value if value is None or isinstance(value, dict) else int(value)


def _check_one(state: dict, mine: dict, plan: Plan) -> dict:
    """One old rank's state checked as that rank's own loader would check it."""
    for key in MAY_DIFFER:
        value = state.get(key)
        if key in MIX:
            continue  # read as a mix (mix_from_spec) where it is not this Loader's
        if key in SHAPE and isinstance(value, dict) or (
                key == "batch_size" and value is None and state.get("batch_tokens")) or (
                key == "batch_tokens" and value is None):
            continue  # a schedule's record (read and checked by Schedule.from_record), or
            # batches cut by a token budget (or not)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise LoaderStateError(f"loader state field {key!r} is {value!r}")
    try:
        old = _old(plan, state["rank"], state["world_size"],
                   {key: state.get(key) for key in SHAPE}, state_start(state),
                   state.get("epoch"), _old_mix(state, mine))
    except ConfigError as err:
        raise LoaderStateError(f"loader state's batch shape or mix does not fit this "
                               f"dataset: {err}") from None
    as_old = {**mine, **{key: state.get(key) for key in MAY_DIFFER}}
    return check_state(state, as_old, old)


def _derive(state: dict, world: int, mine: dict, plan: Plan, mixed: dict | None
            ) -> list[dict]:
    """Every old rank's state from one (padded and packing mode: by the index); ``mixed``:
    the old run's mix where it was not this Loader's."""
    at = _check_one(state, mine, plan)
    if at["tok"]:
        raise LoaderStateError("a padded or packing state has no token offset")
    out = []
    for rank in range(world):
        old = _old(plan, rank, world, {key: state.get(key) for key in SHAPE},
                   state_start(state), at["epoch"], mixed)
        share = old.share(at["epoch"])
        shapes = old.shapes_of(at["epoch"])
        pos = 0
        if plan.mode == "padded" and not shapes.budgeted:
            pos = min(shapes.rows_before(at["batch"]), share.length)
        else:  # packing, or a token budget: batch after batch, by the index
            for k in range(at["batch"]):
                pos = min(old.chunk_end(share.packets, pos, 0, 1, shapes.at(k),
                                        shapes.budget_at(k)), share.length)
        out.append(seal({**{k: v for k, v in state.items() if k != "check"}, "rank": rank,
                         "pos": pos, "tok": 0}))
    return out
