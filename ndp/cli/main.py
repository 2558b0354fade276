"""The ``ndp`` command line: convert, export, index, inspect, verify, demo, explain (argument
parsing and exit statuses here; each command's work in ``ndp.cli.commands``, explain's in
``ndp.cli.explain``).

Environment and logging are set up here, at the entry point, never at import of the library.
Exit status: 0 success, 1 a check failed (verify or inspect found damage, or a file that holds
no valid packet; convert found its records unusable), 2 bad usage or input. Error messages
name this command line's options where the library's name the Python API's (``OPTIONS``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys

from ndp.cli import commands, explain
from ndp.errors import ConvertError, NDPError
from ndp.wire.format import Dst, Src

#: the Python API parameters that error messages name in backticks (``ndp.errors``) -> the
#: options that set them; `name=value` becomes "--option value" (`overwrite=True`: --overwrite)
OPTIONS = {
    "batch_size": "--batch-size",
    "batch_tokens": "--batch-tokens",
    "seq_len": "--seq-len",
    "crc_drop_rate": "--crc-drop-rate",
    "world_size": "--world-size",
    "cache_dir": "--cache-dir",
    "eos_token_id": "--eos-id",
    "fmt": "--format",
    "hf_split": "--hf-split",
    "max_files": "--max-files",
    "max_shard_bytes": "--shard-size-mb",
    "max_skipped": "--max-skipped",
    "max_tokens": "--max-tokens",
    "overflow": "--overflow",
    "overwrite": "--overwrite",
    "append": "--append",
    "shard_tokens": "--shard-tokens",
    "split": "--split",
    "storage_options": "--storage-options",
    "text_unit": "--text-unit",
    "token_width": "--token-width",
    "version": "--version",
}
_PARAM = re.compile(r"`(\w+)(?:=([^`]*))?`")
QUOTES = "'\""  # around a string value: `overflow='split'` is --overflow split


def cli_message(err: BaseException) -> str:
    """``err``'s message with each Python API parameter it names (`max_skipped`,
    `overwrite=True`) shown as the command line's option (--max-skipped, --overwrite)."""

    def option(match: re.Match) -> str:
        name, value = match.groups()
        if name not in OPTIONS:
            return match.group(0)
        if value is None or value == "True":
            return OPTIONS[name]
        return f"{OPTIONS[name]} {value.strip(QUOTES)}"

    return _PARAM.sub(option, str(err))


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _enum_arg(enum_type):
    def parse(text: str):
        try:
            return enum_type[text.upper()] if not text.isdigit() else enum_type(int(text))
        except (KeyError, ValueError):
            names = ", ".join(m.name for m in enum_type)
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {names}") from None

    return parse


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
        return version("neural-datagram")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown (not installed)"


def _remote_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage-options", type=json.loads, default=None, metavar="JSON",
                   help="for a URL (s3://bucket/prefix/, any fsspec URL): fsspec's options as "
                        "JSON, e.g. '{\"client_kwargs\": {\"endpoint_url\": \"http://...\"}}'")
    p.add_argument("--cache-dir", default=None,
                   help="where a URL's shards are downloaded to (default: NDP_CACHE_DIR, else "
                        "~/.cache/ndp)")


