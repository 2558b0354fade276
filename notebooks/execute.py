"""Run the notebooks top to bottom and save them with their outputs.

    python notebooks/execute.py                      # every notebook here, copies into --out
    python notebooks/execute.py benchmark.ipynb      # one
    python notebooks/execute.py --in-place           # rewrite the committed notebooks (maintainers)

By default the executed copies go to ``--out`` (``$NDP_RESULTS_DIR/notebooks``, else
``ndp-results/notebooks/`` in the working directory; see ``benchmarks/harness.py``), and the
committed notebooks are left as they are. ``--in-place`` overwrites them, so that GitHub and
nbviewer show the saved outputs: run it after committing a results file, since
``benchmark.ipynb`` reads ``benchmarks/results/`` (``NDP_RESULTS_DIR`` is ignored then) and
``tests/test_notebooks.py`` checks that the saved benchmark notebook lists every one.

Each runs in a fresh ``python3`` kernel whose working directory is ``notebooks/``, as a reader's
Jupyter runs it (CPU only, offline). A notebook is written only if every cell ran.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def execute(path: Path, cwd: Path = HERE) -> nbformat.NotebookNode:
    """``path`` run top to bottom in ``cwd``; raises ``CellExecutionError`` on a cell error."""
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(HERE.parent / "benchmarks"))
    from harness import default_out

    from ndp.store.atomic import atomic_write

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", metavar="NOTEBOOK",
                    help="notebooks in notebooks/, or paths (default: every one in notebooks/)")
    ap.add_argument("--out", type=Path, default=default_out() / "notebooks", metavar="DIR",
                    help="folder for the executed copies (default: $NDP_RESULTS_DIR/notebooks, "
                         "else ./ndp-results/notebooks)")
    ap.add_argument("--in-place", action="store_true",
                    help="overwrite the notebooks themselves (after committing a results file)")
    args = ap.parse_args(argv)
    if args.in_place:
        os.environ.pop("NDP_RESULTS_DIR", None)  # the repository's own results
    for name in args.names or sorted(p.name for p in HERE.glob("*.ipynb")):
        path = HERE / name if (HERE / name).exists() else Path(name)
        start = time.perf_counter()
        nb = execute(path)
        target = path if args.in_place else args.out / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, nbformat.writes(nb) + "\n")
        print(f"{name}: executed in {time.perf_counter() - start:.1f} s, saved to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
