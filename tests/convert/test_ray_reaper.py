"""ndp.convert.reaper: the local Ray that ``ndp convert --engine ray`` starts dies with the
command even when the command is killed with SIGKILL (issue 28 item 9, issue 39 item 9), and its
directory goes with it. Processes are found as the reaper must find them: by what they write in
the Ray session's directory, not only by parentage (an orphan has no parent to follow)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ndp.cli.demo import stdlib_files

psutil = pytest.importorskip("psutil")
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

HANG = 180  # seconds: a bound that only a hang reaches (Ray starts in ~10 s on 2 busy cores)
#: Ray's own watchers end its orphaned agents ~60 s after the raylet dies (Ray 2.60, measured):
#: a bound well under that tests ndp's reaper, which takes ~1-2 s
REAPED = 30

# the owner: starts the reaper, then, as the raylet starts its agents, a process through a child
# that ends at once (the orphan is nobody's descendant), with an environment of its own (no
# token), writing its log in the local Ray's directory
OWNER = r"""
import os, subprocess, sys
from ndp.convert.reaper import reap_with_this_process
root = reap_with_this_process()
spawn = ("import subprocess, sys; log = open(sys.argv[1] + '/agent.log', 'a'); "
         "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
         "stdout=log, stderr=log, start_new_session=True); print(p.pid, flush=True)")
middle = subprocess.Popen([sys.executable, "-c", spawn, str(root)], stdout=subprocess.PIPE,
                          text=True, env={"PATH": os.environ.get("PATH", "")})
orphan = middle.stdout.readline().strip()
middle.wait()
print(root, orphan, flush=True)
sys.stdin.read()
"""


def _alive(pid: int, started: float) -> bool:
    try:
        p = psutil.Process(pid)
        return p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _until(done, bound: float) -> bool:
    """Whether ``done()`` became true within ``bound`` seconds (polled every 0.2 s)."""
    deadline = time.monotonic() + bound
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_an_orphan_with_no_token_writing_in_the_ray_directory_dies_with_its_owner(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    root, pid = owner.stdout.readline().split()
    orphan = psutil.Process(int(pid))
    started = orphan.create_time()
    try:
        assert orphan.ppid() != owner.pid and "NDP_LOCAL_RAY" not in orphan.environ()
        owner.kill()
        owner.wait(timeout=HANG)
        assert _until(lambda: not _alive(orphan.pid, started), REAPED), "the orphan runs on"
        assert _until(lambda: not Path(root).exists(), REAPED), f"{root} is still there"
    finally:
        if _alive(orphan.pid, started):
            orphan.kill()


def _tree(pid: int) -> list:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _session(procs: list) -> str | None:
    """The Ray session directory these processes write their logs in."""
    for p in procs:
        try:
            for f in p.open_files():
                found = re.match(r"(.*/session_[^/]+)/", f.path)
                if found:
                    return found.group(1)
        except psutil.Error:
            pass
    return None


def _session_processes(session: str, seen: dict) -> dict:
    """(pid, start) -> name of every live process seen before, or writing under ``session``."""
    out = {}
    for p in psutil.process_iter(["name", "create_time"]):
        key = (p.pid, p.info["create_time"])
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if key in seen or any(f.path.startswith(session + "/") and f.mode != "r"
                                  for f in p.open_files()):
                out[key] = p.info["name"]
        except psutil.Error:
            pass
    return out


@pytest.mark.slow
def test_a_local_ray_dies_with_a_command_killed_by_sigkill(tokenizer_dir, tmp_path):
    """Killed as soon as the raylet's first processes run (its agents, which carry no token and
    are the last to die by Ray's own means), the command leaves no process of its Ray session
    and no session directory behind."""
    text = "".join(p.read_text(encoding="utf-8") for p in stdlib_files(40))
    for j in range(4):  # enough input to outlast Ray's start by many seconds
        with open(tmp_path / f"in{j}.jsonl", "w", encoding="utf-8") as f:
            for k in range(60):
                f.write(json.dumps({"text": text[k * 97 % 5000:]}) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    child = subprocess.Popen(
        [sys.executable, "-m", "ndp.cli", "convert", *sorted(map(str, tmp_path.glob("*.jsonl"))),
         str(tmp_path / "out"), "--tokenizer", tokenizer_dir, "--engine", "ray",
         "--no-progress"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: dict = {}
    session = None
    try:
        deadline = time.monotonic() + HANG
        while not (session and any(n.startswith("ray::") for n in seen.values())):
            assert child.poll() is None, "the conversion ended before Ray's processes were seen"
            assert time.monotonic() < deadline, "Ray's processes never appeared"
            procs = _tree(child.pid)
            for p in procs:
                try:
                    seen[(p.pid, p.create_time())] = p.name()
                except psutil.Error:
                    pass
            session = session or _session(procs)
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=HANG)
        assert _until(lambda: not _session_processes(session, seen), REAPED), sorted(
            _session_processes(session, seen).values())
        assert _until(lambda: not Path(session).exists(), REAPED), f"{session} is left"
    finally:
        if child.poll() is None:
            child.kill()
        for pid, _ in _session_processes(session, seen) if session else ():
            try:  # whatever this test made, even where it failed
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
