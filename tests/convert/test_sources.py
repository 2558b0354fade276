"""What real users bring to ``ndp convert`` (ndp.convert.sources): datasets with extra columns,
other field names, the files Hugging Face ``datasets`` writes (JSON Lines, JSON arrays,
compressed JSON, Parquet, Arrow, save_to_disk folders, dataset folders by name), damaged lines,
and runs that would keep nothing. Each converts to the same packets as the plain JSONL of the
same texts, or fails loudly, exit 1, with nothing written.
"""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from ndp.cli import main
from ndp.convert import MANIFEST, ConvertOptions, convert
from ndp.errors import ConfigError, ConvertError

datasets = pytest.importorskip("datasets")

N = 50
TEXTS = [f"def f{k}(x):\n    return x * {k} + {k % 7}\n" for k in range(N)]
#: FineWeb's columns beside the text
ROWS = [{"text": t, "id": f"<urn:uuid:{k}>", "dump": "CC-MAIN-2024-10",
         "url": f"https://example.com/{k}", "date": "2024-02-21", "language": "en",
         "language_score": 0.93, "token_count": len(t)} for k, t in enumerate(TEXTS)]


def write_jsonl(path, rows, opener=open):
    with opener(path, "wt") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def opts(**kw):
    return ConvertOptions(progress=False, **kw)


def stream(out_dir) -> list[tuple]:
    """Every packet of a converted dataset, in order (its tokens and mask)."""
    from ndp.packet import decode_packet
    from ndp.index import load_index
    from ndp.shard import Shard

    manifest = json.loads((out_dir / MANIFEST).read_text())
    got = []
    for entry in manifest["shards"]:
        shard = Shard(out_dir / entry["name"])
        for off in load_index(shard, on_stale="error").offsets:
            p = decode_packet(shard.data, int(off))
            got.append((p.tokens.tolist(), None if p.mask is None else p.mask.tolist()))
        shard.close()
    return got


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tokenizer_dir):
    d = tmp_path_factory.mktemp("ref")
    write_jsonl(d / "plain.jsonl", [{"text": t} for t in TEXTS])
    convert([d / "plain.jsonl"], d / "out", tokenizer=tokenizer_dir, options=opts())
    return stream(d / "out")


def check(inputs, out, tokenizer_dir, reference, **kw):
    summary = convert(inputs, out, tokenizer=tokenizer_dir, options=opts(**kw))
    assert summary.examples == N and summary.skipped == {}
    assert stream(out) == reference
    return summary


def test_fineweb_style_jsonl_keeps_every_record_and_names_the_ignored_columns(
        tmp_path, tokenizer_dir, reference):
    src = write_jsonl(tmp_path / "fw.jsonl", ROWS)
    summary = check([src], tmp_path / "out", tokenizer_dir, reference)
    assert summary.ignored_fields == ["date", "dump", "language", "language_score",
                                      "token_count", "url"]
    assert "ignored columns: date, dump" in summary.describe()


def test_what_hf_datasets_writes(tmp_path, tokenizer_dir, reference):
    ds = datasets.Dataset.from_list(ROWS)
    ds.to_parquet(str(tmp_path / "a.parquet"))
    ds.to_json(str(tmp_path / "lines.json"))  # JSON Lines, the default
    ds.to_json(str(tmp_path / "array.json"), lines=False)
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(3))}).save_to_disk(
        str(tmp_path / "saved_dict"))
    write_jsonl(tmp_path / "z.json.gz", ROWS, opener=gzip.open)
    arrow = next((tmp_path / "saved").glob("*.arrow"))
    shutil.copy(arrow, tmp_path / "rows.arrow")
    for i, name in enumerate(("a.parquet", "lines.json", "array.json", "saved", "saved_dict",
                              "z.json.gz", "rows.arrow")):
        check([tmp_path / name], tmp_path / f"out{i}", tokenizer_dir, reference)
    # the split of a DatasetDict is chosen
    summary = convert([tmp_path / "saved_dict"], tmp_path / "test_split", tokenizer=tokenizer_dir,
                      options=opts(hf_split="test"))
    assert summary.examples == 3
    with pytest.raises(ConfigError, match="'validation' split"):
        convert([tmp_path / "saved_dict"], tmp_path / "x", tokenizer=tokenizer_dir,
                options=opts(hf_split="validation"))


