"""What every benchmark here shares (standard library at import; NumPy and ndp inside the
functions that need them, so that ``gpu/gpu_check.py`` reads it before its preflight has seen
whether ndp imports).

The scripts live in folders by what they measure (``cpu/``, ``gpu/``, ``loaders/``, ``scale/``,
``plan/``, ``storage/``, ``training/``, ``inputs/``; each folder's ``__init__.py`` says what it
holds) and run as files, ``python benchmarks/<folder>/<script>.py``: each puts ``benchmarks/``
on ``sys.path`` first, then imports this module by name and any other script by its folder
(``from gpu.bench_gpu import device_info``), never by its bare name (which would load a second
copy of the module).

Where results go: ``benchmarks/results/`` is the project's record, committed, quoted by the
README's headline and shown by the docs' performance pages (``docs/plugins/``,
``tests/test_docs.py``) and by ``notebooks/benchmark.ipynb`` (which ``tests/test_notebooks.py``
checks lists every file). A run adds to it only when asked (``--out benchmarks/results``);
otherwise it writes to ``$NDP_RESULTS_DIR``, else ``ndp-results/`` in the working directory
(ignored by git), so a trial run leaves the checkout and the test suite as they were
(``add_out_argument``, also used by ``notebooks/execute.py``).

``machine()``: the machine, versions and commit a result was measured on (every benchmark's JSON).
``command()``: the command line a result records, as run from the repository's root.
``write_report()``: a run's JSON, ``<prefix>-<time>.json``, written atomically into ``--out``
(``report_path()`` names it first, for a script that writes a figure beside it).
``write_dataset()``: the synthetic corpus of ``gpu/gpu_host.py`` and ``scale/first_batch.py``.

``fresh_counts()``: a measured run counts its epochs as a training run does, once each, into a
new empty count cache. Without it, the runs of one invocation share the user's count cache
(``NDP_COUNT_CACHE``, else ``~/.cache/ndp/counts``): a run after the first finds its epochs
counted by the runs before it on the same data and skips the count pass (a per-token cost of
every real run: 4-5 us of CPU a 64 x 1024 batch on this project's 2-core VM), so the first run
of a comparison paid for the others and ``--repeat`` medians came out low.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

#: ``benchmarks/``
HERE = Path(__file__).resolve().parent
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


def command(script: str, argv: list[str] | None) -> str:
    """The command line a result records: ``python benchmarks/<folder>/<name>.py`` (``script``
    is the caller's ``__file__``) and its arguments (``argv``, else ``sys.argv``'s)."""
    import sys

    rel = Path(script).resolve().relative_to(HERE.parent).as_posix()
    return " ".join(["python", rel, *(sys.argv[1:] if argv is None else argv)])


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


def report_path(out: Path, prefix: str, *, tag: str = "", precise: bool = False) -> Path:
    """``out/<prefix>-<local time><tag>.json`` (``out`` made if missing); ``precise`` adds the
    microseconds to the time (for runs that may end within the same second)."""
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S" + ("-%f" if precise else ""))
    return out / f"{prefix}-{stamp}{tag}.json"


def write_report(out: Path | None, prefix: str, report: dict, *, path: Path | None = None
                 ) -> Path:
    """``report`` as ``report_path(out, prefix)`` (or at ``path``, named by it first), written
    atomically (``ndp.store.atomic``); says where."""
    from ndp.store.atomic import atomic_write

    path = path or report_path(out, prefix)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(report, indent=1) + "\n")
    print(f"wrote {path}")
    return path


def machine() -> dict:
    """The machine and versions a result was measured on (every benchmark's JSON has it)."""
    import numba
    import numpy as np

    cpu = platform.processor()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {"python": platform.python_version(), "numpy": np.__version__,
                "numba": numba.__version__}
    for name in ("tokenizers", "transformers", "torch"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=HERE).stdout.strip()
        # the code measured is not the commit's where its sources differ from it
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                  "ndp", "kernels", "benchmarks/*.py", "pyproject.toml"],
                                 capture_output=True, text=True, cwd=HERE.parent).stdout.strip()
        if commit and changed:
            commit += "-dirty"
    except OSError:
        commit = ""
    # on a lent device the copy of .git is the one the session started with, so git there names
    # an older commit and reads the tree as changed: the caller names the commit it sent
    sent = os.environ.get("NDP_COMMIT")
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "numba_threads": numba.get_num_threads(),
        "ndp_threads": ndp_threads(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "versions": versions,
        "ndp_commit": sent or commit,
        **({"ndp_commit_from": "NDP_COMMIT, set by the caller that sent the tree"}
           if sent else {}),
    }


def ndp_threads() -> int:
    from ndp.engine.threads import get_num_threads

    return get_num_threads()
