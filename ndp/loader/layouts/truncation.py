"""Padded rows cut at ``seq_len``: how many of an epoch's tokens, from the index, before its
first batch; and a warning when that is more than ``WARN_PERCENT`` of them.

In ``mode="padded"`` a row holds its packet's first ``seq_len`` tokens, and its ``labels`` are
those tokens, not shifted (why: ``ndp.loader.loader``, "Modes"). So a packet of
``n > seq_len`` tokens loses its last ``n - seq_len`` tokens, and as many next-token targets
(fewer where the cut tokens were masked). The share is those tokens over every token of the epoch's
packets: this rank's share
of the epoch, each packet as its index entry says. On intact data that is exactly what
``stats.truncated_tokens`` adds up batch by batch over the epoch (from the decoded packets,
on either backend); a corrupt packet, dropped as it is decoded, is counted here still.

Pretraining text read as padded rows lost 37% of its tokens in a trial, silently: ``packed``
windows run across packets and cut nothing. The converter warns past the same share of the
tokens its own truncation cuts (``ndp.convert.options.TRUNCATION_WARN``).
The epoch's count (``ndp.loader.planning.count``, on the plan's thread) or the plan's pass with
CRC-Drop
(``ndp.loader.planning.epoch``) counts it from the token counts it reads window by window, in index
order; with mixing or in an elastic remainder (planned whole) it is one gather of the share's
token counts, on the consumer's thread when a loop starts the epoch. Nothing per batch, no
device work, no host wait (``CutReport``: when the report comes).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

#: warn when more than this percentage of an epoch's tokens are cut
WARN_PERCENT = 1


@dataclass(frozen=True)
class Cut:
    """What padded rows of ``seq_len`` cut from packets, by their index token counts."""

    tokens: int  #: the packets' tokens
    truncated: int  #: those past ``seq_len``
    longer: int  #: packets longer than ``seq_len``
    longest: int  #: tokens of the longest packet

    def plus(self, other: Cut) -> Cut:
        """The cut of both sets of packets."""
        return Cut(self.tokens + other.tokens, self.truncated + other.truncated,
                   self.longer + other.longer, max(self.longest, other.longest))


def cut_of(tokens: np.ndarray, seq_len: int | np.ndarray) -> Cut:
    """The ``Cut`` of rows of ``seq_len`` over packets of ``tokens`` tokens each (an array:
    each packet's row's, where ``seq_len`` is a schedule,
    ``ndp.loader.planning.shapes.Shapes.row_lens``)."""
    if tokens.shape[0] == 0:
        return Cut(0, 0, 0, 0)
    over = tokens.astype(np.int64, copy=False) - seq_len
    long = over > 0
    return Cut(int(tokens.sum()), int(over[long].sum()), int(long.sum()), int(tokens.max()))


def row_lens(shapes: Any, tokens: np.ndarray) -> int | np.ndarray:
    """The ``seq_len`` of the row each of a padded share's packets (``tokens`` by the index,
    in order) lands in: one int for one ``seq_len``, else each packet's batch's
    (``ndp.loader.planning.shapes``; with a token budget, the batches the index cuts)."""
    if len(set(shapes.lens)) == 1:
        return shapes.lens[0]
    if not shapes.budgeted:
        return shapes.row_lens(tokens.shape[0])
    from ndp.loader.layouts.packing import count_batches

    batch_of = np.empty(tokens.shape[0], np.int64)
    count_batches(tokens, shapes, batch_of)
    phase = np.searchsorted(np.array(shapes.starts), batch_of, side="right") - 1
    return np.array(shapes.lens, np.int64)[phase]


#: a padded epoch of at most this many packets has its cut counted before its first batch
#: (milliseconds); a larger one reports it at the first batch after the plan's thread counted it
WAIT_PACKETS = 1 << 20


class CutReport:
    """Once per epoch, when a loop starts it (or takes it up after a resume): the padded cut
    of this rank's share into ``stats.epoch_tokens`` and ``stats.epoch_truncated_tokens``,
    and a warning if it is more than ``WARN_PERCENT`` of the tokens. Padded mode only
    (``packed`` cuts nothing; ``packing`` rows cut too, but which packets an epoch reaches
    is known only as its batches are laid out). The cut is counted by the epoch's count
    (``ndp.loader.planning.count``): before the first batch for a dataset of up to ``WAIT_PACKETS``,
    else at the first batch (``poll``) after it is counted, seconds into the epoch at 1e8."""

    def __init__(self, plan: Any, stats: Any) -> None:
        self.plan, self.stats = plan, stats
        self._epoch: int | None = None  # the epoch last reported, or being counted
        self._pending = False  # its cut is still being counted

    def start(self, epoch: int) -> None:
        """A loop starts (or takes up) ``epoch``: count and warn, unless done for it already."""
        plan = self.plan
        if plan.mode != "padded" or epoch == self._epoch:
            return
        self._epoch, self._pending = epoch, True
        share = plan.share(epoch)
        if share.cut is None and plan.corpus.n_packets <= WAIT_PACKETS:
            share.count.counted()
        self._report(wait=False)

    def end(self) -> None:
        """The epoch ended: report its cut if not done yet (waiting for the count)."""
        if self._pending:
            self._report(wait=True)

    def poll(self) -> None:
        """Report the epoch's cut if it was being counted and is counted now (a batch was
        delivered: cheap unless it is)."""
        if self._pending:
            self._report(wait=False)

    def _report(self, *, wait: bool) -> None:
        plan, epoch = self.plan, self._epoch
        share = plan.share(epoch)
        if share.cut is None and not share.count.final:
            if not wait:
                return
            share.count.counted()
        self._pending = False
        shapes = plan.shapes_of(epoch)
        cut = share.cut
        if cut is None:  # not counted by the epoch's count (a known count): from the index,
            # a walk of the whole share (the count's cut spares the training loop's thread it)
            tokens = np.asarray(plan.corpus.tokens[share.packets[:share.length]])
            cut = cut_of(tokens, row_lens(shapes, tokens))
        lens = (f"`seq_len={plan.seq_len}`" if len(set(plan.shapes.lens)) == 1 else
                f"the rows' `seq_len` ({', '.join(map(str, sorted(set(shapes.lens))))} in "
                f"this epoch's phases)")
        self.stats.epoch_tokens, self.stats.epoch_truncated_tokens = cut.tokens, cut.truncated
        if cut.truncated * 100 <= WARN_PERCENT * cut.tokens:
            return
        who = f"rank {plan.rank}'s share of " if plan.world_size > 1 else ""
        warnings.warn(
            f"ndp.Loader: padded rows cut {cut.truncated:,} of the {cut.tokens:,} tokens of "
            f"{who}epoch {epoch} ({100 * cut.truncated / cut.tokens:.1f}%) at "
            f"{lens}: {cut.longer:,} packets are longer (the longest "
            f"{cut.longest:,} tokens), and a row keeps a packet's first `seq_len` tokens. For "
            f"pretraining data use `mode='packed'` (windows across packets: no token is cut); "
            f"for SFT examples, a larger `seq_len`. Counted in stats.epoch_truncated_tokens",
            stacklevel=4)  # the user's loop
