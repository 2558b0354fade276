"""Inputs the converter reads, each yielding (where, record, bytes consumed).

Structured data is read by Hugging Face ``datasets`` itself, so ndp reads what it reads:

* JSON Lines and JSON (``.jsonl``, ``.json``, ``.ndjson``), CSV (``.csv``) and TSV (``.tsv``,
  tab-separated), each compressed or not (``.gz``, ``.bz2``, ``.xz``, ``.zst``), Parquet
  (``.parquet``) and Arrow (``.arrow``) files, streamed (nothing is copied into the datasets
  cache); ``where`` is ``file:record N`` (1-based; for JSON Lines without blank lines, the line
  number; for CSV, the row under the header). A CSV record is its row, every cell the string
  it is (``ndp.convert.datafiles``).
* a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk`` (the ``split``
  of a ``DatasetDict``); ``where`` is ``folder[split]:row N``.
* ``hf:NAME`` (``hf:NAME@CONFIG``): a dataset ``datasets.load_dataset`` finds by name, such
  as one already in the local Hugging Face cache (the ``ndp`` command never downloads: it
  sets ``HF_HUB_OFFLINE=1`` unless told otherwise), or a local dataset folder.

A JSON Lines file that ``datasets`` cannot parse (a damaged line, a record of another shape,
JSON nested absurdly deep) is read on from where it stopped one line at a time, so that each
bad line is one ``RecordError`` naming ``file:line`` in place of its record, and the caller skips
or stops on it. Any other file that cannot be read (a compressed stream cut short, a cut or
empty Parquet or Arrow file, a CSV row with too many fields) is one ``InputError`` naming the
file and where reading stopped; an empty JSON Lines or CSV file holds no records.

Anything else is plain UTF-8 text, one ``{"text": ...}`` record per file (``text_unit="file"``,
the right unit for source code) or per non-empty line (``text_unit="line"``).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ndp.convert.datafiles import (COMPRESSION, Item, first_line, quiet_datasets,
                                   read_data_file, rows, spread)
from ndp.errors import ConfigError, RecordError


@dataclass(frozen=True)
class RemoteInput:
    """An input file in object storage (an fsspec URL), read from a local copy made when it
    is read; records are named by the URL."""

    url: str
    size: int
    storage_options: dict | None = field(default=None, compare=False)

    @property
    def name(self) -> str:
        return self.url.rstrip("/").rsplit("/", 1)[-1]


Input = Path | str | RemoteInput  # a file, a save_to_disk folder, "hf:NAME", or a URL's file
TEXT_UNITS = ("file", "line")
HUB = "hf:"
BUILDERS = {".jsonl": "json", ".json": "json", ".ndjson": "json", ".csv": "csv", ".tsv": "tsv",
            ".parquet": "parquet", ".arrow": "arrow"}


def _suffix(name: str) -> str:
    """The data suffix of a file name, under a compression suffix if there is one."""
    name = name.lower()
    for c in COMPRESSION:
        if name.endswith(c):
            name = name[: -len(c)]
            break
    return os.path.splitext(name)[1]


def is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` is a folder written by ``save_to_disk``."""
    return path.is_dir() and ((path / "state.json").is_file()
                              or (path / "dataset_dict.json").is_file())


def input_kind(item: Input) -> str:
    """``remote``, ``hub``, ``saved`` (a save_to_disk folder), ``json``, ``csv``, ``tsv``,
    ``parquet``, ``arrow`` or ``text``."""
    if isinstance(item, RemoteInput):
        return "remote"
    if isinstance(item, str):
        return "hub"
    if is_saved_dataset(item):
        return "saved"
    return BUILDERS.get(_suffix(item.name), "text")


def input_size(item: Input) -> int:
    """Bytes on disk (0 for a dataset named on the hub)."""
    if isinstance(item, RemoteInput):
        return item.size
    if isinstance(item, str):
        return 0
    if item.is_dir():
        return sum(f.stat().st_size for f in item.rglob("*") if f.is_file())
    return item.stat().st_size


def _read_saved(path: Path, split: str) -> Iterator[Item]:
    with quiet_datasets() as datasets:
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ConfigError(f"{path}: a DatasetDict without a {split!r} split (it has "
                                  f"{sorted(ds)}); name one with --hf-split")
            ds = ds[split]
        yield from _dataset_rows(ds, f"{path}[{split}]", input_size(path))


