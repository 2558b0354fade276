"""Token files in and out: llm.c, llm.q and raw uint16 -> NDP shards -> llm.c.

The files are written here byte by byte from the format descriptions (not with ndp's own
writer), from ramp documents: document ``k`` holds ``k * stride + arange(n)`` plus its EOS/EOT, so
a token in the wrong packet or a shifted cut shows up as a wrong value.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from ndp_test_helpers import ramp, ramp_mask, write_shards

from ndp.cli.main import main
from ndp.convert import MANIFEST
from ndp.convert.export_llmc import export_llmc
from ndp.convert.token_import import convert_token_files
from ndp.convert.tokenfiles import (
    detect_token_format,
    document_bounds,
    read_llmc,
    read_llmq,
    read_raw_u16,
)
from ndp.store.corpus import Corpus
from ndp.engine.reference import decode_padded
from ndp.errors import ConfigError, PacketError, TokenFileError
from ndp.wire.format import Typ, max_tokens_per_packet
from ndp.store.index import build_index
from ndp.wire.packet import encode_tokens
from ndp.store.shard import Shard

EOT = 50256  # GPT-2's <|endoftext|>, llm.c version 1's default
EOS = 7  # no ramp document (k >= 1) holds id 7


# --- writing the formats, independently of ndp ------------------------------------------------
def llmc_bytes(tokens, version: int = 1, *, magic: int = 20240520, count: int | None = None):
    head = np.zeros(256, "<i4")
    head[:3] = (magic, version, len(tokens) if count is None else count)
    dtype = "<u2" if version == 1 else "<u4"
    return head.tobytes() + np.asarray(tokens, dtype).tobytes()


def write_llmc(path, tokens, version: int = 1, **kw):
    path.write_bytes(llmc_bytes(tokens, version, **kw))
    return path


def write_llmq(path, tokens, mask=None, *, version=2, bytes_per_token=4, vocab_size=0,
               count=None, cut=0):
    head = bytearray(1024)
    head[:8] = b"BIN.TOK\n"
    n = len(tokens) if count is None else count
    head[8:28] = np.array([version, bytes_per_token, n, vocab_size, mask is not None],
                          "<i4").tobytes()
    body = np.asarray(tokens, "<i4").tobytes()
    if mask is not None:
        body += np.packbits(np.asarray(mask, bool), bitorder="little").tobytes()
    data = bytes(head) + body
    path.write_bytes(data[: len(data) - cut])
    return path


def write_raw(path, tokens):
    path.write_bytes(np.asarray(tokens, "<u2").tobytes())
    return path


def eot_first(lengths, *, stride=1000, eot=EOT):
    """llm.c documents: EOT, then ramp document k + 1."""
    return [np.concatenate([[eot], ramp(k + 1, n, stride=stride)]) for k, n in enumerate(lengths)]


def eos_last(lengths, *, stride=1000, eos=EOS):
    """llm.q / nanoGPT documents: ramp document k + 1, then EOS."""
    return [np.concatenate([ramp(k + 1, n, stride=stride), [eos]]) for k, n in enumerate(lengths)]


def packets(out_dir):
    """(TYP, tokens, labels) of every packet in ``out_dir``, in corpus order, by the CPU decode."""
    corpus = Corpus(out_dir)
    result = []
    for shard, index in zip(corpus.shards, corpus.indexes):
        batch = decode_padded(shard.data, index.offsets, pad_token_id=0,
                              seq_len=max(1, int(np.asarray(corpus.tokens).max())))
        assert batch.stats.valid == len(index)
        for row, typ in enumerate(index.entries["typ"].tolist()):
            n = int(batch.lengths[row])
            result.append((typ, batch.input_ids[row, :n], batch.labels[row, :n]))
    return result


def assert_packets(out_dir, want_tokens, *, typ, want_labels=None):
    got = packets(out_dir)
    assert [t for t, _, _ in got] == [typ] * len(want_tokens)
    assert [x.tolist() for _, x, _ in got] == [np.asarray(w).tolist() for w in want_tokens]
    labels = want_tokens if want_labels is None else want_labels
    assert [y.tolist() for _, _, y in got] == [np.asarray(w).tolist() for w in labels]


def convert(inputs, out, **kw):
    return convert_token_files(inputs if isinstance(inputs, list) else [inputs], out,
                               progress=False, **kw)


# --- import -----------------------------------------------------------------------------------
def test_llmc_documents_start_at_eot(tmp_path):
    head = ramp(0, 2) + 20  # tokens before the first EOT are a document too
    docs = [head] + eot_first([5, 0, 17, 3])
    src = write_llmc(tmp_path / "train_000001.bin", np.concatenate(docs))
    assert detect_token_format(src) == "llmc"
    summary = convert(src, tmp_path / "out")
    assert_packets(tmp_path / "out", docs, typ=Typ.TOKEN_IDS_U16)
    assert (summary.documents, summary.packets, summary.continued) == (5, 5, 0)
    assert summary.tokens == sum(map(len, docs)) and summary.token_width == 2
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    (info,) = manifest["source"]["files"]
    assert manifest["source"]["formats"] == ["llmc"] and info["version"] == 1
    assert (info["split"], info["eos_token_id"], info["documents"]) == ("before", EOT, 5)
    assert manifest["tokenizer"]["eos_token_id"] == EOT
    assert manifest["shards"][0]["packets"] == 5


@pytest.mark.parametrize("stride, typ", [(1000, Typ.TOKEN_IDS_U16_MASKED),
                                         (100_000, Typ.TOKEN_IDS_MASKED)])
def test_llmq_mask_becomes_the_loss_mask_and_eos_ends_documents(tmp_path, stride, typ):
    docs = eos_last([4, 0, 12, 9], stride=stride) + [ramp(9, 3, stride=stride)]  # tail: no EOS
    tokens = np.concatenate(docs)
    mask = ramp_mask(len(tokens), 1)
    src = write_llmq(tmp_path / "sft.bin", tokens, mask)
    assert detect_token_format(src) == "llmq"
    summary = convert(src, tmp_path / "out", eos_token_id=EOS)
    cuts = np.cumsum([0] + [len(d) for d in docs])
    labels = [np.where(mask, tokens, -100)[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
    assert_packets(tmp_path / "out", docs, typ=typ, want_labels=labels)
    assert summary.masked_packets == summary.packets == 5
    assert summary.files[0]["split"] == "after"


def test_llmq_without_mask_or_eos_is_one_stream(tmp_path):
    tokens = ramp(3, 50)
    src = write_llmq(tmp_path / "a.bin", tokens, vocab_size=4000)
    summary = convert(src, tmp_path / "out")
    assert_packets(tmp_path / "out", [tokens], typ=Typ.TOKEN_IDS_U16)
    assert summary.files[0]["split"] == "none" and summary.masked_packets == 0


def test_raw_u16_is_read_only_when_named(tmp_path):
    docs = eos_last([6, 2, 11])
    src = write_raw(tmp_path / "train.bin", np.concatenate(docs))
    assert detect_token_format(src) is None
    with pytest.raises(TokenFileError, match="raw-u16") as err:
        convert(src, tmp_path / "out")
    assert "train.bin" in str(err.value)
    summary = convert(src, tmp_path / "out", fmt="raw-u16", eos_token_id=EOS)
    assert_packets(tmp_path / "out", docs, typ=Typ.TOKEN_IDS_U16)
    assert summary.documents == 3


def test_split_override_and_none(tmp_path):
    tokens = np.concatenate(eot_first([3, 4, 2]))
    src = write_llmc(tmp_path / "a.bin", tokens)
    convert(src, tmp_path / "after", split="after")
    after = [tokens[:1], tokens[1:5], tokens[5:10], tokens[10:]]  # each EOT ends a document
    assert_packets(tmp_path / "after", after, typ=Typ.TOKEN_IDS_U16)
    convert(src, tmp_path / "none", split="none")
    assert_packets(tmp_path / "none", [tokens], typ=Typ.TOKEN_IDS_U16)
    convert(src, tmp_path / "other", eos_token_id=int(tokens[6]))  # cut at another id
    assert_packets(tmp_path / "other", [tokens[:6], tokens[6:]], typ=Typ.TOKEN_IDS_U16)


def test_document_bounds_concatenate_to_the_input():
    tokens = np.array([EOS, 1, 2, EOS, EOS, 3, EOS])
    assert document_bounds(tokens, EOS, "before").tolist() == [0, 3, 4, 7 - 1, 7]
    assert document_bounds(tokens, EOS, "after").tolist() == [0, 1, 4, 5, 7]
    assert document_bounds(tokens, None, "after").tolist() == [0, 7]
    assert document_bounds(tokens[:0], EOS, "after").tolist() == [0]


def test_long_documents_continue_in_consecutive_packets(tmp_path):
    cap32 = max_tokens_per_packet(Typ.TOKEN_IDS)
    long = np.concatenate([[1 << 20], (1 << 20) + 1 + np.arange(2 * cap32 + 5)])
    docs = [long] + eot_first([4], stride=100_000, eot=1 << 20)
    src = write_llmc(tmp_path / "big.bin", np.concatenate(docs), 2)
    summary = convert(src, tmp_path / "out", eos_token_id=1 << 20)
    want = [long[:cap32], long[cap32: 2 * cap32], long[2 * cap32:], docs[1]]
    assert_packets(tmp_path / "out", want, typ=Typ.TOKEN_IDS)
    assert (summary.documents, summary.packets, summary.continued) == (2, 4, 1)

    cap16m = max_tokens_per_packet(Typ.TOKEN_IDS_U16_MASKED)
    tokens = np.concatenate([np.arange(cap16m + 10), [EOS], ramp(1, 3)])
    mask = ramp_mask(len(tokens), 2)
    write_llmq(tmp_path / "m.bin", tokens, mask)
    convert(tmp_path / "m.bin", tmp_path / "m", eos_token_id=65535)  # an id not in the file
    labels = np.where(mask, tokens, -100)
    assert_packets(tmp_path / "m", [tokens[:cap16m], tokens[cap16m:]],
                   typ=Typ.TOKEN_IDS_U16_MASKED, want_labels=[labels[:cap16m], labels[cap16m:]])


def test_several_inputs_keep_their_order_and_pick_one_width(tmp_path):
    (tmp_path / "in").mkdir()
    a = eot_first([3, 2])
    b = eos_last([4], stride=100_000)  # ids > 65535: every packet becomes int32
    write_llmc(tmp_path / "in" / "a_000000.bin", np.concatenate(a))
    write_llmq(tmp_path / "in" / "b_000001.bin", np.concatenate(b))
    summary = convert(tmp_path / "in", tmp_path / "out", split="after")
    assert summary.token_width == 4 and [f["format"] for f in summary.files] == ["llmc", "llmq"]
    flat = np.concatenate(a)
    want = [flat[:1], flat[1:5], flat[5:]] + b  # EOT 50256 ends llm.c docs; llm.q not cut
    assert_packets(tmp_path / "out", want, typ=Typ.TOKEN_IDS)


def test_output_with_shards_needs_overwrite(tmp_path):
    src = write_llmc(tmp_path / "a.bin", np.concatenate(eot_first([3])))
    convert(src, tmp_path / "out")
    with pytest.raises(ConfigError, match="overwrite"):
        convert(src, tmp_path / "out")
    convert(src, tmp_path / "out", overwrite=True)


# --- export and round trips -------------------------------------------------------------------
@pytest.mark.parametrize("version, stride", [(1, 1000), (2, 100_000)])
def test_llmc_round_trip_is_byte_identical(tmp_path, version, stride):
    tokens = np.concatenate(eot_first([5, 0, 30, 8], stride=stride, eot=EOT))
    src = write_llmc(tmp_path / "train.bin", tokens, version)
    convert(src, tmp_path / "out")
    summary = export_llmc(tmp_path / "out", tmp_path / "back.bin")
    assert summary.version == version and summary.tokens == len(tokens)
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()


def test_version_follows_the_ids_unless_named(tmp_path):
    tokens = np.concatenate(eot_first([6, 3]))
    src = write_llmc(tmp_path / "v2.bin", tokens, 2)  # version 2, but every id fits uint16
    convert(src, tmp_path / "out")
    assert export_llmc(tmp_path / "out", tmp_path / "same.bin", version=2).version == 2
    assert (tmp_path / "same.bin").read_bytes() == src.read_bytes()
    assert export_llmc(tmp_path / "out", tmp_path / "auto.bin").version == 1
    back = read_llmc(tmp_path / "auto.bin")
    assert back.version == 1 and back.tokens.tolist() == tokens.tolist()

    big = write_llmc(tmp_path / "big.bin", [70_000, 1, 2], 2)
    convert(big, tmp_path / "big")
    with pytest.raises(ConfigError, match="version 2"):
        export_llmc(tmp_path / "big", tmp_path / "x.bin", version=1)


def test_llmq_and_raw_round_trip_tokens(tmp_path, caplog):
    tokens = np.concatenate(eos_last([9, 3, 20]))
    write_llmq(tmp_path / "q.bin", tokens, ramp_mask(len(tokens)))
    convert(tmp_path / "q.bin", tmp_path / "q", eos_token_id=EOS)
    with caplog.at_level(logging.WARNING, logger="ndp.convert"):
        summary = export_llmc(tmp_path / "q", tmp_path / "q_back.bin")
    assert summary.masked_packets == summary.packets == 3
    assert len([r for r in caplog.records if "mask" in r.getMessage()]) == 1
    assert read_llmc(tmp_path / "q_back.bin").tokens.tolist() == tokens.tolist()

    write_raw(tmp_path / "r.bin", tokens)
    convert(tmp_path / "r.bin", tmp_path / "r", fmt="raw-u16", eos_token_id=EOS)
    export_llmc(tmp_path / "r", tmp_path / "r_back.bin")
    assert read_llmc(tmp_path / "r_back.bin").tokens.tolist() == tokens.tolist()
    assert (tmp_path / "r_back.bin").read_bytes()[1024:] == (tmp_path / "r.bin").read_bytes()


def test_shard_tokens_splits_into_numbered_files_of_whole_documents(tmp_path):
    tokens = np.concatenate(eot_first([10, 12, 15, 2, 1]))  # documents of 11, 13, 16, 3, 2
    convert(write_llmc(tmp_path / "a.bin", tokens), tmp_path / "out")
    summary = export_llmc(tmp_path / "out", tmp_path / "exp" / "fineweb.bin", shard_tokens=16)
    names = [p.split("/")[-1] for p in summary.files]
    assert names == [f"fineweb_{i:06d}.bin" for i in range(4)]
    parts = [read_llmc(p) for p in summary.files]
    # a file ends where a document does (11 + 13 > 16, so not 16, 16, 8 as tokens would fill)
    assert [p.tokens.shape[0] for p in parts] == [11, 13, 16, 5]
    assert all(p.tokens[0] == EOT for p in parts)  # llm.c documents start at their EOT
    assert np.concatenate([p.tokens for p in parts]).tolist() == tokens.tolist()
    assert (summary.files_cut, summary.oversized_files) == ("documents", 0)
    assert not list((tmp_path / "exp").glob("*.tmp"))


def test_export_refuses_corrupt_packets_naming_shard_and_offset(tmp_path):
    good = [encode_tokens(ramp(k, 5), width=2) for k in range(3)]
    bad = bytearray(good[1])
    bad[8] ^= 0x01  # a payload bit: the CRC no longer matches
    (info,) = write_shards(tmp_path / "d", [good[0], bytes(bad), good[2]])
    at = 32 + len(good[0])
    with pytest.raises(PacketError, match=f"byte {at}.*BAD_CRC") as err:
        export_llmc(tmp_path / "d", tmp_path / "x.bin")
    assert info.path.name in str(err.value)
    assert not (tmp_path / "x.bin").exists()


def test_export_refuses_a_shard_whose_index_skips_damage(tmp_path):
    """A stale index is rebuilt by a scan that steps over the damaged packet: still an error."""
    convert(write_llmc(tmp_path / "a.bin", np.concatenate(eot_first([5, 6, 7]))), tmp_path / "o")
    shard = next((tmp_path / "o").glob("*.ndp"))
    data = bytearray(shard.read_bytes())
    data[60] ^= 0x10
    shard.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="scanning"), pytest.raises(PacketError) as err:
        export_llmc(tmp_path / "o", tmp_path / "x.bin")
    assert shard.name in str(err.value) and "byte " in str(err.value)
    build_index(Shard(shard))  # a fresh index that no longer lists the damaged packet
    # packet 0 is bytes 32..52 (6 uint16 tokens + 8), the damaged packet 1 is bytes 52..74:
    # the manifest's crc32 says the shard changed, and the corpus' scan finds where
    with pytest.warns(UserWarning, match="damaged after it was written"), \
            pytest.raises(PacketError, match="byte 52: 22 bytes skipped") as err:
        export_llmc(tmp_path / "o", tmp_path / "x.bin")
    assert shard.name in str(err.value) and not (tmp_path / "x.bin").exists()
    # named without its manifest, the fresh index is all there is to go by: its gap is found
    with pytest.raises(PacketError, match="bytes 52\\.\\.74 hold no valid packet") as err:
        export_llmc([shard], tmp_path / "x.bin")
    assert shard.name in str(err.value) and not (tmp_path / "x.bin").exists()


# --- malformed inputs -------------------------------------------------------------------------
def _bad_files(tmp_path):
    """case -> (path, format to read it as, words the error must contain)."""
    t = np.concatenate(eot_first([3, 4]))
    q = np.concatenate(eos_last([3, 4]))

    def put(name, data: bytes):
        (tmp_path / name).write_bytes(data)
        return tmp_path / name

    return {
        "wrong magic": (write_llmc(tmp_path / "magic.bin", t, magic=20240521), "llmc",
                        "magic 20240520"),
        "unsupported version": (write_llmc(tmp_path / "v3.bin", t, 3), "auto", "version 3"),
        "truncated llm.c": (write_llmc(tmp_path / "short.bin", t, count=len(t) + 1), "auto",
                            "truncated"),
        "short header": (put("hdr.bin", llmc_bytes(t)[:100]), "auto", "1024-byte"),
        "odd raw": (put("odd.bin", b"\x01\x00\x02"), "raw-u16", "even number"),
        "llm.q bytes_per_token": (write_llmq(tmp_path / "q2.bin", q, bytes_per_token=2), "auto",
                                  "bytes_per_token 4"),
        "llm.q version": (write_llmq(tmp_path / "q1.bin", q, version=1), "auto", "version 2"),
        "llm.q truncated mask": (write_llmq(tmp_path / "qm.bin", q, [1] * len(q), cut=1), "auto",
                                 "mask bytes"),
        "llm.q id >= vocab": (write_llmq(tmp_path / "qv.bin", q, vocab_size=100), "auto",
                              "vocab_size 100"),
        "negative id": (write_llmq(tmp_path / "qn.bin", [1, -5, 2]), "auto", "id -5"),
        "not a token file": (put("t.txt", b"hello"), "auto", "llm.q"),
    }


BAD_CASES = ["wrong magic", "unsupported version", "truncated llm.c", "short header", "odd raw",
             "llm.q bytes_per_token", "llm.q version", "llm.q truncated mask",
             "llm.q id >= vocab", "negative id", "not a token file"]


@pytest.mark.parametrize("case", BAD_CASES)
def test_malformed_inputs_are_named_errors(tmp_path, case):
    path, fmt, words = _bad_files(tmp_path)[case]
    with pytest.raises(TokenFileError, match=words) as err:
        convert(path, tmp_path / "out", fmt=fmt)
    assert str(path) in str(err.value) and "expected" in str(err.value)
    assert err.value.path == str(path)
    assert not (tmp_path / "out").exists()  # every input is checked before anything is written


def test_readers_check_the_header_they_are_asked_for(tmp_path):
    q = write_llmq(tmp_path / "q.bin", [1, 2, 3])
    with pytest.raises(TokenFileError, match="magic"):
        read_llmc(q)
    with pytest.raises(TokenFileError, match="BIN.TOK"):
        read_llmq(write_llmc(tmp_path / "c.bin", [1, 2]))
    assert read_raw_u16(write_raw(tmp_path / "r.bin", [5, 6])).tokens.tolist() == [5, 6]
    empty = read_llmc(write_llmc(tmp_path / "e.bin", []))
    assert empty.tokens.shape == (0,)


# --- command line -----------------------------------------------------------------------------
def test_cli_convert_detects_token_files_and_export_round_trips(tmp_path, capsys):
    src = write_llmc(tmp_path / "train.bin", np.concatenate(eot_first([4, 9, 2])))
    assert main(["convert", str(src), str(tmp_path / "out"), "--no-progress"]) == 0
    assert "documents 3" in capsys.readouterr().out
    assert main(["export", str(tmp_path / "out"), "-o", str(tmp_path / "back.bin"),
                 "--no-progress"]) == 0
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()
    assert main(["export", str(tmp_path / "out"), "-o", str(tmp_path / "s" / "x.bin"),
                 "--version", "2", "--shard-tokens", "13", "--no-progress"]) == 0
    # documents of 5, 10 and 3 tokens: 5 + 10 > 13, 10 + 3 <= 13
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["x_000000.bin", "x_000001.bin"]
    assert read_llmc(tmp_path / "s" / "x_000000.bin").version == 2


def test_cli_raw_u16_with_eos_and_split(tmp_path):
    docs = eos_last([3, 5])
    src = write_raw(tmp_path / "train.bin", np.concatenate(docs))
    assert main(["convert", str(src), str(tmp_path / "out"), "--format", "raw-u16",
                 "--eos-token-id", str(EOS), "--split", "after", "--no-progress"]) == 0
    assert_packets(tmp_path / "out", docs, typ=Typ.TOKEN_IDS_U16)


def test_cli_errors_exit_2_naming_the_file(tmp_path, capsys):
    bad = write_llmc(tmp_path / "cut.bin", [EOT, 1, 2, 3], count=9)
    assert main(["convert", str(bad), str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "truncated" in err
    text = tmp_path / "a.txt"
    text.write_text("hello")
    assert main(["convert", str(text), str(tmp_path / "out2"), "--no-progress"]) == 2
    assert "--tokenizer" in capsys.readouterr().err
    good = write_llmc(tmp_path / "good.bin", [EOT, 1])
    assert main(["convert", str(good), str(text), str(tmp_path / "o3"), "--no-progress"]) == 2
    assert "mix" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "nothing"), "-o", str(tmp_path / "x.bin")]) == 2


def test_export_refuses_to_overwrite_an_earlier_export(tmp_path):
    from ndp_test_helpers import ramp_specs

    write_shards(tmp_path / "ds", [s.encode() for s in ramp_specs([5, 9, 3, 1], width=2)])
    out = tmp_path / "out" / "train.bin"
    export_llmc(tmp_path / "ds", out, shard_tokens=4)  # no EOS known: cut between packets
    names = sorted(p.name for p in out.parent.iterdir())
    assert names == [f"train_{i:06d}.bin" for i in range(3)]  # 5, 9, 3 + 1
    with pytest.raises(ConfigError, match="earlier export"):
        export_llmc(tmp_path / "ds", out, shard_tokens=13)
    export_llmc(tmp_path / "ds", out, shard_tokens=13, overwrite=True)  # 5, then 9 + 3 + 1
    assert sorted(p.name for p in out.parent.iterdir()) == ["train_000000.bin", "train_000001.bin"]
    assert main(["export", str(tmp_path / "ds"), "-o", str(out), "--shard-tokens", "13"]) == 2
