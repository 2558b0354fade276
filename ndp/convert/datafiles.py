"""Data files read through Hugging Face ``datasets``' builders, and what ndp does when one is
damaged.

``read_data_file`` yields ``(where, record, bytes consumed)`` for a JSON Lines or JSON file
(builder ``json``), CSV or TSV (``csv``, the TSV with a tab separator), Parquet (``parquet``) or
Arrow (``arrow``), compressed or not; ``where`` is ``file:record N`` (1-based). Every CSV cell is
read as the string it is (no ``"007"`` read as 7, no ``"NA"`` or empty cell as a missing value):
the records are text to tokenize.

Damage follows one rule: a bad JSON Lines line is one skipped record, anything else one error.

* JSON Lines that ``datasets`` cannot read (a line cut mid-value, a record of another shape,
  whatever pyarrow, pandas' ujson or ``datasets`` raise on it, when loading or later) is read on
  from where it stopped one line at a time, by Python's ``json``: each bad line is a
  ``RecordError`` naming ``file:line`` in place of its record (the caller skips or stops on
  it); the good lines around it are read once each, in order.
* A JSON file nested deeper than ``MAX_DEPTH`` levels (``ndp.convert.nesting`` scans it)
  never reaches pyarrow, whose JSON reader overflows the C stack (a segfault: no message, no
  cleanup) somewhere past 17,000 levels: JSON Lines is read by the line reader (where Python's
  ``json`` raises ``RecursionError`` past about 1,000 levels: that line is a bad record), a
  JSON array is an ``InputError``.
* Anything else that cannot be read (a compressed stream cut short, a Parquet file without its
  footer, an empty Parquet or Arrow file, a cut Arrow file, a CSV row with too many fields, a
  JSON array that does not parse) is one ``InputError`` naming the file, where reading stopped
  and what to do. An empty JSON Lines or CSV file holds no records. A file that cannot be
  opened at all (missing, no permission) raises the ``OSError`` that says so.
"""

from __future__ import annotations

import contextlib
import json
import logging
import lzma
import zlib
from pathlib import Path
from typing import Any, Iterator

from ndp.convert.nesting import MAX_DEPTH, scan_json
from ndp.errors import ConfigError, InputError, RecordError

Item = tuple[str, Any, int]  # (where, record or RecordError, input bytes consumed)
COMPRESSION = (".gz", ".bz2", ".xz", ".zst")  # read through fsspec's codecs, as datasets does

_ROWS_PER_READ = 1000
_NAMES = {"json": "JSON Lines", "csv": "CSV", "tsv": "TSV", "parquet": "a Parquet file",
          "arrow": "an Arrow file"}
_CODECS = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zst": "zstd"}
_SEPARATORS = {"csv": ",", "tsv": "\t"}
log = logging.getLogger(__name__)


def _decompress_errors() -> tuple[type[BaseException], ...]:
    """What reading a compressed stream that is cut short or damaged raises: EOFError (gzip,
    bz2, xz cut short), OSError (``gzip.BadGzipFile``, bz2's "Invalid data stream"),
    ``zlib.error`` and ``lzma.LZMAError`` (damaged data), zstandard's ZstdError."""
    errors: tuple[type[BaseException], ...] = (EOFError, OSError, zlib.error, lzma.LZMAError)
    try:
        import zstandard
    except ImportError:  # .zst inputs need it; without it fsspec says so when one is opened
        return errors
    return (*errors, zstandard.ZstdError)


def _read_errors() -> tuple[type[BaseException], ...]:
    """What ``datasets`` and the readers under it raise on a damaged file, and only that: a bug
    elsewhere (a KeyError, an AttributeError) still shows its traceback."""
    import pyarrow as pa
    from datasets import exceptions

    return (
        # pyarrow's readers: ArrowInvalid (a JSON parse error, a Parquet file without its
        # footer, a cut Arrow file), ArrowTypeError, ArrowNotImplementedError, ...
        pa.ArrowException,
        # pandas' CSV parser (ParserError, EmptyDataError) and its ujson ("Expected object or
        # value", the 1,024-level depth limit), datasets' CastError, UnicodeDecodeError
        ValueError,
        RecursionError,  # Python's json, where datasets falls back to it
        *_decompress_errors(),
        # datasets wraps a reader's error in it when it builds a dataset (not when it streams)
        getattr(exceptions, "DatasetGenerationError", ValueError),
    )


def _is_damage(err: BaseException) -> bool:
    """Whether ``err``, raised while ``datasets`` read a file, says the file is damaged; not
    that it cannot be opened (the caller's ``OSError`` names the path), nor a bug."""
    if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    if type(err) is RuntimeError:  # noqa: E721 - RecursionError, a subclass, is damage
        # how datasets (5.x) says a JSON file has no rows: inferring the schema calls next()
        # on the file's first table, and the StopIteration surfaces as a RuntimeError
        return isinstance(err.__cause__, StopIteration)
    return isinstance(err, _read_errors())


