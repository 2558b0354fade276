"""Where a chunk of batches ends in a rank's share, by the index's token counts (``Reach``):
the plan's answer to the producer's "how many packets make these batches"
(``ndp.loader.pipeline.chunks``),
from token counts gathered a block of share positions at a time and remembered.

A ``Plan`` is a ``Reach``: it gives ``corpus``, ``mode`` and the memo fields (``_blocks_of``,
``_blocks``), which it sets up.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ndp.loader.ordering import units
from ndp.loader.layouts.align import aligned_reach
from ndp.loader.layouts.packing import budget_ends, chain_end
from ndp.store.columns import tokens_of

#: share positions whose token counts ``Reach.share_tokens`` gathers at once
TOKEN_BLOCK = 1 << 14


class Reach:
    """``chunk_end``, ``share_tokens`` and packing's ``candidates`` (module docstring)."""

    corpus: Any
    mode: str
    align: str | None
    _blocks_of: Any
    _blocks: dict
    #: packed: the running token sum ``chunk_end`` last made, ``(share, pos, sum)``, for
    #: ``stream_run`` (a tuple, replaced whole: a thread that reads it sees one whole)
    _run_memo: tuple | None = None
    #: packing: share positions a batch read in the last chunk (``chunk_end``'s first guess)
    _packing_per_batch: float = 0.0

    def chunk_end(self, share: np.ndarray, pos: int, tok: int, batches: int,
                  shape: tuple[int, int], budget: int = 0) -> int:
        """The share position where a chunk of ``batches`` batches of ``shape`` (B, T; or
        cut by a token ``budget``) from ``(pos, tok)`` ends, by the index's token counts."""
        n = share.shape[0]
        B, T = shape
        if self.mode == "padded":
            if budget:
                return self.budget_end(share, pos, batches, budget, T)
            return min(pos + batches * B, n)
        if self.mode == "packed" and self.align is not None:
            return self._aligned_end(share, pos, tok, batches, B, T)
        if self.mode == "packed":
            need = tok + batches * B * T + 1
            ahead = 64  # a bounded look-ahead: never a cumulative sum over the rest of the epoch
            memo = self._run_memo  # the last chunk's tokens a packet make the first guess
            if memo is not None and memo[0] is share and memo[2].shape[0]:
                mean = max(float(memo[2][-1]) / memo[2].shape[0], 1.0)
                ahead = max(ahead, int((need / mean) * 1.125) + 64)
            # past the share's own packets (its repeat, for a rank short of tokens) only if
            # they do not hold enough: the repeat's first window is not read for nothing
            edge = min(getattr(share, "length", n), n)
            edge = n if pos >= edge else edge
            while True:
                cum = np.cumsum(self.share_tokens(share, pos, min(pos + ahead, edge)))
                if cum.shape[0] and cum[-1] >= need:
                    break
                if pos + ahead >= edge:
                    if edge >= n:
                        break
                    edge = n
                # as far again as the tokens so far say is needed, an eighth more
                mean = max(float(cum[-1]) / cum.shape[0], 1.0) if cum.shape[0] else 1.0
                ahead = max(2 * ahead, int((need / mean) * 1.125) + 64)
            self._run_memo = (share, pos, cum)
            return min(pos + int(np.searchsorted(cum, need)) + 1, n)
        # packing: a batch takes its candidates when all are valid (``chain_end``, compiled),
        # read as far ahead as they need: as far as the last chunk's batches read per batch
        # say, an eighth more (the first: 8 packets a row), doubled until it is enough
        per = self._packing_per_batch
        cap = int(batches * per * 1.125) + 64 if per else max(64, 8 * B * batches)
        while True:
            end = min(pos + cap, n)
            q = chain_end(self.share_tokens(share, pos, end), batches=batches, rows=B,
                          row_len=T, budget=budget, complete=end >= n)
            if q >= 0:
                if end < n:  # a chunk cut short by the share's end says nothing
                    self._packing_per_batch = q / batches
                return pos + q
            cap *= 2

    def _aligned_end(self, share: np.ndarray, pos: int, tok: int, batches: int, B: int,
                     T: int) -> int:
        """``chunk_end`` of packed windows at documents (``ndp.loader.layouts.align``): the greedy
        over the documents from ``pos``, as far ahead as it needs (past the share's own
        packets, into its repeat, only if they do not hold enough)."""
        n = share.shape[0]
        edge = min(getattr(share, "length", n), n)
        edge = n if pos >= edge else edge
        # as far as the last chunk's batches read per batch say, an eighth more
        per = getattr(self, "_aligned_per_batch", 0.0)
        ahead = int(batches * per * 1.125) + 64 if per else max(64, 2 * batches * B)
        while True:
            end = min(pos + ahead, edge)
            q, point = aligned_reach(self.share_tokens(share, pos, end), tok=tok,
                                     batch_size=B, seq_len=T, batches=batches)
            if q >= 0:
                self._aligned_per_batch = q / batches
                # the search point after them, for the guess of the next chunk's start
                self._aligned_last = (id(share), pos, tok, batches, B, T, q, point)
                return pos + q
            if end >= edge:
                if edge >= n:
                    return n
                edge = n
            ahead *= 2

    def aligned_point(self, share: np.ndarray, pos: int, tok: int, batches: int, B: int,
                      T: int) -> tuple[int, int]:
        """``align.aligned_reach`` of the documents from ``pos``: how many ``batches`` read
        and the search point after them, as the last ``chunk_end`` found it if it was asked
        the same (the producer asks both for every chunk), else by the index."""
        last = getattr(self, "_aligned_last", None)
        if last is not None and last[:6] == (id(share), pos, tok, batches, B, T):
            return last[6], last[7]
        end = self.chunk_end(share, pos, tok, batches, (B, T))
        return aligned_reach(self.share_tokens(share, pos, end), tok=tok, batch_size=B,
                             seq_len=T, batches=batches)

    def budget_end(self, share: np.ndarray, pos: int, batches: int, budget: int,
                   row_len: int) -> int:
        """Where ``batches`` batches cut by a token ``budget`` from share position ``pos``
        end (``ndp.loader.layouts.packing.budget_ends``), reading as far ahead as they need."""
        n = share.shape[0]
        cap = 64 * batches
        while True:
            window = self.share_tokens(share, pos, pos + cap)
            ends = budget_ends(window, budget=budget, row_len=row_len, most=batches)
            if pos + cap >= n or (ends.shape[0] == batches and ends[-1] < window.shape[0]):
                return pos + int(ends[-1]) if ends.shape[0] else pos
            cap *= 2

    def stream_run(self, share: np.ndarray, a: int, b: int) -> np.ndarray:
        """``np.cumsum(share_tokens(share, a, b))``: the stream position after each packet of
        ``share[a:b]`` from ``a``'s start; a slice of the sum ``chunk_end`` made for the chunk
        from ``a`` where it covers it (the producer's guess of the next chunk's start, right
        after it planned this one, asks for that same sum)."""
        memo = self._run_memo
        b = min(b, share.shape[0])
        if memo is not None and memo[0] is share and memo[1] == a and memo[2].shape[0] >= b - a:
            return memo[2][:max(b - a, 0)]
        return np.cumsum(self.share_tokens(share, a, b))

    def share_tokens(self, share: np.ndarray, a: int, b: int) -> np.ndarray:
        """The index token counts of ``share[a:b]``, gathered ``TOKEN_BLOCK`` positions at a
        time and remembered for the share last asked about (its last 8 blocks): the
        producer's chunk plans and layouts ask for the positions it reads, in order, a few
        times a batch, and a gather from the shards' indexes costs ~100 us a call."""
        b = min(b, share.shape[0])
        if b <= a:
            return np.zeros(0, np.int64)
        documents = units.active(self.corpus, self.mode)  # a place's tokens: its document's
        tables = getattr(share, "tables", None)  # a RankOrder's own entries, held
        if tables is not None:
            e = tables.entries(a, b)
            toks = tokens_of(e["length"], e["typ"]).astype(np.int64, copy=False)
            return units.place_tokens(self.corpus, share[a:b], toks) if documents else toks
        own = getattr(share, "length", None)  # a RankOrder twice over: p >= own is p - own
        if own is not None and share.shape[0] > own and b > own:
            if a >= own:
                return self.share_tokens(share, a - own, b - own)
            return np.concatenate([self.share_tokens(share, a, own),
                                   self.share_tokens(share, 0, b - own)])
        end = share.shape[0] if own is None else own  # blocks end there
        if self._blocks_of is not share:
            self._blocks_of, self._blocks = share, {}
        first, last = a // TOKEN_BLOCK, (b - 1) // TOKEN_BLOCK
        parts = []
        for k in range(first, last + 1):
            got = self._blocks.get(k)
            if got is None:
                packets = share[k * TOKEN_BLOCK: min((k + 1) * TOKEN_BLOCK, end)]
                got = self.corpus.tokens[packets]
                if documents:
                    got = units.place_tokens(self.corpus, packets, got)
                self._blocks[k] = got
                while len(self._blocks) > 8:  # blocks behind the producer are not asked again
                    self._blocks.pop(next(iter(self._blocks)))
            parts.append(got)
        joined = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return joined[a - first * TOKEN_BLOCK: b - first * TOKEN_BLOCK]

    def candidates(self, share: np.ndarray, at: int, shape: tuple[int, int],
                   budget: int = 0) -> int:
        """Packing: the end of the candidates of the batch of ``shape`` (B rows of L, or a
        token ``budget``) that starts at share position ``at``: the packets whose index
        lengths fill its rows or its budget (at least one)."""
        return self.chunk_end(share, at, 0, 1, shape, budget)
