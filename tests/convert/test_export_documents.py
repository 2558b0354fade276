"""``ndp export`` then ``ndp convert`` of its llm.c file brings the dataset's documents back: the
export records the document rule (the EOS id and where documents are cut) in header words llm.c
leaves at 0, and the import uses it unless ``--eos-id`` / ``--split`` say otherwise."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ndp.cli.main import main
from ndp.convert import ConvertOptions, convert
from ndp.convert.export_llmc import export_llmc
from ndp.convert.token_import import convert_token_files
from ndp.convert.tokenfiles import LLMC_HEADER_WORDS, read_llmc
from ndp.store.corpus import Corpus
from ndp.errors import TokenFileError
from ndp.wire.packet import decode_packet

#: the last documents are longer than the packets the text conversion writes (--max-tokens 40)
TEXTS = [f"def f{k}(x):\n    return x * {k}\n" * (1 + k % 4) for k in range(30)] + \
        ["x = 1\n" * 60, "y = 2\n" * 45]


def packet_tokens(out_dir) -> list[list[int]]:
    corpus = Corpus(out_dir)
    return [decode_packet(s.data, int(o)).tokens.tolist()
            for s, i in zip(corpus.shards, corpus.indexes) for o in i.offsets]


@pytest.fixture
def dataset(tmp_path, tokenizer_dir, hf_tokenizer):
    """A text dataset, and its documents as the tokenizer makes them (EOS appended)."""
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    convert([src], tmp_path / "ds", tokenizer=tokenizer_dir,
            options=ConvertOptions(max_tokens=40, progress=False))
    eos = hf_tokenizer.eos_token_id
    docs = [hf_tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in TEXTS]
    assert len(packet_tokens(tmp_path / "ds")) > len(docs)  # some documents span packets
    return tmp_path / "ds", docs, eos


def test_export_then_convert_gives_the_documents_back(tmp_path, dataset):
    ds, docs, eos = dataset
    summary = export_llmc(ds, tmp_path / "train.bin")
    assert (summary.eos_token_id, summary.split, summary.recorded) == (eos, "after", True)
    assert f"end with EOS id {eos}" in summary.describe()
    back = read_llmc(tmp_path / "train.bin")
    assert (back.eos_token_id, back.split) == (eos, "after")
    assert back.tokens.tolist() == sum(docs, [])
    imported = convert_token_files([tmp_path / "train.bin"], tmp_path / "back", progress=False)
    assert imported.documents == len(docs)
    assert packet_tokens(tmp_path / "back") == docs  # token for token, document for document
    (info,) = imported.files
    assert (info["eos_token_id"], info["split"], info["rule_from"]) == (eos, "after", "header")


def test_explicit_eos_and_split_win_over_the_header(tmp_path, dataset):
    ds, docs, eos = dataset
    export_llmc(ds, tmp_path / "train.bin")
    one = convert_token_files([tmp_path / "train.bin"], tmp_path / "none", split="none",
                              progress=False)
    assert one.documents == 1 and one.files[0]["rule_from"] == "option"
    before = convert_token_files([tmp_path / "train.bin"], tmp_path / "before", split="before",
                                 progress=False)
    assert before.documents == len(docs) + 1  # the tokens before the first EOS, then each EOS on
    assert packet_tokens(tmp_path / "before")[1][0] == eos
    other = convert_token_files([tmp_path / "train.bin"], tmp_path / "other", eos_token_id=70000,
                                progress=False)
    assert other.documents == 1 and other.files[0]["split"] == "after"


def test_the_cli_round_trip_and_the_export_summary(tmp_path, dataset, capsys):
    ds, docs, eos = dataset
    assert main(["export", str(ds), "-o", str(tmp_path / "x.bin"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"end with EOS id {eos}" in out
    assert main(["export", str(ds), "-o", str(tmp_path / "j.bin"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["eos_token_id"], report["split"], report["recorded"]) == (eos, "after", True)
    assert main(["convert", str(tmp_path / "x.bin"), str(tmp_path / "back"), "--no-progress"]) == 0
    assert f"documents {len(docs)}" in capsys.readouterr().out
    assert packet_tokens(tmp_path / "back") == docs


def test_a_plain_llmc_header_is_not_read_as_ndp_and_a_damaged_record_is_an_error(tmp_path):
    head = np.zeros(LLMC_HEADER_WORDS, "<i4")
    head[:3] = (20240520, 1, 4)
    head[-2:] = (3, 1)  # not ndp's: the mark word is 0
    (tmp_path / "plain.bin").write_bytes(head.tobytes() + np.array([50256, 1, 50256, 2],
                                                                   "<u2").tobytes())
    plain = read_llmc(tmp_path / "plain.bin")
    assert plain.split is None and plain.eos_token_id is None
    summary = convert_token_files([tmp_path / "plain.bin"], tmp_path / "o", progress=False)
    assert summary.documents == 2  # GPT-2's EOT, documents starting at it

    export_llmc(tmp_path / "o", tmp_path / "again.bin")
    words = np.frombuffer((tmp_path / "again.bin").read_bytes()[:1024], "<i4").copy()
    assert not words[3:].any()  # the format's own default: the header stays llm.c's
    words[-1] = 9  # ndp's mark would be here; a split code that does not exist
    words[-3] = np.frombuffer(b"NDP1", "<i4")[0]
    damaged = tmp_path / "damaged.bin"
    damaged.write_bytes(words.tobytes() + (tmp_path / "again.bin").read_bytes()[1024:])
    with pytest.raises(TokenFileError, match="split code"):
        read_llmc(damaged)


def test_shards_named_without_their_manifest_record_no_rule(tmp_path, dataset):
    ds, _, _ = dataset
    summary = export_llmc(sorted(ds.glob("*.ndp")), tmp_path / "x.bin")
    assert summary.recorded is False and summary.split is None
    assert "not recorded" in summary.describe()
    assert not np.frombuffer((tmp_path / "x.bin").read_bytes()[:1024], "<i4")[3:].any()


FULL_DISK = """
    import resource, signal, sys
    import ndp.convert.export_llmc
    from ndp.cli.main import main
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (1500, 1500))  # the header and a few tokens fit
    sys.exit(main(["export", sys.argv[1], "-o", sys.argv[2], "--no-progress"]))
