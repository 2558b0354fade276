"""What real users bring to ``ndp convert`` (ndp.convert.sources): datasets with extra columns,
other field names, the files Hugging Face ``datasets`` writes (JSON Lines, JSON arrays,
compressed JSON, CSV and TSV, Parquet, Arrow, save_to_disk folders, dataset folders by name),
damaged lines, cut and empty files, and runs that would keep nothing. Each converts to the same
packets as the plain JSONL of the same texts, or fails loudly, exit 1, with nothing written.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import shutil
import subprocess
import sys

import pytest

from ndp.cli.main import main
from ndp.convert import MANIFEST, ConvertOptions, convert
from ndp.convert.sources import read_inputs
from ndp.errors import ConfigError, ConvertError, InputError, RecordError

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
    from ndp.wire.packet import decode_packet
    from ndp.store.index import load_index
    from ndp.store.shard import Shard

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
                      options=opts(max_tokens=64, overflow="truncate"))
    assert summary.truncated == 4
    assert "truncation cut" in caplog.text and "--overflow split keeps them" in caplog.text
    caplog.clear()
    convert([src], tmp_path / "split", tokenizer=tokenizer_dir,
            options=opts(max_tokens=64, overflow="split"))
    assert "truncation cut" not in caplog.text


# Damaged inputs. Each bad line is a skipped record named by its file:line (the good records
# around it kept, in order, none read twice), or the whole file is one named error that says
# where reading stopped; never a traceback from inside datasets, pandas or pyarrow.


def read_all(path) -> list:
    """Every record read from ``path`` (``RecordError`` for a bad one), checking on the way
    that the bytes counted for the progress bar add up to the file's size."""
    items = list(read_inputs([path]))
    assert sum(nbytes for *_, nbytes in items) == path.stat().st_size
    return [record for _, record, _ in items if record is not None]


def jsonl_lines() -> list[str]:
    return [json.dumps({"text": t}) for t in TEXTS]


@pytest.mark.parametrize("at", [0, 2, N])
def test_a_line_cut_mid_value_is_one_skipped_record_named_by_its_line(tmp_path, tokenizer_dir,
                                                                     reference, at):
    """``datasets`` infers the schema from the first block when the dataset is loaded: pyarrow
    reads ``{"text": `` and the next line as a column that changed type, datasets' ujson then
    fails on the cut line, and the error came from ``load_dataset``, before ndp read a
    record."""
    lines = jsonl_lines()
    lines.insert(at, '{"text": ')
    src = write_jsonl(tmp_path / "cut.jsonl", lines)
    records = read_all(src)
    (bad,) = [r for r in records if isinstance(r, RecordError)]
    assert bad.where == f"{src}:{at + 1}" and bad.kind == "bad_json"
    assert [r["text"] for r in records if not isinstance(r, RecordError)] == TEXTS
    summary = convert([src], tmp_path / "out", tokenizer=tokenizer_dir,
                      options=opts(max_skipped=0.05))
    assert summary.examples == N and summary.skipped == {"bad_json": 1}
    assert stream(tmp_path / "out") == reference


DEEP = 100_000
NESTED_SCRIPT = """
import json, sys
from pathlib import Path
from ndp.convert.sources import read_inputs
from ndp.errors import RecordError
got = {}
for path in sorted(Path(sys.argv[1]).glob("*.jsonl")):
    items = list(read_inputs([path]))
    assert sum(n for *_, n in items) == path.stat().st_size, items
    got[path.name] = [[r.kind, r.where] if isinstance(r, RecordError) else r["text"]
                      for _, r, _ in items if r is not None]
print(json.dumps(got))
"""


def test_absurdly_nested_lines_are_skipped_records_never_a_crash(tmp_path):
    """A line of 100,000 ``[`` raises RecursionError in Python's json and ValueError in pandas'
    ujson; a closed one crashes pyarrow's JSON reader (the C stack overflows past about 17,000
    levels: a segfault, no message), so the check runs in a child process."""
    for name, line in (("open.jsonl", "[" * DEEP),
                       ("closed.jsonl", '{"text": "x", "m": ' + "[" * DEEP + "]" * DEEP + "}")):
        write_jsonl(tmp_path / name, [json.dumps({"text": TEXTS[0]}), line,
                                      json.dumps({"text": TEXTS[1]})])
    child = subprocess.run([sys.executable, "-c", NESTED_SCRIPT, str(tmp_path)],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    got = json.loads(child.stdout.strip().splitlines()[-1])
    for name in ("open.jsonl", "closed.jsonl"):
        assert got[name] == [TEXTS[0], ["bad_json", f"{tmp_path / name}:2"], TEXTS[1]]


@pytest.mark.parametrize("suffix,compress", [(".gz", gzip.compress), (".bz2", bz2.compress),
                                             (".xz", lzma.compress)])
def test_a_cut_compressed_file_is_one_named_error_and_nothing_is_written(tmp_path, tokenizer_dir,
                                                                         suffix, compress):
    whole = compress(("\n".join(jsonl_lines() * 20) + "\n").encode())
    src = tmp_path / f"cut.jsonl{suffix}"
    src.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InputError, match=rf"{src}: the \w+ stream is cut short .*; fetch"):
        convert([src], tmp_path / "out", tokenizer=tokenizer_dir, options=opts())
    assert not (tmp_path / "out").exists()


