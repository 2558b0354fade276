"""Run the notebooks top to bottom and save them with their outputs, so they can be read
without running them (GitHub and nbviewer render the saved outputs).

    python notebooks/execute.py                  # every notebook in this folder
    python notebooks/execute.py benchmark.ipynb  # one

Each runs in a fresh ``python3`` kernel whose working directory is ``notebooks/``, as a reader's
Jupyter runs it (CPU only, offline; ``benchmark.ipynb`` reads ``benchmarks/results/``, so run
this after committing a results file: ``tests/test_notebooks.py`` checks that the saved
benchmark notebook lists every one). A notebook is written only if every cell ran.
"""

from __future__ import annotations

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


def main(argv: list[str]) -> int:
    from ndp.atomic import atomic_write

    os.environ.pop("NDP_RESULTS_DIR", None)  # the repository's own results
    names = argv or sorted(p.name for p in HERE.glob("*.ipynb"))
    for name in names:
        path = HERE / name
        start = time.perf_counter()
        nb = execute(path)
        atomic_write(path, nbformat.writes(nb) + "\n")
        print(f"{name}: executed and saved in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
