"""Where a benchmark run writes, for every script here and ``notebooks/execute.py``.

``benchmarks/results/`` is the project's record: committed, quoted by the README's headline and
shown by the docs' performance pages (``docs/plugins/``, ``tests/test_docs.py``) and by
``notebooks/benchmark.ipynb`` (which ``tests/test_notebooks.py`` checks lists every file). A run
adds to it only when asked (``--out benchmarks/results``); otherwise it writes to
``$NDP_RESULTS_DIR``, else ``ndp-results/`` in the working directory (ignored by git), so a
trial run leaves the checkout and the test suite as they were. Standard library only:
``gpu_check.py`` reads it before its preflight has seen whether ndp imports.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

OUT_HELP = ("folder for the results (default: $NDP_RESULTS_DIR, else ./ndp-results); "
            "--out benchmarks/results adds them to the project's record")


def default_out() -> Path:
    """``$NDP_RESULTS_DIR`` if set, else ``ndp-results/`` in the working directory, absolute (a
    script that runs others in another directory passes it on). The environment is read when
    this is called: at the command line's entry point, never at import."""
    return Path(os.environ.get("NDP_RESULTS_DIR") or "ndp-results").absolute()


def add_out_argument(parser: argparse.ArgumentParser, help: str = OUT_HELP) -> None:
    """``--out DIR`` on ``parser``, defaulting to ``default_out()``."""
    parser.add_argument("--out", type=Path, default=default_out(), metavar="DIR", help=help)