def arrow_file(tmp_path):
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "saved"))
    return next((tmp_path / "saved").glob("*.arrow"))


@pytest.mark.parametrize("name", ["cut.parquet", "empty.parquet", "cut.arrow", "empty.arrow",
                                  "array.json"])
def test_a_cut_or_empty_binary_file_is_one_named_error(tmp_path, tokenizer_dir, name):
    src = tmp_path / name
    if name.endswith(".parquet"):
        datasets.Dataset.from_list(ROWS).to_parquet(str(src))
    elif name.endswith(".arrow"):
        shutil.copy(arrow_file(tmp_path), src)
    else:  # a JSON array (not JSON Lines) cut off: there is no line to read on from
        datasets.Dataset.from_list(ROWS).to_json(str(src), lines=False)
    data = src.read_bytes()
    src.write_bytes(data[: len(data) * 2 // 3] if name.startswith(("cut", "array")) else b"")
    with pytest.raises(InputError, match=rf"{src}: .*; .*the inputs") as err:
        convert([src], tmp_path / "out", tokenizer=tokenizer_dir, options=opts())
    assert ("0 bytes" in str(err.value)) == name.startswith("empty")
    assert not (tmp_path / "out").exists()


def test_empty_files_hold_no_records(tmp_path, tokenizer_dir, reference):
    """An empty JSON Lines or CSV file (0 bytes, only blank lines, compressed nothing, only a
    header) or a Parquet file of no rows holds no records; an empty plain text file is one
    empty document, skipped as such."""
    (tmp_path / "a.jsonl").write_bytes(b"")
    (tmp_path / "b.jsonl").write_bytes(b"\n  \n\n")
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(b""))
    (tmp_path / "d.csv").write_bytes(b"")
    (tmp_path / "e.tsv").write_bytes(b"")
    (tmp_path / "e.csv.gz").write_bytes(gzip.compress(b"text,id\n"))
    datasets.Dataset.from_list(ROWS).select([]).to_parquet(str(tmp_path / "e.parquet"))
    for name in ("a.jsonl", "b.jsonl", "c.jsonl.gz", "d.csv", "e.tsv", "e.csv.gz",
                 "e.parquet"):
        assert read_all(tmp_path / name) == []
    (tmp_path / "f.txt").write_bytes(b"")
    src = write_jsonl(tmp_path / "g.jsonl", jsonl_lines())
    summary = convert(sorted(tmp_path.iterdir()), tmp_path / "out", tokenizer=tokenizer_dir,
                      options=opts(max_skipped=0.05))
    assert summary.examples == N and summary.skipped == {"empty": 1}
    assert stream(tmp_path / "out") == reference and src.exists()


@pytest.mark.parametrize("name", ["a.csv", "a.tsv", "a.csv.gz", "a.tsv.xz"])
def test_csv_and_tsv_are_records_one_per_row(tmp_path, tokenizer_dir, reference, name):
    """TEXTS hold newlines and commas: quoted fields, as pandas (and so datasets) writes them."""
    buf = io.BytesIO()
    datasets.Dataset.from_list(ROWS).to_csv(buf, index=False,
                                            sep="\t" if ".tsv" in name else ",")
    compress = {"gz": gzip.compress, "xz": lzma.compress}.get(name.rsplit(".", 1)[-1])
    src = tmp_path / name
    src.write_bytes(compress(buf.getvalue()) if compress else buf.getvalue())
    items = list(read_inputs([src]))
    assert items[0][0] == f"{src}:record 1" and items[N - 1][0] == f"{src}:record {N}"
    assert items[0][1]["id"] == ROWS[0]["id"]
    check([src], tmp_path / "out", tokenizer_dir, reference)


def test_csv_cells_are_read_as_the_strings_they_are(tmp_path):
    """pandas would read a column of numbers as numbers ("007" as 7, "3.10" as 3.1) and "NA",
    "null" or an empty cell as a missing value: a text converter wants the text."""
    src = tmp_path / "qa.csv"
    src.write_text("prompt,completion\n6*7=,42\nbond,007\npython,3.10\nnothing,NA\nnone,null\n"
                   "blank,\n")
    assert [r["completion"] for r in read_all(src)] == ["42", "007", "3.10", "NA", "null", ""]


@pytest.mark.parametrize("damage", ["extra_field", "cut_gzip"])
def test_a_damaged_csv_is_one_named_error(tmp_path, tokenizer_dir, damage):
    lines = ["text,id"] + [f'"{t}",{k}' for k, t in enumerate(TEXTS)]
    if damage == "extra_field":
        src = tmp_path / "bad.csv"
        src.write_text("\n".join(lines[:4] + ["a,b,c"] + lines[4:]) + "\n")
        where = r"record 4 \(line 11\) has 3 fields"  # the 3 rows before it span 9 lines
    else:
        src = tmp_path / "cut.csv.gz"
        whole = gzip.compress(("\n".join(lines * 20) + "\n").encode())
        src.write_bytes(whole[: len(whole) // 2])
        where = "cut short"
    with pytest.raises(InputError, match=rf"{src}: .*{where}"):
        convert([src], tmp_path / "out", tokenizer=tokenizer_dir, options=opts())
    assert not (tmp_path / "out").exists()


def test_a_line_of_json_that_is_no_object_is_a_skipped_record_never_dropped(tmp_path,
                                                                           tokenizer_dir):
    """``null`` once became None, which marks the end of a file: it was dropped uncounted."""
    lines = jsonl_lines()
    lines[3:3] = ["null", "42", '"text"', "[1, 2]"]
    src = write_jsonl(tmp_path / "values.jsonl", lines)
    records = read_all(src)
    assert len(records) == N + 4
    assert isinstance(records[3], RecordError) and records[3].where == f"{src}:4"
    summary = convert([src], tmp_path / "out", tokenizer=tokenizer_dir,
                      options=opts(max_skipped=0.1))
    assert summary.examples == N and summary.skipped == {"bad_record": 4}


def nesting_reference(data: bytes) -> int:
    """``ndp.convert.nesting``'s rule, one byte at a time: a quote after an odd run of
    backslashes is no quote; the others open and close strings, which a newline ends too;
    depth is the rise of the bracket level outside strings above its lowest point."""
    level = low = deepest = run = 0
    in_string = False
    for c in data.decode("latin-1"):
        quote = c == '"' and run % 2 == 0
        run = run + 1 if c == "\\" else 0
        if c == "\n":
            in_string = False
        elif quote:
            in_string = not in_string
        elif not in_string and c in "[{]}":
            level += 1 if c in "[{" else -1
            low = min(low, level)
            deepest = max(deepest, level - low)
    return deepest


def test_the_nesting_scan_agrees_with_a_plain_reference_however_the_bytes_are_chunked():
    import random

    from ndp.convert.nesting import NestingScan

    rng = random.Random(0)
    for _ in range(500):
        data = bytes(rng.choice(b'[]{}"\\\\\\\n a') for _ in range(rng.randrange(120)))
        cuts = sorted(rng.sample(range(len(data) + 1), rng.randrange(min(5, len(data) + 1))))
        scan = NestingScan()
        for lo, hi in zip([0, *cuts], [*cuts, len(data)]):
            scan.feed(data[lo:hi])
        assert scan.deepest == nesting_reference(data), (data, cuts)
    # strings full of brackets, quotes and backslashes do not count; values across lines do
    record = {"t": 'a " ] [[[ \\', "u": '}}}\\"{', "m": [[[1]]]}
    line = json.dumps(record) + "\n"
    scan = NestingScan()
    scan.feed(line.encode() * 3 + json.dumps(record, indent=1).encode())
    assert scan.deepest == 4 and scan.first == b"{"


@pytest.mark.parametrize("name", ["in.jsonl", "in.jsonl.gz", "in.csv", "in.parquet"])
def test_the_progress_bar_moves_with_each_record(tmp_path, name):
    """Every record counts its share of the file's bytes as it is read (a bar that sat at 0%
    until a JSON Lines file's end, then jumped to 100%, told nothing for minutes); the
    shares add up to the file's size."""
    path = tmp_path / name
    if name.startswith("in.jsonl"):
        data = "".join(line + "\n" for line in jsonl_lines()).encode()
        path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    elif name == "in.csv":
        import csv

        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text"])
            w.writerows([t] for t in TEXTS)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": TEXTS}), path)
    items = list(read_inputs([path]))
    shares = [nbytes for _, record, nbytes in items if record is not None]
    assert len(shares) == N and min(shares) > 0
    assert sum(nbytes for *_, nbytes in items) == path.stat().st_size