@contextlib.contextmanager
def quiet_datasets() -> Iterator[Any]:
    """``datasets``, with its own progress bars off (ndp shows one) for the duration."""
    try:
        import datasets
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ConfigError("reading JSON, CSV, Parquet, Arrow and Hugging Face datasets needs "
                          "'datasets' (pip install 'neural-datagram[tokenize]')") from err
    was_off = datasets.utils.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    # a file datasets cannot parse is logged as an ERROR before it raises; ndp reads on and
    # reports each bad line itself, or raises one InputError that says it all
    logger = logging.getLogger("datasets")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield datasets
    finally:
        logger.setLevel(level)
        if not was_off:
            datasets.enable_progress_bars()


def rows(ds: Any) -> Iterator[dict]:
    """Rows of a ``datasets`` dataset as dicts, read a thousand at a time."""
    for columns in ds.iter(batch_size=_ROWS_PER_READ):
        names = list(columns)
        for values in zip(*(columns[n] for n in names)):
            yield dict(zip(names, values))


def spread(size: int, count: int | None) -> Any:
    """Bytes to count for row ``i`` (1-based) of ``count`` in ``size`` bytes; without a row
    count, none until the end (the caller counts the rest)."""
    if not count:
        return lambda i: 0
    return lambda i: size * i // count - size * (i - 1) // count


def first_line(err: BaseException) -> str:
    """An exception in one line: its type and the last line of its message."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1] if text else ''}"


def read_data_file(path: Path, kind: str) -> Iterator[Item]:
    """Records of a ``json``, ``csv``, ``tsv``, ``parquet`` or ``arrow`` file (see the module
    docstring for what happens when it is damaged); last, ``(file:end, None, bytes not yet
    counted)``."""
    size = path.stat().st_size
    if size == 0:
        if kind in ("parquet", "arrow"):
            raise InputError(f"{path}: an empty file (0 bytes), not {_NAMES[kind]}; write "
                             f"it again, or leave it out of the inputs")
        yield f"{path}:end", None, 0  # an empty JSON Lines or CSV file holds no records
        return
    array = False
    if kind == "json":
        scan = scan_json(path, errors=_decompress_errors())
        array = scan.first == b"["
        if scan.deepest > MAX_DEPTH:
            if array:
                raise InputError(
                    f"{path}: a JSON array nested more than {MAX_DEPTH} levels deep, deeper "
                    f"than ndp gives pyarrow's JSON reader (it crashes past about 17,000); "
                    f"write it as JSON Lines, one record per line, so that only the deep "
                    f"records are skipped")
            log.debug("%s: nested more than %d levels deep; read line by line", path, MAX_DEPTH)
            yield from _read_json_lines(path, skip=0, size_left=size)
            return
    # the records, for the progress bar to move with them: a Parquet footer's count, a JSON
    # Lines or CSV file's lines (less the header); an Arrow file or a JSON array: at the end
    count = (_parquet_rows(path) if kind == "parquet" else scan.lines if kind == "json"
             and not array else _lines(path) - 1 if kind in _SEPARATORS else None)
    if count == 0 and kind == "parquet":  # datasets refuses a Parquet file of no rows
        # ("BatchSize must be > 0")
        yield f"{path}:end", None, size
        return
    share, counted, n = spread(size, count), 0, 0
    failed: BaseException | None = None
    with quiet_datasets() as datasets:
        try:
            for record in _records(datasets, path, kind):
                n += 1
                nbytes = min(share(n), size - counted)  # a count of lines may be short
                counted += nbytes
                yield f"{path}:record {n}", record, nbytes
        except (*_read_errors(), RuntimeError) as err:
            if not _is_damage(err):
                raise
            failed = err
    if failed is None:
        yield f"{path}:end", None, size - counted
        return
    if kind in _SEPARATORS:
        import pandas as pd

        if isinstance(failed, pd.errors.ParserError):
            raise InputError(_bad_csv(path, kind, failed)) from failed
    if kind != "json" or array:
        raise InputError(_damaged(path, "a JSON array" if array else _NAMES[kind],
                                  f"after record {n}" if n else "before its first record",
                                  failed)) from failed
    log.debug("%s: datasets stopped after record %d (%s); reading on line by line", path, n,
              first_line(failed))
    yield from _read_json_lines(path, skip=n, size_left=size - counted)


def _records(datasets: Any, path: Path, kind: str) -> Iterator[dict]:
    """The file's rows, streamed by ``datasets`` (nothing copied into the datasets cache)."""
    if kind not in _SEPARATORS:
        yield from rows(datasets.load_dataset(kind, data_files=[str(path)], split="train",
                                              streaming=True))
        return
    sep = _SEPARATORS[kind]
    columns = _csv_columns(path, sep)
    if columns is None:  # not even a header: no records
        return
    yield from rows(datasets.load_dataset(
        "csv", data_files=[str(path)], split="train", streaming=True, sep=sep,
        features=datasets.Features({c: datasets.Value("string") for c in columns}),
        keep_default_na=False, na_filter=False))


