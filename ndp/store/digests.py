"""The digests of a corpus' index entries, held against the counts made from them
(``IndexDigests``, used by ``ndp.loader.planning.shared_count``).

A batch count cached for a dataset names the entries it was counted from: the crc32 of each
index's checked entries (``ndp.store.lazy.entries_digest``). A run that takes the count from
the cache gives those digests here (``expect``); each index's own digest is known once its
entries pass their first-use check (``checked``), and one that differs calls the count's
``differs`` (which raises) before any batch of that index is read. An expectation is held only
until its index is checked: a long run holds none.
"""

from __future__ import annotations

import threading
from typing import Any


class IndexDigests:
    """Per shard, the digest of its checked index entries (None until checked), and the
    digests counts in use expect of the indexes not checked yet."""

    def __init__(self) -> None:
        self.known: list[int | None] = []
        self._expected: dict[int, list[tuple[int, Any]]] = {}
        self._lock = threading.Lock()

    def add(self, digest: int | None = None) -> None:
        """One more shard: its digest if its entries are checked already."""
        self.known.append(digest)

    def expect(self, digests: list, differs: Any) -> None:
        """A count made from index entries with ``digests`` (per shard; None: not read) is in
        use: ``differs(shard number)`` is called (and raises) if an index's checked entries
        have another digest, checked now or when they are."""
        wrong = []
        with self._lock:
            for s, want in enumerate(digests[:len(self.known)]):
                if want is None:
                    continue
                if self.known[s] is None:  # compared when checked (held until then only)
                    self._expected.setdefault(s, []).append((want, differs))
                elif self.known[s] != want:
                    wrong.append(s)
        if wrong:
            differs(wrong[0])

    def checked(self, s: int, digest: int) -> None:
        """Index ``s`` passed its first-use check with entries of ``digest`` (a refusal
        raised here leaves it unchecked: the next reader is refused again)."""
        with self._lock:
            wrong = [differs for want, differs in self._expected.get(s, []) if want != digest]
            if not wrong:
                self._expected.pop(s, None)
                self.known[s] = digest
        if wrong:
            wrong[0](s)
