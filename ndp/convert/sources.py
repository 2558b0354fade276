"""Inputs the converter reads, each yielding (where, record, bytes consumed).

Structured data is read by Hugging Face ``datasets`` itself, so ndp reads what it reads:

* JSON Lines and JSON (``.jsonl``, ``.json``, ``.ndjson``, compressed or not: ``.gz``, ``.bz2``,
  ``.xz``, ``.zst``), Parquet (``.parquet``) and Arrow (``.arrow``) files, streamed (nothing is
  copied into the datasets cache); ``where`` is ``file:record N`` (1-based; for JSON Lines
  without blank lines, the line number).
* a folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk`` (the ``split``
  of a ``DatasetDict``); ``where`` is ``folder[split]:row N``.
* ``hf:NAME`` (``hf:NAME@CONFIG``): a dataset ``datasets.load_dataset`` finds by name, such
  as one already in the local Hugging Face cache (the ``ndp`` command never downloads: it
  sets ``HF_HUB_OFFLINE=1`` unless told otherwise), or a local dataset folder.

A JSON Lines file that ``datasets`` cannot parse (a damaged line, a record of another shape) is
read on from where it stopped one line at a time, so that each bad line is one ``RecordError``
naming ``file:line`` in place of its record, and the caller skips or stops on it.

Anything else is plain UTF-8 text, one ``{"text": ...}`` record per file (``text_unit="file"``,
the right unit for source code) or per non-empty line (``text_unit="line"``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ndp.errors import ConfigError, RecordError

Item = tuple[str, Any, int]  # (where, record or RecordError, input bytes consumed)


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
COMPRESSION = (".gz", ".bz2", ".xz", ".zst")
BUILDERS = {".jsonl": "json", ".json": "json", ".ndjson": "json", ".parquet": "parquet",
            ".arrow": "arrow"}
_ROWS_PER_READ = 1000


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
    """``hub``, ``saved`` (a save_to_disk folder), ``json``, ``parquet``, ``arrow`` or
    ``text``."""
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


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[Any]:
    """``datasets``, with its own progress bars off (ndp shows one) for the duration."""
    try:
        import datasets
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ConfigError("reading JSON, Parquet, Arrow and Hugging Face datasets needs "
                          "'datasets' (pip install 'neural-datagram[tokenize]')") from err
    was_off = datasets.utils.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    # a file datasets cannot parse is logged as an ERROR before it raises; ndp reads on and
    # reports each bad line itself
    logger = logging.getLogger("datasets")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield datasets
    finally:
        logger.setLevel(level)
        if not was_off:
            datasets.enable_progress_bars()


def _rows(ds: Any) -> Iterator[dict]:
    """Rows of a ``datasets`` dataset as dicts, read a thousand at a time."""
    for columns in ds.iter(batch_size=_ROWS_PER_READ):
        names = list(columns)
        for values in zip(*(columns[n] for n in names)):
            yield dict(zip(names, values))


def _spread(size: int, rows: int | None) -> Any:
    """Bytes to count for row ``i`` (1-based) of ``rows`` in ``size`` bytes; without a row
    count, none until the end (the caller counts the rest)."""
    if not rows:
        return lambda i: 0
    return lambda i: size * i // rows - size * (i - 1) // rows


def _read_file(path: Path, builder: str) -> Iterator[Item]:
    size = path.stat().st_size
    with _quiet_datasets() as datasets:
        ds = datasets.load_dataset(builder, data_files=[str(path)], split="train",
                                   streaming=True)
        rows = None
        if builder == "parquet":
            import pyarrow.parquet as pq

            rows = pq.ParquetFile(path).metadata.num_rows
        share, counted, n = _spread(size, rows), 0, 0
        try:
            for record in _rows(ds):
                n += 1
                nbytes = share(n)
                counted += nbytes
                yield f"{path}:record {n}", record, nbytes
        except Exception as err:  # noqa: BLE001 - pyarrow / datasets parse errors
            if builder != "json" or _starts_with(path, b"["):
                raise ConfigError(f"{path}: cannot be read as {builder} after record {n} "
                                  f"({_first_line(err)}); fix the file") from None
            yield from _read_json_lines(path, skip=n, size_left=size - counted)
            return
    yield f"{path}:end", None, size - counted


def _starts_with(path: Path, prefix: bytes) -> bool:
    import fsspec

    with fsspec.open(str(path), "rb", compression="infer") as f:
        return f.read(4096).lstrip().startswith(prefix)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1] if text else ''}"


def _read_json_lines(path: Path, *, skip: int, size_left: int) -> Iterator[Item]:
    """JSON Lines one line at a time, after the ``skip`` records already read: a line that is
    not a JSON object is a ``RecordError`` naming it."""
    import fsspec

    seen = 0
    with fsspec.open(str(path), "rb", compression="infer") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            seen += 1
            if seen <= skip:
                continue
            where = f"{path}:{lineno}"
            try:
                record: Any = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                record = RecordError(where, f"bad JSON ({err}); fix or remove the line",
                                     kind="bad_json")
            nbytes = min(len(line), size_left)
            size_left -= nbytes
            yield where, record, nbytes
    yield f"{path}:end", None, size_left


def _read_saved(path: Path, split: str) -> Iterator[Item]:
    with _quiet_datasets() as datasets:
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ConfigError(f"{path}: a DatasetDict without a {split!r} split (it has "
                                  f"{sorted(ds)}); name one with --hf-split")
            ds = ds[split]
        yield from _dataset_rows(ds, f"{path}[{split}]", input_size(path))


def _read_hub(name: str, split: str) -> Iterator[Item]:
    name, _, config = name[len(HUB):].partition("@")
    with _quiet_datasets() as datasets:
        try:
            ds = datasets.load_dataset(name, config or None, split=split)
        except Exception as err:  # noqa: BLE001 - not cached, offline, no such split, ...
            raise ConfigError(
                f"{HUB}{name}: datasets.load_dataset could not load it ({_first_line(err)}); "
                f"ndp reads datasets already in the local Hugging Face cache (set "
                f"HF_HUB_OFFLINE=0 to let datasets download) or local dataset folders") from None
        yield from _dataset_rows(ds, f"{HUB}{name}[{split}]", 0)


def _dataset_rows(ds: Any, label: str, size: int) -> Iterator[Item]:
    share = _spread(size, len(ds))
    for n, record in enumerate(_rows(ds), start=1):
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
        raise ConfigError(f"text_unit must be one of {TEXT_UNITS}, got {text_unit!r}")
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
            yield from _read_file(item, kind)


def _read_remote(item: RemoteInput, text_unit: str, split: str) -> Iterator[Item]:
    """The records of a file in object storage, read from a local copy (the records named by
    the URL, as the local file's would be by its path)."""
    from ndp.remote import filesystem, with_retries

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
    from ndp.remote import filesystem, with_retries

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
    from ndp.remote import is_url

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