def _csv_columns(path: Path, sep: str) -> list[str] | None:
    """The columns pandas names in the header of a CSV file (as datasets will read it: the
    same parser, so a repeated name is ``name.1`` in both), or None when it has none."""
    import fsspec
    import pandas as pd

    with fsspec.open(str(path), "rb", compression="infer") as f:
        try:
            return [str(c) for c in pd.read_csv(f, sep=sep, nrows=0).columns]
        except pd.errors.EmptyDataError:  # nothing but blank lines, or compressed nothing
            return None


def _bad_csv(path: Path, kind: str, err: BaseException) -> str:
    """The message for a row pandas refuses, naming its record and physical line (pandas' own
    "line 5" is the fifth row, however many lines its quoted fields span), found again with
    Python's csv reader; pandas' message where that reader finds no such row."""
    import csv

    import fsspec

    sep = _SEPARATORS[kind]
    problem = None
    with fsspec.open(str(path), "rt", compression="infer", encoding="utf-8", newline="",
                     errors="replace") as f:
        reader = csv.reader(f, delimiter=sep)
        try:
            header = next(reader, [])
            record = 0
            for row in reader:
                record += bool(row)  # a blank line is no record, to pandas either
                if len(row) > len(header):  # fewer fields are read as empty ones
                    problem = (f"record {record} (line {reader.line_num}) has {len(row)} "
                               f"fields, the header {len(header)}")
                    break
        except (csv.Error, *_decompress_errors()):  # a damage pandas' message names
            pass
    name = "a tab" if sep == "\t" else "a comma"
    return (f"{path}: cannot be read as {_NAMES[kind]}: {problem or first_line(err)}; a field "
            f"that holds {name}, a quote or a newline must be quoted: fix the row, or leave "
            f"the file out of the inputs")


def _lines(path: Path) -> int:
    """The lines of a file, compressed or not, as ``NestingScan.lines`` counts them (one pass,
    at the speed of reading it)."""
    import fsspec

    newlines, last = 0, b""
    with fsspec.open(str(path), "rb", compression="infer") as f, contextlib.suppress(
            *_decompress_errors()):
        while chunk := f.read(8 << 20):
            newlines += chunk.count(b"\n")
            last = chunk[-1:]
    return newlines + (last not in (b"", b"\n"))


def _parquet_rows(path: Path) -> int:
    """The row count in a Parquet file's footer, which a file cut short has lost."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (pa.ArrowException, OSError) as err:  # ArrowInvalid: no footer, not Parquet
        if not _is_damage(err):
            raise
        raise InputError(_damaged(path, _NAMES["parquet"], "at its footer", err)) from err


def _damaged(path: Path, what: str, where: str, err: BaseException) -> str:
    """The message of an ``InputError``: the file, what went wrong where, what to do."""
    codec = next((c for c in COMPRESSION if path.name.lower().endswith(c)), None)
    if codec and isinstance(err, _decompress_errors()):
        return (f"{path}: the {_CODECS[codec]} stream is cut short or damaged {where} "
                f"({first_line(err)}); fetch the file again or compress it anew, or leave it "
                f"out of the inputs")
    if isinstance(err, UnicodeDecodeError):
        return (f"{path}: not UTF-8 text {where} ({first_line(err)}); convert the file to "
                f"UTF-8 (iconv -f LATIN1 -t UTF-8, say), or leave it out of the inputs")
    return (f"{path}: cannot be read as {what} {where} ({first_line(err)}); the file is "
            f"damaged or is not {what}: fetch it again or write it anew, or leave it out of "
            f"the inputs")


def _read_json_lines(path: Path, *, skip: int, size_left: int) -> Iterator[Item]:
    """JSON Lines one line at a time, after the ``skip`` records already read: a line that is
    not JSON is a ``RecordError`` naming it."""
    import fsspec

    seen = lineno = 0
    with fsspec.open(str(path), "rb", compression="infer") as f:
        lines = iter(f)
        while True:
            try:
                line = next(lines, None)
            except _decompress_errors() as err:
                raise InputError(_damaged(
                    path, "JSON Lines", f"after line {lineno}" if lineno else
                    "before its first line", err)) from err
            if line is None:
                break
            lineno += 1
            if not line.strip():
                continue
            seen += 1
            if seen <= skip:
                continue
            where = f"{path}:{lineno}"
            nbytes = min(len(line), size_left)
            size_left -= nbytes
            yield where, _parse_line(line, where), nbytes
    yield f"{path}:end", None, size_left


def _parse_line(line: bytes, where: str) -> Any:
    """The record on one line, or the ``RecordError`` that says why there is none (a record
    is never None: None marks the end of a file)."""
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        return RecordError(where, f"bad JSON ({err}); fix or remove the line", kind="bad_json")
    except RecursionError:
        return RecordError(where, "JSON nested deeper than Python's json reads (about 1,000 "
                                  "levels); flatten or remove the line", kind="bad_json")
    if record is None:
        return RecordError(where, "a record must be a JSON object, got null")
    return record
