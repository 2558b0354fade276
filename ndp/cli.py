"""The ``ndp`` command line: convert, export, index, inspect, verify, demo.

Environment and logging are set up here, at the entry point, never at import of the library.
Exit status: 0 success, 1 a check failed (verify found damage), 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import asdict
from pathlib import Path

from ndp.errors import NDPError
from ndp.format import SHARD_SUFFIX, Dst, Src


def _enum_arg(enum_type):
    def parse(text: str):
        try:
            return enum_type[text.upper()] if not text.isdigit() else enum_type(int(text))
        except (KeyError, ValueError):
            names = ", ".join(m.name for m in enum_type)
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {names}") from None

    return parse


def _shard_paths(paths: list[str]) -> list[Path]:
    """Shards named directly, or every shard inside a directory; ``ConfigError`` for a path
    that does not exist or a directory without shards."""
    from ndp.errors import ConfigError

    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob(f"*{SHARD_SUFFIX}"))
            if not found:
                raise ConfigError(f"{p}: no *{SHARD_SUFFIX} shards in this directory")
            out.extend(found)
        elif p.exists():
            out.append(p)
        else:
            raise ConfigError(f"{p}: no such shard or directory")
    return out


def _input_format(args: argparse.Namespace) -> str:
    """``text`` or a token-file format: as ``--format`` says, else from the inputs' headers."""
    from ndp.convert.sources import expand_inputs
    from ndp.convert.tokenfiles import detect_token_format
    from ndp.errors import ConfigError

    if args.format != "auto":
        return args.format
    found = {p: detect_token_format(p) if isinstance(p, Path) and p.is_file() else None
             for p in expand_inputs(args.inputs)}
    tokens = [p for p, f in found.items() if f]
    text = [p for p, f in found.items() if not f]
    if tokens and text:
        raise ConfigError(
            f"inputs mix token files ({tokens[0]}) with other files ({text[0]}); convert them "
            "separately, or name the format with --format"
        )
    return "auto" if tokens else "text"


def _cmd_convert(args: argparse.Namespace) -> int:
    from ndp.convert import ConvertOptions, convert
    from ndp.errors import ConfigError, ConvertError

    fmt = _input_format(args)
    if fmt != "text":
        from ndp.convert.token_import import convert_token_files

        summary = convert_token_files(
            args.inputs, args.output, fmt=fmt, eos_token_id=args.eos_id, split=args.split,
            src=args.src, dst=args.dst, max_shard_bytes=int(args.shard_size_mb * (1 << 20)),
            overwrite=args.overwrite, progress=not args.no_progress,
        )
        print(summary.describe())
        return 0
    if args.tokenizer is None:
        raise ConfigError(
            "text inputs (JSONL, Parquet, plain text) need --tokenizer; llm.c and llm.q token "
            "files are recognised by their headers, raw uint16 tokens need --format raw-u16"
        )
    opts = ConvertOptions(
        max_tokens=args.max_tokens,
        overflow=args.overflow,
        src=args.src,
        dst=args.dst,
        token_width=args.token_width,
        strict=args.strict,
        batch_size=args.batch_size,
        max_shard_bytes=int(args.shard_size_mb * (1 << 20)),
        text_unit=args.text_unit,
        eos_token_id=args.eos_id,
        overwrite=args.overwrite,
        progress=not args.no_progress,
        fields={name: column for name, column in (
            ("text", args.text_field), ("messages", args.messages_field),
            ("prompt", args.prompt_field), ("completion", args.completion_field)) if column},
        max_skipped=args.max_skipped,
        hf_split=args.hf_split,
    )
    try:
        summary = convert(args.inputs, args.output, tokenizer=args.tokenizer, options=opts)
    except ConvertError as err:  # the inputs' records: like damage found, exit 1
        print(f"ndp convert: {err}", file=sys.stderr)
        return 1
    print(summary.describe())
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from ndp.convert.export_llmc import export_llmc

    version = args.version if args.version == "auto" else int(args.version)
    summary = export_llmc(args.data, args.output, version=version,
                          shard_tokens=args.shard_tokens, overwrite=args.overwrite,
                          progress=not args.no_progress and not args.json)
    if args.json:
        print(json.dumps(asdict(summary), indent=2))
        return 0
    print(summary.describe())
    for path in summary.files:
        print(f"  {path}")
    return 0


