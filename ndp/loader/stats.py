"""What a ``Loader`` has delivered: packets, drops by reason, tokens, waits (``loader.stats``).

Counted on the consumer's side from what each batch's layout counted
(``ndp.loader.layouts.layout``'s
``counts``, a row a batch), when ``loader.stats`` is read, the next chunk is taken or the epoch
ends (``ndp.loader.pipeline.taken``): the figures describe exactly the batches taken so far, and
``next()`` does not count them one by one.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from ndp.errors import user_level
from ndp.wire.format import DropReason

from ndp.loader.layouts.layout import (COUNTS, EMPTY, LEFT_OVER, ON_PURPOSE, PACKETS, REASONS,
                               REPEATED, TOKENS, TRUNCATED, VALID)

SKIPPED = DropReason.SKIPPED.name


@dataclass
class LoaderStats:
    """What the loader has delivered so far (consumer side)."""

    batches: int = 0
    packets: int = 0  # packets of this rank's order taken into batches
    valid: int = 0
    corrupt: dict[str, int] = field(default_factory=dict)  # DropReason name -> count
    dropped_on_purpose: int = 0  # CRC-Drop
    tokens: int = 0  # tokens delivered (x tokens in packed mode)
    truncated_tokens: int = 0  # padded and packing rows cut at seq_len (from the packets)
    # : padded mode, the epoch a loop last started (``ndp.loader.layouts.truncation``): the tokens
    # its
    #: packets hold by the index, and how many of them its rows cut at seq_len (warned past 1%)
    epoch_tokens: int = 0
    epoch_truncated_tokens: int = 0
    unused_tokens: int = 0  # packed: stream tokens left at epoch ends
    #: several ranks: packets left out so that every rank delivers as many batches, and
    #: packets delivered twice (packed mode, a rank left short by corrupt packets)
    rank_balance: int = 0
    repeated: int = 0
    wait_seconds: float = 0.0  # consumer time blocked on the producer
    sources: dict[str, int] = field(default_factory=dict)  # mixing: packets per source
    mix_unused: dict[str, int] = field(default_factory=dict)  # mixing: left when an epoch ended
    #: mixing with mix_size "longest" or a number: packets taken again (upsampled sources)
    mix_repeated: dict[str, int] = field(default_factory=dict)
    # damage found when a stale index was rebuilt (those bytes are no packets in the index)
    corrupt_regions: int = 0
    corrupt_bytes: int = 0
    #: padded mode: batches with no row, every packet of them dropped (warned about once)
    empty_batches: int = 0
    # : left out on purpose (``ndp.loader.planning.skips``): the batches of skipped steps, the
    # packets
    #: those took and the packets ``skip_packets`` named, and the tokens of skipped batches
    #: (their corrupt packets are in ``corrupt`` too)
    skipped_batches: int = 0
    skipped_packets: int = 0
    skipped_tokens: int = 0
    #: packed windows at documents (``align="bos"``, ``ndp.loader.layouts.align``): tokens no window
    #: reads as an input, passed over to start the next window at a document
    left_over_tokens: int = 0
    _warned_empty: bool = field(default=False, repr=False, compare=False)

    def add(self, other: dict) -> None:
        """Add what one batch (or an epoch's end) counted; on the consumer's hot path, so
        written out key by key."""
        get = other.get
        self.packets += get("packets", 0)
        self.valid += get("valid", 0)
        self.tokens += get("tokens", 0)
        self.truncated_tokens += get("truncated_tokens", 0)
        self.dropped_on_purpose += get("dropped_on_purpose", 0)
        self.unused_tokens += get("unused_tokens", 0)
        self.rank_balance += get("rank_balance", 0)
        self.repeated += get("repeated", 0)
        empty = get("empty_batches")
        if empty:
            self._empty(empty)
        for key in ("corrupt", "sources", "mix_unused", "mix_repeated"):
            found = get(key)
            if found:
                mine = getattr(self, key)
                for name, n in found.items():
                    if key == "corrupt" and name == SKIPPED:  # left out on purpose
                        self.skipped_packets += n
                        continue
                    mine[name] = mine.get(name, 0) + n

    def add_counts(self, rows: np.ndarray) -> None:
        """Add what consecutive batches counted: rows of ``Layout.counts`` (columns
        ``COUNTS``, then one per drop reason), one batch each."""
        sums = rows.sum(axis=0).tolist()
        self.packets += sums[PACKETS]
        self.valid += sums[VALID]
        self.tokens += sums[TOKENS]
        self.truncated_tokens += sums[TRUNCATED]
        self.repeated += sums[REPEATED]
        self.dropped_on_purpose += sums[ON_PURPOSE]
        self.left_over_tokens += sums[LEFT_OVER]
        if any(sums[len(COUNTS):]):
            self._reasons(sums[len(COUNTS):])
        if sums[EMPTY]:
            first = int(np.flatnonzero(rows[:, EMPTY])[0])
            self.batches += first  # the warning names the first batch with no row
            self._empty(sums[EMPTY])
            self.batches -= first
        self.batches += rows.shape[0]

    def add_skipped(self, rows: np.ndarray) -> None:
        """Add batches of skipped steps (rows of ``Layout.counts``): counted as skipped, not
        delivered; what was corrupt among their packets is counted all the same."""
        sums = rows.sum(axis=0).tolist()
        self.skipped_batches += rows.shape[0]
        self.skipped_packets += sums[PACKETS]
        self.skipped_tokens += sums[TOKENS]
        self.dropped_on_purpose += sums[ON_PURPOSE]
        self.left_over_tokens += sums[LEFT_OVER]
        if any(sums[len(COUNTS):]):
            self._reasons(sums[len(COUNTS):])

    def _reasons(self, counts: list[int]) -> None:
        """Drops by reason (``REASONS`` order): into ``corrupt``, but for packets left out on
        purpose (``skip_packets``), which are ``skipped_packets``."""
        corrupt = self.corrupt
        for name, n in zip(REASONS, counts):
            if n:
                if name == SKIPPED:
                    self.skipped_packets += n
                else:
                    corrupt[name] = corrupt.get(name, 0) + n

    def _empty(self, n: int) -> None:
        self.empty_batches += n
        if not self._warned_empty:
            self._warned_empty = True
            warnings.warn(
                f"ndp.Loader: batch {self.batches + 1} has no rows: every packet of it was "
                "dropped (corrupt, or CRC-Drop), so a mean loss over it is NaN. Use a zero "
                "loss for a batch with no rows (under DDP every rank must still run its "
                "backward), or a larger batch_size; counted in loader.stats.empty_batches",
                UserWarning, stacklevel=user_level())

    def as_dict(self) -> dict:
        return {
            "batches": self.batches, "packets": self.packets, "valid": self.valid,
            "corrupt": dict(self.corrupt), "dropped_on_purpose": self.dropped_on_purpose,
            "tokens": self.tokens, "truncated_tokens": self.truncated_tokens,
            "unused_tokens": self.unused_tokens, "epoch_tokens": self.epoch_tokens,
            "epoch_truncated_tokens": self.epoch_truncated_tokens,
            "rank_balance": self.rank_balance,
            "repeated": self.repeated, "wait_seconds": round(self.wait_seconds, 6),
            "corrupt_regions": self.corrupt_regions, "corrupt_bytes": self.corrupt_bytes,
            "empty_batches": self.empty_batches,
            **({"skipped_batches": self.skipped_batches, "skipped_packets": self.skipped_packets,
                "skipped_tokens": self.skipped_tokens}
               if self.skipped_batches or self.skipped_packets else {}),
            **({"left_over_tokens": self.left_over_tokens} if self.left_over_tokens else {}),
            "sources": dict(self.sources), "mix_unused": dict(self.mix_unused),
            "mix_repeated": dict(self.mix_repeated),
        }
