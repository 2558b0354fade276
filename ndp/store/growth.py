"""A dataset that grew: shards appended after those a resume state was made on (``ndp convert
--append``, or a mixing group added last), found by the fingerprint the state records.

A corpus' ``fingerprint`` hashes its shards in order (group, name, size, crc32 and packet count
of each), so the dataset a state was made on before shards were appended is this corpus' first
``k`` shards, for the ``k`` whose hash of the first ``k`` is the state's (``grown_from``), and
``first`` gives it back as a corpus: the same packets under the same numbers, the appended
ones left out. A shard removed, renamed or rewritten changes every hash from it on: no ``k``
matches, and the state is refused (``ndp.loader.states.state``).
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any


def fingerprint_of(marks: list[bytes]) -> str:
    """The fingerprint of shards whose marks (``Corpus._marks``) are ``marks``, in order."""
    digest = hashlib.sha256()
    for mark in marks:
        digest.update(mark)
    return digest.hexdigest()[:16]


def grown_from(corpus: Any, fingerprint: Any) -> int | None:
    """How many of ``corpus``' first shards are the dataset ``fingerprint`` names, where that
    is fewer than all of them; ``None`` where no first shards are (one pass, O(shards))."""
    digest = hashlib.sha256()
    for k, mark in enumerate(corpus._marks[:-1], 1):
        digest.update(mark)
        if digest.hexdigest()[:16] == fingerprint:
            return k
    return None


def first(corpus: Any, k: int) -> Any:
    """``corpus`` as its first ``k`` shards (and the groups they are in): its packets keep
    their numbers, so orders and positions made on it name the same packets in ``corpus``."""
    view = copy.copy(corpus)
    view.shards, view.paths = corpus.shards[:k], corpus.paths[:k]
    view.indexes = corpus.indexes[:k]
    view.base = corpus.base[:k + 1]
    view.n_packets = int(view.base[-1])
    view.shard_group = corpus.shard_group[:k]
    view.groups = corpus.groups[:int(view.shard_group.max()) + 1]
    view.continued = corpus.continued[:k]
    view._marks = corpus._marks[:k]
    view.fingerprint = fingerprint_of(view._marks)
    return view
