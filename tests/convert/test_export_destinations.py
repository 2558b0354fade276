"""``ndp export`` writes only to a new path or over a file an export wrote (an llm.c token file,
with ``overwrite``): a device, FIFO, socket, directory, another kind of file, and any of the
dataset's own files (by name, symbolic or hard link) are refused by name, before a byte is
written, and left as they were (issue 39, finding 9: ``--overwrite`` onto a device replaced it
with a regular file; onto a shard of the dataset, it overwrote the shard)."""

from __future__ import annotations

import os
import socket
import stat

import numpy as np
import pytest

from ndp.cli.main import main
from ndp.convert.export_llmc import export_llmc
from ndp.convert.tokenfiles import read_llmc
from ndp.errors import ConfigError
from ndp.wire.packet import encode_tokens

from ndp_test_helpers import ramp, write_shards


@pytest.fixture
def ds(tmp_path):
    """A committed one-shard dataset of ramp packets, and its shard's bytes."""
    (info,) = write_shards(tmp_path / "ds", [encode_tokens(ramp(k, 20), width=2)
                                             for k in range(5)])
    return tmp_path / "ds", info.path, info.path.read_bytes()


def refused(ds_dir, out, match: str, *, shard_tokens=None, named=None) -> None:
    """Both ways of asking (the API with ``overwrite``, the command line with --overwrite) are
    a ConfigError that names the path refused (``named``, else ``out``) and says why; the
    command line exits 2."""
    with pytest.raises(ConfigError, match=match) as err:
        export_llmc(ds_dir, out, overwrite=True, shard_tokens=shard_tokens)
    assert str(err.value).startswith(f"{named or out}: ")
    argv = ["export", str(ds_dir), "-o", str(out), "--overwrite", "--no-progress"]
    assert main(argv + (["--shard-tokens", str(shard_tokens)] if shard_tokens else [])) == 2


def character_device(tmp_path):
    """A character device to export onto: a node of our own (``/dev/null``'s numbers) when
    we may make one, so that a regression cannot replace the system's ``/dev/null``; else
    ``/dev/null`` itself (then we are not root, and cannot replace it either)."""
    node = tmp_path / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        return node
    except PermissionError:
        return "/dev/null"


def test_a_device_is_refused_and_left_a_device(tmp_path, ds, capsys):
    device = character_device(tmp_path)
    refused(ds[0], device, "a character device, not a file an export wrote")
    assert "a character device" in capsys.readouterr().err
    assert stat.S_ISCHR(os.stat(device).st_mode)


def test_a_fifo_is_refused_and_left_a_fifo(tmp_path, ds):
    fifo = tmp_path / "out.bin"
    os.mkfifo(fifo)
    refused(ds[0], fifo, "a FIFO")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_a_socket_is_refused(tmp_path, ds):
    path = tmp_path / "s.bin"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        refused(ds[0], path, "a socket")
    assert stat.S_ISSOCK(os.stat(path).st_mode)


@pytest.mark.parametrize("which", ["shard", "index", "manifest"])
def test_the_datasets_own_files_are_refused_and_left_whole(tmp_path, ds, which):
    directory, shard, _ = ds
    target = {"shard": shard, "index": shard.with_name(shard.name + ".idx"),
              "manifest": directory / "ndp.json"}[which]
    before = target.read_bytes()
    refused(directory, target, f"is an? {which} of the dataset being exported")
    assert target.read_bytes() == before


def test_a_link_to_a_shard_is_refused_symbolic_or_hard(tmp_path, ds):
    directory, shard, data = ds
    (tmp_path / "sym.bin").symlink_to(shard)
    refused(directory, tmp_path / "sym.bin", "through a symbolic link")
    os.link(shard, tmp_path / "hard.bin")
    refused(directory, tmp_path / "hard.bin", "a shard of the dataset")
    os.link(shard, tmp_path / "num_000001.bin")  # a numbered file an export would remove
    refused(directory, tmp_path / "num.bin", "a shard of the dataset", shard_tokens=30,
            named=tmp_path / "num_000001.bin")
    assert shard.read_bytes() == data and (tmp_path / "sym.bin").is_symlink()


def test_a_temporary_name_linked_to_a_shard_is_refused(tmp_path, ds):
    """The atomic write opens ``<name>.tmp`` for writing: a link there would cut the shard."""
    directory, shard, data = ds
    (tmp_path / "out.bin.tmp").symlink_to(shard)
    refused(directory, tmp_path / "out.bin", "a symbolic link, where the export writes",
            named=tmp_path / "out.bin.tmp")
    assert shard.read_bytes() == data


def test_other_files_and_directories_are_refused(tmp_path, ds):
    script = tmp_path / "train.py"
    script.write_text("print('my work')\n")
    refused(ds[0], script, "not an llm.c token file")
    assert script.read_text() == "print('my work')\n"
    (tmp_path / "x_000003.bin").mkdir()  # named like a file of an earlier export
    refused(ds[0], tmp_path / "x.bin", "a directory, not a file an export wrote",
            shard_tokens=30, named=tmp_path / "x_000003.bin")
    (tmp_path / "gone.bin").symlink_to(tmp_path / "nowhere")
    refused(ds[0], tmp_path / "gone.bin", "which does not exist")


def test_an_earlier_export_is_replaced_with_overwrite_only(tmp_path, ds):
    out = tmp_path / "out.bin"
    export_llmc(ds[0], out)
    with pytest.raises(ConfigError, match="earlier export"):
        export_llmc(ds[0], out)
    export_llmc(ds[0], out, overwrite=True, version=2)
    assert read_llmc(out).version == 2
    assert read_llmc(out).tokens.tolist() == np.concatenate([ramp(k, 20) for k in range(5)]
                                                            ).tolist()
