"""What the converter does with an example longer than ``max_tokens`` (``overflow``): by
default (``auto``) a plain-text document is split over consecutive packets (pretraining: no
token is lost) and an SFT example (chat, prompt/completion, alpaca) is truncated; ``truncate``
and ``split`` apply to every record. The manifest, the summary and the round-trip check say
which rule each schema got.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from ndp.cli.main import main
from ndp.convert import MANIFEST, ConvertOptions, convert
from ndp.convert.options import overflow_rule
from ndp.convert.roundtrip import check_roundtrip
from ndp.errors import ConfigError

LONG = "x = 1\n" * 200  # ~400 tokens with the test tokenizer
MAX = 50


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def packet_tokens(out_dir) -> list[list[int]]:
    from ndp.store.corpus import Corpus
    from ndp.wire.packet import decode_packet

    corpus = Corpus(out_dir)
    return [decode_packet(s.data, int(o)).tokens.tolist()
            for s, i in zip(corpus.shards, corpus.indexes) for o in i.offsets]


@pytest.fixture
def mixed(tmp_path):
    """One long pretraining document, then one long prompt/completion example."""
    return write_jsonl(tmp_path / "in.jsonl", [{"text": LONG},
                                              {"prompt": "q: ", "completion": LONG}])


def test_the_default_splits_documents_and_truncates_sft_examples(tmp_path, mixed,
                                                                  tokenizer_dir, hf_tokenizer):
    assert ConvertOptions().overflow == "auto"
    summary = convert([mixed], tmp_path / "out", tokenizer=tokenizer_dir,
                      options=ConvertOptions(max_tokens=MAX, progress=False))
    doc = hf_tokenizer(LONG, add_special_tokens=False)["input_ids"] + [hf_tokenizer.eos_token_id]
    got = packet_tokens(tmp_path / "out")
    parts = -(-len(doc) // MAX)
    assert sum(got[:parts], []) == doc  # the whole document, in consecutive packets
    assert len(got) == parts + 1 and len(got[-1]) == MAX  # the SFT example: cut
    assert (summary.split, summary.truncated, summary.packets) == (1, 1, parts + 1)
    assert summary.overflow == "auto"
    assert "text split, chat/prompt/alpaca truncated" in summary.describe()
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert manifest["overflow"] == "auto"
    assert manifest["overflow_by_schema"] == {"text": "split", "chat": "truncate",
                                              "prompt": "truncate", "alpaca": "truncate"}
    assert check_roundtrip([mixed], tmp_path / "out", tokenizer=tokenizer_dir) == parts + 1
    # the document's later pieces say they continue it (DST bit 7), in the index too; the
    # truncated example is a document of its own
    from ndp.store.corpus import Corpus
    from ndp.wire.format import DST_CONTINUES

    corpus = Corpus(tmp_path / "out")
    dst = np.concatenate([np.asarray(i.entries["dst"]) for i in corpus.indexes])
    assert ((dst & DST_CONTINUES) != 0).tolist() == [False] + [True] * (parts - 1) + [False]
    assert corpus.continued == [parts - 1] and corpus.has_pieces


@pytest.mark.parametrize("rule", ["truncate", "split"])
def test_an_explicit_rule_applies_to_every_record(tmp_path, mixed, tokenizer_dir, rule):
    summary = convert([mixed], tmp_path / "out", tokenizer=tokenizer_dir,
                      options=ConvertOptions(max_tokens=MAX, overflow=rule, progress=False))
    want = (0, 2) if rule == "truncate" else (2, 0)
    assert (summary.split, summary.truncated) == want
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert manifest["overflow"] == rule and set(manifest["overflow_by_schema"].values()) == {rule}
    packets = check_roundtrip([mixed], tmp_path / "out", tokenizer=tokenizer_dir)
    assert packets == summary.packets and (packets == 2) == (rule == "truncate")


def test_overflow_rule_by_schema():
    assert [overflow_rule("auto", s) for s in ("text", "chat", "prompt", "alpaca")] == \
        ["split", "truncate", "truncate", "truncate"]
    assert overflow_rule("truncate", "text") == "truncate"
    assert overflow_rule("split", "chat") == "split"
    with pytest.raises(ConfigError, match="'auto', 'truncate', 'split'"):
        convert([], "unused", tokenizer="unused", options=ConvertOptions(overflow="cut"))


def test_the_truncation_warning_says_what_was_cut_and_what_keeps_it(tmp_path, tokenizer_dir,
                                                                    caplog):
    sft = write_jsonl(tmp_path / "sft.jsonl", [{"prompt": "q: ", "completion": LONG}] * 3)
    with caplog.at_level(logging.WARNING, logger="ndp.convert"):
        convert([sft], tmp_path / "a", tokenizer=tokenizer_dir,
                options=ConvertOptions(max_tokens=MAX, progress=False))
    assert "truncation cut" in caplog.text and "SFT examples" in caplog.text
    assert "--overflow split keeps them" in caplog.text
    caplog.clear()
    text = write_jsonl(tmp_path / "text.jsonl", [{"text": LONG}] * 3)
    with caplog.at_level(logging.WARNING, logger="ndp.convert"):
        convert([text], tmp_path / "b", tokenizer=tokenizer_dir,
                options=ConvertOptions(max_tokens=MAX, overflow="truncate", progress=False))
    assert "truncation cut" in caplog.text and "--overflow auto" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ndp.convert"):
        convert([text], tmp_path / "c", tokenizer=tokenizer_dir,
                options=ConvertOptions(max_tokens=MAX, progress=False))
    assert "truncation cut" not in caplog.text


def test_the_command_line_defaults_to_auto(tmp_path, tokenizer_dir, capsys):
    from ndp.cli.main import build_parser

    convert_help = build_parser()._subparsers._group_actions[0].choices["convert"].format_help()
    assert "{auto,truncate,split}" in convert_help and "plain-text documents" in convert_help
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": LONG}])
    assert main(["convert", str(src), str(tmp_path / "out"), "--tokenizer", tokenizer_dir,
                 "--max-tokens", str(MAX), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "truncated 0" in out and "split 1" in out
    assert np.sum([len(p) for p in packet_tokens(tmp_path / "out")]) > MAX
