"""What the benchmarks here share about running a measured Loader (standard library at import;
NumPy and ndp inside the functions that need them).

``write_dataset()``: the synthetic corpus of ``gpu_host.py`` and ``first_batch.py``.
``write_report()``: a run's JSON, ``<prefix>-<time>.json``, written atomically into ``--out``.

``fresh_counts()``: a measured run counts its epochs as a training run does, once each, into a
new empty count cache. Without it, the runs of one invocation share the user's count cache
(``NDP_COUNT_CACHE``, else ``~/.cache/ndp/counts``): a run after the first finds its epochs
counted by the runs before it on the same data and skips the count pass (a per-token cost of
every real run: 4-5 us of CPU a 64 x 1024 batch on this project's 2-core VM), so the first run
of a comparison paid for the others and ``--repeat`` medians came out low.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def fresh_counts() -> Iterator[str]:
    """``NDP_COUNT_CACHE`` set to a new empty directory for the block (removed after, and the
    variable put back as it was)."""
    saved = os.environ.get("NDP_COUNT_CACHE")
    path = tempfile.mkdtemp(prefix="ndp-bench-counts-")
    os.environ["NDP_COUNT_CACHE"] = path
    try:
        yield path
    finally:
        if saved is None:
            os.environ.pop("NDP_COUNT_CACHE", None)
        else:
            os.environ["NDP_COUNT_CACHE"] = saved
        shutil.rmtree(path, ignore_errors=True)


def write_dataset(root: Path, *, tokens: int, doc_tokens: int, shard_mb: int, seed: int = 0
                  ) -> Path:
    """Documents of uniform random length (mean ``doc_tokens``: 1 to ``2 * doc_tokens - 1``
    tokens) of ramp-like uint16 ids, about ``tokens`` in all, in shards of ``shard_mb`` MiB."""
    import numpy as np

    from ndp.store.writer import ShardWriter
    from ndp.wire.packet import encode_tokens

    rng = np.random.default_rng(seed)
    ids = (np.arange(2 * doc_tokens, dtype=np.int64) * 7919) % 50_000
    out = root / "data"
    done = 0
    with ShardWriter(out, max_shard_bytes=shard_mb << 20) as writer:
        while done < tokens:
            n = int(rng.integers(1, 2 * doc_tokens))
            writer.write(encode_tokens(np.roll(ids, done % 977)[:n], width=2))
            done += n
    return out


def write_report(out: Path, prefix: str, report: dict) -> Path:
    """``report`` as ``out/<prefix>-<local time>.json`` (``out`` made if missing), written
    atomically (``ndp.store.atomic``); says where."""
    from ndp.store.atomic import atomic_write

    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{prefix}-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    atomic_write(path, json.dumps(report, indent=1) + "\n")
    print(f"wrote {path}")
    return path
