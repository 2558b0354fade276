"""One ``ndp convert`` at a time into an output, and one that is stopped leaves nothing behind
(issue 39 item 9, ndp.store.manifest.staged_output), with real processes: a second conversion
into an output another one is writing is refused at once, by name, before it does any work;
SIGTERM or Ctrl-C removes the staging directory, exits non-zero with one line, and leaves the
output as it was.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ndp.cli.demo import stdlib_files
from ndp.cli.main import main
from ndp.store.manifest import read_manifest

CLI = "import sys; from ndp.cli.main import main; sys.exit(main(sys.argv[1:]))"
HANG = 120  # seconds: far past any step here (a conversion takes ~10 s on 2 busy cores)


def _jsonl(path: Path, files: int) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for p in stdlib_files(files):
            f.write(json.dumps({"text": p.read_text(encoding="utf-8")}) + "\n")
    return path


def _interruptible() -> None:
    """In the child before it starts: SIGINT at its default, as under a terminal, so Python
    raises KeyboardInterrupt for it. A suite run in the background (``cmd &`` in a script) has
    SIGINT ignored, and a child would inherit that and let the Ctrl-C pass (it did)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _convert(src: Path, out: Path, tokenizer: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CLI, "convert", str(src), str(out), "--tokenizer", tokenizer,
         "--overflow", "split", "--no-progress", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=_interruptible)


def _staging(out: Path, pid: int) -> Path:
    return out.parent / f".{out.name}.ndp-partial-{pid}"


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    """Until ``path`` exists (the writer has taken the lock and begun); the writer must still
    run then."""
    deadline = time.monotonic() + HANG
    while not path.exists():
        assert proc.poll() is None, f"the writer ended ({proc.returncode}) before {path} was " \
                                    f"made: {proc.stderr.read()}"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def _leftovers(parent: Path) -> list[str]:
    """What writers left beside their outputs (the lock file stays, on purpose)."""
    return sorted(p.name for p in parent.iterdir() if ".ndp-" in p.name
                  and not p.name.endswith(".ndp-lock"))


@pytest.mark.slow
def test_a_second_writer_is_refused_at_once_while_the_first_writes(tmp_path, tokenizer_dir):
    src = _jsonl(tmp_path / "in.jsonl", 12)
    out = tmp_path / "out"
    first = _convert(src, out, tokenizer_dir)
    try:
        _wait_for(_staging(out, first.pid), first)
        first.send_signal(signal.SIGSTOP)  # holds its lock, mid-conversion, until SIGCONT
        assert _staging(out, first.pid).exists(), "the first writer finished too early"
        second = subprocess.run(
            [sys.executable, "-c", CLI, "convert", str(src), str(out), "--tokenizer",
             tokenizer_dir, "--no-progress", "--overwrite"],
            capture_output=True, text=True, timeout=HANG)
        assert second.returncode == 2, second.stderr
        assert (f"another conversion (pid {first.pid} on {socket.gethostname()}) is writing "
                f"there now") in second.stderr
        assert _leftovers(tmp_path) == [_staging(out, first.pid).name]  # none of the second's
        assert not out.exists()
    finally:
        first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=HANG) == 0, first.stderr.read()
    assert read_manifest(out)["shards"]
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_conversion_removes_its_staging_and_says_so(sig, tmp_path, tokenizer_dir):
    src = _jsonl(tmp_path / "in.jsonl", 12)
    out = tmp_path / "out"
    overwrite = sig == signal.SIGINT  # Ctrl-C while replacing: the old dataset stays whole
    if overwrite:
        assert main(["convert", str(_jsonl(tmp_path / "old.jsonl", 3)), str(out),
                     "--tokenizer", tokenizer_dir, "--no-progress"]) == 0
    before = read_manifest(out) if overwrite else None
    proc = _convert(src, out, tokenizer_dir, *(["--overwrite"] if overwrite else []))
    _wait_for(_staging(out, proc.pid), proc)
    proc.send_signal(sig)
    status = proc.wait(timeout=HANG)
    err = proc.stderr.read()
    assert status == 128 + sig, err  # 143 for SIGTERM, 130 for Ctrl-C, as a shell says
    assert err.strip().splitlines() == [
        f"ERROR ndp.store.manifest: {out}: conversion stopped ("
        f"{'SIGTERM received' if sig == signal.SIGTERM else 'interrupted: SIGINT or Ctrl-C'}"
        f"); its unfinished dataset is removed and {out} is as it was"]
    assert _leftovers(tmp_path) == []
    assert read_manifest(out) == before if overwrite else not out.exists()
