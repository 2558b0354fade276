"""The notebooks in ``notebooks/`` run top to bottom (CPU only, offline) and are committed with
their outputs (``python notebooks/execute.py --in-place``), so they can be read without running
them.

Each notebook is executed by ``nbclient`` in a fresh ``python3`` kernel whose working directory is
``notebooks/``, as a reader's Jupyter would run it; any cell error fails the test with the
cell's traceback. The notebooks write only into temporary directories. ``benchmark.ipynb`` is
also run against a results directory of its own (``NDP_RESULTS_DIR``): one holding every kind of
results file the notebook knows, plus files it must refuse, and an empty one, since the
repository's own ``benchmarks/results/`` holds only some kinds. The saved benchmark notebook
must list every committed results file (re-run ``notebooks/execute.py --in-place`` after adding
one), and a copy of a notebook outside the repository still finds its data or says where it is.
``notebooks/execute.py`` itself rewrites a notebook only when told to.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = ["quickstart.ipynb", "benchmark.ipynb", "integrity.ipynb", "schedules.ipynb",
             "loss_spike.ipynb"]


def execute(name: str, cwd: Path = NOTEBOOKS_DIR) -> nbformat.NotebookNode:
    """Run every cell of ``notebooks/<name>`` (found in ``cwd``, and run there); raises
    ``CellExecutionError`` on a cell error."""
    nb = nbformat.read(cwd / name, as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})
    start = time.perf_counter()
    client.execute()
    print(f"{name}: executed in {time.perf_counter() - start:.1f} s")
    return nb


def outputs(nb: nbformat.NotebookNode) -> list[dict]:
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


def text_of(nb: nbformat.NotebookNode) -> str:
    """Everything the notebook printed (streams and plain-text results)."""
    parts = []
    for out in outputs(nb):
        if out.output_type == "stream":
            parts.append(out.text)
        elif "data" in out:
            parts.append(out.data.get("text/plain", ""))
    return "\n".join(parts)


def images(nb: nbformat.NotebookNode) -> int:
    return sum("image/png" in out.get("data", {}) for out in outputs(nb))


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_committed_with_the_outputs_of_one_clean_run(name):
    raw = json.loads((NOTEBOOKS_DIR / name).read_text())
    nb = nbformat.reads(json.dumps(raw), as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code = [cell for cell in raw["cells"] if cell["cell_type"] == "code"]
    assert code, f"{name} has no code cells"
    counts = [cell["execution_count"] for cell in code]
    assert counts == list(range(1, len(code) + 1)), (
        f"{name}: saved from a partial or out-of-order run ({counts}); run "
        f"python notebooks/execute.py --in-place {name}")
    assert not [o for o in outputs(nb) if o.output_type == "error"], f"{name} saved an error"
    assert text_of(nb), f"{name} was saved without outputs"
    assert any(cell["cell_type"] == "markdown" for cell in raw["cells"])


def test_the_saved_benchmark_notebook_shows_every_committed_result():
    nb = nbformat.read(NOTEBOOKS_DIR / "benchmark.ipynb", as_version=4)
    text = text_of(nb)
    results = NOTEBOOKS_DIR.parent / "benchmarks" / "results"
    missing = [p.name for p in sorted(results.glob("*.json")) if p.name not in text]
    assert not missing, (f"benchmark.ipynb was saved before {missing} were committed: run "
                         f"python notebooks/execute.py --in-place benchmark.ipynb")
    assert images(nb) >= 3  # the charts are in the file, readable without running it


@pytest.mark.parametrize("name", ["benchmark.ipynb", "quickstart.ipynb"])
def test_a_copy_outside_the_repository_finds_its_data_or_says_where_it_is(name, tmp_path,
                                                                          monkeypatch):
    import shutil

    monkeypatch.delenv("NDP_RESULTS_DIR", raising=False)
    shutil.copy(NOTEBOOKS_DIR / name, tmp_path / name)
    nb = execute(name, cwd=tmp_path)
    assert not [o for o in outputs(nb) if o.output_type == "error"]
    if name == "benchmark.ipynb":  # ndp is installed from this clone (pip install -e .)
        text = text_of(nb)
        assert "the repository the installed ndp comes from" in text
        assert "the directory does not exist" not in text
        assert not re.search(r"(?<!\d)0 JSON file", text)  # it found the results


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, monkeypatch):
    monkeypatch.delenv("NDP_RESULTS_DIR", raising=False)  # benchmark.ipynb: the repository's files
    nb = execute(name)
    errors = [out for out in outputs(nb) if out.output_type == "error"]
    assert not errors, errors
    text = text_of(nb)
    if name == "quickstart.ipynb":
        assert "backend: " in text and "in the loss" in text
    elif name == "integrity.ipynb":
        assert "every packet is accounted for" in text
    elif name == "loss_spike.ipynb":  # the planted source's steps found, named and skipped
        assert "spike steps: [60, 61, 62, 63, 64, 65, 66, 67]" in text
        assert "'bad': 505" in text and "bad/shard-00000.ndp @" in text
        assert "skipped: 8 batches" in text and "the state keeps [[60, 68]]" in text
        assert "106 packets of bad/ left out; 106 met and dropped as SKIPPED" in text
        assert images(nb) >= 2
    elif name == "schedules.ipynb":
        assert "the same batches as the uninterrupted run" in text and "realised" in text
        assert images(nb) >= 1
    else:
        results = NOTEBOOKS_DIR.parent / "benchmarks" / "results"
        for path in sorted(results.glob("*.json")):
            assert path.name in text  # every results file is listed


def _write(path: Path, report) -> None:
    path.write_text(report if isinstance(report, str) else json.dumps(report))


def test_benchmark_notebook_shows_every_kind_and_refuses_the_rest(tmp_path, monkeypatch):
    machine = {"cpu": "test CPU", "cores": 2}
    _write(tmp_path / "cpu-1.json", {
        "command": "python benchmarks/cpu/bench_cpu.py", "date": "d", "machine": machine,
        "decode": [{"token_width": 2, "masked": False, "packets": 8, "seq": 16, "batch": 4,
                    "validate_tokens_per_s": 1.5e9, "validate_gb_per_s": 3.0,
                    "padded_tokens_per_s": 6.5e8, "packed_tokens_per_s": None}],
        "convert": {"sft": {"input_mb": 1.0, "examples": 10, "tokens": 1000, "seconds": 1.0,
                            "tokens_per_s": 1000.0, "input_mb_per_s": 1.0}},
    })
    _write(tmp_path / "cpu-loader-1.json", {
        "command": "python benchmarks/cpu/bench_cpu.py --only loader", "machine": machine,
        "loader": [{"mode": "padded", "packets": 8, "seq_len": 16, "batch": 4, "prefetch": 2,
                    "tokens_per_s": 3.0e8, "next_p50_us": 200.0, "next_p99_us": 300.0,
                    "host_cpu_s_per_billion_tokens": 6.0}],
    })
    _write(tmp_path / "loaders-1.json", {
        "command": "python benchmarks/loaders/bench_loaders.py --quick", "created": "c",
        "machine": machine,
        "pipelines": [
            {"name": "ndp-cpu-padded", "tokens_per_s": 3.0e8, "samples_per_s": 4000.0,
             "next_p50_us": 200.0, "next_p99_us": 300.0, "host_cpu_s_per_billion_tokens": 6.0,
             "peak_rss_mb": 300.0, "time_to_first_batch_s": 0.25},
            {"name": "jsonl-tokenize", "tokens_per_s": 2.0e6, "samples_per_s": 800.0,
             "next_p50_us": None, "next_p99_us": 30000.0, "host_cpu_s_per_billion_tokens": 900.0,
             "peak_rss_mb": 900.0, "time_to_first_batch_s": 3.5},
        ],
    })
    _write(tmp_path / "gpu-1.json", {
        "created": "c", "machine": machine, "device": {"name": "Test GPU"},
        "config": {"command": "python benchmarks/gpu/bench_gpu.py"},
        "physical_limits": {"h2d_pinned_gb_per_s": 25.0, "d2d_gb_per_s": 1500.0},
        "results": {"gpu_resident_padded": {"tokens_per_s": 6.0e10, "next_p50_us": 10.0,
                                            "next_p99_us": 20.0}},
    })
    _write(tmp_path / "gpu-loader-1.json", {
        "created": "c", "machine": machine, "device": {"name": "Test GPU"},
        "command": "python benchmarks/gpu/bench_gpu_loader.py",
        "results": {"ndp_cuda_resident_padded": {
            "tokens_per_s": 5.5e9, "next_p50_us": 12.0, "next_p99_us": 40.0,
            "host_cpu_s_per_billion_tokens": 1.5,
            "per_batch": {"launches": 0.031, "host_waits": 0.016}}},
    })
    _write(tmp_path / "cpu-breakdown-1.json", {
        "benchmark": "cpu-breakdown", "command": "python benchmarks/cpu/cpu_breakdown.py",
        "corpus": "test corpus", "machine": machine, "threads": 1,
        "rows": [{"mode": "packed", "batch": 16, "tokens_per_s": 1.7e8,
                  "ns_per_token": {"stage": 2.25, "verdicts": 1.17, "layout": 0.61,
                                   "build": 1.41, "producer_other": 0.78,
                                   "consumer": 1.14, "process": 7.36}},
                 {"mode": "padded", "batch": 64, "tokens_per_s": None,
                  "ns_per_token": {"stage": 2.63, "build": None, "process": 9.43}}],
    })
    _write(tmp_path / "kernel-profile-1.json", {
        "benchmark": "kernel_profile", "created": "c", "machine": machine,
        "device": {"name": "Test GPU"}, "command": "python benchmarks/gpu/kernel_profile.py",
        "modes": {"padded": {"launches": [
            {"kernel": "cudapy::ndp::kernels::verdict_cuda::verdicts_lanes_cuda[abi]",
             "duration_us": 67.5, "tokens_per_s": 6.2e10, "dram_gb_per_s": 255.0,
             "dram_bytes_over_floor": 1.02, "sm_pct_of_peak": 71.9,
             "achieved_occupancy_pct": 35.7},
            {"kernel": "build_padded_cuda", "duration_us": None}]}},
    })
    _write(tmp_path / "sim-1.json", {"results": {"gpu_host_padded": {"tokens_per_s": 1.0}}})
    _write(tmp_path / "broken.json", "{not json")
    _write(tmp_path / "other.json", {"something": 1})
    monkeypatch.setenv("NDP_RESULTS_DIR", str(tmp_path))
    nb = execute("benchmark.ipynb")
    text = text_of(nb)
    assert "kinds with no results file: none" in text
    assert "verdicts_lanes_cuda" in text and "67.5" in text and "62.0" in text
    for shown in ("ndp-cpu-padded", "jsonl-tokenize", "gpu_resident_padded", "Test GPU",
                  "650.0", "60.000", "3.50", "1,500.0", "ndp_cuda_resident_padded", "5.500",
                  "0.031", "0.016", "test corpus", "packed B=16", "7.36", "padded B=64",
                  "2.63"):
        assert shown in text, shown
    assert "n/a" in text  # the missing figures are marked, not filled in
    for refused in ("sim-1.json", "broken.json", "other.json"):
        assert refused in text.split("not shown:")[-1]
    assert images(nb) == 7  # decode, loader, pipelines, breakdown, GPU calls, GPU Loader, kernels


def test_benchmark_notebook_with_no_results(tmp_path, monkeypatch):
    monkeypatch.setenv("NDP_RESULTS_DIR", str(tmp_path / "nothing-here"))
    nb = execute("benchmark.ipynb")
    text = text_of(nb)
    assert "0 JSON file(s) (the directory does not exist)" in text
    assert text.count(": skipped.") == 7 and "kinds with results: none" in text
    assert images(nb) == 0


def test_execute_leaves_the_committed_notebook_alone_unless_told(tmp_path):
    """``notebooks/execute.py`` writes executed copies to ``$NDP_RESULTS_DIR/notebooks``, else
    ``ndp-results/notebooks/`` in the working directory; only ``--in-place`` (what maintainers
    run after committing results) rewrites the notebook itself."""
    import os
    import subprocess
    import sys

    tmp_path = tmp_path.resolve()  # as the script's working directory reads it
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    committed = tmp_path / "tiny.ipynb"
    nbformat.write(nb, committed)
    saved = committed.read_bytes()
    env = {k: v for k, v in os.environ.items() if k != "NDP_RESULTS_DIR"}
    script = str(NOTEBOOKS_DIR / "execute.py")

    def run(*args):
        proc = subprocess.run([sys.executable, script, *args, str(committed)], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    out = run()
    assert committed.read_bytes() == saved
    copy = tmp_path / "ndp-results" / "notebooks" / "tiny.ipynb"
    assert str(copy) in out and "42" in text_of(nbformat.read(copy, as_version=4))
    run("--in-place")
    assert "42" in text_of(nbformat.read(committed, as_version=4))


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_code_runs_on_gpu_batches_too(name):
    """With ``backend="auto"`` a GPU machine hands the notebooks CUDA tensors, on which
    ``.numpy()`` raises: every ``.numpy()`` must follow ``.cpu()`` (this machine has no GPU, so
    the run above cannot show it)."""
    import re

    nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            bare = re.findall(r"(?<!\.cpu\(\))\.numpy\(\)", cell.source)
            assert not bare, f"{name}: cell {cell.get('id')} calls .numpy() without .cpu()"
