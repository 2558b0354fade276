"""A ``Loader``'s checkpoint: ``state_dict()`` and ``load_state_dict()`` (what a state holds
and how it is checked: ``ndp.loader.states.state``, ``ndp.loader.states.resume``,
``ndp.loader.states.elastic``; the
skip ranges it keeps: ``ndp.loader.planning.skips``)."""

from __future__ import annotations

from typing import Any

from ndp.loader.planning import skips
from ndp.loader.ordering.order import ORDER
from ndp.loader.states.resume import resume
from ndp.loader.states.state import seal

#: 2: with the dataset's fingerprint; 3: with the batch number in the epoch; 4: with the order;
#: 5: with the run's step (``Loader.step``), and batch shapes that may be schedules
STATE_VERSION = 5


class CheckpointMethods:
    """``state_dict`` and ``load_state_dict`` (the Loader gives its settings, ``plan``,
    ``step``, ``_state`` and ``_stop_producer``)."""

    plan: Any
    _state: dict
    _active: Any
    _shape_settings: dict
    mode: str
    seed: int
    shuffle: bool
    rank: int
    world_size: int
    crc_drop_rate: float
    vocab_size: int
    step: int
    _stop_producer: Any

    def state_dict(self) -> dict:
        """Where the consumer is: the next batch after ``load_state_dict`` of this is the one
        the consumer would have received next. Small and JSON-serialisable."""
        plan = self.plan
        return seal({"version": STATE_VERSION, "mode": self.mode, "seed": self.seed,
                     "shuffle": self.shuffle, "rank": self.rank, "world_size": self.world_size,
                     **self._shape_settings, "step": self.step,
                     "crc_drop_rate": self.crc_drop_rate,
                     **plan.dataset_of(self._state["epoch"]),
                     "mix": plan.mix_spec, "mix_size": plan.mix_size, "order": ORDER,
                     "shuffle_window": plan.shuffle_window, "vocab_size": self.vocab_size,
                     **self._elastic_record(),
                     **skips.record(plan.skips, plan.skip_packets),
                     # windows at documents (``ndp.loader.layouts.align``); unaligned states as
                     # before
                     **({"align": plan.align} if plan.align is not None else {}),
                     **self._state})

    def _elastic_record(self) -> dict:
        rest = self.plan.elastic
        if rest is None or rest.epoch != self._state["epoch"]:
            return {}
        return {"elastic": rest.record}

    def load_state_dict(self, state: dict | list[dict], *, elastic: bool = False,
                        skip: Any = None, skip_packets: Any = None) -> None:
        """Continue from ``state`` (from ``state_dict``). ``LoaderStateError`` (a
        ``ConfigError``) if it was made for another dataset (its fingerprint) or configuration,
        since its positions would mean other packets, or if its positions lie outside the epoch
        it names; the message says which field and why.

        Elastic resume (``ndp.loader.states.elastic``): the states of every rank of a run with
        another
        ``world_size``, as a list, continue its epoch on this run's ranks, each remaining packet
        once (one is enough in padded and packing mode, with ``elastic=True``); a state with
        other batch shapes or another mix goes on so too, with a warning, and one made before
        shards were appended goes on over those it began with (``ndp.store.growth``).

        ``skip``: run steps to leave out from here on, ``[(a, b), ...]``
        (``ndp.loader.planning.skips``:
        the batches of steps ``a .. b-1``), besides those the state keeps and this Loader's
        ``skip=``; a range given again is one. ``skip_packets``: packets to leave out from
        here on, by number (``Piece.packet``), besides those the state keeps."""
        kept, packets, n = self.plan.skips, self.plan.skip_packets, self.plan.corpus.n_packets
        for one in state if isinstance(state, list) else [state]:
            if isinstance(one, dict):
                kept = skips.joined(kept, skips.check_skip(one.get("skip"),
                                                           name="state's skip"))
                packets = skips.joined_packets(packets, one.get("skip_packets"), n)
        kept = skips.joined(kept, skip)
        packets = skips.joined_packets(packets, skip_packets, n)
        resumed = resume(self.plan, state, self.state_dict(), elastic=elastic)
        self._active = None
        self._stop_producer()
        self.plan.go_on(resumed)  # stops the plan's thread first
        self.plan.skips, self.plan.skip_packets = kept, packets
        self._state = resumed.position
