"""A rank's share built whole (``Plan.share`` with mixing or in an elastic remainder): the
epoch's order, every rank's share of it after CRC-Drop and mixing (mixing draws over a rank's
whole share; a remainder is a whole order already, mixed again where the mix changed:
``ndp.loader.states.elastic``), cut to the shortest one's length (the rank balance), and the epoch's
batch count, the smallest any rank's cut share makes by the index.

A resume from the states of an earlier run's ranks plans that run's epoch once per old rank,
with only the rank changed. Within ``Plan.memo()`` the plan and those made from it
(``Plan.variant``) share the last epoch built (every rank's share, for one set of settings), so
the order is built once per resume rather than once per old rank: 8 old ranks at 1e7 packets
took 39 s, most of it building the same order 17 times.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ndp.loader.planning.count import Count
from ndp.loader.ordering.order import drop_mask, epoch_order, rank_share
from ndp.loader.ordering.share import Share


def share_whole(plan: Any, epoch: int, rest: Any) -> Share:
    """``plan``'s rank's ``Share`` of ``epoch``, built whole (``rest``: the elastic remainder
    the epoch is, or ``None``)."""
    shapes = plan.shapes_of(epoch)
    key = (epoch, plan.world_size, id(rest), plan.corpus.fingerprint, plan.mode,
           json.dumps(plan.mix_spec), plan.mix_size, json.dumps(shapes.record()),
           plan.start_step(epoch))
    memo = plan._whole
    built = memo.get(key) if memo is not None else None
    if built is None:
        every, peak = _every(plan, epoch, rest)
        m = min(k.shape[0] for k, *_ in every)
        batches = min(plan.batches_of(k[:m], shapes) for k, *_ in every)
        built = (every, m, batches, peak, rest)  # rest held: its id names it while kept
        if memo is not None:
            memo.clear()  # the last settings only: an epoch's every share is O(packets)
            memo[key] = built
    every, m, batches, plan.peak_plan_elements, _ = built
    kept, n_dropped, unused, again = every[plan.rank]
    own = kept[:m]
    packets = np.concatenate([own, own]) if plan.mode == "packed" else own
    if rest is None:
        again_given = 0
    elif rest.remix:  # where mixing put them in this share
        again_given = plan.place_packets(own[np.isin(own, rest.packets[rest.partial])])
    else:
        again_given = plan.place_packets(rest.packets[rest.partial[
            (rest.partial % plan.world_size == plan.rank)
            & (rest.partial // plan.world_size < m)]])
    return Share(packets, m, Count(batches), n_dropped, unused, again,
                 plan.place_packets(kept[m:]), again_given)


def _every(plan: Any, epoch: int, rest: Any) -> tuple[list[tuple], int]:
    """Every rank's (kept, dropped, unused, again) of ``epoch`` (``Mixing._kept``), and the
    most elements of the arrays built for them."""
    world = plan.world_size
    if rest is not None and rest.remix:  # dropped; mixed again by this plan's mix
        size = plan.mix_size if isinstance(plan.mix_size, str) else max(
            0, plan.mix_size - rest.delivered)
        every = [(m, 0, *u) for m, *u in (
            plan._mixed(rank_share(rest.packets, r, world), epoch, r, size)
            for r in range(world))]
        return every, int(rest.packets.shape[0])
    if rest is not None:  # already dropped and mixed by the run it comes from
        return ([(rank_share(rest.packets, r, world), 0, {}, {}) for r in range(world)],
                int(rest.packets.shape[0]))
    order = epoch_order(plan.corpus.base, seed=plan.seed, epoch=epoch, shuffle=plan.shuffle,
                        shard_bytes=plan._shard_bytes, window_bytes=plan._window_bytes)
    dropped = drop_mask(plan.corpus.n_packets, seed=plan.seed, epoch=epoch,
                        rate=plan.crc_drop_rate)
    return [plan._kept(order, dropped, epoch, r) for r in range(world)], int(order.shape[0])
