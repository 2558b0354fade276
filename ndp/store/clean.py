"""Whether a dataset's packets are exactly what its indexes say (``all_clean``): every packet
an index lists gets, when decoded, the verdict of a valid packet holding the tokens its entry
says (or is dropped holding none by its entry: an empty packet, a TYP that carries no tokens).

An index lists the packets that passed their CRC when it was made; a shard damaged since, or
a token id at or past the vocabulary size the run checks, makes the Loader drop a packet the
index counted, and a ``packed`` stream then runs short of the index's token counts. What
relies on those counts to say where a packed batch starts without reading the packets before
it (``ndp.loader.planning.marks``, used by ``ndp.loader.explain``) asks this first.

The check decodes every packet of a shard once (CRC-16 and ids, ``ndp.kernels.verdict``, a
shard's packets read a block at a time, in file order) and keeps the answer in the folder it
is given (the Loader's: its count cache's, ``ndp.loader.planning.shared_count``), keyed by the shard's path,
identity (device, inode, size, modification time), the index's stamp and the vocabulary size:
a shard rewritten, touched or re-indexed is checked again; with the cache off, the answer is
kept for the process. A remote dataset's shards are not read for it (the answer is no).
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ndp.kernels.verdict import verdicts_cpu
from ndp.store.atomic import atomic_write
from ndp.wire.format import FRAME_BYTES

_KNOWN: dict[str, bool] = {}  # key: answer, for this process
_LOCK = threading.Lock()


def _key(shard: Any, stamp: Any, vocab: int) -> str:
    fields = [str(shard.path), [int(v) for v in shard.identity], repr(stamp), int(vocab)]
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:32]


def shard_clean(corpus: Any, s: int, vocab: int) -> bool:
    """Whether every packet shard ``s`` of ``corpus``'s index lists decodes to the tokens its
    entry says (see the module docstring)."""
    lo, hi = int(corpus.base[s]), int(corpus.base[s + 1])
    if hi <= lo:
        return True
    shard = corpus.shards[s]
    offsets = np.asarray(corpus.offsets[lo:hi], np.int64)
    ends = offsets + np.asarray(corpus.frame_bytes[lo:hi], np.int64)
    want = np.asarray(corpus.tokens[lo:hi], np.int64)
    order = np.argsort(offsets, kind="stable")  # an index lists its packets in file order
    offsets, ends, want = offsets[order], ends[order], want[order]
    got = np.empty(hi - lo, np.int64)
    for i, j, data, at in shard.packet_blocks(offsets, ends):
        verdicts_cpu(data, at, np.zeros(0, np.int64), got[i:j], vocab)
    return bool(np.array_equal(np.maximum(got, 0), want))


def all_clean(corpus: Any, vocab: int, *, keep: Path | None, progress: bool = True) -> bool:
    """Whether every shard of ``corpus`` is clean for ``vocab`` (``shard_clean``), each
    shard's answer found where it was kept or worked out and kept: in the folder ``keep``
    (None: for this process only). A progress bar while shards are checked (a pass over the
    data: about a second a GB)."""
    if getattr(corpus, "remotes", None):
        return False
    stamps = getattr(corpus, "index_stamps", None)
    folder = keep
    todo = []
    for s, shard in enumerate(corpus.shards):
        identity = getattr(shard, "identity", None)
        if identity is None:
            return False
        key = _key(shard, None if stamps is None else stamps[s], vocab)
        with _LOCK:
            known = _KNOWN.get(key)
        if known is None and folder is not None:
            try:
                known = bool(json.loads((folder / f"clean-{key}.json").read_text())["clean"])
            except (OSError, ValueError, KeyError, TypeError):
                known = None
        if known is False:
            return False
        if known is None:
            todo.append((s, key))
    if not todo:
        return True
    from ndp.progress import progress_bar

    total = sum(int(corpus.shards[s].size) for s, _ in todo)
    with progress_bar(total=total, desc="ndp: checking packets against their indexes",
                      unit="B", unit_scale=True, enabled=progress and total > 1 << 28) as bar:
        for s, key in todo:
            clean = shard_clean(corpus, s, vocab)
            with _LOCK:
                _KNOWN[key] = clean
            if folder is not None:
                _keep(folder / f"clean-{key}.json", clean)
            bar.update(int(corpus.shards[s].size))
            if not clean:
                return False
    return True


def _keep(path: Path, clean: bool) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps({"clean": clean}) + "\n")
    except OSError:  # a read-only cache: the answer is kept for the process only
        pass
