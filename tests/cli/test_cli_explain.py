"""``ndp explain``: the step the Python API explains, from options or from a state the run
saved, as text, JSON or decoded text; bad input exits 2 with a message."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loader"))

import golden  # noqa: E402

import ndp  # noqa: E402
from ndp.cli.main import main  # noqa: E402

KW = dict(mode="packed", batch_size=2, seq_len=16, seed=7, crc_drop_rate=0.1, rank=1,
          world_size=3)
ARGS = ["--mode", "packed", "--batch-size", "2", "--seq-len", "16", "--seed", "7",
        "--crc-drop-rate", "0.1", "--rank", "1", "--world-size", "3"]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    return golden.write_datasets(tmp_path_factory.mktemp("explain-cli"))


def loader(data, **over):
    return ndp.Loader(data, backend="cpu", output="arrays", **(KW | over))


def test_json_is_what_the_loader_explains(datasets, capsys):
    assert main(["explain", str(datasets["main"]), *ARGS, "--step", "9", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    with loader(datasets["main"]) as ld:
        assert got == ld.explain(9).to_dict()


def test_align_bos_from_the_option_and_from_a_state(datasets, tmp_path, capsys):
    """Windows at documents (``align="bos"``): the same as the API's, whether ``--align``
    says so or the state the run saved does."""
    with loader(datasets["main"], align="bos") as ld:
        want = ld.explain(6).to_dict()
        state = ld.state_dict()
    with loader(datasets["main"]) as ld:
        assert want != ld.explain(6).to_dict()  # other windows than unaligned ones
    assert main(["explain", str(datasets["main"]), *ARGS, "--align", "bos", "--step", "6",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == want
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    assert main(["explain", str(datasets["main"]), "--state", str(path), "--step", "6",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == want


def test_text_names_every_piece_and_drop(datasets, capsys):
    with loader(datasets["main"]) as ld:
        steps = [s for s in range(len(ld)) if ld.explain(s).dropped]
        ex = ld.explain(steps[0])
    assert main(["explain", str(datasets["main"]), *ARGS, "--step", str(steps[0])]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"step {steps[0]}: batch {steps[0]} of epoch 0, rank 1 of 3")
    for p in ex.pieces:
        assert f"{p.shard} @ {p.offset:,}" in out
    assert f"dropped: {ex.dropped[0].reason}" in out


def test_a_saved_state_gives_the_settings_and_the_epochs_start(datasets, tmp_path, capsys):
    """A mixed run resumed in its second epoch: the state names the mix, the shapes and the
    step its epoch began at."""
    data = {"main": str(datasets["main"]), "extra": str(datasets["extra"])}
    with loader(data, mix={"main": 0.7, "extra": 0.3}, rank=0, world_size=2) as ld:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            for _ in ld:
                pass
            it = iter(ld)
            next(it)
        state = ld.state_dict()
        want = ld.explain(ld.step + 3).to_dict()
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    argv = ["explain", f"main={data['main']}", f"extra={data['extra']}", "--state", str(path),
            "--step", str(want["step"]), "--json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out) == want


def test_a_tokenizer_prints_each_rows_text(tmp_path, tokenizer_dir, hf_tokenizer, capsys):
    texts = ["the quick brown fox jumps over the lazy dog", "import os\nprint(os.getcwd())",
             "def add(a, b):\n    return a + b"]
    with ndp.ShardWriter(tmp_path / "d") as w:
        for text in texts * 4:
            w.write(ndp.encode_tokens(np.array(hf_tokenizer.encode(text)), width=2))
    assert main(["explain", str(tmp_path / "d"), "--seq-len", "64", "--batch-size", "3",
                 "--step", "1", "--tokenizer", tokenizer_dir, "--no-shuffle"]) == 0
    out = capsys.readouterr().out
    shown = [line for line in out.splitlines() if line.startswith("  text: ")]
    assert len(shown) == 3 and all(eval(line[8:]) in texts for line in shown)


@pytest.mark.parametrize("argv, message", [
    (["--seq-len", "16", "--batch-size", "2", "--step", "100000000"],
     "more than 1,000 epochs"),
    (["--seq-len", "16", "--batch-size", "2", "--step", "100000", "--epoch", "2"],
     "past its end"),
    (["--step", "1"], "--seq-len is needed"),
    (["--seq-len", "16", "--step", "1"], "--batch-size (or --batch-tokens) is needed"),
    (["--seq-len", "16", "--batch-size", "2", "--step", "-1"], "negative"),
    (["--seq-len", "16", "--batch-size", "2", "--step", "1", "--mix", "main"], "NAME=VALUE"),
    (["--seq-len", "16", "--step", "0", "--epoch", "0", "--batch-size", "0"], "batch_size"),
])
def test_bad_input_exits_2_naming_it(datasets, capsys, argv, message):
    assert main(["explain", str(datasets["main"]), *argv]) == 2
    assert message in capsys.readouterr().err
