"""Input files the converter reads, each yielding (where, record, bytes consumed).

* ``.jsonl`` / ``.json`` / ``.jsonl.gz``: one JSON object per line; ``where`` is ``file:line``.
  Blank lines are skipped. A line that is not valid JSON yields a ``RecordError`` in place of
  its record, so the caller decides whether to skip it or stop.
* ``.parquet``: one record per row (columns are the record's fields); ``where`` is
  ``file:row N`` (1-based).
* anything else: plain UTF-8 text, one ``{"text": ...}`` record per file (``text_unit="file"``,
  the right unit for source code) or per non-empty line (``text_unit="line"``).
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any, Iterator

from ndp.errors import ConfigError, RecordError

Item = tuple[str, Any, int]  # (where, record or RecordError, input bytes consumed)
TEXT_UNITS = ("file", "line")


def input_kind(path: Path) -> str:
    """``jsonl``, ``parquet`` or ``text`` from the file name."""
    name = path.name.lower()
    if name.endswith((".jsonl", ".json", ".jsonl.gz", ".ndjson")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    return "text"


def _read_jsonl(path: Path) -> Iterator[Item]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            if not line.strip():
                continue
            try:
                record: Any = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                record = RecordError(where, f"bad JSON ({err}); fix or remove the line",
                                     kind="bad_json")
            yield where, record, len(line)


def _read_parquet(path: Path) -> Iterator[Item]:
    try:
        import pyarrow.parquet as pq
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ConfigError(f"{path}: reading Parquet needs pyarrow (pip install 'ndp[tokenize]')") from err
    pf = pq.ParquetFile(path)
    total_rows = max(1, pf.metadata.num_rows)
    size = path.stat().st_size
    row = 0
    for batch in pf.iter_batches(batch_size=4096):
        for record in batch.to_pylist():
            row += 1
            yield f"{path}:row {row}", record, size * row // total_rows - size * (row - 1) // total_rows


def _read_text(path: Path, text_unit: str) -> Iterator[Item]:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        yield f"{path}:byte {err.start}", RecordError(
            f"{path}:byte {err.start}", "not UTF-8 text; convert the file to UTF-8",
            kind="bad_text"), len(raw)
        return
    if text_unit == "file":
        yield str(path), {"text": text}, len(raw)
        return
    for lineno, line in enumerate(text.splitlines(keepends=True), start=1):
        if line.strip():
            yield f"{path}:{lineno}", {"text": line.rstrip("\r\n")}, len(line.encode("utf-8"))


def read_inputs(paths: list[str | os.PathLike], *, text_unit: str = "file") -> Iterator[Item]:
    """Records of every input in order; directories are walked (sorted) for files."""
    if text_unit not in TEXT_UNITS:
        raise ConfigError(f"text_unit must be one of {TEXT_UNITS}, got {text_unit!r}")
    for path in expand_inputs(paths):
        kind = input_kind(path)
        if kind == "jsonl":
            yield from _read_jsonl(path)
        elif kind == "parquet":
            yield from _read_parquet(path)
        else:
            yield from _read_text(path, text_unit)


def expand_inputs(paths: list[str | os.PathLike]) -> list[Path]:
    """Input files: files as given, directories walked recursively in sorted order."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file())
            if not found:
                raise ConfigError(f"input {p} is a directory with no files in it; name the "
                                  f"JSONL, Parquet, text or token files to convert")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise ConfigError(f"input {p} does not exist")
    return files
