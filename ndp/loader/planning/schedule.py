"""``ndp.Schedule``: a value that changes with the run's step, as plain data.

    ndp.Loader(data, mode="packed", seed=0,
               seq_len=ndp.Schedule([(0, 256), (2_000, 1024), (10_000, 4096)]),
               batch_size=ndp.Schedule([(0, 32), (1_000, 128), (3_000, 512)]))

A schedule is a list of phases ``(step, value)``: the first starts at step 0, the steps
increase, and each value holds from its step until the next phase's (``interpolate="step"``,
the default). The step is the run's: the number of batches the Loader delivered before this
one since the start of training, across epochs (``Loader.step``), the same on every rank. A
plain value is a schedule of one phase, so ``seq_len=1024`` is ``Schedule([(0, 1024)])``.

A schedule is data: ``record()`` is JSON (it goes into ``Loader.state_dict()``, and a state is
refused by a Loader made with another one), ``Schedule.from_record`` reads it back, and two
schedules are equal when their records are. What each phase's value may be is checked where
the schedule is used (``ndp.loader.planning.shapes`` for ``batch_size`` and ``seq_len``), and a bad
one
is a ``ConfigError`` that names the option and the phase.

Exactness (``ndp.loader.planning.shapes``): a change of ``batch_size`` or ``seq_len`` takes effect
at
its step exactly, on every rank; in ``packed`` mode the token stream goes on across it (the
first window after a change starts at the token the last window before it ended at, as windows
follow one another), so no token is lost or repeated; ``len(loader)``, ``loader.remaining`` and
resumes (``state_dict``, elastic) count with the schedule.
"""

from __future__ import annotations

import bisect
import math
import numbers
from collections.abc import Iterable
from typing import Any

from ndp.errors import ConfigError

#: how a schedule's value goes from one phase to the next
INTERPOLATIONS = ("step", "linear")