def test_a_dataset_by_name_through_datasets_load_dataset(tmp_path, tokenizer_dir, reference):
    repo = tmp_path / "my_dataset"  # a dataset folder, as a cached hub dataset is found by name
    (repo / "data").mkdir(parents=True)
    datasets.Dataset.from_list(ROWS).to_parquet(str(repo / "data" / "train-00000.parquet"))
    check([f"hf:{repo}"], tmp_path / "out", tokenizer_dir, reference)
    with pytest.raises(ConfigError, match="local Hugging Face cache"):
        convert(["hf:nobody/no-such-dataset-xyz"], tmp_path / "y", tokenizer=tokenizer_dir,
                options=opts())


def test_the_cli_names_other_columns_and_fails_when_it_would_keep_nothing(tmp_path,
                                                                        tokenizer_dir,
                                                                        reference, capsys):
    src = write_jsonl(tmp_path / "content.jsonl",
                      [{"content": t, "repo": "r", "path": f"f{k}.py"}
                       for k, t in enumerate(TEXTS)])
    out = tmp_path / "out"
    assert main(["convert", str(src), str(out), "--tokenizer", tokenizer_dir,
                 "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "none of the 50 records" in err and "--text-field" in err and "nothing was written" in err
    assert not out.exists()
    assert main(["convert", str(src), str(out), "--tokenizer", tokenizer_dir, "--no-progress",
                 "--text-field", "content"]) == 0
    assert stream(out) == reference


def test_more_skipped_than_allowed_fails_and_commits_nothing(tmp_path, tokenizer_dir):
    rows = [{"text": t} for t in TEXTS] + [{"text": ""}] * 3  # 3 of 53 empty: 5.7%
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    with pytest.raises(ConvertError, match=r"3 of 53 records were skipped \(5\.7%"):
        convert([src], tmp_path / "out", tokenizer=tokenizer_dir, options=opts())
    assert not (tmp_path / "out").exists()
    summary = convert([src], tmp_path / "out", tokenizer=tokenizer_dir,
                      options=opts(max_skipped=0.06))
    assert summary.examples == N and summary.skipped == {"empty": 3}


def test_a_damaged_line_in_a_large_jsonl_is_named_and_the_rest_kept(tmp_path, tokenizer_dir,
                                                                   caplog):
    rows = [{"text": TEXTS[k % N]} for k in range(3000)]
    lines = [json.dumps(r) for r in rows]
    lines[2500] = '{"text": "cut off'
    src = write_jsonl(tmp_path / "big.jsonl", lines)
    summary = convert([src], tmp_path / "out", tokenizer=tokenizer_dir, options=opts())
    assert summary.examples == 2999 and summary.skipped == {"bad_json": 1}
    assert f"{src}:2501: bad JSON" in caplog.text
    assert len(stream(tmp_path / "out")) == 2999


def test_truncation_of_a_real_share_is_said_loudly(tmp_path, tokenizer_dir, caplog):
    src = write_jsonl(tmp_path / "long.jsonl", [{"text": "x = 1\n" * 300}] * 4)
    summary = convert([src], tmp_path / "out", tokenizer=tokenizer_dir,
                      options=opts(max_tokens=64))
    assert summary.truncated == 4
    assert "truncation cut" in caplog.text and "--overflow split keeps them" in caplog.text
    caplog.clear()
    convert([src], tmp_path / "split", tokenizer=tokenizer_dir,
            options=opts(max_tokens=64, overflow="split"))
    assert "truncation cut" not in caplog.text
