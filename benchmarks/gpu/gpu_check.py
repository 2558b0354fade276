"""Everything only a GPU can show, in one command that fits one 10-minute device call.

    python benchmarks/gpu/gpu_check.py            # on a machine with a CUDA GPU
    python benchmarks/gpu/gpu_check.py --list     # the steps, without running them
    python benchmarks/gpu/gpu_check.py --out benchmarks/results   # adds to the project's record

Steps, each in its own process with its own time limit, all of them whatever an earlier one did
(``--steps`` picks some); steps 2-4 time nothing, so they run side by side, then the benchmarks
one at a time:

1. ``preflight``: a CUDA device Numba can use, CuPy, torch with CUDA and a NumPy that the
   installed numba-cuda works with; anything missing fails here, with what to install, instead
   of a later step skipping silently (a missing ``compute-sanitizer``, found in CUDA's toolkit
   but not in CUDA's pip wheels, fails the memcheck step alone: the rest still runs);
2. ``gpu-tests``: the ``gpu``-marked tests (``tests/engine/test_gpu_device.py``) but the
   memcheck run;
3. ``device-equality``: the CUDA-against-CPU tests (kernels, decoder, Loader chunks, accounting,
   held batches through CuPy's array interface), which run on the device when there is one;
   ``device-schedules``: the same for schedules (a change of batch shape on the device's flat
   output ring, token budgets, mix schedules), their CUDA cases only;
4. ``memcheck``: ``compute-sanitizer --tool memcheck`` over hostile input
   (``tests/kernels/hostile_run.py``); the log is kept in ``--out``;
5. ``bench-gpu-loader``: ``benchmarks/gpu/bench_gpu_loader.py`` (the Loader on the GPU, issue 11's
   targets);
6. ``bench-gpu``: ``benchmarks/gpu/bench_gpu.py --quick`` (the per-call decoder API);
7. ``bench-loaders``: the GPU rows of ``benchmarks/loaders/bench_loaders.py`` beside the CPU ones
   (``--quick``: a small corpus, so it fits);
8. ``train-ab``: ``benchmarks/training/train_ab.py`` with the model on the GPU;
9. ``two-ranks``: ``benchmarks/gpu/gpu_ranks.py`` under torchrun with 2 processes, each rank's
   Loader on its own device (``ndp.engine.gpu``) where there are 2 GPUs or more, both on the one
   device where there is one.

Every results file lands in ``--out`` (default ``$NDP_RESULTS_DIR``, else ``./ndp-results``;
each benchmark step is given the same ``--out``), with the log of every step that failed; the
summary lists them, with one line per step. Exit status 0 only if every step passed. A test
skipped on a GPU machine is a failure here.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import add_out_argument  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
DEVICE_TESTS = ["tests/kernels/test_cuda_kernels.py", "tests/engine/test_gpu_decode.py",
                "tests/loader/pipeline/test_chunks.py", "tests/engine/test_counters.py",
                "tests/adapters/test_torch.py", "tests/loader/pipeline/test_serve.py",
                "tests/engine/test_verdict_lanes.py", "tests/loader/test_golden.py",
                "tests/loader/pipeline/test_ahead.py"]
#: the schedules' tests whose CUDA runs go to the device (``-k cuda``: their CPU runs are CI's)
SCHEDULE_TESTS = ["tests/loader/planning/test_schedule.py",
                  "tests/loader/planning/test_batch_tokens.py",
                  "tests/loader/ordering/test_mix_schedule.py"]


def cuda_tool(name: str, *also: str) -> str | None:
    """CUDA toolkit program ``name`` on PATH, in ``$CUDA_HOME/bin`` or ``/usr/local/cuda/bin``,
    else the last match of the ``also`` globs (absolute paths), else None."""
    found = shutil.which(name)
    if found:
        return found
    for base in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if base and Path(base, "bin", name).exists():
            return str(Path(base, "bin", name))
    matches = sorted(str(p) for pattern in also for p in Path("/").glob(pattern.lstrip("/")))
    return matches[-1] if matches else None


def sanitizer() -> str | None:
    """``compute-sanitizer`` on PATH or in the usual CUDA install places."""
    return cuda_tool("compute-sanitizer")


def preflight() -> list[str]:
    """What is missing for the other steps (empty: nothing)."""
    problems = []
    try:
        from ndp.engine.backend import cuda_unavailable_reason, simulated
    except Exception as exc:  # noqa: BLE001 - reported
        return [f"ndp does not import: {exc}"]
    if simulated():
        problems.append("NUMBA_ENABLE_CUDASIM=1 is set: unset it, this check needs the device")
    elif (reason := cuda_unavailable_reason()) is not None:
        problems.append(f"the cuda backend cannot run: {reason}")
    try:
        import torch

        if not torch.cuda.is_available():
            problems.append(f"torch {torch.__version__} sees no CUDA device (a CPU build?)")
    except ImportError:
        problems.append("torch is not installed: pip install 'neural-datagram[torch]'")
    import numpy

    if tuple(int(x) for x in numpy.__version__.split(".")[:2]) >= (2, 5):
        problems.append(f"numpy {numpy.__version__}: numba-cuda 0.30 needs numpy < 2.5 "
                        f"(pip install 'numpy<2.5')")
    return problems


#: why the memcheck step cannot run, when ``compute-sanitizer`` is missing
NO_SANITIZER = ("not run: compute-sanitizer was not found (CUDA toolkit's bin/, or CUDA_HOME; "
                "CUDA from pip wheels has none)")


def gpus() -> int:
    """CUDA devices this process sees (0 where Numba cannot tell)."""
    try:
        from numba import cuda

        return len(cuda.gpus)
    except Exception:  # noqa: BLE001 - no driver: the preflight says so
        return 0


def steps(sanitizer_path: str, out: Path) -> list[tuple[str, list[str], int]]:
    """(name, command, time limit in seconds) of every step after the preflight; the benchmarks
    write into ``out`` (absolute: they run in the repository root)."""
    to_out = ["--out", str(out)]
    return [
        ("gpu-tests", [PY, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", "gpu",
                       "-k", "not memcheck", "tests/engine/test_gpu_device.py"], 150),
        ("device-equality", [PY, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                             "-m", "not simulator", *DEVICE_TESTS], 150),
        ("device-schedules", [PY, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                              "-m", "not simulator", "-k", "cuda", *SCHEDULE_TESTS], 150),
        ("memcheck", [sanitizer_path, "--tool", "memcheck", "--report-api-errors", "no",
                      "--error-exitcode", "9", PY, "tests/kernels/hostile_run.py"], 150),
        ("bench-gpu-loader", [PY, "benchmarks/gpu/bench_gpu_loader.py", "--seconds", "3",
                              "--modes", "padded", "packed", "packed+documents", *to_out], 150),
        ("bench-gpu", [PY, "benchmarks/gpu/bench_gpu.py", "--quick", *to_out], 60),
        ("bench-loaders", [PY, "benchmarks/loaders/bench_loaders.py", "--quick", "--seconds", "3",
                           "--pipelines", "ndp-gpu-padded", "ndp-gpu-packed", "ndp-cpu-padded",
                           "ndp-cpu-packed", "memmap-get-batch", "threaded-numpy", *to_out], 150),
        ("train-ab", [PY, "benchmarks/training/train_ab.py", "--steps", "150", *to_out], 120),
        ("two-ranks", [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                       "2", "benchmarks/gpu/gpu_ranks.py"], 120),
    ]


def verdict(name: str, rc: int, out: str) -> tuple[bool, str]:
    """Whether a step passed, and its one-line summary."""
    tail = [line for line in out.strip().splitlines() if line.strip()]
    last = tail[-1] if tail else ""
    if name in ("gpu-tests", "device-equality", "device-schedules"):
        skipped = re.search(r"(\d+) skipped", last)
        if rc == 0 and skipped:
            return False, f"{last} (a skip on a GPU machine is a failure here)"
        return rc == 0, last
    if name == "memcheck":
        clean = "ERROR SUMMARY: 0 errors" in out
        checked = next((line for line in tail if "equal to the CPU" in line), "")
        return rc == 0 and clean and bool(checked), (
            f"{'0 memory errors' if clean else 'memory errors or no summary'}; {checked}")
    if name == "two-ranks":
        ranks = [line for line in tail if line.startswith("rank ") and " ok" in line]
        return rc == 0 and len(ranks) == 2, "; ".join(ranks) or last
    wrote = [line for line in tail if line.startswith("wrote")]
    return rc == 0, wrote[-1] if wrote else last


#: steps that time nothing: run side by side, before the benchmarks
CONCURRENT = ("gpu-tests", "device-equality", "device-schedules", "memcheck")


def _step(name: str, cmd: list[str], limit: int, *, found: str | None, devices: int, env: dict,
          results: Path, stamp: str, left: float) -> tuple[str, bool | None, float, str]:
    """Run one step within ``limit`` and the ``left`` seconds of the budget; its summary row
    (printed as it ends). A failed step's output, and memcheck's always, is kept in ``results``."""
    t = time.time()

    def row(ok: bool | None, line: str) -> tuple[str, bool | None, float, str]:
        word = "SKIP" if ok is None else "PASS" if ok else "FAIL"
        print(f"{word}  {name:18s} {time.time() - t:6.1f} s  {line}", flush=True)
        return name, ok, time.time() - t, line

    if name == "memcheck" and found is None:
        return row(False, NO_SANITIZER)
    if name == "two-ranks" and devices < 1:
        return row(None, "not run: no GPU")
    limit = int(min(limit, left))
    if limit < 10:
        return row(False, "not run: the time budget was spent")
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=limit)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc = 124
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) \
            else (exc.stdout or "")
        out += f"\n(timed out after {limit} s)"
    ok, line = verdict(name, rc, out)
    if rc == 124:
        ok, line = False, f"timed out after {limit} s; {line}"
    log = results / f"{'memcheck' if name == 'memcheck' else 'gpu-check-' + name}-{stamp}.log"
    if name == "memcheck" or not ok:
        from ndp.store.atomic import atomic_write

        atomic_write(log, f"$ {' '.join(cmd)}\n(exit {rc})\n{out}")
    return row(ok, line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print the steps and exit")
    ap.add_argument("--budget", type=float, default=570.0,
                    help="seconds for the whole check (a device call allows 600); a step "
                         "left without time fails as not run")
    ap.add_argument("--steps", nargs="+", metavar="NAME", default=None,
                    help="run only these steps (default: all; --list names them)")
    add_out_argument(ap)
    args = ap.parse_args(argv)
    results = args.out.absolute()  # the steps run in the repository root
    names = [name for name, _, _ in steps("compute-sanitizer", results)]
    if unknown := sorted(set(args.steps or ()) - set(names)):
        ap.error(f"no step {', '.join(unknown)}: the steps are {', '.join(names)}")
    if args.list:
        for name, cmd, limit in steps(sanitizer() or "compute-sanitizer", results):
            print(f"{name:18s} {limit:4d} s  {' '.join(cmd)}")
        return 0
    start = time.time()
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    env = dict(os.environ)
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    summary: list[tuple[str, bool | None, float, str]] = []
    problems = preflight()
    summary.append(("preflight", not problems, time.time() - start,
                    "; ".join(problems) or "GPU, CuPy, torch, numpy"))
    if problems:
        _report(summary, [], results, start)
        return 1
    results.mkdir(parents=True, exist_ok=True)
    before = set(results.iterdir())
    found, devices = sanitizer(), gpus()
    chosen = [s for s in steps(found or "compute-sanitizer", results)
              if not args.steps or s[0] in args.steps]
    # the checks time nothing, so they share the device (and the call's minutes); the
    # benchmarks then run one at a time, alone on it
    checks = [s for s in chosen if s[0] in CONCURRENT]
    with ThreadPoolExecutor(max_workers=max(len(checks), 1)) as pool:
        done = list(pool.map(lambda s: _step(*s, found=found, devices=devices, env=env,
                                              results=results, stamp=stamp,
                                              left=args.budget - (time.time() - start)),
                             checks))
    for step in chosen:
        if step[0] not in CONCURRENT:
            done.append(_step(*step, found=found, devices=devices, env=env, results=results,
                              stamp=stamp, left=args.budget - (time.time() - start)))
    summary.extend(done)
    new = sorted(p.name for p in set(results.iterdir()) - before)
    _report(summary, new, results, start)
    return 0 if all(ok is not False for _, ok, _, _ in summary) else 1


def _report(summary: list[tuple[str, bool | None, float, str]], new: list[str], results: Path,
            start: float) -> None:
    """The summary; a step not run for want of hardware (``ok`` None) is shown, not failed."""
    print("\n=== ndp GPU check ===")
    for name, ok, seconds, line in summary:
        word = "SKIP" if ok is None else "PASS" if ok else "FAIL"
        print(f"{word}  {name:18s} {seconds:6.1f} s  {line[:150]}")
    print(f"results files in {results} ({len(new)}): " + (", ".join(new) or "none"))
    print(f"total {time.time() - start:.0f} s; "
          f"{'all passed' if all(ok is not False for _, ok, _, _ in summary) else 'FAILED'}")


if __name__ == "__main__":
    sys.exit(main())