"""


def test_an_export_onto_a_full_disk_fails_by_name_and_leaves_no_temporary_file(tmp_path,
                                                                              dataset):
    """A file-size limit stands in for a full disk: a write fails with an OSError part way
    through a file; the command says so without a traceback, and no ``.tmp`` is left (closing
    the half-written file raised too, and the removal was skipped)."""
    import subprocess
    import sys
    import textwrap

    out = tmp_path / "llmc"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(FULL_DISK), str(dataset[0]),
                           str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "File too large" in proc.stderr or "No space" in proc.stderr, proc.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("llmc")) == []


#: the id documents end with in ``ramp_documents``: above every ramp token
RAMP_EOS = 65000


def ramp_documents(n_docs: int = 1001, seed: int = 14) -> list[np.ndarray]:
    """Ramp documents (token i == position i of the stream, uint16) of 1-80 tokens and a few
    of 700-1,300, each ending with ``RAMP_EOS`` in place of its last position."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 80, n_docs)
    lengths[[10, 500, 990]] = (700, 1300, 1001)  # longer than the files asked for below
    ends = np.cumsum(lengths)
    stream = np.arange(int(ends[-1]), dtype=np.int64)
    stream[ends - 1] = RAMP_EOS
    assert ends[-1] < RAMP_EOS
    return np.split(stream, ends[:-1])


def test_files_of_shard_tokens_hold_whole_documents_so_the_round_trip_gives_them_back(
        tmp_path, capsys):
    """Issue 39, finding 14: an export cut every --shard-tokens tokens, so converting its files
    back gave 1,004 documents for 1,001 (a document cut at each file boundary)."""
    docs = ramp_documents()
    src = tmp_path / "in.bin"
    head = np.zeros(LLMC_HEADER_WORDS, "<i4")
    head[:3] = (20240520, 1, sum(map(len, docs)))
    src.write_bytes(head.tobytes() + np.concatenate(docs).astype("<u2").tobytes())
    convert_token_files([src], tmp_path / "ds", eos_token_id=RAMP_EOS, split="after",
                        max_shard_bytes=70_000, progress=False)  # 2 shards: a boundary too
    assert len(list((tmp_path / "ds").glob("*.ndp"))) == 2

    summary = export_llmc(tmp_path / "ds", tmp_path / "out" / "x.bin", shard_tokens=500)
    files = [read_llmc(p) for p in summary.files]
    assert np.concatenate([f.tokens for f in files]).tolist() == np.concatenate(docs).tolist()
    assert all(f.tokens[-1] == RAMP_EOS for f in files)  # each file ends where a document does
    over = [f.tokens.shape[0] for f in files if f.tokens.shape[0] > 500]
    assert sorted(over) == [700, 1001, 1300] and summary.oversized_files == 3  # alone, whole
    assert "each holds whole documents; 3 file(s) hold more tokens" in summary.describe()
    back = convert_token_files(summary.files, tmp_path / "back", progress=False)
    assert back.documents == len(docs) == 1001
    assert packet_tokens(tmp_path / "back") == [d.tolist() for d in docs]

    assert main(["export", str(tmp_path / "ds"), "-o", str(tmp_path / "cli" / "y.bin"),
                 "--shard-tokens", "500", "--no-progress"]) == 0
    capsys.readouterr()
    names = sorted(str(p) for p in (tmp_path / "cli").glob("y_*.bin"))
    assert main(["convert", *names, str(tmp_path / "back2"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["documents"] == 1001
