"""Where a resumed Loader goes on (``Loader.load_state_dict``): a state of this run's rank,
checked field by field (``ndp.loader.state``), or the states of an earlier run's ranks shared
out over this run's (``ndp.loader.elastic``); and the run step its epoch began at, which
schedules are keyed by (``ndp.loader.shapes``).
"""

from __future__ import annotations

from typing import Any

from ndp.errors import LoaderStateError
from ndp.loader.elastic import Remainder, from_record, from_states
from ndp.loader.plan import Plan
from ndp.loader.state import check_state, state_start


def resume(plan: Plan, state: Any, mine: dict, *, elastic: bool
           ) -> tuple[dict[str, int], int, Remainder | None]:
    """``(position, start, remainder)`` for ``state``: the (epoch, pos, tok, batch) to go on
    from, the run step of that epoch's first batch, and the elastic remainder it is in (or
    ``None``). ``mine``: the resuming Loader's own state (its settings). Raises
    ``LoaderStateError`` naming what does not fit."""
    if isinstance(state, (list, tuple)) or (elastic and isinstance(state, dict)):
        rest = from_states(list(state) if not isinstance(state, dict) else [state], mine, plan)
        # the rest of the epoch begins at the step the earlier run stopped at
        return {"epoch": rest.epoch, "pos": 0, "tok": 0, "batch": 0}, rest.step, rest
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
    return checked, state_start(state), rest
