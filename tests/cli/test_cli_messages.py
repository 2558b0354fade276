"""What the command line says: errors name its options (not the Python API's parameters), a
missing tokenizer directory is named as one, ``convert --json``, ``inspect`` of a file that is
not a shard, and a progress bar cleared before an error."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ndp.cli.main import main
from ndp.convert import ConvertOptions, convert
from ndp.cli.demo import stdlib_files, train_tokenizer
from ndp.errors import ConfigError

#: every Python API parameter the convert / export options stand for
API_NAMES = ("max_shard_bytes", "max_skipped", "batch_size", "shard_tokens", "overwrite=",
             "token_width", "eos_token_id", "max_tokens", "version=")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    return str(train_tokenizer([p.read_text() for p in stdlib_files(10)], root, vocab_size=512))


@pytest.fixture
def jsonl(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": f"x{i} = {i}\n" * 3}) + "\n" for i in range(20)))
    return src


def error_of(capsys, argv, status=2) -> str:
    capsys.readouterr()
    assert main(argv) == status
    err = capsys.readouterr().err
    assert not any(name in err for name in API_NAMES), err
    return err


# --- a missing tokenizer directory ------------------------------------------------------------
@pytest.mark.parametrize("name", ["./missing", "missing/tok/dir", "~/ndp-no-such-tokenizer",
                                  "ABSOLUTE", "FILE"])
def test_a_path_that_is_no_directory_is_named(tmp_path, jsonl, capsys, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("not a tokenizer")
    name = {"ABSOLUTE": str(tmp_path / "nope"), "FILE": "a-file"}.get(name, name)
    err = error_of(capsys, ["convert", str(jsonl), str(tmp_path / "o"), "--tokenizer", name,
                            "--no-progress"])
    assert "no such tokenizer directory: " in err and "Repo id" not in err
    assert name in err and "never downloads" in err


def test_a_name_is_still_looked_up_in_the_cache(tmp_path, jsonl, capsys):
    err = error_of(capsys, ["convert", str(jsonl), str(tmp_path / "o"), "--tokenizer",
                            "no-such-org/no-such-model", "--no-progress"])
    assert "no such tokenizer directory" not in err and "never downloads" in err


# --- errors name the options ------------------------------------------------------------------
def test_convert_errors_name_the_options(tmp_path, jsonl, tok, capsys):
    base = ["convert", str(jsonl), str(tmp_path / "o"), "--tokenizer", tok, "--no-progress"]
    assert "--shard-size-mb" in error_of(capsys, base + ["--shard-size-mb", "0.01"])
    assert "--max-skipped" in error_of(capsys, base + ["--max-skipped", "5"])
    assert "--batch-size" in error_of(capsys, base + ["--batch-size", "0"])
    assert "--max-tokens" in error_of(capsys, base + ["--max-tokens", "40000"])
    assert main(base) == 0
    assert "--overwrite" in error_of(capsys, base)


def test_token_file_and_export_errors_name_the_options(tmp_path, capsys):
    from ndp.convert.tokenfiles import LLMC_HEADER_WORDS

    head = np.zeros(LLMC_HEADER_WORDS, "<i4")
    head[:3] = (20240520, 2, 3)
    (tmp_path / "t.bin").write_bytes(head.tobytes() + np.array([70_000, 1, 2], "<u4").tobytes())
    base = ["convert", str(tmp_path / "t.bin"), str(tmp_path / "ds"), "--no-progress"]
    assert "--shard-size-mb" in error_of(capsys, base + ["--shard-size-mb", "0.01"])
    assert main(base) == 0
    export = ["export", str(tmp_path / "ds"), "-o", str(tmp_path / "x.bin"), "--no-progress"]
    assert "--version 2" in error_of(capsys, export + ["--version", "1"])
    assert "--shard-tokens" in error_of(capsys, export + ["--shard-tokens", "0"])
    assert main(export) == 0
    assert "--overwrite" in error_of(capsys, export)


def test_the_python_api_still_names_its_parameters(tmp_path, jsonl, tok):
    from ndp.cli.main import cli_message

    with pytest.raises(ConfigError, match="`max_skipped` is a share") as info:
        convert([jsonl], tmp_path / "o", tokenizer=tok,
                options=ConvertOptions(max_skipped=5, progress=False))
    assert cli_message(info.value).startswith("--max-skipped is a share")
    err = ConfigError("pass `overwrite=True`, `version=2`, `overflow='split'` or `cache_limit`")
    assert cli_message(err) == "pass --overwrite, --version 2, --overflow split or `cache_limit`"


# --- convert --json ---------------------------------------------------------------------------
def test_convert_json_prints_the_summary_and_no_bar(tmp_path, jsonl, tok, capsys):
    capsys.readouterr()
    assert main(["convert", str(jsonl), str(tmp_path / "o"), "--tokenizer", tok, "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["examples"] == 20 and summary["overflow"] == "auto"
    assert len(summary["shards"]) == 1 and "convert:" not in captured.err
    assert main(["export", str(tmp_path / "o"), "-o", str(tmp_path / "x.bin"), "--json"]) == 0
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "x.bin"), str(tmp_path / "b"), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["documents"] == 20 and "convert:" not in captured.err


# --- inspect of a file that is not a shard ----------------------------------------------------
def test_inspect_of_a_file_that_is_no_shard_fails(jsonl, capsys):
    capsys.readouterr()
    assert main(["inspect", str(jsonl)]) == 1
    assert "holds no valid packet" in capsys.readouterr().out
    assert main(["inspect", str(jsonl), "--json"]) == 1
    (report,) = json.loads(capsys.readouterr().out)
    assert any("holds no valid packet" in p for p in report["problems"])
    assert main(["verify", str(jsonl)]) == 1
    assert "holds no valid packet" in capsys.readouterr().out


# --- the progress bar and an error ------------------------------------------------------------
@pytest.mark.parametrize("case", ["before the records", "output taken", "while converting"])
def test_a_failing_command_clears_its_bar_before_the_error(tmp_path, jsonl, tok, case):
    argv = ["convert", str(jsonl), str(tmp_path / "o"), "--tokenizer", tok]
    if case == "before the records":
        argv += ["--shard-size-mb", "0.01"]
    elif case == "output taken":
        assert main(argv + ["--no-progress"]) == 0
    else:  # a bad record deep in the file stops a --strict run
        with open(jsonl, "a") as f:
            f.write("".join(json.dumps({"text": "y = 2\n" * 50}) + "\n" for _ in range(3000)))
            f.write("{not json\n")
        argv += ["--strict"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-m", "ndp.cli", *argv], capture_output=True,
                            env=env, timeout=300)
    assert result.returncode == 2
    screen = terminal(result.stderr.decode())
    assert screen[-1].startswith("ndp convert: error: "), screen[-3:]
    assert not any("%|" in line for line in screen), screen[-3:]  # no bar left standing


def terminal(text: str) -> list[str]:
    """The lines ``text`` leaves on a terminal: ``\r`` returns to the line's start, and what
    follows overwrites what was there."""
    lines = []
    for line in text.rstrip("\n").split("\n"):
        shown = ""
        for part in line.split("\r"):
            shown = part + shown[len(part):]
        lines.append(shown.rstrip())
    return lines
