"""Mixing's sources: the shard groups or SRC types of a corpus, each with its weight
(``ndp.loader.ordering.order.mix`` interleaves a rank's share by them, or with weights that change
with
the step ``ndp.loader.ordering.mix_schedule``), and a ``Plan``'s mixing of a rank's share
(``Mixing``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ndp.checks import real
from ndp.errors import ConfigError
from ndp.loader.ordering.mix_schedule import read_schedule
from ndp.loader.ordering.order import drop_mask, epoch_order, mix, rank_share
from ndp.loader.planning.schedule import Schedule


def mix_sources(corpus: Any, weights: Any, mix_by: str
                ) -> tuple[list[str], np.ndarray | None, np.ndarray | None, Any, Any]:
    """The sources of ``weights`` (``{source: weight}``, a ``Schedule`` of such dicts, or
    ``None``: no mixing) by ``mix_by`` (``"group"`` or ``"src"``): their sorted names, weights
    (a schedule's first phase's), a lookup from a packet's group or SRC to its source number,
    the spec a state records, and the ``MixSchedule`` (``None`` for fixed weights). Every
    source present in the corpus must have a weight (0 leaves it out on purpose), so no packet
    is left out silently; ``ConfigError`` names what is wrong (and the phase)."""
    if mix_by not in ("group", "src"):
        raise ConfigError(f"mix_by must be 'group' or 'src', got {mix_by!r}")
    if weights is None:
        return [], None, None, None, None
    if mix_by == "group":
        present: dict[str, Any] = {name: g for g, name in enumerate(corpus.groups)}
    else:
        from ndp.wire.format import Src

        present = {}
        for v in np.unique(corpus.src).tolist():
            try:
                present[Src(v).name] = v
            except ValueError:
                present[str(v)] = v

    def check_phase(what: str, given: dict) -> tuple[list[str], np.ndarray]:
        named = _named(given, present, mix_by, what)
        names = sorted(named)
        row = np.array([named[n] for n in names])
        mix([np.zeros(0, np.int64)] * len(names), row, seed=0, epoch=0, rank=0)  # checks
        return names, row

    schedule = None
    if isinstance(weights, Schedule) and weights.constant:
        weights = weights.values[0]
    if isinstance(weights, Schedule):
        schedule = read_schedule(weights, check_phase)
        names, mix_weights, spec = schedule.names, schedule.table[0], schedule.spec()
    else:
        names, mix_weights = check_phase("mix", weights)
        spec = [[n, float(w)] for n, w in zip(names, mix_weights)]
    values = np.array([present[n] for n in names], np.int64)
    lookup = np.full(256 if mix_by == "src" else len(corpus.groups), -1, np.int64)
    lookup[values] = np.arange(values.shape[0])
    return names, mix_weights, lookup, spec, schedule


def _named(weights: dict, present: dict, mix_by: str, what: str) -> dict[str, float]:
    """``{source name: weight}`` of one dict of weights, every source of the corpus named."""
    if not isinstance(weights, dict):
        raise ConfigError(f"{what} must be a dict of {{source: weight}}, got "
                          f"{type(weights).__name__}")
    named = {}
    for key, w in weights.items():
        name = key.name if hasattr(key, "name") else str(key)
        if isinstance(key, int) and mix_by == "src" and not hasattr(key, "name"):
            name = next((n for n, v in present.items() if v == key), str(key))
        if name not in present:
            raise ConfigError(f"{what} names {key!r}, which is not a {mix_by} of this corpus "
                              f"(it has {sorted(present)})")
        named[name] = real(f"the {what} weight of {key!r}", w, least=0.0)
    missing = sorted(set(present) - set(named))
    if missing:
        raise ConfigError(f"{what} gives no weight to {missing}; give each {mix_by} a weight "
                          f"(0 to leave it out on purpose)")
    return named


def mix_from_spec(spec: Any) -> Any:
    """The ``mix=`` a state's ``mix`` field records (``Plan.mix_spec``): ``None``, a dict of
    weights, or a ``Schedule`` of them."""
    if spec is None:
        return None
    try:
        if isinstance(spec, dict):
            return Schedule([(int(step), {str(n): float(w) for n, w in row})
                             for step, row in spec["phases"]],
                            interpolate=spec.get("interpolate", "step"))
        return {str(n): float(w) for n, w in spec}
    except (KeyError, TypeError, ValueError) as err:
        raise ConfigError(f"not a recorded mix: {spec!r} ({err})") from None


class Mixing:
    """A ``Plan``'s mixing: its sources (``_setup_mix``), a rank's share drawn from them
    (``_kept``) and a batch's packets per source (``by_source``). The plan gives ``corpus``,
    ``mode``, ``seed``, ``world_size``, ``mix_size``, ``place_packets``, ``place_sizes``,
    ``place_tokens``, ``shapes_of`` and ``start_step``."""

    corpus: Any
    mode: str
    seed: int
    world_size: int
    mix_size: Any
    place_packets: Any
    place_sizes: Any
    place_tokens: Any
    shapes_of: Any
    start_step: Any
    elastic: Any
    shuffle: bool
    crc_drop_rate: float
    _shard_bytes: np.ndarray
    _window_bytes: Any

    def _setup_mix(self, weights: dict | None, mix_by: str) -> None:
        """Sources and their weights (``ndp.loader.ordering.sources.mix_sources``)."""
        self._mix_by = mix_by
        self._mix_names, self._mix_weights, self._mix_keys, self.mix_spec, \
            self._mix_schedule = mix_sources(self.corpus, weights, mix_by)
        if self._mix_schedule is not None and self.mix_size == "longest":
            raise ConfigError(
                "mix_size='longest' with a mix schedule: which source must be used whole "
                "changes with the weights; use 'shortest' or a number of packets per epoch")

    def _source_key(self, packets: np.ndarray) -> np.ndarray:
        """Mixing source number of each packet."""
        raw = self.corpus.group[packets] if self._mix_by == "group" else self.corpus.src[packets]
        return self._mix_keys[raw]

    def _kept(self, order: np.ndarray, dropped: np.ndarray, epoch: int,
              rank: int) -> tuple[np.ndarray, int, dict, dict]:
        """Rank ``rank``'s packets of the epoch's ``order`` after CRC-Drop and mixing, how many
        CRC-Drop removed, and per source how many packets mixing left unused and took again."""
        share = rank_share(order, rank, self.world_size)
        kept, unused, again = self._mixed(share[~dropped[share]], epoch, rank, self.mix_size)
        return kept, self.place_packets(share[dropped[share]]), unused, again

    def _mixed(self, kept: np.ndarray, epoch: int, rank: int, size: Any
               ) -> tuple[np.ndarray, dict, dict]:
        """Rank ``rank``'s places ``kept`` interleaved from their sources (as they are without
        mixing) for an epoch of ``size`` (``mix_size``, all ranks), and per source how many
        packets mixing left unused and took again."""
        unused_by_source: dict[str, int] = {}
        again_by_source: dict[str, int] = {}
        if self._mix_keys is None:
            return kept, unused_by_source, again_by_source
        key = self._source_key(kept)
        parts = [kept[key == k] for k in range(len(self._mix_names))]
        if not isinstance(size, str):  # packets per epoch, all ranks: this rank's part
            size = size // self.world_size + (rank < size % self.world_size)
        if self._mix_schedule is None:
            kept, unused, again = mix(parts, self._mix_weights, seed=self.seed,
                                      epoch=epoch, rank=rank, size=size)
        else:  # each place drawn with the weights of the step it lands in
            kept, unused, again = self._mix_schedule.draw(
                parts, [self.place_tokens(p) for p in parts], seed=self.seed, epoch=epoch,
                rank=rank, size=size, mode=self.mode, shapes=self.shapes_of(epoch),
                start=self.start_step(epoch))
        # in packets: a place of packed mode's order holds a document (``units``)
        for g, (name, part) in enumerate(zip(self._mix_names, parts)):
            used = part.shape[0] - int(unused[g]) + int(again[g])
            if unused[g]:
                unused_by_source[name] = self.place_packets(part[used:])
            if again[g]:
                taken = np.arange(part.shape[0], used) % part.shape[0]
                again_by_source[name] = self.place_packets(part[taken])
        return kept, unused_by_source, again_by_source

    def every_share(self, epoch: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every rank's places of ``epoch`` (after CRC-Drop) before mixing, and its share as
        mixing draws it from them (before the rank balance cuts it): what an elastic resume
        with another mix needs of every old rank, the epoch's order built once."""
        rest = self.elastic if self.elastic is not None and self.elastic.epoch == epoch else None
        size = self.mix_size
        if rest is not None:
            pools = [rank_share(rest.packets, r, self.world_size)
                     for r in range(self.world_size)]
            if not rest.remix:  # mixed already by the run it comes from
                return [(p, p) for p in pools]
            size = size if isinstance(size, str) else max(0, size - rest.delivered)
        else:
            order = epoch_order(self.corpus.base, seed=self.seed, epoch=epoch,
                                shuffle=self.shuffle, shard_bytes=self._shard_bytes,
                                window_bytes=self._window_bytes)
            dropped = drop_mask(self.corpus.n_packets, seed=self.seed, epoch=epoch,
                                rate=self.crc_drop_rate)
            pools = [s[~dropped[s]] for s in (rank_share(order, r, self.world_size)
                                              for r in range(self.world_size))]
        return [(p, self._mixed(p, epoch, r, size)[0]) for r, p in enumerate(pools)]

    @property
    def mixes(self) -> bool:
        """Whether sources are mixed (batches count their packets per source)."""
        return self._mix_keys is not None

    def sources_in(self, share: np.ndarray, a: int, b: int) -> dict[str, int] | None:
        """Packets per source of share positions ``[a, b)`` (mixing only; else ``None``)."""
        if self._mix_keys is None or b <= a:
            return None
        places = share[a:b]
        n = np.bincount(self._source_key(places), minlength=len(self._mix_names),
                        weights=self.place_sizes(places)).astype(np.int64)
        return {name: int(k) for name, k in zip(self._mix_names, n) if k}

    def by_source(self, share: np.ndarray, counted: dict) -> None:
        """Turn a batch's ``_range`` of newly counted share positions into packets per source
        (mixing only)."""
        a, b = counted.pop("_range", (0, 0))
        found = self.sources_in(share, a, b)
        if found is not None:
            counted["sources"] = found
