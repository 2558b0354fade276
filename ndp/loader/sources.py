"""Mixing's sources: the shard groups or SRC types of a corpus, each with its weight
(``ndp.loader.order.mix`` interleaves a rank's share by them)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ndp.checks import real
from ndp.errors import ConfigError
from ndp.loader.order import mix


def mix_sources(corpus: Any, weights: dict | None, mix_by: str
                ) -> tuple[list[str], np.ndarray | None, np.ndarray | None, list | None]:
    """The sources of ``weights`` (``{source: weight}``, ``None``: no mixing) by ``mix_by``
    (``"group"`` or ``"src"``): their sorted names, weights, a lookup from a packet's group
    or SRC to its source number, and the spec a state records. Every source present in the
    corpus must have a weight (0 leaves it out on purpose), so no packet is left out
    silently; ``ConfigError`` names what is wrong."""
    if mix_by not in ("group", "src"):
        raise ConfigError(f"mix_by must be 'group' or 'src', got {mix_by!r}")
    if weights is None:
        return [], None, None, None
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
    named = {}
    for key, w in weights.items():
        name = key.name if hasattr(key, "name") else str(key)
        if isinstance(key, int) and mix_by == "src" and not hasattr(key, "name"):
            name = next((n for n, v in present.items() if v == key), str(key))
        if name not in present:
            raise ConfigError(f"mix names {key!r}, which is not a {mix_by} of this corpus "
                              f"(it has {sorted(present)})")
        named[name] = real(f"the mix weight of {key!r}", w, least=0.0)
    missing = sorted(set(present) - set(named))
    if missing:
        raise ConfigError(f"mix gives no weight to {missing}; give each {mix_by} a weight "
                          f"(0 to leave it out on purpose)")
    names = sorted(named)
    mix_weights = np.array([named[n] for n in names])
    values = np.array([present[n] for n in names], np.int64)
    lookup = np.full(256 if mix_by == "src" else len(corpus.groups), -1, np.int64)
    lookup[values] = np.arange(values.shape[0])
    mix([np.zeros(0, np.int64)] * len(values), mix_weights, seed=0, epoch=0, rank=0)  # checks
    return names, mix_weights, lookup, [[n, named[n]] for n in names]
