"""The run's steps as a ``Plan`` sees them (``RunSteps``): the batch shape of every step
(``ndp.loader.planning.shapes``), and the run step each epoch's first batch is, which an epoch's
shapes are counted from.

A run's step counts its batches since the start of training, across epochs, the same on every
rank: epoch ``e`` begins at the step the run resumed in (``set_start``, from a state) plus the
batch counts of the epochs between. With one batch shape nothing depends on it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ndp.errors import LoaderUsageError
from ndp.loader.planning.shapes import Shapes
from ndp.loader.planning.skips import skipped


class RunSteps:
    """A ``Plan``'s shapes and epoch starts; the plan gives ``epoch_batches(epoch)``."""

    shapes: Shapes
    _starts: dict[int, int]
    epoch_batches: Any
    #: the run's last step plus one (``max_steps``), or None: a run of as many epochs as asked
    max_steps: int | None = None
    #: run steps whose batches are left out (``ndp.loader.planning.skips``)
    skips: tuple[tuple[int, int], ...] = ()
    #: packets left out wherever they come (sorted global numbers, ``ndp.loader.planning.skips``)
    skip_packets: np.ndarray = np.zeros(0, np.int64)

    def run_batches(self, epoch: int) -> int:
        """Batches ``epoch`` delivers in this run: all of them, or those before the run's end
        (``max_steps``): fewer in the epoch it ends in, none after."""
        n = self.epoch_batches(epoch)
        if self.max_steps is None:
            return n
        return max(0, min(n, self.max_steps - self.start_step(epoch)))

    def kept_batches(self, epoch: int) -> int:
        """``run_batches(epoch)`` less the steps the plan's skip ranges leave out
        (``ndp.loader.planning.skips``): the batches a loop over the epoch yields."""
        n = self.run_batches(epoch)
        if not self.skips:
            return n
        start = self.start_step(epoch)
        return n - skipped(self.skips, start, start + n)

    def ended(self, step: int) -> bool:
        """Whether run step ``step`` is at or past the run's end."""
        return self.max_steps is not None and step >= self.max_steps

    def _set_shapes(self, batch_size: Any, seq_len: Any, batch_tokens: Any = None) -> None:
        """``shapes``: the batch shape of every run step (``ndp.loader.planning.shapes``);
        ``batch_size`` and ``seq_len``: the first step's."""
        self.batch_setting, self.len_setting = batch_size, seq_len
        self.tokens_setting = batch_tokens
        self.shapes = Shapes.of(batch_size, seq_len, batch_tokens)
        self.batch_size, self.seq_len = self.shapes.at(0)

    def set_start(self, epoch: int, step: int) -> None:
        """Epoch ``epoch``'s first batch is run step ``step`` (a resumed state says so)."""
        self._starts = {epoch: step}

    def start_step(self, epoch: int) -> int:
        """The run step of ``epoch``'s first batch: the last known epoch start plus the batch
        counts of the epochs from it (each counted once, and kept)."""
        have = self._starts.get(epoch)
        if have is not None:
            return have
        known = [e for e in self._starts if e < epoch]
        if not known:
            raise ValueError(f"epoch {epoch} is before the epoch this run resumed in "
                             f"({min(self._starts)}): its first step is not known")
        e = max(known)
        step = self._starts[e]
        for k in range(e, epoch):
            step += self.epoch_batches(k)
            self._starts[k + 1] = step
        return step

    def shapes_of(self, epoch: int) -> Shapes:
        """``epoch``'s batch shapes, from its first batch (one shape: the run's, whatever the
        epoch's first step)."""
        return self.shapes if self.shapes.constant else self.shapes.after(self.start_step(epoch))


class StepViews:
    """A ``Loader``'s view of the run's steps: ``epoch``, ``step``, ``remaining``, the run's
    end and the next batch's shape (the Loader gives ``plan``, ``_state`` and ``len``)."""

    plan: Any
    _state: dict
    __len__: Any

    @property
    def epoch(self) -> int:
        """The epoch the next loop continues or starts."""
        return self._state["epoch"]

    @property
    def remaining(self) -> int:
        """Batches this rank still delivers in the current epoch: ``len(loader)`` at an
        epoch's start, the rest after ``load_state_dict`` of a state saved mid-epoch, one less
        per batch a loop takes (skipped steps aside)."""
        batch = self._state["batch"]
        if not self.plan.skips:
            return len(self) - batch
        start = self.plan.start_step(self.epoch)
        return len(self) - batch + skipped(self.plan.skips, start, start + batch)

    @property
    def max_steps(self) -> int | None:
        """The run's end (``max_steps=``): a loop stops before the batch of that step, and a
        loop begun there is refused (``LoaderUsageError``); None: no end."""
        return self.plan.max_steps

    def _refuse_past_end(self) -> None:
        if self.plan.ended(self.step):
            raise LoaderUsageError(
                f"this run ended at step {self.plan.max_steps:,} (max_steps): there is nothing "
                f"left to deliver; stop the training loop at loader.step >= loader.max_steps, "
                f"or make a Loader with a larger max_steps and load this one's state_dict()")

    @property
    def step(self) -> int:
        """The run step of the next batch: the batches delivered before it since the start of
        training, across epochs (resumes included), the same on every rank. Schedules
        (``ndp.Schedule``) are keyed by it."""
        return self.plan.start_step(self.epoch) + self._state["batch"]

    @property
    def batch_size(self) -> int | None:
        """The next batch's ``batch_size`` (``batch_size=`` if it is an int; a schedule's
        value at ``step``; None where batches are cut by ``batch_tokens``)."""
        return None if self.plan.shapes.budgeted else self._shape()[0]

    @property
    def batch_tokens(self) -> int | None:
        """The next batch's token budget (``batch_tokens=``; None: batches of
        ``batch_size`` rows)."""
        shapes = self.plan.shapes
        return shapes.budget_at(self.step) if shapes.budgeted else None

    @property
    def seq_len(self) -> int:
        """The next batch's ``seq_len`` (``seq_len=`` if it is an int; a schedule's value at
        ``step``)."""
        return self._shape()[1]

    def _shape(self) -> tuple[int, int]:
        shapes = self.plan.shapes
        return shapes.at(0) if shapes.constant else shapes.at(self.step)
