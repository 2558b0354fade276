"""The converter end to end on a real (small, locally trained) tokenizer."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ndp.convert import MANIFEST, ConvertOptions, convert
from ndp.convert.roundtrip import check_roundtrip
from ndp.engine.reference import decode_padded
from ndp.errors import ConfigError, RecordError, TokenizerError
from ndp.wire.format import IGNORE_INDEX, Src, Typ
from ndp.store.index import load_index
from ndp.wire.packet import decode_packet
from ndp.store.shard import Shard


def write_jsonl(path, records: list):
    """Write records (dicts, or raw strings written as-is) one per line."""
    with open(path, "w") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


TEXTS = ["def f(x):\n    return x + 1\n", "import os\nprint(os.getcwd())\n", "class A:\n    pass\n"]


def packets(out_dir):
    """Every packet of every shard in ``out_dir``, in order."""
    manifest = json.loads((out_dir / MANIFEST).read_text())
    result = []
    for entry in manifest["shards"]:
        shard = Shard(out_dir / entry["name"])
        for off in load_index(shard, on_stale="error").offsets:
            result.append(decode_packet(shard.data, int(off)))
    return result


def opts(**kw):
    return ConvertOptions(progress=False, **kw)


def test_text_records_round_trip(tmp_path, tokenizer_dir, hf_tokenizer):
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in TEXTS])
    summary = convert([src], tmp_path / "out", tokenizer=tokenizer_dir,
                      options=opts(src=Src.CODE_REPO))
    got = packets(tmp_path / "out")
    eos = hf_tokenizer.eos_token_id
    for text, packet in zip(TEXTS, got, strict=True):
        want = hf_tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
        assert packet.tokens.tolist() == want
        assert packet.src == Src.CODE_REPO and packet.typ == Typ.TOKEN_IDS_U16
        assert packet.mask is None
    assert summary.examples == 3 and summary.skipped == {}
    assert summary.tokens == sum(p.tokens.size for p in got)
    assert check_roundtrip([src], tmp_path / "out", tokenizer=tokenizer_dir) == 3


def test_prompt_completion_masks_prompt_tokens(tmp_path, tokenizer_dir, hf_tokenizer):
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "Question: what is x?\n",
                                               "completion": "Answer: x is one."}])
    convert([src], tmp_path / "out", tokenizer=tokenizer_dir, options=opts())
    (packet,) = packets(tmp_path / "out")
    assert packet.typ == Typ.TOKEN_IDS_U16_MASKED
    labels = packet.labels()
    kept = hf_tokenizer.decode([t for t in labels.tolist() if t != IGNORE_INDEX])
    assert "Answer: x is one." in kept and "Question" not in kept
    assert labels[-1] == hf_tokenizer.eos_token_id  # EOS is a target
    assert check_roundtrip([src], tmp_path / "out", tokenizer=tokenizer_dir) == 1


@pytest.mark.parametrize("straddle", ["prompt", "answer"])
def test_a_token_across_the_prompt_answer_boundary_goes_where_straddle_says(
        tmp_path, tokenizer_dir, hf_tokenizer, straddle):
    """The prompt ends mid-word ("impor" + "t os"): the tokenizer's token over the boundary
    starts in the prompt, so it is masked by default and a target with ``straddle="answer"``;
    counted either way, and the manifest records the rule."""
    prompt, completion = "x = 1\nimpor", "t os\nprint(os.getcwd())\n"
    enc = hf_tokenizer(prompt + completion, add_special_tokens=False,
                       return_offsets_mapping=True)
    across = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < len(prompt) < b]
    assert len(across) == 1  # the data has the case it tests
    src = write_jsonl(tmp_path / "in.jsonl", [{"prompt": prompt, "completion": completion}])
    summary = convert([src], tmp_path / "out", tokenizer=tokenizer_dir,
                      options=opts(straddle=straddle))
    (packet,) = packets(tmp_path / "out")
    assert packet.tokens[:-1].tolist() == enc["input_ids"]
    labels = packet.labels()
    assert (labels[across[0]] != IGNORE_INDEX) == (straddle == "answer")
    assert (labels[:across[0]] == IGNORE_INDEX).all()  # the prompt before it: masked
    assert (labels[across[0] + 1:] != IGNORE_INDEX).all()  # the answer after it: trained
    assert summary.straddled == 1
    manifest = json.loads((tmp_path / "out" / MANIFEST).read_text())
    assert manifest["straddle"] == straddle and manifest["summary"]["straddled"] == 1


def test_straddle_must_be_prompt_or_answer(tmp_path, tokenizer_dir):
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "x"}])
    with pytest.raises(ConfigError, match="straddle"):
        convert([src], tmp_path / "out", tokenizer=tokenizer_dir, options=opts(straddle="both"))


def test_chat_records_train_on_assistant_turns(tmp_path, tokenizer_dir, hf_tokenizer):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a loop."},
            {"role": "assistant", "content": "for i in range(3): pass"}]
    src = write_jsonl(tmp_path / "in.jsonl", [{"messages": msgs}])
    convert([src], tmp_path / "out", tokenizer=tokenizer_dir, options=opts())
    (packet,) = packets(tmp_path / "out")
    kept = hf_tokenizer.decode([t for t in packet.labels().tolist() if t != IGNORE_INDEX])
    assert "for i in range(3): pass" in kept
    assert "Name a loop" not in kept and "Be brief" not in kept
    assert check_roundtrip([src], tmp_path / "out", tokenizer=tokenizer_dir) == 1


def test_parquet_and_text_inputs(tmp_path, tokenizer_dir):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": TEXTS}), tmp_path / "in.parquet")
    (tmp_path / "a.py").write_text(TEXTS[0])
    (tmp_path / "lines.txt").write_text("one line\n\nsecond line\n")
    convert([tmp_path / "in.parquet", tmp_path / "a.py"], tmp_path / "o1",
            tokenizer=tokenizer_dir, options=opts())
    assert len(packets(tmp_path / "o1")) == 4
    assert check_roundtrip([tmp_path / "in.parquet", tmp_path / "a.py"], tmp_path / "o1",
                           tokenizer=tokenizer_dir) == 4
    s = convert([tmp_path / "lines.txt"], tmp_path / "o2", tokenizer=tokenizer_dir,
                options=opts(text_unit="line"))
    assert s.examples == 2


def test_bad_records_are_skipped_and_counted_or_fatal(tmp_path, tokenizer_dir, caplog):
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "good"}, "{not json", {"txt": "typo"},
                                              {"text": "also good"}])
    summary = convert([src], tmp_path / "out", tokenizer=tokenizer_dir,
                      options=opts(max_skipped=0.5))
    assert summary.examples == 2
    assert summary.skipped == {"bad_json": 1, "no_schema": 1}
    assert f"{src}:2" in caplog.text and f"{src}:3" in caplog.text
    with pytest.raises(RecordError) as info:
        convert([src], tmp_path / "strict", tokenizer=tokenizer_dir, options=opts(strict=True))
    assert info.value.where == f"{src}:2"
    assert not (tmp_path / "strict" / MANIFEST).exists()
    assert not list((tmp_path / "strict").glob("*.tmp"))


def test_truncate_and_split(tmp_path, tokenizer_dir, hf_tokenizer):
    text = "x = 1\n" * 200
    want = hf_tokenizer(text, add_special_tokens=False)["input_ids"] + [hf_tokenizer.eos_token_id]
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": text}])
    s = convert([src], tmp_path / "t", tokenizer=tokenizer_dir,
                options=opts(max_tokens=50, overflow="truncate"))
    (p,) = packets(tmp_path / "t")
    assert p.tokens.tolist() == want[:50]
    assert s.truncated == 1 and s.truncated_tokens == len(want) - 50
    s = convert([src], tmp_path / "s", tokenizer=tokenizer_dir,
                options=opts(max_tokens=50, overflow="split"))
    parts = packets(tmp_path / "s")
    assert [len(p.tokens) for p in parts[:-1]] == [50] * (len(parts) - 1)
    assert np.concatenate([p.tokens for p in parts]).tolist() == want
    assert s.split == 1 and s.packets == len(parts)
    assert check_roundtrip([src], tmp_path / "s", tokenizer=tokenizer_dir) == len(parts)


def test_rollover_into_several_shards(tmp_path, tokenizer_dir):
    records = [{"text": f"value_{i} = {i} * {i}\n" * 40} for i in range(200)]
    src = write_jsonl(tmp_path / "in.jsonl", records)
    s = convert([src], tmp_path / "out", tokenizer=tokenizer_dir,
                options=opts(max_shard_bytes=70_000, token_width=4))
    assert len(s.shards) > 1
    assert check_roundtrip([src], tmp_path / "out", tokenizer=tokenizer_dir) == 200
    offsets = [load_index(Shard(p), on_stale="error").offsets for p in s.shards]
    assert sum(len(o) for o in offsets) == 200


def test_padded_decode_of_converted_shard(tmp_path, tokenizer_dir, hf_tokenizer):
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in TEXTS])
    convert([src], tmp_path / "out", tokenizer=tokenizer_dir, options=opts())
    shard = Shard(next((tmp_path / "out").glob("*.ndp")))
    batch = decode_padded(shard.data, load_index(shard).offsets, seq_len=64,
                          pad_token_id=hf_tokenizer.pad_token_id)
    for row, text in zip(range(3), TEXTS):
        n = int(batch.attention_mask[row].sum())
        assert hf_tokenizer.decode(batch.input_ids[row, : n - 1].tolist()) == text
        assert (batch.labels[row, n:] == IGNORE_INDEX).all()


def test_max_tokens_up_to_a_packets_capacity_masked_examples_to_theirs(tmp_path,
                                                                        tokenizer_dir):
    """--max-tokens 32000 for 2-byte tokens: plain text keeps 32,000 tokens per packet; an
    example with a loss mask, whose packet also carries the mask bits, is cut at 30,839."""
    long = "def f(x):\n    return x + 1\n" * 6000
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": long},
                                             {"prompt": "q: ", "completion": long}])
    s = convert([src], tmp_path / "out", tokenizer=tokenizer_dir,
                options=opts(max_tokens=32000, overflow="truncate"))
    assert s.examples == 2 and s.truncated == 2
    shard = Shard(next((tmp_path / "out").glob("*.ndp")))
    assert sorted(tokens_of_index(load_index(shard))) == [30839, 32000]


def tokens_of_index(index) -> list[int]:
    from ndp.store.columns import tokens_of

    return tokens_of(index.entries["length"], index.entries["typ"]).tolist()


def test_option_and_environment_errors(tmp_path, tokenizer_dir):
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "a"}])
    convert([src], tmp_path / "out", tokenizer=tokenizer_dir, options=opts())
    with pytest.raises(ConfigError, match="already holds"):
        convert([src], tmp_path / "out", tokenizer=tokenizer_dir, options=opts())
    convert([src], tmp_path / "out", tokenizer=tokenizer_dir, options=opts(overwrite=True))
    with pytest.raises(ConfigError, match="`max_tokens` must be 1..32767 .*30839 for examples "
                                          "with a loss mask"):
        convert([src], tmp_path / "big", tokenizer=tokenizer_dir, options=opts(max_tokens=40000))
    with pytest.raises(TokenizerError, match="never downloads"):
        convert([src], tmp_path / "t", tokenizer=str(tmp_path / "no-such-tokenizer"),
                options=opts())
    with pytest.raises(ConfigError, match="does not exist"):
        convert([tmp_path / "missing.jsonl"], tmp_path / "m", tokenizer=tokenizer_dir,
                options=opts())
