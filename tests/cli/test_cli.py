"""The ndp command line: convert -> inspect -> verify -> index, and its exit codes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ndp.cli.main import main
from ndp.cli.demo import stdlib_files, train_tokenizer


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    tok = train_tokenizer([p.read_text() for p in stdlib_files(10)], root / "tok", vocab_size=512)
    src = root / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"x{i} = {i}\n" * (i + 1)}) + "\n" for i in range(30)))
    assert main(["convert", str(src), str(root / "out"), "--tokenizer", str(tok),
                 "--max-tokens", "64", "--overflow", "truncate", "--src", "code_repo",
                 "--no-progress"]) == 0
    return root / "out", tok, src


def copy_out(converted, tmp_path) -> Path:
    import shutil

    dst = tmp_path / "out"
    shutil.copytree(converted[0], dst)
    return dst


def test_inspect_json_counts(converted, capsys):
    capsys.readouterr()
    assert main(["inspect", str(converted[0]), "--json"]) == 0
    (report,) = json.loads(capsys.readouterr().out)
    assert report["packets"] == 30 and report["by_src"] == {"CODE_REPO": 30}
    assert report["by_typ"] == {"TOKEN_IDS_U16": 30}
    assert report["index"] == "ok" and report["problems"] == []
    assert sum(report["length_histogram"].values()) == 30
    assert report["tokens"] > 0


def test_inspect_text(converted, capsys):
    assert main(["inspect", str(converted[0])]) == 0
    out = capsys.readouterr().out
    assert "packets 30" in out and "CODE_REPO 30" in out and "tokens per packet" in out


def test_verify_passes_then_fails_with_offset_after_a_flipped_byte(converted, tmp_path, capsys):
    out = copy_out(converted, tmp_path)
    assert main(["verify", str(out)]) == 0
    shard = next(out.glob("*.ndp"))
    data = bytearray(shard.read_bytes())
    data[200] ^= 0x10
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["verify", str(shard)]) == 1
    text = capsys.readouterr().out
    assert "FAIL" in text and "stale" in text and "skipped (BAD_CRC)" in text
    assert main(["index", str(shard)]) == 1  # rebuilt, but reports the corrupt region
    capsys.readouterr()
    assert main(["verify", str(shard)]) == 1  # index now matches; the corrupt packet remains
    text = capsys.readouterr().out
    assert "stale" not in text and "BAD_CRC" in text


def test_verify_flags_missing_and_stale_index_and_index_rebuilds(converted, tmp_path, capsys):
    out = copy_out(converted, tmp_path)
    shard = next(out.glob("*.ndp"))
    Path(str(shard) + ".idx").unlink()
    assert main(["verify", "--require-index", str(shard)]) == 1
    assert main(["index", str(shard)]) == 0
    assert main(["verify", str(shard)]) == 0
    with open(shard, "ab") as f:  # truncated tail: half a packet appended
        f.write(bytes([0xAA, 1, 1, 2, 0, 40, 0, 1]))
    capsys.readouterr()
    assert main(["verify", str(shard)]) == 1
    text = capsys.readouterr().out
    assert "TRUNCATED" in text and "stale" in text


def test_errors_exit_2_with_a_message(converted, tmp_path, capsys):
    _, tok, src = converted
    assert main(["convert", str(src), str(tmp_path / "o"), "--tokenizer",
                 str(tmp_path / "nope"), "--no-progress"]) == 2
    assert "never downloads" in capsys.readouterr().err
    assert main(["verify", str(tmp_path / "empty-dir-does-not-exist")]) == 2


def test_console_script_is_installed():
    script = shutil.which("ndp") or str(Path(sys.executable).with_name("ndp"))
    result = subprocess.run([script, "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "convert" in result.stdout and "verify" in result.stdout


def test_verify_passes_a_valid_shard_without_an_index_and_says_so(tmp_path, capsys):
    """A headerless stream of good packets with no .idx is a valid shard: verify checks its
    packets by a framing scan and passes, saying no index was found; --require-index fails it."""
    from ndp.wire.packet import encode_tokens

    shard = tmp_path / "plain.ndp"
    shard.write_bytes(b"".join(encode_tokens(k * 1000 + np.arange(k + 1)) for k in range(20)))
    capsys.readouterr()
    assert main(["verify", str(shard)]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "20 packets" in out and "no index" in out and "ndp index" in out
    assert main(["verify", "--require-index", str(shard)]) == 1
    assert "index: missing" in capsys.readouterr().out
    shard.write_bytes(shard.read_bytes()[:-3])  # damage is still found without an index
    assert main(["verify", str(shard)]) == 1


def test_the_command_line_shows_ndp_logs_without_turning_on_other_libraries_logs(converted):
    """main() once set the root logger to INFO, so a notebook that called it printed Numba's
    CUDA driver messages ('INFO numba.cuda.cudadrv.driver: init') from then on."""
    import logging

    root_level = logging.getLogger().level
    assert main(["verify", str(converted[0])]) == 0
    assert logging.getLogger().level == root_level
    assert logging.getLogger("ndp").getEffectiveLevel() == logging.INFO
    if root_level > logging.INFO:
        assert not logging.getLogger("numba.cuda.cudadrv.driver").isEnabledFor(logging.INFO)


def test_verify_fails_an_index_with_a_flipped_length(converted, tmp_path, capsys):
    """The index's size and crc32 still match the shard; its entry does not match the packet."""
    from ndp.store.index import read_index, write_index

    out = copy_out(converted, tmp_path)
    idx = next(out.glob("*.idx"))
    index = read_index(idx)
    entries = index.entries.copy()
    entries["length"][2] ^= 0x0002
    write_index(idx, entries, index.shard_size, index.shard_crc32, index.data_offset)
    capsys.readouterr()
    assert main(["verify", str(out)]) == 1
    assert "disagrees with the packet header" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["index", "{tmp}/nosuchdir"], "no such shard or directory"),
    (["inspect", "{tmp}/nosuchdir"], "no such shard or directory"),
    (["verify", "{tmp}/nosuchdir"], "no such shard or directory"),
    (["index", "{tmp}"], "no *.ndp shards"),
    (["export", "{out}", "-o", "{tmp}", "--overwrite"], "is a directory"),
    (["export", "{out}", "-o", "{tmp}/a-file/train.bin"], "check the path"),
])
def test_a_users_mistake_is_one_error_line_exit_2_and_nothing_left_behind(
        converted, tmp_path, capsys, argv, message):
    (tmp_path / "a-file").write_text("not a directory")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    capsys.readouterr()
    argv = [a.format(tmp=tmp_path, out=converted[0]) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no .tmp, nothing new


def test_verify_fails_an_unreadable_index_and_goes_on(converted, tmp_path, capsys):
    out = copy_out(converted, tmp_path)
    idx = next(out.glob("*.idx"))
    idx.unlink()
    idx.mkdir()  # reading it fails with an OSError (as an unreadable file does for a user)
    capsys.readouterr()
    assert main(["verify", str(out)]) == 1
    text = capsys.readouterr().out
    assert "FAIL" in text and "index: unreadable" in text


def test_version_and_help_show_defaults_and_allowed_values(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("ndp ")
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("tokens per example, EOS included (default: 2048)",
                  "records per tokenizer call (default: 512)", "(default: 256)",
                  "SRC byte: text_corpus, code_repo, gradient; the Loader can mix datasets "
                  "by it (mix_by='src')", "(default: text_corpus)",
                  "DST byte: embedding, attention, ffn, lora; recorded for your own tools, "
                  "ndp's loaders do not use it"):
        assert shown in text
    assert "(default: None)" not in text and "(default: False)" not in text


@pytest.mark.parametrize("command", ["", "convert", "export", "index", "inspect", "verify",
                                     "demo"])
def test_help_is_plain_text_without_docstring_markup(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"] if command else ["--help"])
    text = capsys.readouterr().out
    for markup in ("``", ":func:", ":class:", ":meth:", ".. "):
        assert markup not in text, (command, markup)


def test_verify_index_and_export_speak_json(converted, tmp_path, capsys):
    out = copy_out(converted, tmp_path)
    capsys.readouterr()
    assert main(["verify", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["failed"] == 0 and report["passed"] == len(report["checked"]) >= 2
    assert [c["kind"] for c in report["checked"]][0] == "manifest"
    shard = next(out.glob("*.ndp"))
    data = bytearray(shard.read_bytes())
    data[200] ^= 0x10
    shard.write_bytes(bytes(data))
    assert main(["verify", str(out), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    bad = [c for c in report["checked"] if not c["ok"]]
    assert report["failed"] == len(bad) >= 1 and any("crc32" in p for c in bad
                                                     for p in c["problems"])
    assert main(["index", str(shard), "--json"]) == 1
    (entry,) = json.loads(capsys.readouterr().out)["shards"]
    assert entry["path"] == str(shard) and entry["corrupt"]
    assert main(["export", str(converted[0]), "-o", str(tmp_path / "x.bin"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["files"] == [str(tmp_path / "x.bin")] and summary["tokens"] > 0


@pytest.mark.parametrize("command", ["inspect", "verify", "index", "export", "convert"])
@pytest.mark.parametrize("where", ["missing", "empty"])
def test_every_subcommand_answers_a_missing_or_empty_path_with_exit_2(tmp_path, capsys,
                                                                      command, where):
    path = tmp_path / "data"
    if where == "empty":
        path.mkdir()
    argv = {"export": ["export", str(path), "-o", str(tmp_path / "x.bin")],
            "convert": ["convert", str(path), str(tmp_path / "out"), "--tokenizer", "t"]}
    assert main(argv.get(command, [command, str(path)])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and str(path) in err
    if where == "empty" and command != "convert":
        assert "no *.ndp shards" in err


@pytest.mark.parametrize("name", ["cut.jsonl.gz", "cut.parquet", "empty.parquet", "rows.csv"])
def test_convert_answers_a_damaged_input_with_one_message_naming_it(converted, tmp_path,
                                                                     capsys, name):
    """A cut compressed stream, a Parquet file without its footer or with no bytes, a CSV row
    with a field too many: one message naming the file, never a traceback from inside
    datasets, pandas or pyarrow, and nothing written."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    _, tok, src = converted
    bad = tmp_path / name
    if name.endswith(".gz"):
        whole = gzip.compress(src.read_bytes() * 50)
        bad.write_bytes(whole[: len(whole) // 2])
    elif name.endswith(".parquet"):
        pq.write_table(pa.table({"text": [f"x = {i}" for i in range(100)]}), bad)
        bad.write_bytes(bad.read_bytes()[:-100] if name.startswith("cut") else b"")
    else:
        bad.write_text("text,id\nx = 1,1\nx = 2,2,oops\n")
    capsys.readouterr()
    code = main(["convert", str(bad), str(tmp_path / "out"), "--tokenizer", str(tok),
                 "--no-progress"])
    err = capsys.readouterr().err
    assert code in (1, 2) and "Traceback" not in err and f"{bad}: " in err
    assert "leave it out of the inputs" in err or "leave the file out of the inputs" in err
    assert not (tmp_path / "out").exists()


def test_convert_skips_and_counts_a_cut_line_and_an_absurdly_nested_one(converted, tmp_path,
                                                                        capsys, caplog):
    _, tok, src = converted
    lines = src.read_text().splitlines()
    lines[3:3] = ['{"text": ', "[" * 100_000]
    bad = tmp_path / "damaged.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(["convert", str(bad), str(tmp_path / "out"), "--tokenizer", str(tok),
                 "--no-progress", "--max-skipped", "0.1"]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert f"{bad}:4: bad JSON" in caplog.text and f"{bad}:5: JSON nested" in caplog.text
    assert "30 examples" in captured.out or "examples 30" in captured.out


def test_a_fifo_named_like_a_shard_is_refused_not_waited_on(converted, tmp_path):
    """Opening a FIFO for reading blocks until a writer comes: each command must refuse it
    (exit 2, naming it) before it opens anything. Run in a subprocess with a timeout, so a
    regression fails here instead of hanging the suite."""
    import os

    out = copy_out(converted, tmp_path)
    fifo = out / "zz-fifo.ndp"
    os.mkfifo(fifo)
    for argv in (["verify", str(out)], ["inspect", str(out)], ["index", str(out)],
                 ["verify", str(fifo)]):
        result = subprocess.run([sys.executable, "-m", "ndp.cli", *argv], capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 2, (argv, result.stdout, result.stderr)
        assert str(fifo) in result.stderr and "a FIFO, not a regular file" in result.stderr


def test_a_reader_that_leaves_early_is_not_an_error(tmp_path):
    """``ndp inspect ... | head``: the pipe closed before ndp wrote, so its writes fail with
    EPIPE. That is the reader's choice, not a path to check: no message, the status of a
    command killed by SIGPIPE (141), as before it said 'Broken pipe (check the path and its
    permissions)' and exited 2."""
    from ndp.store.writer import ShardWriter
    from ndp.wire.packet import encode_tokens

    with ShardWriter(tmp_path) as writer:
        for k in range(20):
            writer.write(encode_tokens(np.arange(k, k + 9)))
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from ndp.cli.main import main; "
         "sys.exit(main(sys.argv[1:]))", "inspect", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # long before the child has imported ndp and written a line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Broken pipe" not in err and "Traceback" not in err


def test_json_output_says_an_error_as_json(tmp_path, capsys):
    """A script that reads ``--json`` from stdout gets a JSON object for an error too (before:
    nothing on stdout), a usage error included; the message stays on stderr as well."""
    assert main(["verify", "--json", str(tmp_path / "nothing")]) == 2
    out, err = capsys.readouterr()
    got = json.loads(out)
    assert got["exit"] == 2 and "nothing: no such shard or directory" in got["error"]
    assert "no such shard" in err
    with pytest.raises(SystemExit) as exc:
        main(["verify", "--json"])
    assert exc.value.code == 2
    got = json.loads(capsys.readouterr().out)
    assert got == {"error": "usage: the following arguments are required: shards", "exit": 2}
    assert main(["verify", str(tmp_path / "nothing")]) == 2  # without --json: stderr alone
    assert capsys.readouterr().out == ""
