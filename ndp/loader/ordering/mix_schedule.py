"""Mixing weights that change with the run's step: ``mix=ndp.Schedule([(0, {...}), (90_000,
{...})])``, held from phase to phase or, with ``interpolate="linear"``, in a straight line
between them (annealing the mix at the end of pretraining).

A rank's share is interleaved from its sources (``ndp.loader.ordering.order.mix`` for fixed weights)
by
a seeded draw, place after place, each with the weights of the step its place lands in. That
step follows from the places already drawn and the index's token counts, as the epoch's
batches will cut them (``ndp.loader.planning.shapes``): ``padded``, ``B_k`` places a batch;
``packed``,
``B_k * T_k`` tokens a batch; ``packing``, the greedy placement into ``B_k`` rows of ``T_k``;
with a token budget (``batch_tokens``), whole examples while they fit it.
So the realised mix of each step follows the schedule; it is a draw, so it deviates as a
binomial does (for a source of weight ``p`` over ``n`` places, a standard deviation of
``sqrt(p (1 - p) / n)``); a packet dropped as it is decoded takes its place's share with it.

``mix_size``: ``"shortest"`` (the epoch ends at the first draw of a source that has run out)
or a number of places (sources that run out start again, counted as ``mix_repeated``);
``"longest"`` is refused with a schedule (which source must be used whole changes with the
weights). Everything is a pure function of the seed, the epoch, the rank and the epoch's
first step: resumes, ranks and backends agree.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ndp.kernels._jit import cpu_kernel
from ndp.loader.layouts.packing import phase_of  # the compiled counts' own lookup
from ndp.loader.planning.shapes import Shapes

#: the random stream of scheduled draws (fixed weights draw from ``order._MIX_STREAM``)
_SCHEDULED_STREAM = 0x5C4E
#: how the epoch's step advances with each place drawn, by mode
MODE_CODES = {"padded": 0, "packed": 1, "packing": 2}


@cpu_kernel
def _draw(u, sizes, tokens, first, table, steps, linear, start, mode, sh_starts, sh_b, sh_t,
          sh_budget, limit, shortest, out_part, out_index):  # pragma: no cover - compiled
    groups = sizes.shape[0]
    used = np.zeros(groups, np.int64)
    w = np.zeros(groups, np.float64)
    k = 0  # the epoch's batch the next place lands in
    filled = 0  # padded: places in batch k (and a token budget's: its tokens, ``spent``)
    spent = 0
    t = 0  # packed: tokens drawn; acc: where batch k starts
    acc = 0
    r = 0  # packing: row and column in batch k
    c = 0
    n = 0
    for i in range(u.shape[0]):
        if not shortest and n >= limit:
            break
        s = start + k
        p = phase_of(steps, s)
        total = 0.0
        for g in range(groups):
            v = table[p, g]
            if linear and p + 1 < steps.shape[0]:
                v += (table[p + 1, g] - v) * (s - steps[p]) / (steps[p + 1] - steps[p])
            w[g] = v if sizes[g] > 0 else 0.0
            total += w[g]
        if total <= 0.0:
            break  # no source with a weight has anything on this rank
        x = u[i] * total
        g = groups - 1
        run = 0.0
        for h in range(groups):
            run += w[h]
            if x < run and w[h] > 0.0:
                g = h
                break
        while w[g] <= 0.0:  # rounding past the last weight: the last source with one
            g -= 1
        if shortest and used[g] >= sizes[g]:
            break
        j = used[g] % sizes[g]
        used[g] += 1
        out_part[n] = g
        out_index[n] = j
        n += 1
        length = tokens[first[g] + j]
        q = phase_of(sh_starts, k)
        if mode != 1 and sh_budget[q] > 0:  # whole examples while they fit the budget
            m = min(length, sh_t[q])
            if filled > 0 and spent + m > sh_budget[q]:
                k += 1
                filled = 0
                spent = 0
                m = min(length, sh_t[phase_of(sh_starts, k)])
            filled += 1
            spent += m
        elif mode == 0:
            filled += 1
            if filled >= sh_b[q]:
                k += 1
                filled = 0
        elif mode == 1:
            t += length
            while t - acc >= sh_b[q] * sh_t[q]:
                acc += sh_b[q] * sh_t[q]
                k += 1
                q = phase_of(sh_starts, k)
        else:
            m = min(length, sh_t[q])
            if c + m > sh_t[q]:
                r += 1
                c = 0
            if r == sh_b[q]:
                k += 1
                r = 0
                c = 0
                m = min(length, sh_t[phase_of(sh_starts, k)])
            c += m
    return n


class MixSchedule:
    """Weights by step for sources ``names`` (``table[p]``: phase ``p``'s, from ``steps[p]``)."""

    def __init__(self, names: list[str], steps: list[int], table: np.ndarray,
                 linear: bool) -> None:
        self.names, self.linear = names, linear
        self.steps = np.asarray(steps, np.int64)
        self.table = np.ascontiguousarray(table, np.float64)

    def at(self, step: int) -> np.ndarray:
        """The weights at run step ``step``."""
        p = int(np.searchsorted(self.steps, step, side="right")) - 1
        w = self.table[p].copy()
        if self.linear and p + 1 < self.steps.shape[0]:
            a, b = int(self.steps[p]), int(self.steps[p + 1])
            w += (self.table[p + 1] - w) * (step - a) / (b - a)
        return w

    def spec(self) -> dict:
        """What a state records (``Loader.state_dict()['mix']``)."""
        return {"phases": [[int(s), [[n, float(x)] for n, x in zip(self.names, row)]]
                           for s, row in zip(self.steps.tolist(), self.table)],
                "interpolate": "linear" if self.linear else "step"}

    def draw(self, parts: list[np.ndarray], tokens: list[np.ndarray], *, seed: int,
             epoch: int, rank: int, size: str | int, mode: str, shapes: Shapes,
             start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``parts`` (each a source's places in its own order, ``tokens`` their index token
        counts) interleaved by the weights of each place's step (the epoch's batch shapes
        ``shapes`` from run step ``start``): the merged places, and per part how many the epoch
        left unused and took again (as ``ndp.loader.ordering.order.mix``)."""
        sizes = np.array([p.shape[0] for p in parts], np.int64)
        shortest = size == "shortest"
        limit = 0 if shortest else int(size)
        n = int(sizes.sum()) + 1 if shortest else limit
        rng = np.random.Generator(np.random.PCG64([seed, epoch, rank, _SCHEDULED_STREAM]))
        u = rng.random(n)
        first = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        flat = (np.concatenate(tokens).astype(np.int64) if tokens
                else np.zeros(0, np.int64))
        out_part, out_index = np.empty(n, np.int64), np.empty(n, np.int64)
        got = int(_draw(u, sizes, flat, first, self.table, self.steps, self.linear, start,
                        MODE_CODES[mode], *shapes.arrays(), limit, shortest, out_part,
                        out_index))
        merged = np.empty(got, np.int64)
        used = np.zeros(len(parts), np.int64)
        for g, part in enumerate(parts):
            at = np.flatnonzero(out_part[:got] == g)
            if at.shape[0]:
                merged[at] = part[out_index[:got][at]]
            used[g] = at.shape[0]
        return merged, np.maximum(sizes - used, 0), np.maximum(used - sizes, 0)


def read_schedule(schedule: Any, check_phase: Any) -> MixSchedule:
    """A ``Schedule`` of ``{source: weight}`` dicts as a ``MixSchedule``: each phase's dict
    checked by ``check_phase(what, weights) -> (names, weights)`` (every source named, each
    weight finite and >= 0, their sum > 0; ``what`` names the phase in its errors)."""
    from ndp.errors import ConfigError

    names, rows = None, []
    for k, (step, weights) in enumerate(schedule.phases):
        what = f"mix phase {k} (from step {step:,})"
        if not isinstance(weights, dict):
            raise ConfigError(f"{what} is {weights!r}; each phase of a mix schedule is a dict "
                              f"of {{source: weight}}")
        got_names, got = check_phase(what, weights)
        if names is not None and got_names != names:
            raise ConfigError(f"{what} names {got_names}, phase 0 {names}: every phase gives "
                              f"every source a weight (0 leaves it out)")
        names = got_names
        rows.append(got)
    return MixSchedule(names, list(schedule.steps), np.array(rows, np.float64),
                       schedule.interpolate == "linear")