class _Parser(argparse.ArgumentParser):
    """argparse's parser, which keeps its last usage error (its subcommands' parsers are of
    its class) for ``main`` to give as JSON when ``--json`` was asked for."""

    last_error: str | None = None

    def error(self, message: str):  # type: ignore[override]
        _Parser.last_error = message
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ndp", description="Neural Datagram Protocol shards: convert, export, index, "
        "inspect, verify, and a demo of the whole path")
    parser.add_argument("--version", action="version", version=f"ndp {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("convert", help="JSONL / JSON / Parquet / Arrow / HF datasets / text / "
                                       "token files -> NDP shards")
    p.add_argument("inputs", nargs="+",
                   help="input files or directories: JSON Lines, JSON, CSV and TSV (one record "
                        "per row; each compressed or not), Parquet, Arrow, save_to_disk folders, "
                        "hf:NAME[@CONFIG] (a Hugging Face dataset in the local cache), plain "
                        "text, token files")
    p.add_argument("output", help="output directory for shards, indexes and ndp.json, or a URL "
                                  "(s3://bucket/prefix/: shards uploaded as finished, ndp.json last)")
    p.add_argument("--format", choices=("auto", "text", "llmc", "llmq", "raw-u16"),
                   default="auto",
                   help="input format; auto (default): llm.c / llm.q token files by their "
                        "header, anything else is text; raw-u16 (headerless) must be named")
    p.add_argument("--tokenizer", default=None,
                   help="text inputs: local Hugging Face tokenizer directory or cached name "
                        "(never downloaded); token files need none")
    p.add_argument("--split", choices=("auto", "before", "after", "none"), default="auto",
                   help="token files: documents start (before) or end (after) at each EOS/EOT; "
                        "auto: as an ndp export recorded in the llm.c header, else before for "
                        "llm.c, after for llm.q and raw")
    p.add_argument("--max-tokens", type=int, default=2048,
                   help="tokens per example, EOS included")
    p.add_argument("--straddle", choices=("prompt", "answer"), default="prompt",
                   help="SFT: who owns a token the tokenizer merged across a prompt/answer "
                        "boundary (often the answer's leading space): prompt (masked, the "
                        "default) or answer (trained); the summary counts such tokens")
    p.add_argument("--overflow", choices=("auto", "truncate", "split"), default="auto",
                   help="examples longer than --max-tokens: split (continued in further "
                        "packets) or truncate; auto (default): split plain-text documents "
                        "(pretraining), truncate chat, prompt/completion and alpaca examples")
    p.add_argument("--src", type=_enum_arg(Src), default="text_corpus",
                   help="where the data came from, written in every packet's SRC byte: "
                        + ", ".join(m.name.lower() for m in Src) + "; the Loader can mix "
                        "datasets by it (mix_by='src'); the tokens are the same whatever it is "
                        "(default: text_corpus)")
    p.add_argument("--dst", type=_enum_arg(Dst), default="embedding",
                   help="the layer the data is meant for, written in every packet's DST byte: "
                        + ", ".join(m.name.lower() for m in Dst) + "; recorded for your own "
                        "tools, ndp's loaders do not use it (default: embedding)")
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
                        "cut at (default: the id an ndp export recorded in the llm.c header, "
                        "else 50256 for llm.c version 1, else not cut)")
    p.add_argument("--overwrite", action="store_true", help="replace shards already in OUTPUT")
    p.add_argument("--append", action="store_true",
                   help="add the new shards to the dataset in OUTPUT (a new generation of its "
                        "manifest, atomic): resume states saved before go on exactly, and the "
                        "new shards join at the next epoch")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true",
                   help="machine-readable summary on stdout (no progress bar)")
    p.add_argument("--storage-options", type=json.loads, default=None, metavar="JSON",
                   help="for input and OUTPUT URLs (s3://bucket/prefix/): fsspec's options as JSON")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local (default): this process; ray: Ray Data tasks, one per input "
                        "file, on a local Ray or the cluster at --ray-address (pip install "
                        "'neural-datagram[ray]')")
    p.add_argument("--ray-address", default=None,
                   help="the Ray cluster (default: RAY_ADDRESS, else a local Ray)")
    p.add_argument("--ray-num-cpus", type=int, default=None,
                   help="CPUs of a local Ray (default: all of this machine's)")
    p.set_defaults(func=commands.run_convert)

    p = sub.add_parser("export", help="NDP shards -> llm.c token files")
    p.add_argument("data", nargs="+", help="NDP shards, directories of them, or dataset URLs")
    p.add_argument("-o", "--output", required=True,
                   help="llm.c file to write (with --shard-tokens: NAME_000000.bin, ...)")
    p.add_argument("--version", choices=("auto", "1", "2"), default="auto",
                   help="1: uint16 tokens, 2: uint32; auto (default): 1 if every id fits")
    p.add_argument("--shard-tokens", type=int, default=None,
                   help="split into files of at most this many tokens, each of whole documents "
                        "(a file is longer only when one document is; the summary counts them)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the llm.c files of an earlier export (never a device, FIFO, "
                        "socket, directory, other file, or one of the dataset's own files)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _remote_options(p)
    p.set_defaults(func=commands.run_export)

    p = sub.add_parser("index", help="rebuild sidecar indexes by a framing scan")
    p.add_argument("shards", nargs="+", help="shard files or directories")
    p.add_argument("--write-manifest", action="store_true",
                   help="also write each directory's ndp.json listing its shards as they are "
                        "now: commits a directory of shards without one as a dataset")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=commands.run_index)

    p = sub.add_parser("inspect", help="packet counts, tokens, lengths, corruption (exit 1 "
                                       "if a file has a problem, as verify)")
    p.add_argument("shards", nargs="+", help="shard files, directories or dataset URLs")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _remote_options(p)
    p.set_defaults(func=commands.run_inspect)

    p = sub.add_parser("verify", help="exit 1 on any corrupt packet or index mismatch")
    p.add_argument("shards", nargs="+", help="shard files, directories or dataset URLs")
    p.add_argument("--require-index", action="store_true",
                   help="fail a shard that has no .idx beside it (by default a missing index "
                        "is reported, and the packets are checked by a framing scan)")
    p.add_argument("--no-manifest", action="store_true",
                   help="check the shards of a directory as they are, without its ndp.json "
                        "(by default a directory must be the whole dataset its manifest lists)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _remote_options(p)
    p.set_defaults(func=commands.run_verify)

    p = sub.add_parser("demo", help="the embedded default job: stdlib corpus end to end, offline")
    p.add_argument("--workdir", default="ndp-demo", help="where to write")
    p.add_argument("--max-files", type=_at_least_one, default=None,
                   help="use only the first N files (default: every file)")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=commands.run_demo)
    explain.add(sub)
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
    # with --json a script reads stdout: an error is a JSON object there too, not nothing
    as_json = "--json" in (sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        if as_json and exc.code not in (0, None):
            _json_error(f"usage: {_Parser.last_error}", int(exc.code))
        raise

    def fail(message: str, code: int) -> int:
        print(f"ndp {args.command}: error: {message}", file=sys.stderr)
        if getattr(args, "json", False):
            _json_error(message, code)
        return code

    try:
        return args.func(args)
    except ConvertError as err:  # the inputs' records were unusable: like damage found
        return fail(cli_message(err), 1)
    except NDPError as err:
        return fail(cli_message(err), 2)
    except BrokenPipeError:  # the reader left (``ndp inspect ... | head``): not an error
        # of ndp's; stdout to /dev/null so that Python's exit flush does not fail again, and
        # the status a command killed by SIGPIPE has (128 + 13)
        with contextlib.suppress(OSError, ValueError):  # a stdout with no file (tests)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as err:  # a path that cannot be read or written: the user's to fix
        where = f"{err.filename}: " if err.filename else ""
        return fail(f"{where}{err.strerror or err} (check the path and its permissions)", 2)
    except KeyboardInterrupt:
        return 130


def _json_error(message: str, code: int) -> None:
    """An error as the JSON a ``--json`` caller reads from stdout."""
    print(json.dumps({"error": message, "exit": code}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
