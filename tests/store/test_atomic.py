"""Atomic writes (ndp.store.atomic): a file appears whole or not at all, and every writer in the
package and the benchmarks uses this one helper rather than its own temp-fsync-rename."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ndp.store.atomic import AtomicFile, atomic_file, atomic_write

ROOT = Path(__file__).resolve().parents[2]


def test_a_file_appears_only_when_complete(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"old")
    out = AtomicFile(path)
    out.file.write(b"new, half")
    assert path.read_bytes() == b"old"  # the old file until the commit
    out.commit()
    assert path.read_bytes() == b"new, half" and sorted(tmp_path.iterdir()) == [path]


def test_an_exception_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "f.txt"
    atomic_write(path, "old")
    with pytest.raises(RuntimeError):
        with atomic_file(path, "w") as f:
            f.write("new")
            raise RuntimeError("killed half way")
    assert path.read_text() == "old" and sorted(tmp_path.iterdir()) == [path]


def test_every_writer_uses_the_helper():
    """No module writes a file with its own temp-fsync-rename (issue 13 item 10)."""
    offenders = []
    for source in [*ROOT.glob("ndp/**/*.py"), *ROOT.glob("kernels/*.py"),
                   *ROOT.glob("benchmarks/*.py"), *ROOT.glob("benchmarks/[!.]*/*.py")]:
        if source.name == "atomic.py":
            continue
        text = source.read_text(encoding="utf-8")
        for pattern in (r"os\.replace\(", r"os\.fsync\(", r"\.write_text\(", r"\.write_bytes\("):
            if re.search(pattern, text):
                offenders.append(f"{source.relative_to(ROOT)}: {pattern}")
    # the bad-input cases damage files on purpose (their test data), which is not writing results
    damaging = ("benchmarks/inputs/bad_inputs.py", "benchmarks/inputs/cases.py")
    assert [o for o in offenders if not o.startswith(damaging)] == []


@pytest.mark.parametrize("how", ["symlink", "hardlink"])
def test_a_link_where_the_temporary_goes_is_never_written_through(tmp_path, how):
    """``<name>.tmp`` made a link to another file (a shard) before the write: the write makes
    a file of its own there, and the other file is left as it was (it was once truncated
    through the link)."""
    victim = tmp_path / "shard.ndp"
    victim.write_bytes(b"the shard's bytes")
    tmp = tmp_path / "out.bin.tmp"
    if how == "symlink":
        tmp.symlink_to(victim)
    else:
        tmp.hardlink_to(victim)
    atomic_write(tmp_path / "out.bin", b"exported")
    assert victim.read_bytes() == b"the shard's bytes"
    assert (tmp_path / "out.bin").read_bytes() == b"exported" and not tmp.exists()