def _cmd_index(args: argparse.Namespace) -> int:
    from ndp.errors import ConfigError
    from ndp.index import build_index
    from ndp.manifest import shard_entry, write_manifest
    from ndp.shard import Shard

    if args.write_manifest:
        for directory in map(Path, args.shards):
            if not directory.is_dir():
                raise ConfigError(f"{directory}: --write-manifest commits a directory of shards; "
                                  f"name the directory")
    status = 0
    say = (lambda *a: None) if args.json else print
    report = {"shards": [], "manifests": []}
    built = {}
    for path in _shard_paths(args.shards):
        shard = Shard(path)
        index, result = build_index(shard)  # a full scan: its crc32 is the file's own
        built[path] = shard_entry(path, shard.size, len(index), index.shard_crc32)
        say(f"{path}: {len(index)} packets indexed -> {shard.index_path}")
        report["shards"].append({"path": str(path), "packets": len(index),
                                 "index": str(shard.index_path),
                                 "corrupt": [c.describe() for c in result.corrupt]})
        for c in result.corrupt:
            say(f"  {c.describe()}")
            status = 1
    if args.write_manifest:
        for directory in map(Path, args.shards):
            entries = [built[p] for p in sorted(directory.glob(f"*{SHARD_SUFFIX}"))]
            record = {k: v for k, v in (read_manifest_or_none(directory) or {}).items()
                      if k != "shards"}
            path = write_manifest(directory, {**record, "shards": entries})
            report["manifests"].append({"path": str(path), "shards": len(entries)})
            say(f"{path}: committed {len(entries)} shard(s) as they are now "
                f"(the dataset is what these shards hold; check it with 'ndp verify')")
    if args.json:
        print(json.dumps(report, indent=2))
    return status


def read_manifest_or_none(directory: Path) -> dict | None:
    """A directory's manifest, or None if it has none or it cannot be read."""
    from ndp.manifest import read_manifest

    try:
        return read_manifest(directory)
    except NDPError:
        return None


def _print_report(report) -> None:
    print(f"{report.path}: {report.size:,} bytes, format version {report.version or 'none (headerless)'}")
    print(f"  packets {report.packets:,}  tokens {report.tokens:,}  index {report.index.split(':')[0]}")
    for title, counts in (("SRC", report.by_src), ("DST", report.by_dst), ("TYP", report.by_typ)):
        print(f"  {title}: " + (", ".join(f"{k} {v:,}" for k, v in counts.items()) or "-"))
    if report.length_histogram:
        print("  tokens per packet:")
        peak = max(report.length_histogram.values())
        for bucket, n in report.length_histogram.items():
            print(f"    {bucket:>13}  {n:>9,}  {'#' * max(1, 40 * n // peak)}")
    if report.dropped:
        print("  dropped by the decoder: " + ", ".join(f"{k} {v:,}" for k, v in report.dropped.items()))
    print(f"  corrupt: {report.corrupt_regions} region(s), {report.corrupt_bytes:,} bytes")
    for problem in report.problems[:50]:
        print(f"  ! {problem}")
    if len(report.problems) > 50:
        print(f"  ! ... {len(report.problems) - 50} more")


def _cmd_inspect(args: argparse.Namespace) -> int:
    from ndp.inspect import inspect_shard

    reports = [inspect_shard(p) for p in _shard_paths(args.shards)]
    if args.json:
        print(json.dumps([asdict(r) for r in reports], indent=2))
    else:
        for r in reports:
            _print_report(r)
    return 0


def _manifest_problems(directory: Path, no_manifest: bool) -> tuple[list[str], dict]:
    """Why ``directory`` is not the whole dataset its manifest lists (one line each), and its
    entries by shard name (to compare each shard's size and crc32 with)."""
    from ndp.errors import ManifestError
    from ndp.manifest import entries_by_name, listed_shards

    if no_manifest:
        return [], {}
    try:
        _, record = listed_shards(directory)
    except ManifestError as exc:
        record = read_manifest_or_none(directory)
        return [str(exc)], entries_by_name(record) if record else {}
    return [], entries_by_name(record)


