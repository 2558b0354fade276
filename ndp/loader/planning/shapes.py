"""The batch shape of every step: ``batch_size`` and ``seq_len`` schedules as phases of one
``(B, T)`` each (``Shapes``), and the counting every mode does with them.

A run's ``Shapes`` start at run step 0; an epoch's are the run's seen from the epoch's first
step (``after``), so that everything an epoch plans (its batch count, a chunk's batches, a
resume's position) counts from 0 as it did with one shape. With one phase both are the same
object and nothing depends on where an epoch starts.

What each mode makes of a stream of its epoch, by the index (the counts every rank agrees on):

* ``padded``: batch ``k`` takes the next ``B_k`` packets of the share: ``padded_batches(n)``
  is the smallest ``k`` whose batches take all ``n`` (the last one may be short);
* ``packed``: batch ``k`` takes the next ``B_k * T_k`` tokens of the stream and reads one past
  them (its last target): ``packed_batches(n)`` is the largest ``k`` with
  ``tokens_before(k) + 1 <= n``. A change of shape cuts the stream where the last batch before
  it ended: no token is lost or repeated at a boundary;
* ``packing``: batch ``k`` fills ``B_k`` rows of ``T_k`` (``ndp.loader.layouts.packing`` takes the
  phases as arrays, ``arrays()``).

The producer never puts a change of shape inside a chunk (``phase_end``): every chunk is laid out
and built with one shape, as before.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from ndp.checks import integer
from ndp.errors import ConfigError
from ndp.loader.planning.schedule import Schedule


class Shapes:
    """``(B, T)`` from each phase's first step on (module docstring); with a token budget
    (``budgets``, 0: none) a batch takes whole examples while their tokens, each cut to ``T``,
    fit it (``B`` is then only the rows a budget's batch is sized for: ``budget // T``)."""

    __slots__ = ("starts", "sizes", "lens", "budgets")

    def __init__(self, starts: list[int], sizes: list[int], lens: list[int],
                 budgets: list[int] | None = None) -> None:
        self.starts, self.sizes, self.lens = tuple(starts), tuple(sizes), tuple(lens)
        self.budgets = tuple(budgets) if budgets is not None else (0,) * len(self.starts)

    @classmethod
    def of(cls, batch_size: Any, seq_len: Any, batch_tokens: Any = None) -> Shapes:
        """A run's shapes from ``batch_size`` (or ``batch_tokens``, the token budget of a
        batch) and ``seq_len``, each an int or a ``Schedule`` of ints >= 1 (checked:
        ``ConfigError`` naming the option and phase)."""
        t = shape_schedule("seq_len", seq_len)
        if (batch_size is None) == (batch_tokens is None):
            raise ConfigError("give batch_size (rows a batch) or batch_tokens (tokens a "
                              "batch, padded and packing mode), one of them")
        if batch_tokens is None:
            b = shape_schedule("batch_size", batch_size)
            starts = sorted(set(b.steps) | set(t.steps))
            return cls._merged(starts, [b.at(s) for s in starts], [t.at(s) for s in starts],
                               [0] * len(starts))
        k = shape_schedule("batch_tokens", batch_tokens)
        starts = sorted(set(k.steps) | set(t.steps))
        lens, budgets = [t.at(s) for s in starts], [k.at(s) for s in starts]
        return cls._merged(starts, [max(1, x // y) for x, y in zip(budgets, lens)], lens,
                           budgets)

    @classmethod
    def _merged(cls, starts: list[int], sizes: list[int], lens: list[int],
                budgets: list[int]) -> Shapes:
        """The phases with a phase that repeats the one before it left out: a change of
        shape is where the shape changes (a chunk is cut there, and nowhere else)."""
        keep = [i for i in range(len(starts))
                if i == 0 or (sizes[i], lens[i], budgets[i]) != (sizes[i - 1], lens[i - 1],
                                                                 budgets[i - 1])]
        return cls([starts[i] for i in keep], [sizes[i] for i in keep],
                   [lens[i] for i in keep], [budgets[i] for i in keep])

    @property
    def budgeted(self) -> bool:
        """Batches are cut by a token budget (``batch_tokens``)."""
        return any(self.budgets)

    def budget_at(self, step: int) -> int:
        """The token budget of step ``step``'s batch (0: none, ``B`` rows)."""
        return self.budgets[self._phase(step)]

    @property
    def constant(self) -> bool:
        """One shape at every step."""
        return len(self.starts) == 1

    def _phase(self, step: int) -> int:
        return bisect.bisect_right(self.starts, step) - 1  # a few phases: no array made

    def at(self, step: int) -> tuple[int, int]:
        """``(B, T)`` of step ``step``."""
        k = self._phase(step)
        return self.sizes[k], self.lens[k]

    def phase_end(self, step: int) -> int | None:
        """The first step after ``step`` with another shape (``None``: none follows)."""
        k = self._phase(step)
        return None if k + 1 >= len(self.starts) else self.starts[k + 1]

    def after(self, start: int) -> Shapes:
        """These shapes with run step ``start`` as step 0 (an epoch's, from its first step)."""
        if self.constant or start == 0:
            return self
        k = self._phase(start)
        starts = [0] + [s - start for s in self.starts[k + 1:]]
        return Shapes(starts, self.sizes[k:], self.lens[k:], self.budgets[k:])

    def elements(self, per_phase: Any) -> int:
        """The most of ``per_phase(B, T)`` over the phases."""
        return max(per_phase(b, t) for b, t in zip(self.sizes, self.lens))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(starts, sizes, lens, budgets)`` as int64 arrays (compiled counts take them)."""
        return (np.array(self.starts, np.int64), np.array(self.sizes, np.int64),
                np.array(self.lens, np.int64), np.array(self.budgets, np.int64))

    def record(self) -> list[list[int]]:
        """JSON: ``[[first step, B, T], ...]``, ``[first step, B, T, budget]`` where a phase
        has a budget (a shared count's key, ``ndp.loader.planning.shared_count``)."""
        return [[s, b, t, k] if k else [s, b, t]
                for s, b, t, k in zip(self.starts, self.sizes, self.lens, self.budgets)]

    # ------------------------------------------------------------------------------ counts
    def _spans(self) -> Any:
        """``(steps in the phase or None for the last, B, T)`` phase by phase."""
        n = len(self.starts)
        for k in range(n):
            span = self.starts[k + 1] - self.starts[k] if k + 1 < n else None
            yield span, self.sizes[k], self.lens[k]

    def padded_batches(self, rows: int) -> int:
        """The batches that take ``rows`` packets, ``B_k`` a batch (the last may be short)."""
        if rows <= 0:
            return 0
        k = 0
        for span, b, _ in self._spans():
            need = -(-rows // b)
            if span is None or need <= span:
                return k + need
            k, rows = k + span, rows - span * b
        raise AssertionError("unreachable: the last phase has no end")

    def packed_batches(self, tokens: int) -> int:
        """The batches a stream of ``tokens`` tokens makes: batch ``k`` takes ``B_k * T_k``
        tokens and reads the one after them."""
        rest = tokens - 1
        if rest <= 0:
            return 0
        k = 0
        for span, b, t in self._spans():
            n = rest // (b * t)
            if span is not None:
                n = min(n, span)
            k, rest = k + n, rest - n * b * t
            if span is None or n < span:
                return k
        return k

    def rows_before(self, k: int) -> int:
        """Packets (padded) or rows the batches before batch ``k`` take."""
        return self._before(k, lambda b, t: b)

    def tokens_before(self, k: int) -> int:
        """Stream tokens the packed batches before batch ``k`` take."""
        return self._before(k, lambda b, t: b * t)

    def _before(self, k: int, per: Any) -> int:
        total = 0
        for span, b, t in self._spans():
            n = k if span is None else min(k, span)
            total, k = total + n * per(b, t), k - n
            if k <= 0:
                break
        return total

    def row_lens(self, rows: int) -> np.ndarray:
        """Padded: the ``T`` of the batch that takes each of the share's first ``rows``
        packets (int64)."""
        out = np.empty(max(rows, 0), np.int64)
        at = 0
        for span, b, t in self._spans():
            end = rows if span is None else min(rows, at + span * b)
            out[at:end] = t
            at = end
            if at >= rows:
                break
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Shapes) and self.record() == other.record()

    def __hash__(self) -> int:
        return hash((self.starts, self.sizes, self.lens, self.budgets))

    def __repr__(self) -> str:
        return f"Shapes({self.record()})"


def shape_schedule(name: str, value: Any) -> Schedule:
    """``value`` (an int or a ``Schedule`` of ints >= 1) as a schedule of Python ints."""
    if not isinstance(value, Schedule):
        return Schedule([(0, integer(name, value, least=1))])
    if value.interpolate != "step":
        raise ConfigError(f"{name}: a batch shape changes at steps, it is not interpolated; "
                          f"give its steps (Schedule([(0, 256), (1000, 512), ...]))")
    return value.map(lambda k, v: integer(
        f"{name} phase {k} (from step {value.steps[k]:,})", v, least=1))


def setting(value: Any) -> Any:
    """How a state records ``batch_size`` or ``seq_len``: the int (one phase, as states always
    did), else the schedule's record."""
    if isinstance(value, Schedule):
        return value.values[0] if value.constant else value.record()
    return value


def from_setting(recorded: Any) -> Any:
    """A recorded ``batch_size`` or ``seq_len`` (``setting``) as Loaders take it: the int, or
    the schedule a record is."""
    return Schedule.from_record(recorded) if isinstance(recorded, dict) else recorded