def _read_hub(name: str, split: str) -> Iterator[Item]:
    name, _, config = name[len(HUB):].partition("@")
    with quiet_datasets() as datasets:
        try:
            ds = datasets.load_dataset(name, config or None, split=split)
        except Exception as err:  # noqa: BLE001 - not cached, offline, no such split, ...
            raise ConfigError(
                f"{HUB}{name}: datasets.load_dataset could not load it ({first_line(err)}); "
                f"ndp reads datasets already in the local Hugging Face cache (set "
                f"HF_HUB_OFFLINE=0 to let datasets download) or local dataset folders") from None
        yield from _dataset_rows(ds, f"{HUB}{name}[{split}]", 0)


def _dataset_rows(ds: Any, label: str, size: int) -> Iterator[Item]:
    share = spread(size, len(ds))
    for n, record in enumerate(rows(ds), start=1):
        yield f"{label}:row {n}", record, share(n)


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


def read_inputs(inputs: list[Input], *, text_unit: str = "file",
                split: str = "train") -> Iterator[Item]:
    """Records of every input in order (``expand_inputs`` first); an item whose record is
    ``None`` only counts bytes (the end of a file)."""
    if text_unit not in TEXT_UNITS:
        raise ConfigError(f"`text_unit` must be one of {TEXT_UNITS}, got {text_unit!r}")
    for item in expand_inputs(inputs):
        kind = input_kind(item)
        if kind == "remote":
            yield from _read_remote(item, text_unit, split)
        elif kind == "hub":
            yield from _read_hub(item, split)
        elif kind == "saved":
            yield from _read_saved(item, split)
        elif kind == "text":
            yield from _read_text(item, text_unit)
        else:
            yield from read_data_file(item, kind)


def _read_remote(item: RemoteInput, text_unit: str, split: str) -> Iterator[Item]:
    """The records of a file in object storage, read from a local copy (the records named by
    the URL, as the local file's would be by its path)."""
    from ndp.store.remote import filesystem, with_retries

    fs, path = filesystem(item.url, item.storage_options)
    with tempfile.TemporaryDirectory(prefix="ndp-input-") as tmp:
        local = Path(tmp) / item.name
        with_retries(item.url, lambda: fs.get_file(path, str(local)))
        prefix = str(local)
        for where, record, nbytes in read_inputs([local], text_unit=text_unit, split=split):
            where = where.replace(prefix, item.url, 1)
            if isinstance(record, RecordError):
                record = RecordError(record.where.replace(prefix, item.url, 1), record.problem,
                                     kind=record.kind)
            yield where, record, nbytes


def _expand_url(url: str, storage_options: dict | None) -> list[RemoteInput]:
    """The files at ``url`` (a file, or every file under a prefix, in sorted order)."""
    from ndp.store.remote import filesystem, with_retries

    fs, path = filesystem(url, storage_options)
    scheme = url.split("://", 1)[0]
    found = with_retries(url, lambda: fs.find(path, detail=True))
    if not found:
        raise ConfigError(f"input {url} does not exist (no object there or under it)")
    return [RemoteInput(f"{scheme}://{p.lstrip('/')}" if scheme != "file" else p,
                        int(info.get("size") or 0), storage_options)
            for p, info in sorted(found.items()) if info.get("type", "file") == "file"]


def expand_inputs(inputs: list[str | os.PathLike | RemoteInput], *,
                  storage_options: dict | None = None) -> list[Input]:
    """Inputs: ``hf:`` names and ``save_to_disk`` folders as given, files as given, other
    directories walked recursively in sorted order (a ``save_to_disk`` folder inside one is
    one input); a URL (``s3://bucket/in/``, read with ``storage_options``) is its files, or
    every file under it in sorted order."""
    from ndp.store.remote import is_url

    out: list[Input] = []
    for given in inputs:
        if isinstance(given, RemoteInput):
            out.append(given)
            continue
        if is_url(given):
            out.extend(_expand_url(str(given), storage_options))
            continue
        if isinstance(given, str) and given.startswith(HUB):
            out.append(given)
            continue
        p = Path(given)
        if is_saved_dataset(p):
            out.append(p)
        elif p.is_dir():
            found = _walk(p)
            if not found:
                raise ConfigError(f"input {p} is a directory with no files in it; name the "
                                  f"JSONL, Parquet, text or token files to convert")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            raise ConfigError(f"input {p} does not exist")
    return out


def _walk(directory: Path) -> list[Path]:
    found: list[Path] = []
    for entry in sorted(directory.iterdir()):
        if is_saved_dataset(entry):
            found.append(entry)
        elif entry.is_dir():
            found.extend(_walk(entry))
        elif entry.is_file():
            found.append(entry)
    return found