def _cmd_verify(args: argparse.Namespace) -> int:
    from ndp.inspect import inspect_shard
    from ndp.shard import Shard

    failed = 0
    say = (lambda *a: None) if args.json else print
    results: list[dict] = []
    paths = _shard_paths(args.shards)
    entries: dict[Path, dict] = {}
    for directory in (Path(p) for p in args.shards if Path(p).is_dir()):
        problems, by_name = _manifest_problems(directory, args.no_manifest)
        entries.update({directory / name: e for name, e in by_name.items()})
        if not args.no_manifest:
            results.append({"path": str(directory), "kind": "manifest", "ok": not problems,
                            "problems": problems})
        for problem in problems:
            failed += 1
            say(f"FAIL  {problem}")
    for path in paths:
        report = inspect_shard(path, require_index=args.require_index)
        entry = entries.get(path)
        if entry is not None:
            if report.size != entry["bytes"]:
                report.problems.append(f"{report.size:,} bytes where the manifest recorded "
                                       f"{entry['bytes']:,} (cut, extended or replaced)")
            elif Shard(path).crc32() != entry["crc32"]:
                report.problems.append("crc32 differs from the manifest's: changed after the "
                                       "dataset was written")
        results.append({"path": str(path), "kind": "shard", "ok": report.ok,
                        "packets": report.packets, "tokens": report.tokens,
                        "index": report.index, "problems": report.problems})
        if report.ok:
            note = ("; no index (packets checked by a framing scan; `ndp index` writes one)"
                    if report.index == "missing" else "")
            say(f"OK    {path}: {report.packets:,} packets, {report.tokens:,} tokens{note}")
            continue
        failed += 1
        say(f"FAIL  {path}: {len(report.problems)} problem(s)")
        for problem in report.problems:
            say(f"      {problem}")
    checked = len(results)
    if args.json:
        print(json.dumps({"passed": checked - failed, "failed": failed, "checked": results},
                         indent=2))
    else:
        print(f"{checked - failed} passed, {failed} failed")
    return 1 if failed else 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from ndp.demo import run_demo

    run_demo(args.workdir, max_files=args.max_files, vocab_size=args.vocab_size,
             progress=not args.no_progress)
    return 0


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default in ``--help``, unless it has none (None, off) or its help
    says it already."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ndp")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ndp", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"ndp {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("convert", help="JSONL / JSON / Parquet / Arrow / HF datasets / text / "
                                       "token files -> NDP shards")
    p.add_argument("inputs", nargs="+",
                   help="input files or directories: JSON Lines and JSON (compressed or not), "
                        "Parquet, Arrow, save_to_disk folders, hf:NAME[@CONFIG] (a Hugging "
                        "Face dataset in the local cache), plain text, token files")
    p.add_argument("output", help="output directory for shards, indexes and ndp.json")
    p.add_argument("--format", choices=("auto", "text", "llmc", "llmq", "raw-u16"),
                   default="auto",
                   help="input format; auto (default): llm.c / llm.q token files by their "
                        "header, anything else is text; raw-u16 (headerless) must be named")
    p.add_argument("--tokenizer", default=None,
                   help="text inputs: local Hugging Face tokenizer directory or cached name "
                        "(never downloaded); token files need none")
    p.add_argument("--split", choices=("auto", "before", "after", "none"), default="auto",
                   help="token files: documents start (before) or end (after) at each EOS/EOT; "
                        "auto: before for llm.c, after for llm.q and raw")
    p.add_argument("--max-tokens", type=int, default=2048,
                   help="tokens per example, EOS included")
    p.add_argument("--overflow", choices=("truncate", "split"), default="truncate",
                   help="longer examples: truncate (default, SFT) or split into packets (pretraining)")
    p.add_argument("--src", type=_enum_arg(Src), default="text_corpus",
                   help="SRC tag: " + ", ".join(m.name.lower() for m in Src))
    p.add_argument("--dst", type=_enum_arg(Dst), default="embedding",
                   help="DST tag: " + ", ".join(m.name.lower() for m in Dst))
    p.add_argument("--token-width", type=int, choices=(0, 2, 4), default=0,
                   help="bytes per token; 0 = 2 if the vocabulary fits, else 4")
    p.add_argument("--strict", action="store_true",
                   help="stop at the first bad record, and refuse fields no schema has "
                        "(by default other columns, such as id or url, are ignored)")
    for name, example in (("text", "content"), ("messages", "conversations"),
                          ("prompt", "question"), ("completion", "answer")):
        p.add_argument(f"--{name}-field", default=None, metavar="COLUMN",
                       help=f"read COLUMN as the records' {name} (e.g. {example})")
    p.add_argument("--max-skipped", type=float, default=0.01, metavar="SHARE",
                   help="fail (exit 1, nothing written) if more than this share of the records "
                        "is skipped as bad")
    p.add_argument("--hf-split", default="train",
                   help="the split of a DatasetDict save_to_disk folder or an hf: dataset")
    p.add_argument("--batch-size", type=int, default=512, help="records per tokenizer call")
    p.add_argument("--shard-size-mb", type=float, default=256, help="roll over at this size")
    p.add_argument("--text-unit", choices=("file", "line"), default="file",
                   help="plain text inputs: one document per file or per line")
    p.add_argument("--eos-id", "--eos-token-id", dest="eos_id", type=int, default=None,
                   help="EOS id if the tokenizer has none; token files: the id documents are "
                        "cut at (default 50256 for llm.c version 1, else not cut)")
    p.add_argument("--overwrite", action="store_true", help="replace shards already in OUTPUT")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser("export", help="NDP shards -> llm.c token files")
    p.add_argument("data", nargs="+", help="NDP shards or directories of them")
    p.add_argument("-o", "--output", required=True,
                   help="llm.c file to write (with --shard-tokens: NAME_000000.bin, ...)")
    p.add_argument("--version", choices=("auto", "1", "2"), default="auto",
                   help="1: uint16 tokens, 2: uint32; auto (default): 1 if every id fits")
    p.add_argument("--shard-tokens", type=int, default=None,
                   help="split into files of this many tokens")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the files of an earlier export")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("index", help="rebuild sidecar indexes by a framing scan")
    p.add_argument("shards", nargs="+", help="shard files or directories")
    p.add_argument("--write-manifest", action="store_true",
                   help="also write each directory's ndp.json listing its shards as they are "
                        "now: commits a directory of shards without one as a dataset")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_index)

    p = sub.add_parser("inspect", help="packet counts, tokens, lengths, corruption")
    p.add_argument("shards", nargs="+", help="shard files or directories")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("verify", help="exit 1 on any corrupt packet or index mismatch")
    p.add_argument("shards", nargs="+", help="shard files or directories")
    p.add_argument("--require-index", action="store_true",
                   help="fail a shard that has no .idx beside it (by default a missing index "
                        "is reported, and the packets are checked by a framing scan)")
    p.add_argument("--no-manifest", action="store_true",
                   help="check the shards of a directory as they are, without its ndp.json "
                        "(by default a directory must be the whole dataset its manifest lists)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("demo", help="the embedded default job: stdlib corpus end to end, offline")
    p.add_argument("--workdir", default="ndp-demo", help="where to write")
    p.add_argument("--max-files", type=int, default=None, help="use only the first N files")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_demo)
    for command in sub.choices.values():
        command.formatter_class = _Help
    return parser


def _log_to_stderr() -> None:
    """Show ndp's own INFO messages on stderr. Only the ``ndp`` logger is configured: setting the
    root logger to INFO (as ``logging.basicConfig`` would) also shows every library's INFO
    messages, Numba's CUDA driver's among them, in the caller's process (a notebook that calls
    ``main`` included)."""
    log = logging.getLogger("ndp")
    if not log.hasHandlers():  # nobody configured logging: print ndp's own messages
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``ndp`` console script."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # ndp never downloads a tokenizer
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    _log_to_stderr()
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except NDPError as err:
        print(f"ndp {args.command}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a path that cannot be read or written: the user's to fix
        where = f"{err.filename}: " if err.filename else ""
        print(f"ndp {args.command}: error: {where}{err.strerror or err} (check the path and "
              f"its permissions)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
