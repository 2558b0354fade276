"""ndp.store.manifest.staged_output in one process (issue 39 item 9): what a writer that died
mid-write left, on any host, is removed by the next writer; a new output that another program
filled while the dataset was built is not replaced, and nothing of the conversion stays."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ndp.errors import ConfigError
from ndp.store.manifest import MANIFEST, staged_output, write_manifest


def _leftovers(parent: Path) -> list[str]:
    """What writers left beside their outputs (the lock file stays, on purpose)."""
    return sorted(p.name for p in parent.iterdir() if ".ndp-" in p.name
                  and not p.name.endswith(".ndp-lock"))


def test_what_dead_writers_left_is_removed_whatever_host_they_ran_on(tmp_path):
    """A writer on another host that shares the directory (NFS) died mid-write: its pid may be
    a live process here, which says nothing; the lock says it is gone."""
    out = tmp_path / "out"
    for kind in ("partial", "old"):  # os.getppid(): a pid that runs here
        d = tmp_path / f".out.ndp-{kind}-{os.getppid()}"
        d.mkdir()
        (d / "shard-00000.ndp").write_bytes(b"\xaa" * 8)
    with staged_output(out, overwrite=False) as stage:
        write_manifest(stage, {"format_version": 1, "shards": []})
    assert _leftovers(tmp_path) == []
    assert os.listdir(out) == [MANIFEST]


def test_an_output_filled_meanwhile_is_not_replaced_and_nothing_stays(tmp_path):
    """A program that takes no ndp lock writes into the new output while the conversion runs:
    the commit is refused by name, and the conversion's staging directory is removed."""
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match=r"another process wrote there .*theirs\.txt"):
        with staged_output(out, overwrite=False) as stage:
            write_manifest(stage, {"format_version": 1, "shards": []})
            out.mkdir()
            (out / "theirs.txt").write_text("mine")
    assert os.listdir(out) == ["theirs.txt"]
    assert _leftovers(tmp_path) == []


def test_a_sigterm_whose_exit_python_swallowed_still_stops_the_write(tmp_path):
    """A SIGTERM handled while Python runs a ``__del__`` (or a weakref callback: it once came
    during an import's module-lock callback) has its ``SystemExit`` printed and ignored; the
    write must not commit as if nothing came: it stops at the block's end, staging removed."""
    import gc
    import os
    import signal
    import time

    from ndp.store.manifest import staged_output

    class Dies:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            end = time.monotonic() + 5
            while time.monotonic() < end:  # the handler runs here, inside __del__
                time.sleep(0.01)

    out = tmp_path / "out"
    # the default disposition, as in a fresh ``ndp convert`` (a test before this one may have
    # started Ray in this process, whose handler the writer leaves alone)
    saved = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with pytest.raises(SystemExit) as stopped:
            with staged_output(out, overwrite=False) as staging:
                (staging / "shard-00000.ndp").write_bytes(b"x")
                obj = Dies()
                del obj
                gc.collect()
    finally:
        signal.signal(signal.SIGTERM, saved)
    assert stopped.value.code == 128 + signal.SIGTERM
    assert not out.exists() and not list(tmp_path.glob(".out.ndp-partial-*"))
