"""A local Ray that ndp starts dies with the command, even one killed with SIGKILL.

``ray.init()`` with no cluster to join starts one in the caller's process: its GCS and raylet
die with their parent (Ray sets ``PR_SET_PDEATHSIG``), but the agents and workers the raylet
starts are orphaned and run on (``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent`` were found
alive after ``ndp convert --engine ray`` was killed). A process that is killed cannot clean up
after itself, so ``reap_with_this_process`` starts a small reaper first, in a session of its own
(a Ctrl-C to the command's process group does not reach it). It marks this process' environment
with a token that the processes Ray starts inherit (not all: the raylet starts its agents with an
environment of its own), notes once a second which processes this one has started, directly or
not, and waits on a pipe whose only writer is this process. When this process ends, however it
ends, the pipe closes and the reaper kills every process it noted (the same pid and start time)
or that carries the token, and their children, then exits. Linux only (``/proc``); elsewhere nothing is
started. A Ray cluster the command joins (``--ray-address``, ``RAY_ADDRESS``) is never touched.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

#: the environment variable every process of ndp's local Ray carries, and the reaper looks for
TOKEN_VAR = "NDP_LOCAL_RAY"

_REAPER = r"""
import os, select, signal, sys, time
owner, token = int(sys.argv[1]), sys.argv[2]
mark = ("NDP_LOCAL_RAY=" + token).encode()
me = os.getpid()

def table():
    # pid -> (parent pid, start time) of every process, and the pids carrying the token
    procs, marked = {}, set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            procs[int(name)] = (int(fields[1]), fields[19])
            with open("/proc/%s/environ" % name, "rb") as f:
                if mark in f.read().split(b"\0"):
                    marked.add(int(name))
        except (OSError, IndexError, ValueError):
            pass
    return procs, marked

def ours(procs, marked, roots):
    # the token's processes and every descendant of roots, as (pid, start time)
    kids = {}
    for pid, (ppid, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    found, todo = set(), list(roots) + list(marked)
    while todo:
        pid = todo.pop()
        if pid in found or pid == me or pid not in procs:
            continue
        found.add(pid)
        todo.extend(kids.get(pid, ()))
    return {(pid, procs[pid][1]) for pid in found}

seen = set()
while True:  # every second, what the owner has started (agents carry no token: Ray cleans
    # their environment); its end closes the pipe
    if select.select([sys.stdin], [], [], 1.0)[0] and not os.read(sys.stdin.fileno(), 1):
        break
    seen |= ours(*table(), [owner])
for _ in range(3):
    procs, marked = table()
    alive = {(pid, procs[pid][1]) for pid, _ in seen if pid in procs}
    victims = (seen & alive) | ours(procs, marked, [pid for pid, _ in seen & alive])
    victims.discard((owner, procs.get(owner, (0, b""))[1]))
    for pid, _ in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if not victims:
        break
    seen |= victims
    time.sleep(0.2)
"""

_writer: int | None = None


def reap_with_this_process() -> str | None:
    """Start the reaper (once per process) and mark this process' environment, so that the
    processes started after it carry the token; the token, or None where there is no
    ``/proc``."""
    global _writer
    if _writer is not None:
        return os.environ.get(TOKEN_VAR)
    if not os.path.isdir("/proc/self"):
        return None
    token = f"{os.getpid()}-{secrets.token_hex(8)}"
    read, write = os.pipe()  # not inherited by later children (close-on-exec)
    env = {k: v for k, v in os.environ.items() if k != TOKEN_VAR}
    subprocess.Popen([sys.executable, "-c", _REAPER, str(os.getpid()), token], stdin=read,
                     env=env,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)
    os.close(read)
    _writer = write  # kept open for this process' life: its close is the reaper's signal
    os.environ[TOKEN_VAR] = token
    return token
