"""A shard cut while a command reads it: every command that reads shards says so, naming the
shard, and exits 1 (a check failed) or 2 (an error); none dies of SIGBUS (exit -7), as
``verify``, ``verify --no-manifest``, ``index`` and ``export`` did when they memory-mapped
shards (issue 39, finding 3).

The cut is made deterministic by a hook in the child process: the shard is cut to half its
size right after the first read of a whole block of it (pread through ``Shard.read_into``),
so the next block's read comes up short; where a command still mapped the shard, the hook
cut it just before the first scan or validation of the mapping (the old code's first touch).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

from ndp.store.shard import BLOCK_BYTES
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp, write_shards

CHILD = """
import os, sys
shard, argv = sys.argv[1], sys.argv[2:]
size = os.path.getsize(shard)
done = []

def cut():
    if not done:
        done.append(True)
        os.truncate(shard, size // 2)

import ndp.store.shard as shards
read_into = getattr(shards.Shard, "read_into", None)
if read_into is not None:
    def read_then_cut(self, offset, out, _read=read_into):
        _read(self, offset, out)
        if str(self.path) == shard and out.shape[0] >= 1 << 20:  # a block, not a header
            cut()
    shards.Shard.read_into = read_then_cut

import ndp.engine.reference as reference
import ndp.store.index as index
for module, name in ((index, "scan_frames"), (reference, "validate")):
    def cut_then_call(*args, _call=getattr(module, name), **kw):
        cut()
        return _call(*args, **kw)
    setattr(module, name, cut_then_call)

from ndp.cli.main import main
sys.exit(main(argv))
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A committed one-shard dataset of ramp packets, larger than two blocks' worth of reads
    (so a cut after the first block leaves the second to find it)."""
    directory = tmp_path_factory.mktemp("big")
    n = 1000
    packets = [encode_tokens(ramp(k, n), width=4) for k in range(BLOCK_BYTES // (4 * n) + 300)]
    (info,) = write_shards(directory, packets)
    assert info.size > BLOCK_BYTES + (1 << 20)
    return directory


@pytest.mark.parametrize("command", [
    ["verify", "{dir}"],
    ["verify", "--no-manifest", "{dir}"],
    ["verify", "{shard}"],
    ["inspect", "{shard}"],
    ["index", "{shard}"],
    ["export", "{dir}", "-o", "{out}", "--no-progress"],
], ids=["verify", "verify-no-manifest", "verify-shard", "inspect", "index", "export"])
def test_a_shard_cut_while_a_command_reads_it_is_named_never_a_sigbus(tmp_path, dataset,
                                                                      command):
    directory = tmp_path / "ds"
    shutil.copytree(dataset, directory)
    shard = next(directory.glob("*.ndp"))
    argv = [a.format(dir=directory, shard=shard, out=tmp_path / "out.bin") for a in command]
    proc = subprocess.run([sys.executable, "-c", CHILD, str(shard), *argv],
                          capture_output=True, text=True, timeout=600)
    said = proc.stdout + proc.stderr
    assert proc.returncode in (1, 2), (proc.returncode, said[-3000:])  # -7: SIGBUS
    assert "Traceback" not in said, said[-3000:]
    assert shard.stat().st_size < np.int64(BLOCK_BYTES)  # the hook did cut it
    problem = [line for line in said.splitlines() if "while ndp read it" in line]
    assert problem and str(shard) in problem[0], said[-3000:]
    if command[0] == "export":
        assert not (tmp_path / "out.bin").exists()
    if command[0] == "index":
        assert not shard.with_name(shard.name + ".idx.tmp").exists()
