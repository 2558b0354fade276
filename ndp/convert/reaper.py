"""A local Ray that ndp starts dies with the command, even one killed with SIGKILL.

``ray.init()`` with no cluster to join starts one in the caller's process: its GCS and raylet
die with their parent (Ray sets ``PR_SET_PDEATHSIG``), but the agents and workers the raylet
starts are orphaned and run on: Ray's own watchers end its workers a few seconds later and its
``ray::DashboardAgent`` and ``ray::RuntimeEnvAgent`` only after about 60 s (measured with Ray
2.60 on Linux). A process that is killed cannot clean up after itself, so
``reap_with_this_process`` starts a small reaper first, in a session of its own (a Ctrl-C to the
command's process group does not reach it), and gives the local Ray a directory of its own
(``ray.init(_temp_dir=...)``). The reaper waits on a pipe whose only writer is this process;
when this process ends, however it ends, the pipe closes and the reaper kills every process of
that Ray, then removes the directory.

Which processes are that Ray's, found three ways, since none alone sees them all: every process
that has a file open for writing in the directory (each Ray process writes its logs there, the
agents included, whose environment the raylet makes anew); every process that carries the token
this process put in its environment (inherited by what Ray starts from here); and every process
this one had started, directly or not, when the reaper last looked (once a second). Linux only
(``/proc``); elsewhere nothing is started. A Ray cluster the command joins (``--ray-address``,
``RAY_ADDRESS``) is never touched.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

#: the environment variable every process of ndp's local Ray carries, and the reaper looks for
TOKEN_VAR = "NDP_LOCAL_RAY"

_REAPER = r"""
import os, select, shutil, signal, sys, time
owner, token, root = int(sys.argv[1]), sys.argv[2], os.path.join(sys.argv[3], "")
mark = ("NDP_LOCAL_RAY=" + token).encode()
me = os.getpid()

def table():
    # pid -> (parent pid, start time) of every process
    procs = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name, "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                procs[int(name)] = (int(fields[1]), fields[19])
            except (OSError, IndexError, ValueError):
                pass
    return procs

def marked(pid):
    # whether pid carries the token, or has a file open for writing under root
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            if mark in f.read().split(b"\0"):
                return True
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return False
    for fd in fds:
        try:
            if not os.readlink("/proc/%d/fd/%s" % (pid, fd)).startswith(root):
                continue
            with open("/proc/%d/fdinfo/%s" % (pid, fd)) as f:
                flags = int(f.read().split("flags:")[1].split()[0], 8)
        except (OSError, IndexError, ValueError):
            continue
        if flags & 3:  # O_WRONLY or O_RDWR: a log it writes, not a reader such as tail
            return True
    return False

def tree(procs, roots):
    # roots and their descendants, as (pid, start time)
    kids = {}
    for pid, (ppid, _) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in found or pid == me or pid not in procs:
            continue
        found.add(pid)
        todo.extend(kids.get(pid, ()))
    return {(pid, procs[pid][1]) for pid in found}

seen = set()
while True:  # what the owner has started, once a second; its end closes the pipe
    if select.select([sys.stdin], [], [], 1.0)[0] and not os.read(sys.stdin.fileno(), 1):
        break
    seen |= tree(table(), [owner])
for _ in range(50):  # until a look finds none: a process being started shows up next time
    procs = table()
    roots = [pid for pid, start in seen if procs.get(pid, (0, None))[1] == start]
    roots += [pid for pid in procs if pid != me and marked(pid)]
    victims = tree(procs, roots)
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
shutil.rmtree(root, ignore_errors=True)  # Ray's logs and sockets: nobody is left to read them
"""

_started: Path | None = None  # the local Ray's directory, once the reaper runs
_pipe: int | None = None


def reap_with_this_process() -> Path | None:
    """Start the reaper (once per process) and mark this process' environment, so that the
    processes started after it carry the token; the directory the local Ray must keep its
    files in (``ray.init(_temp_dir=...)``), or None where there is no ``/proc``."""
    global _started, _pipe
    if _started is not None:
        return _started
    if not os.path.isdir("/proc/self"):
        return None
    # Ray's own default root (RAY_TMPDIR, else /tmp, not TMPDIR): its sockets' paths live under
    # it, and a Unix socket path is at most 107 bytes
    root = Path(tempfile.mkdtemp(prefix="ndp-ray-", dir=os.environ.get("RAY_TMPDIR", "/tmp")))
    token = f"{os.getpid()}-{secrets.token_hex(8)}"
    read, write = os.pipe()  # not inherited by later children (close-on-exec)
    env = {k: v for k, v in os.environ.items() if k != TOKEN_VAR}
    subprocess.Popen([sys.executable, "-c", _REAPER, str(os.getpid()), token, str(root)],
                     stdin=read, env=env, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
    os.close(read)
    _pipe = write  # kept open for this process' life: its close is the reaper's signal
    os.environ[TOKEN_VAR] = token
    _started = root
    return root
