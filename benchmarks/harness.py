"""What the benchmarks here share about running a measured Loader (standard library only).

``fresh_counts()``: a measured run counts its epochs as a training run does, once each, into a
new empty count cache. Without it, the runs of one invocation share the user's count cache
(``NDP_COUNT_CACHE``, else ``~/.cache/ndp/counts``): a run after the first finds its epochs
counted by the runs before it on the same data and skips the count pass (a per-token cost of
every real run: 4-5 us of CPU a 64 x 1024 batch on this project's 2-core VM), so the first run
of a comparison paid for the others and ``--repeat`` medians came out low.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator


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
