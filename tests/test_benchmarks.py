"""The benchmark scripts run (tiny sizes), so they cannot rot on machines without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_gpu_benchmark_smoke_run_under_the_simulator(tmp_path):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, str(BENCH / "gpu/bench_gpu.py"), "--smoke", "--out",
                           str(tmp_path)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (result,) = tmp_path.glob("sim-*.json")
    report = json.loads(result.read_text())
    assert report["device"]["simulated"] is True
    expected = {f"{mode}_{layout}" for mode in ("gpu_host", "gpu_resident", "cpu_copy")
                for layout in ("padded", "packed")}
    assert set(report["results"]) == expected
    tokens = {name: row["tokens"] for name, row in report["results"].items()}
    # every pipeline delivered the same tokens: 24 packets of 16 tokens, padded; packed cuts
    # each 8-packet chunk's 128-token stream into 7 whole windows of 16 (+1 for the last y)
    assert {tokens[f"{m}_padded"] for m in ("gpu_host", "gpu_resident", "cpu_copy")} == {384}
    assert {tokens[f"{m}_packed"] for m in ("gpu_host", "gpu_resident", "cpu_copy")} == {336}
    for row in report["results"].values():
        assert row["batches"] == 3 and row["next_p50_us"] > 0
    assert "versions" in report["machine"] and report["config"]["packets"] == 24


def test_gpu_loader_benchmark_smoke_run_under_the_simulator(tmp_path):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, str(BENCH / "gpu/bench_gpu_loader.py"), "--smoke",
                           "--modes", "padded", "packed", "packed+documents",
                           "--out", str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (result,) = tmp_path.glob("sim-loader-*.json")
    report = json.loads(result.read_text())
    assert report["device"]["simulated"] is True and "--smoke" in report["command"]
    expected = {f"ndp_{kind}_{mode}" for kind in ("cuda_host", "cuda_resident", "cpu_copy")
                for mode in ("padded", "packed")} | {"nanogpt_get_batch"} | {
        f"ndp_{kind}_packed+documents" for kind in ("cuda_host", "cuda_resident")}
    assert set(report["results"]) == expected
    for name, row in report["results"].items():
        assert row["tokens"] == row["batches"] * 2 * 16 and row["next_p50_us"] > 0
        assert row["host_cpu_s_per_billion_tokens"] > 0
        if name.startswith("ndp_cuda"):
            assert row["backend"] == "cuda" and row["chunk_batches"] == 64
            # the run is short: chunks still ramping up (1, 2, 4, ... batches) count here; the
            # steady-state bounds are tests/engine/test_counters.py's
            assert 0 < row["per_batch"]["launches"] <= 2 and row["per_batch"]["host_waits"] <= 1
    assert set(report["targets_met"]) == set(report["targets"])


def test_schedule_benchmark_smoke_run(tmp_path):
    """``bench_schedule.py --smoke``: every mode, the warm-up against its phases' fixed shapes,
    a schedule's own per-chunk work and next() at changes, in a results file."""
    proc = subprocess.run([sys.executable, str(BENCH / "plan/bench_schedule.py"), "--smoke",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (result,) = tmp_path.glob("schedule-*-smoke.json")
    report = json.loads(result.read_text())
    assert "--smoke" in report["command"] and "versions" in report["machine"]
    assert set(report["modes"]) == {"padded", "packed", "packing"}
    for mode in report["modes"].values():
        assert 0 < mode["machinery_us_per_chunk"] < mode["chunk_cpu_us"]
        warm = mode["warm-up"]
        assert warm["batches"] > 0 and warm["next_us_boundary_p99"] > 0
        assert mode["expected_cpu_s_per_1e9_tokens"] > 0
        assert all("step_tokens" not in run for run in warm["runs"])


def test_plan_change_benchmark_smoke_run(tmp_path):
    """``bench_plan_change.py --smoke``: each resume (the same settings, another mix or batch
    size, a grown dataset, both) in a process of its own, timed against a plain resume; the
    changes go on in the rest of the epoch, a plain or grown resume does not."""
    proc = subprocess.run([sys.executable, str(BENCH / "plan/bench_plan_change.py"), "--smoke",
                           "--sizes", "1e5", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (result,) = tmp_path.glob("plan-change-*-smoke.json")
    report = json.loads(result.read_text())
    (size,) = report["sizes"]
    cases = size["cases"]
    assert size["documents"] == 100_000 and len(cases) == 5
    assert all(c["load_state_s"] > 0 and c["peak_rss_mb"] > 0 for c in cases.values())
    assert cases["same settings"]["over_same_settings"] == 1.0
    assert [name for name, c in cases.items() if c["in_a_remainder"]] == [
        "another mix", "another batch size", "grown and another mix"]


def test_explain_benchmark_smoke_run(tmp_path):
    """``bench_explain.py --smoke``: each mode's steps from the epoch's start to its middle,
    and one from a resumed state, each call timed in a process per mode."""
    proc = subprocess.run([sys.executable, str(BENCH / "plan/bench_explain.py"), "--smoke",
                           "--sizes", "1e5", "--loop-steps", "2", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (result,) = tmp_path.glob("explain-*-smoke.json")
    report = json.loads(result.read_text())
    assert [r["mode"] for r in report["rows"]] == ["padded", "packing", "packed"]
    for row in report["rows"]:
        assert row["documents"] == 100_000 and len(row["calls"]) == 6
        assert all(c["wall_s"] > 0 and c["pieces"] > 0 for c in row["calls"])
        assert row["calls"][-1]["after_loop_steps"] == 2


def test_loader_comparison_smoke_run(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH / "loaders/bench_loaders.py"), "--smoke",
                           "--out", str(tmp_path), "--rounds", "2"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (result,) = tmp_path.glob("loaders-*.json")
    report = json.loads(result.read_text())
    names = [p["name"] for p in report["pipelines"]]
    assert set(names) >= {"ndp-cpu-padded", "ndp-cpu-packed", "jsonl-tokenize",
                          "memmap-get-batch", "threaded-numpy", "hf-datasets"}
    for p in report["pipelines"]:
        assert p["tokens_per_s"] > 0 and p["batches"] >= 1 and p["shape"] == [16, 1024]
        # two rounds, and the row holds their median
        assert len(p["rounds"]) == 2 and p["tokens_per_s"] == pytest.approx(
            sum(r["tokens_per_s"] for r in p["rounds"]) / 2)
        assert p["time_to_first_batch_s"] > 0 and p["peak_rss_mb"] > 0
    assert report["config"]["large_tokens"] >= 300_000
    assert report["rounds"] == 2 and report["paired"] == {}  # --smoke runs no peer
    for name in report["figures"]:
        assert (tmp_path / name).stat().st_size > 1000


def _bench(name: str):
    """``benchmarks/<folder>/<name>.py`` as the module ``<folder>.<name>``, as the scripts
    import each other (``benchmarks/`` on ``sys.path``, ``harness.py``'s docstring)."""
    import importlib

    (path,) = BENCH.glob(f"*/{name}.py")
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(f"{path.parent.name}.{name}")
    finally:
        sys.path.remove(str(BENCH))


def test_loader_rounds_pair_each_ndp_row_with_the_cheapest_peer_of_its_round():
    report = _bench("loaders_report")

    def run(cpu):
        return {k: float(cpu) for k in report.ROUND_FIGURES} | {"batches": 3}

    names = ["ndp-cpu-padded", "ndp-cpu-packed", "torchdata-0w", "litdata-0w",
             "torchdata-sft-0w", "memmap-get-batch"]
    rounds = [  # host CPU s per 1e9 tokens; memmap-get-batch is no peer, however cheap
        {"ndp-cpu-padded": run(10), "ndp-cpu-packed": run(8), "torchdata-0w": run(12),
         "litdata-0w": run(20), "torchdata-sft-0w": run(15), "memmap-get-batch": run(1)},
        {"ndp-cpu-padded": run(20), "ndp-cpu-packed": run(10), "torchdata-0w": run(30),
         "litdata-0w": run(11), "torchdata-sft-0w": run(24), "memmap-get-batch": run(1)},
        {"ndp-cpu-padded": run(10), "ndp-cpu-packed": run(10), "torchdata-0w": run(9),
         "litdata-0w": run(50), "torchdata-sft-0w": run(10), "memmap-get-batch": run(1)},
    ]
    pairs = report.paired(names, rounds)
    assert [(p["peer"], p["ratio"]) for p in pairs["windows"]["per_round"]] == [
        ("torchdata-0w", 1.5), ("litdata-0w", 1.1), ("torchdata-0w", 0.9)]
    assert pairs["windows"]["median"] == 1.1
    assert [p["ratio"] for p in pairs["sft"]["per_round"]] == [1.5, 1.2, 1.0]
    assert pairs["sft"]["median"] == 1.2
    # without peers there is nothing to pair
    assert report.paired(["ndp-cpu-padded", "memmap-get-batch"], rounds) == {}
    row = report.summarize([r["torchdata-0w"] for r in rounds])
    assert row["host_cpu_s_per_billion_tokens"] == 12.0 and len(row["rounds"]) == 3
    assert row["batches"] == 3
    assert "rounds" not in report.summarize([rounds[0]["litdata-0w"]])


def test_training_ab_smoke_run_curves_coincide(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH / "training/train_ab.py"), "--quick", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (result,) = tmp_path.glob("train-ab-*.json")
    report = json.loads(result.read_text())
    assert set(report["runs"]) == {"ndp", "jsonl-tokenize"}
    for run in report["runs"].values():
        assert len(run["loss"]) == 5 and 0 <= run["wait_fraction"] <= 1
    # the same tokens in the same order from both pipelines: the same training, bit for bit
    assert report["max_abs_loss_difference"] == 0
    assert (tmp_path / report["figure"]).stat().st_size > 1000


def test_every_ndp_pipeline_of_the_loader_comparison_names_a_real_backend():
    """The GPU rows run only on a GPU machine, so their Loader arguments are checked here: they
    once asked for backend='gpu', which the Loader refuses."""
    from ndp.engine.backend import BACKENDS

    bench = _bench("bench_loaders")
    names = [n for n in bench.GPU_PIPELINES + bench.PIPELINES if n.startswith("ndp-")]
    assert {n.split("-")[1] for n in names} == {"cpu", "gpu"}
    for name in names:
        kind, mode = name.split("-")[1:]
        assert bench.NDP_BACKENDS[kind] in BACKENDS and bench.NDP_BACKENDS[kind] != "auto"
        assert mode in ("padded", "packed", "packing")
    # every row says how it cuts the data into rows, peers included
    for name in bench.GPU_PIPELINES + bench.PIPELINES + bench.peers.PIPELINES:
        kind = name.rsplit("-", 1)[0] if name in bench.peers.PIPELINES else name.split("-")[0]
        assert bench.SEMANTICS[kind]


def test_gpu_check_lists_its_steps_and_fails_loudly_without_a_gpu(tmp_path):
    listed = subprocess.run([sys.executable, str(BENCH / "gpu/gpu_check.py"), "--list"],
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0
    names = [line.split()[0] for line in listed.stdout.splitlines()]
    assert names == ["gpu-tests", "device-equality", "device-schedules", "memcheck",
                     "bench-gpu-loader", "bench-gpu", "bench-loaders", "train-ab", "two-ranks"]
    # under the simulator (as on a machine without a GPU) the preflight fails, saying why, and
    # nothing else runs
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    env.pop("NDP_RESULTS_DIR", None)
    proc = subprocess.run([sys.executable, str(BENCH / "gpu/gpu_check.py")], capture_output=True,
                          text=True, env=env, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1
    assert "FAIL  preflight" in proc.stdout and "NUMBA_ENABLE_CUDASIM=1 is set" in proc.stdout
    assert "gpu-tests" not in proc.stdout and "FAILED" in proc.stdout
    assert list(tmp_path.iterdir()) == []  # nothing ran, so no results folder either


def test_gpu_check_counts_a_skip_or_a_dirty_memcheck_as_a_failure():
    check = _bench("gpu_check")
    assert check.verdict("gpu-tests", 0, "....\n33 passed in 80s")[0]
    assert not check.verdict("gpu-tests", 0, "....\n30 passed, 3 skipped in 80s")[0]
    assert not check.verdict("device-equality", 1, "1 failed, 60 passed")[0]
    clean = "hostile run: 246 batches equal to the CPU\n========= ERROR SUMMARY: 0 errors"
    assert check.verdict("memcheck", 0, clean) == (
        True, "0 memory errors; hostile run: 246 batches equal to the CPU")
    assert not check.verdict("memcheck", 9, clean.replace("0 errors", "3 errors"))[0]
    assert check.verdict("train-ab", 0, "x\nwrote benchmarks/results/train-ab-1.json") == (
        True, "wrote benchmarks/results/train-ab-1.json")
    two = "rank 0 ok: device 0, 20 batches\nrank 1 ok: device 1, 20 batches"
    assert check.verdict("two-ranks", 0, two)[0]
    assert not check.verdict("two-ranks", 0, two.splitlines()[0])[0]  # one rank said nothing


def test_gpu_check_without_compute_sanitizer_fails_memcheck_alone(monkeypatch, tmp_path,
                                                                    capsys):
    """A GPU machine whose CUDA came from pip wheels has no compute-sanitizer: the memcheck
    step fails, saying why, and every other step still runs; on a single GPU the two ranks
    share it; with none the two-rank step is shown as not run, not failed."""
    check = _bench("gpu_check")
    ran = []
    monkeypatch.setattr(check, "preflight", lambda: [])
    monkeypatch.setattr(check, "sanitizer", lambda: None)
    monkeypatch.setattr(check, "gpus", lambda: 1)

    def fake_run(cmd, **kw):
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "1 passed in 1s\nwrote x.json", "")

    monkeypatch.setattr(check.subprocess, "run", fake_run)
    assert check.main(["--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  memcheck" in out and "compute-sanitizer was not found" in out
    assert "PASS  gpu-tests" in out and "PASS  train-ab" in out
    assert len(ran) == 8  # every step but memcheck
    assert any("gpu_ranks.py" in " ".join(cmd) for cmd in ran)
    ran.clear()
    monkeypatch.setattr(check, "gpus", lambda: 0)
    check.main(["--out", str(tmp_path), "--steps", "two-ranks"])
    assert "SKIP  two-ranks" in capsys.readouterr().out and ran == []


def test_gpu_session_script_parses_and_names_only_steps_gpu_check_has():
    """benchmarks/gpu_session.sh runs on a lent GPU only: here, bash parses it, and the
    gpu_check steps it asks for by default exist (a renamed step would fail the whole call)."""
    script = BENCH / "gpu_session.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    default = text.split("${CHECKS:-", 1)[1].split("}", 1)[0].split()
    names = [name for name, _, _ in _bench("gpu_check").steps("compute-sanitizer", Path("out"))]
    assert default and set(default) <= set(names)


def test_peers_install_from_carried_wheels_where_no_index_is_reachable(monkeypatch, tmp_path,
                                                                      capsys):
    """NDP_PEER_WHEELS (a lent GPU machine reaches no package index): the peers' wheels found
    there, and what they need, go into this interpreter, with no index and no resolver; a peer
    with no wheel there is named; nothing else in the folder is installed."""
    peers = _bench("peers")
    for name in ["torchdata-0.11.0-py3-none-any.whl", "litdata-0.2.76-py3-none-any.whl",
                 "boto3-1.44.8-py3-none-any.whl", "obstore-0.12.1-cp311-abi3-any.whl",
                 "numpy-2.4.6-cp312-cp312-manylinux_2_28_x86_64.whl"]:
        (tmp_path / name).write_bytes(b"")
    calls = []
    monkeypatch.setattr(peers.subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    monkeypatch.setenv("NDP_PEER_WHEELS", str(tmp_path))
    assert peers.python("peers") == Path(sys.executable)
    (cmd,) = calls
    assert cmd[:3] == [sys.executable, "-m", "pip"] and "--no-index" in cmd and "--no-deps" in cmd
    assert sorted(Path(c).name.split("-")[0] for c in cmd if c.endswith(".whl")) == [
        "boto3", "litdata", "obstore", "torchdata"]  # not the NumPy wheel beside them
    assert "nvidia-dali-cuda120==2.4.0" in capsys.readouterr().out


def test_gpu_check_runs_the_chosen_steps_and_the_three_checks_side_by_side(monkeypatch,
                                                                           tmp_path, capsys):
    """--steps picks steps (a name it does not know is refused); the two test runs and memcheck
    time nothing and run at once (each waits here for the other two: run one after another,
    they would break the barrier), the benchmarks after them, one at a time."""
    import threading

    check = _bench("gpu_check")
    monkeypatch.setattr(check, "preflight", lambda: [])
    monkeypatch.setattr(check, "sanitizer", lambda: "compute-sanitizer")
    monkeypatch.setattr(check, "gpus", lambda: 1)
    together = threading.Barrier(3, timeout=20)
    ran, lock = [], threading.Lock()

    def fake_run(cmd, **kw):
        name = "memcheck" if cmd[0] == "compute-sanitizer" else cmd[-1] if "pytest" in cmd \
            else Path(cmd[1]).stem
        if "pytest" in cmd or name == "memcheck":
            together.wait()  # all three checks in flight at once
        with lock:
            ran.append(name)
        out = ("hostile run: 1 batches equal to the CPU\nERROR SUMMARY: 0 errors"
               if name == "memcheck" else "1 passed in 1s\nwrote x.json")
        return subprocess.CompletedProcess(cmd, 0, out, "")

    monkeypatch.setattr(check.subprocess, "run", fake_run)
    assert check.main(["--out", str(tmp_path), "--steps", "gpu-tests", "device-equality",
                       "memcheck", "bench-gpu"]) == 0
    assert len(ran) == 4 and ran[-1] == "bench_gpu"  # the benchmark after the checks
    out = capsys.readouterr().out
    assert "PASS  memcheck" in out and "bench-loaders" not in out and "train-ab" not in out
    with pytest.raises(SystemExit):
        check.main(["--out", str(tmp_path), "--steps", "no-such-step"])
    assert "no step no-such-step" in capsys.readouterr().err


@pytest.mark.slow
def test_every_bad_input_of_the_reliability_run_is_handled(tmp_path):
    """The run behind 'N of N cases handled' (the README's headline, docs/concepts/integrity.md):
    every case refused with a named error or delivered exactly (it exits 1 and names the case
    otherwise)."""
    proc = subprocess.run([sys.executable, str(BENCH / "inputs/bad_inputs.py"), "--out",
                           str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, [line for line in proc.stdout.splitlines() if "FAIL" in line]
    (result,) = tmp_path.glob("bad-inputs-*.json")
    report = json.loads(result.read_text())
    assert report["tried"] == report["handled"] >= 40


def test_shuffle_quality_smoke_run_tells_a_shuffle_from_a_rotation(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH / "plan/shuffle_quality.py"), "--smoke",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (path,) = tmp_path.glob("shuffle-*-smoke.json")
    rows = json.loads(path.read_text())["rows"]
    ndp, rotation = rows["ndp, window 1 GiB (default)"], rows["ndp before (rotation)"]
    assert ndp["adjacent_kept"] < 0.01 < 0.9 < rotation["adjacent_kept"]
    assert abs(ndp["mean_displacement"] - 1 / 3) < 0.05



@pytest.mark.parametrize("env_dir", [False, True], ids=["cwd", "NDP_RESULTS_DIR"])
def test_a_run_adds_to_the_project_record_only_when_asked(tmp_path, env_dir):
    """A user's run without ``--out`` leaves ``benchmarks/results/`` (the project's record, which
    the README's headline, the docs' performance pages and the saved benchmark notebook show)
    as it was: it writes to
    ``$NDP_RESULTS_DIR``, else ``ndp-results/`` in the working directory."""
    tmp_path = tmp_path.resolve()  # as the script's working directory reads it
    record = BENCH / "results"
    before = set(record.iterdir())
    env = {k: v for k, v in os.environ.items() if k != "NDP_RESULTS_DIR"}
    if env_dir:
        env["NDP_RESULTS_DIR"] = str(tmp_path / "mine")
    try:
        proc = subprocess.run([sys.executable, str(BENCH / "plan/shuffle_quality.py"), "--smoke"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        added = sorted(p.name for p in set(record.iterdir()) - before)
    finally:
        for path in set(record.iterdir()) - before:  # a failing run's file: not the record's
            path.unlink()
    assert proc.returncode == 0, proc.stderr
    assert added == []
    (path,) = (tmp_path / ("mine" if env_dir else "ndp-results")).glob("shuffle-*-smoke.json")
    assert f"wrote {path}" in proc.stdout


def test_every_script_that_writes_results_takes_out_with_the_shared_default():
    """``accounting.py`` and ``gpu_check.py`` included: no script writes into the project's
    record by default, and every one reads its default folder from the one helper."""
    writers = [p for p in sorted(BENCH.glob("*/*.py")) if p.name != "harness.py"  # the helper
               and ('print(f"wrote' in p.read_text() or "write_report(" in p.read_text()
                    or p.name == "gpu_check.py")]  # its logs
    assert {"accounting.py", "bench_cpu.py", "train_ab.py", "gpu_host.py",
            "first_batch.py"} <= {p.name for p in writers}
    for path in writers:
        text = path.read_text()
        assert "add_out_argument(" in text, f"{path.name} has no --out with the shared default"
        assert "default=RESULTS" not in text and "or RESULTS" not in text, path.name


def test_gpu_check_passes_its_out_folder_to_the_benchmarks_it_runs():
    check = _bench("gpu_check")
    out = Path("/somewhere/results")
    for name, cmd, _ in check.steps("compute-sanitizer", out):
        if any(Path(word).name.startswith(("bench_", "train_")) for word in cmd):
            assert cmd[cmd.index("--out") + 1] == str(out), name


def test_gpu_check_keeps_its_logs_in_its_out_folder_and_lists_the_new_files(tmp_path,
                                                                            monkeypatch, capsys):
    check = _bench("gpu_check")
    wrote = f"from pathlib import Path; Path({str(tmp_path / 'bench-1.json')!r}).touch(); " \
            f"print('wrote bench-1.json')"
    monkeypatch.setattr(check, "preflight", lambda: [])
    monkeypatch.setattr(check, "steps", lambda sanitizer, out: [
        ("bench-gpu", [sys.executable, "-c", wrote], 30),
        ("train-ab", [sys.executable, "-c", "raise SystemExit(3)"], 30)])
    assert check.main(["--out", str(tmp_path)]) == 1
    (log,) = tmp_path.glob("gpu-check-train-ab-*.log")
    summary = capsys.readouterr().out
    assert "PASS  bench-gpu" in summary and "FAIL  train-ab" in summary
    assert f"results files in {tmp_path} (2): bench-1.json, {log.name}" in summary


def test_remote_benchmark_smoke_run_reads_the_same_tokens_three_ways(tmp_path):
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    proc = subprocess.run([sys.executable, str(BENCH / "storage/bench_remote.py"), "--shards", "2",
                           "--shard-mb", "0.5", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (path,) = tmp_path.glob("remote-*.json")
    rows = {r["name"]: r for r in json.loads(path.read_text())["rows"]}
    assert rows["local-disk"]["tokens"] == rows["s3-cold-cache"]["tokens"] \
        == rows["s3-warm-cache"]["tokens"] > 0
    data_bytes = json.loads(path.read_text())["config"]["bytes"]
    assert rows["s3-cold-cache"]["downloaded_bytes"] == data_bytes  # each shard once
    assert rows["s3-warm-cache"]["downloaded_bytes"] == 0  # all from the cache


def test_gpt2_sized_training_ab_smoke_run_times_every_feed(tmp_path):
    """--quick: the tiny model, on feeds that need no peer environment."""
    proc = subprocess.run([sys.executable, str(BENCH / "training/train_gpt2.py"), "--quick",
                           "--feeds", "ndp-cpu-packed", "memmap-get-batch", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (path,) = tmp_path.glob("train-gpt2-*.json")
    report = json.loads(path.read_text())
    assert [r["name"] for r in report["rows"]] == ["ndp-cpu-packed", "memmap-get-batch"]
    for row in report["rows"]:
        assert row["steps"] == 5 and row["tokens"] == 5 * 4 * 128
        assert 0 <= row["wait_fraction"] <= 1 and row["step_ms_p99"] >= row["step_ms_p50"] > 0
    # the two feeds start from the same weights: the same model size
    assert report["rows"][0]["parameters"] == report["rows"][1]["parameters"]


@pytest.mark.parametrize("resident", [False, True])
def test_cpu_breakdown_smoke_run(tmp_path, resident):
    """Resident, with ``--modes``: ``packed+documents`` is packed with ``documents=True``."""
    modes = ["--resident", "--modes", "packed+documents,padded"] if resident else []
    proc = subprocess.run([sys.executable, str(BENCH / "cpu/cpu_breakdown.py"), "--smoke", "--out",
                           str(tmp_path), *modes], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (result,) = tmp_path.glob("cpu-breakdown-*.json")
    report = json.loads(result.read_text())
    assert report["threads"] == 1 and "--smoke" in report["command"]
    assert report["resident"] is resident
    first = "packed+documents" if resident else "packed"
    assert [(r["mode"], r["batch"]) for r in report["rows"]] == [(first, 2), ("padded", 2)]
    for row in report["rows"]:
        ns = row["ns_per_token"]
        assert row["tokens"] > 0 and row["batches"] > 3
        # every stage ran and was timed on its thread; together they are part of the process'
        for stage in ("stage", "verdicts", "layout", "build", "consumer"):
            assert ns[stage] > 0, (row["mode"], stage)
        assert sum(ns[k] for k in ("stage", "verdicts", "layout", "build")) < ns["process"]


def test_scale_benchmark_quick_run_measures_every_cost(tmp_path):
    """``bench_scale.py --quick``: 1e4 and 1e5 documents generated and indexed, rank 0 of 1 and
    of 2, both ranks at once; every figure in the file is a real measurement, and the docs'
    scale table and chart render it."""
    import math

    proc = subprocess.run([sys.executable, str(BENCH / "scale/bench_scale.py"), "--quick",
                           "--modes", "packed,packing", "--data", str(tmp_path / "data"), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (path,) = (tmp_path / "out").glob("scale-*.json")
    report = json.loads(path.read_text())
    assert report["benchmark"] == "scale" and "--quick" in report["command"]
    assert report["machine"]["versions"]["numba"] and report["date"]

    def measured(value):
        return isinstance(value, (int, float)) and math.isfinite(value) and value > 0

    sizes = [10_000, 100_000]
    assert [d["documents"] for d in report["datasets"]] == sizes
    for d, idx in zip(report["datasets"], report["index"]):
        assert d["verify"]["ok"] and d["bytes"] == 32 + d["documents"] * (8 + 2 * 16)
        assert idx["packets"] == idx["documents"] and idx["corrupt"] == 0
        assert measured(idx["seconds"]) and measured(idx["peak_rss_mb"])
    records = {(r["documents"], r["mode"], r["world"], r["which"]): r for r in report["records"]}
    assert set(records) == {(n, m, w, which) for n in sizes for m in ("packed", "packing")
                            for w, which in ((1, "rank 0"), (2, "rank 0"), (2, "node"))}
    for (n, mode, world, which), r in records.items():
        if which == "node":
            assert r["ranks"] == 2
            keys = ["open_plus_first_s", "peak_rss_mb", "peak_rss_max_rank_mb"]
        else:
            keys = ["open_s", "first_batch_s", "open_plus_first_s", "rss_after_first_batch_mb",
                    "peak_rss_mb", "next_p50_ms", "next_p99_ms", "next_max_ms",
                    "boundary_step_ms"]
            assert r["packets"] == n and r["corrupt_packets"] == 0
            # the batches before and after the boundary, the boundary step one of them
            assert r["next_samples"] == r["timed_before"] + r["timed_after"] >= 4
            assert r["next_max_ms"] >= r["next_p99_ms"] >= r["next_p50_ms"]
        for key in keys:
            assert measured(r[key]), (n, mode, world, which, key, r[key])
    # the resume state built from the index is the one iterating to it gives
    assert all(r["state_checked_by_iterating"] for r in report["records"]
               if r["which"] == "rank 0")
    fits = report["model"]["fits"]
    assert "not a measurement" in report["model"]["label"] and fits
    for f in fits:
        assert math.isfinite(f["slope"]) and measured(f["at_model_documents"])
        assert f["sizes"] == sizes

    sys.path.insert(0, str(BENCH.parent / "docs" / "plugins"))
    try:
        import charts  # matplotlib is imported when a chart is drawn
        import results
        import tables
    finally:
        sys.path.remove(str(BENCH.parent / "docs" / "plugins"))
    loaded, skipped = results.load(tmp_path / "out")
    assert [r.name for r in loaded] == [path.name] and not skipped
    assert results.kinds_of(path.name, report) == ["scale"]
    text = tables.render("scale", loaded[0], "performance/scale.md")
    assert "n/a" not in text.split("**Model")[0] and "1e5" in text
    pytest.importorskip("matplotlib")
    assert charts.scale(loaded[0])[:8] == b"\x89PNG\r\n\x1a\n"


def test_scale_peers_stream_holds_the_ndp_datasets_documents(tmp_path):
    """``bench_scale.py --peers``: the peers' uint16 stream (``scale_peers.write_stream``, in
    chunks that cut the ramp's period) is the scale dataset's documents, each followed by EOS,
    as ``ndp.Loader`` reads them back from the shards (padded, in order: one document a row)."""
    import argparse

    import numpy as np

    import ndp

    scale_data, scale_peers = _bench("scale_data"), _bench("scale_peers")
    n, vocab = 7000, 50304
    args = argparse.Namespace(doc_tokens=16, vocab=vocab, shard_mb=0.1)  # several shards
    folder = tmp_path / "ndp"
    made = scale_data.ensure_dataset(folder, scale_data.dataset_spec(n, args))
    assert made["shards"] > 1 and scale_data.index_dataset(folder)["packets"] == n
    spec = scale_peers.stream_spec(n, 16, vocab)
    assert spec["eos"] == vocab  # above every ramp token
    wrote = scale_peers.write_stream(tmp_path / "all.bin", spec, chunk_docs=999)
    stream = np.fromfile(tmp_path / "all.bin", np.uint16)
    assert wrote["bytes"] == stream.nbytes == n * 17 * 2
    rows = stream.reshape(n, 17)
    assert (rows[:, 16] == vocab).all() and (rows[:, :16] < vocab).all()
    loader = ndp.Loader(folder, mode="padded", batch_size=8, seq_len=16, shuffle=False,
                        backend="cpu", output="arrays", seed=0)
    docs = np.concatenate([b["input_ids"] for b in loader])
    assert docs.shape == (n, 16)
    np.testing.assert_array_equal(rows[:, :16], docs)


def test_gpu_threads_splits_the_cpu_by_thread_and_samples_the_producer(tmp_path):
    """``gpu_threads.py`` under the simulator (its times mean nothing there): each mode and
    consumer measured, the threads' CPU per batch read from /proc, and
    the sampler's shares of where each was, summing to at most 1."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, str(BENCH / "gpu/gpu_threads.py"), "--tokens", "8192",
                           "--batch", "2", "--seq", "16", "--seconds", "0.3", "--modes",
                           "padded", "packing", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (result,) = tmp_path.glob("sim-threads-*.json")
    report = json.loads(result.read_text())
    rows = report["results"]
    assert [(r["mode"], r["consumer"]) for r in rows] == [
        (m, c) for m in ("padded", "packing") for c in ("sum", "next")]
    for r in rows:  # (/proc counts CPU in clock ticks: a run this short gives a thread 0 or
        assert r["batches"] > 0 and r["tokens_per_s"] > 0  # a few, so none is asked of one)
        assert all(v > 0 for v in r["thread_cpu_us_per_batch"].values())
        for who in ("ndp-loader", "MainThread"):
            for kind in ("ndp", "leaf"):
                shares = [share for _, share in r["profile"][who][kind]]
                # each share rounded to 4 places: their sum may pass 1 by half a unit each
                assert all(0 < x <= 1 for x in shares) and sum(shares) <= 1 + 5e-5 * len(shares)
    assert any(r["profile"]["MainThread"]["leaf"] for r in rows)
    assert sum(sum(r["thread_cpu_us_per_batch"].values()) for r in rows) > 0


def test_gpu_host_quick_run_counts_every_device_call_per_chunk(tmp_path):
    """The host ceiling of the GPU Loader (``gpu_host.py`` on the counting null device, with the
    consumer's stream handshake running as on a GPU): every mode and source measured, and per
    chunk in steady state the protocol's calls and no more: two launches (verdicts, build),
    one host wait (the verdicts; resident), the consumer's one stream wait and the producer's
    one (the release, before the build), the verdicts', the chunk's and the release's records,
    one query of torch's stream, and not one event made."""
    proc = subprocess.run([sys.executable, str(BENCH / "gpu/gpu_host.py"), "--quick", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (result,) = tmp_path.glob("gpu-host-*.json")
    report = json.loads(result.read_text())
    rows = report["results"]
    assert sorted((r["mode"], r["source"]) for r in rows) == sorted(
        (m, s) for m in ("padded", "packed", "packing") for s in ("host", "resident"))
    for r in rows:
        chunks = r["counters_per_batch"]["chunks"] * r["batches"]
        per_chunk = {k: v * r["batches"] / chunks for k, v in r["device_calls_per_batch"].items()}
        assert r["host_us_per_batch"] > 0 and r["cpu_us_per_batch"] > 0 and chunks >= 4
        assert 0 < r["within_epoch_us_per_batch"] and r["epochs"] >= 1
        assert per_chunk["event_create"] == 0 and r["counters_per_batch"]["events_created"] == 0
        assert per_chunk["stream_synchronize"] == 0
        assert per_chunk["launch"] <= 2.1  # (+1 for a chunk the close cut short, or a retry)
        assert 0.9 <= per_chunk["current_stream_query"] <= 1.1  # one per chunk served
        if r["source"] == "resident":
            assert per_chunk["event_synchronize"] <= 1.1  # the verdicts (+1 for a chunk cut by close)
            assert per_chunk["stream_wait_event"] <= 2.1  # consumer's wait, producer's wait
            assert per_chunk["event_record"] <= 3.1  # verdicts, chunk ready, release
            assert per_chunk["memcpy_h2d"] <= 3.1 and per_chunk["memcpy_d2h"] <= 1.1
    assert set(report["targets_met"]) == {"host_us_per_batch", "cpu_s_per_billion_tokens"}


def test_kernel_profile_reads_ncus_raw_csv_and_sets_each_launch_against_its_floor():
    """What ncu prints (``--csv --page raw --print-units base``, after its own log lines) becomes
    one row per launch; the figures derived from it are the chunk's own: 4 MiB tokens in 2 ms is
    2.1 G tokens/s, and a build kernel's floor counts the packets read and outputs written."""
    prof = _bench("kernel_profile")
    names = list(prof.METRICS)
    head = ['"ID"', '"Kernel Name"'] + [f'"{m}"' for m in names]
    units = ['""', '""'] + ['"nsecond"', '"byte"', '"byte"'] + ['"%"'] * 5 + ['""'] * 4
    values = {"gpu__time_duration.sum": "2,000,000", "dram__bytes_read.sum": "40000000",
              "dram__bytes_write.sum": "110000000", "launch__grid_size": "1056"}
    row = ['"0"', '"cudapy::ndp::kernels::build_cuda::build_padded_cuda[abi:v1]"'] + [
        f'"{values.get(m, "12.5")}"' for m in names]
    text = "==PROF== Connected to process 1\n" + "\n".join(
        ",".join(r) for r in (head, units, row, ['"1"', '"verdicts_cuda"'] + ['"n/a"'] * 12))
    launches = prof.parse_raw_csv(text)
    assert len(launches) == 2 and launches[0]["duration_ns"] == 2e6
    assert launches[0]["grid_size"] == 1056 and launches[1]["duration_ns"] is None
    chunk = {"chunk_tokens": 4 << 20, "chunk_output_bytes": 100_000_000}
    got = prof.summarise(launches[0], chunk, 20_000_000)
    assert got["duration_us"] == 2000.0 and round(got["tokens_per_s"] / 1e9, 2) == 2.10
    assert got["dram_gb_per_s"] == 75.0 and got["floor_bytes"] == 120_000_000
    assert got["dram_bytes_over_floor"] == 1.25
    assert prof.summarise(launches[1], chunk, 1) == launches[1]  # nothing measured, nothing made
    assert prof.parse_raw_csv("==ERROR== no kernels were profiled\n") == []


def test_kernel_profile_driver_runs_full_chunks_under_the_simulator(tmp_path):
    """The child ncu runs: a resident GPU Loader warmed to full chunks, then the chunks that
    are profiled, and what one holds (the simulator has no profiler: its range is skipped)."""
    _bench("bench_gpu_loader").write_corpus(tmp_path, 40_000, 16)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, str(BENCH / "gpu/kernel_profile.py"), "--drive",
                           "packed", "--corpus", str(tmp_path), "--batch", "2", "--seq", "16",
                           "--chunks", "1"], capture_output=True, text=True, env=env,
                          timeout=300, cwd=BENCH.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("chunk:"))
    chunk = json.loads(line.split(":", 1)[1])
    assert chunk == {"mode": "packed", "chunk_batches": 64, "chunk_tokens": 64 * 2 * 16,
                     "chunk_output_bytes": 64 * 2 * (2 * 16 * 8)}  # x and y, int64


FAKE_NCU = '''#!{python}
"""ncu as kernel_profile calls it: runs the program after its options, writes a CSV log."""
import subprocess, sys
args = sys.argv[1:]
if args == ["--version"]:
    print("Version fake"); sys.exit(0)
log = args[args.index("--log-file") + 1]
program = args[args.index("--log-file") + 2:]
metrics = args[args.index("--metrics") + 1].split(",")
with open(log, "w") as f:
    head = ['"ID"', '"Kernel Name"'] + [f'"{{m}}"' for m in metrics]
    f.write("==PROF== Connected\\n" + ",".join(head) + "\\n")
    f.write(",".join(['"0"', '"verdicts_cuda"'] + ['"1000"'] * len(metrics)) + "\\n")
sys.exit(subprocess.run(program).returncode)
'''


def test_kernel_profile_runs_each_mode_under_ncu_and_writes_its_report(tmp_path):
    """The parent's whole path with a stand-in ncu on PATH (the device has the real one): the
    child runs under it, the CSV it leaves is read, the report lands in --out."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ncu"
    fake.write_text(FAKE_NCU.format(python=sys.executable))
    fake.chmod(0o755)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1",
               PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run([sys.executable, str(BENCH / "gpu/kernel_profile.py"), "--modes",
                           "packed",
                           "--batch", "2", "--seq", "16", "--tokens", "40000", "--chunks", "1",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          env=env, timeout=300, cwd=BENCH.parent)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(next((tmp_path / "out").glob("kernel-profile-*.json")).read_text())
    packed = report["modes"]["packed"]
    assert packed["chunk"]["chunk_tokens"] == 64 * 2 * 16 and len(packed["launches"]) == 1
    launch = packed["launches"][0]
    assert launch["duration_ns"] == 1000 and launch["tokens_per_s"] == 2048 / 1e-6
    assert report["ncu"] == ["Version fake"] and "--chunks 1" in report["command"]


def test_each_measured_run_counts_its_epochs_in_a_count_cache_of_its_own(monkeypatch, tmp_path):
    """``harness.fresh_counts``: a new, empty count cache for the block, so a run of a
    comparison never finds the epochs a run before it counted (and skips their count pass);
    the variable and the user's cache are as they were after."""
    monkeypatch.syspath_prepend(str(BENCH))
    from harness import fresh_counts

    user = tmp_path / "user-counts"
    user.mkdir()
    (user / "kept.json").write_text("{}")
    monkeypatch.setenv("NDP_COUNT_CACHE", str(user))
    seen = []
    for _ in range(2):
        with fresh_counts() as path:
            assert os.environ["NDP_COUNT_CACHE"] == path != str(user)
            assert not os.listdir(path)
            (Path(path) / "epoch.json").write_text("{}")  # what a run leaves
            seen.append(path)
    assert seen[0] != seen[1] and not any(Path(p).exists() for p in seen)
    assert os.environ["NDP_COUNT_CACHE"] == str(user) and (user / "kept.json").exists()
    monkeypatch.delenv("NDP_COUNT_CACHE")
    with fresh_counts():
        pass
    assert "NDP_COUNT_CACHE" not in os.environ


def test_first_batch_benchmark_smoke_run_splits_numbas_setup_from_the_loaders_part(tmp_path):
    """``first_batch.py``: fresh processes per mode, as a script meets the Loader and with
    Numba's CPU target set up first; the Loader's own part is the smaller, and both are
    recorded run by run."""
    proc = subprocess.run([sys.executable, str(BENCH / "scale/first_batch.py"), "--quick", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (result,) = tmp_path.glob("first-batch-*.json")
    report = json.loads(result.read_text())
    assert set(report["results"]) == {"padded", "packed", "packing"}
    for row in report["results"].values():
        cold, ready = row["cold"], row["numba_ready"]
        assert len(cold["runs"]) == len(ready["runs"]) == report["config"]["repeat"]
        assert cold["numba_setup_s"] < ready["numba_setup_s"] == row["numba_setup_s"]
        for r in (cold, ready):
            assert r["to_first_batch_s"] == pytest.approx(r["loader_s"] + r["first_next_s"])