class Schedule:
    """A value by the run's step: ``phases`` is ``[(step, value), ...]`` (module docstring).

    ``interpolate="step"`` holds each value until the next phase; ``"linear"`` goes from one
    phase's value to the next's in a straight line over the steps between them (numbers, or
    dicts of numbers with the same keys, such as mixing weights), and holds the last."""

    __slots__ = ("_steps", "_values", "interpolate")

    def __init__(self, phases: Iterable[tuple[int, Any]], *, interpolate: str = "step") -> None:
        if isinstance(phases, (str, bytes, dict)) or not isinstance(phases, Iterable):
            raise ConfigError(f"Schedule takes a list of (step, value) phases, got "
                              f"{type(phases).__name__}")
        if interpolate not in INTERPOLATIONS:
            raise ConfigError(f"Schedule interpolate must be one of "
                              f"{', '.join(map(repr, INTERPOLATIONS))}, got {interpolate!r}")
        steps: list[int] = []
        values: list[Any] = []
        for k, phase in enumerate(phases):
            if not isinstance(phase, (tuple, list)) or len(phase) != 2:
                raise ConfigError(f"Schedule phase {k} is {phase!r}; a phase is a (step, value) "
                                  f"pair")
            step, value = phase
            if isinstance(step, bool) or not isinstance(step, numbers.Integral):
                raise ConfigError(f"Schedule phase {k}: its step must be an integer (a batch "
                                  f"number of the run), got {step!r}")
            step = int(step)
            if k == 0 and step != 0:
                raise ConfigError(f"Schedule phase 0 starts at step {step}; the first phase "
                                  f"starts at step 0 (say what the run starts with)")
            if k and step <= steps[-1]:
                raise ConfigError(f"Schedule phase {k} starts at step {step}, not after phase "
                                  f"{k - 1}'s step {steps[-1]}: steps must increase")
            steps.append(step)
            values.append(value)
        if not steps:
            raise ConfigError("Schedule has no phase; give at least [(0, value)]")
        if interpolate == "linear":
            for k, value in enumerate(values):
                _check_linear(k, value, values[0])
        self._steps, self._values, self.interpolate = tuple(steps), tuple(values), interpolate

    # ----------------------------------------------------------------------------- reading
    @property
    def phases(self) -> list[tuple[int, Any]]:
        """``[(step, value), ...]`` as given."""
        return list(zip(self._steps, self._values))

    @property
    def steps(self) -> tuple[int, ...]:
        """Each phase's first step."""
        return self._steps

    @property
    def values(self) -> tuple[Any, ...]:
        """Each phase's value."""
        return self._values

    @property
    def constant(self) -> bool:
        """One phase: the same value at every step."""
        return len(self._steps) == 1

    def at(self, step: int) -> Any:
        """The value at run step ``step`` (>= 0)."""
        k = bisect.bisect_right(self._steps, step) - 1
        if k < 0:
            raise ConfigError(f"a schedule has no value at step {step}; steps start at 0")
        value = self._values[k]
        if self.interpolate == "step" or k + 1 == len(self._steps):
            return value
        a, b = self._steps[k], self._steps[k + 1]
        f = (step - a) / (b - a)
        nxt = self._values[k + 1]
        if isinstance(value, dict):
            return {key: value[key] + f * (nxt[key] - value[key]) for key in value}
        return value + f * (nxt - value)

    def map(self, fn: Any) -> Schedule:
        """The same phases with ``fn(phase_number, value)`` as values (checks, conversions)."""
        return Schedule([(s, fn(k, v)) for k, (s, v) in enumerate(self.phases)],
                        interpolate=self.interpolate)

    # ------------------------------------------------------------------------------ as data
    def record(self) -> dict:
        """The schedule as JSON-able data (``from_record`` reads it back)."""
        return {"phases": [[s, v] for s, v in self.phases], "interpolate": self.interpolate}

    @classmethod
    def from_record(cls, record: dict) -> Schedule:
        """The schedule ``record()`` wrote."""
        if not isinstance(record, dict) or "phases" not in record:
            raise ConfigError(f"not a schedule's record: {record!r}")
        return cls([tuple(p) for p in record["phases"]],
                   interpolate=record.get("interpolate", "step"))

    @classmethod
    def of(cls, value: Any) -> Schedule:
        """``value`` if it is a schedule, else the schedule of one phase that holds it."""
        return value if isinstance(value, Schedule) else cls([(0, value)])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and self.record() == other.record()

    def __hash__(self) -> int:
        return hash((self._steps, repr(self._values), self.interpolate))

    def __repr__(self) -> str:
        extra = "" if self.interpolate == "step" else f", interpolate={self.interpolate!r}"
        return f"Schedule({self.phases!r}{extra})"


def _check_linear(k: int, value: Any, first: Any) -> None:
    """A linear schedule's phase value: a finite number, or a dict of them with the first
    phase's keys."""
    def number(x: Any, what: str) -> None:
        if isinstance(x, bool) or not isinstance(x, numbers.Real) or not math.isfinite(x):
            raise ConfigError(f"Schedule phase {k}: {what} is {x!r}; a linear schedule goes "
                              f"between finite numbers")

    if isinstance(value, dict):
        if not isinstance(first, dict) or set(value) != set(first):
            raise ConfigError(f"Schedule phase {k} has keys {sorted(map(str, value))}, phase 0 "
                              f"{sorted(map(str, first)) if isinstance(first, dict) else first!r}:"
                              f" a linear schedule of dicts needs the same keys in every phase")
        for key, x in value.items():
            number(x, f"the value of {key!r}")
    else:
        number(value, "its value")


def check_run_end(name: str, value: Any, max_steps: int | None) -> None:
    """``ConfigError`` naming the phase of ``value`` (a ``Schedule`` given as option ``name``)
    that begins at or after the run's end (``max_steps``): it would never be used."""
    if max_steps is None or not isinstance(value, Schedule):
        return
    for k, step in enumerate(value.steps):
        if step >= max_steps:
            raise ConfigError(
                f"{name} phase {k} (from step {step:,}) begins at or after the run's end "
                f"(max_steps={max_steps:,}): it would never be used; end the schedule before "
                f"step {max_steps:,}, or make the run longer")
