"""The ``ndp`` subcommands' work: what each command does once its arguments are parsed
(``ndp.cli.main`` parses them and maps errors to exit statuses: 0 success, 1 a check failed or the
inputs' records were unusable, 2 bad usage or input).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from ndp.errors import NDPError
from ndp.wire.format import SHARD_SUFFIX

def _remote(url: str, args: argparse.Namespace):
    from ndp.store.remote import RemoteDataset

    return RemoteDataset(url, storage_options=getattr(args, "storage_options", None),
                         cache_dir=getattr(args, "cache_dir", None))


def _shard_paths(paths: list[str], args: argparse.Namespace | None = None) -> list[Path]:
    """Shards named directly, every shard inside a directory, or every shard of a dataset URL
    (downloaded into the cache, checked against its manifest); ``ConfigError`` for a path
    that does not exist or a directory without shards, ``ShardFormatError`` for one that is not
    a regular file (a FIFO named ``*.ndp`` would block the first open, so it is stat'ed)."""
    from ndp.errors import ConfigError
    from ndp.store.files import regular_file
    from ndp.store.remote import is_url

    out: list[Path] = []
    for p in paths:
        if is_url(p):
            out.extend(_remote(p, args).fetch_all(progress=sys.stderr.isatty()))
            continue
        p = Path(p)
        if p.is_dir():
            found = sorted(p.glob(f"*{SHARD_SUFFIX}"))
            if not found:
                raise ConfigError(f"{p}: no *{SHARD_SUFFIX} shards in this directory")
            out.extend(found)
        elif p.exists():
            out.append(p)
        else:
            raise ConfigError(f"{p}: no such shard or directory")
    for p in out:
        regular_file(p)
    return out


def _input_format(args: argparse.Namespace) -> str:
    """``text`` or a token-file format: as ``--format`` says, else from the inputs' headers."""
    from ndp.convert.sources import expand_inputs
    from ndp.convert.tokenfiles import detect_token_format
    from ndp.errors import ConfigError

    if args.format != "auto":
        return args.format
    found = {p: detect_token_format(p) if isinstance(p, Path) and p.is_file() else None
             for p in expand_inputs(args.inputs, storage_options=args.storage_options)}
    tokens = [p for p, f in found.items() if f]
    text = [p for p, f in found.items() if not f]
    if tokens and text:
        raise ConfigError(
            f"inputs mix token files ({tokens[0]}) with other files ({text[0]}); convert them "
            "separately, or name the format with --format"
        )
    return "auto" if tokens else "text"


def run_convert(args: argparse.Namespace) -> int:
    from ndp.convert import ConvertOptions, convert
    from ndp.errors import ConfigError

    fmt = _input_format(args)
    if args.append and (fmt != "text" or args.engine == "ray"):
        raise ConfigError("--append adds text inputs (JSONL, Parquet, Arrow, text) converted "
                          "with the local engine; convert token files, or with --engine ray, "
                          "into a directory of their own and read both")
    if fmt != "text" and args.engine == "ray":
        raise ConfigError("--engine ray converts text inputs (JSONL, Parquet, Arrow, text); "
                          "token files are converted without a tokenizer: drop --engine")
    if fmt != "text":
        from ndp.convert.token_import import convert_token_files

        summary = convert_token_files(
            args.inputs, args.output, fmt=fmt, eos_token_id=args.eos_id, split=args.split,
            src=args.src, dst=args.dst, max_shard_bytes=int(args.shard_size_mb * (1 << 20)),
            overwrite=args.overwrite, progress=not args.no_progress and not args.json,
            storage_options=args.storage_options,
        )
        print(json.dumps(asdict(summary), indent=2) if args.json else summary.describe())
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
        append=args.append,
        progress=not args.no_progress and not args.json,
        fields={name: column for name, column in (
            ("text", args.text_field), ("messages", args.messages_field),
            ("prompt", args.prompt_field), ("completion", args.completion_field)) if column},
        max_skipped=args.max_skipped,
        straddle=args.straddle,
        hf_split=args.hf_split,
        storage_options=args.storage_options,
    )
    if args.engine == "ray":  # a ConvertError (unusable records) is exit 1 (ndp.cli.main)
        from ndp.convert.ray_engine import convert_ray

        summary = convert_ray(args.inputs, args.output, tokenizer=args.tokenizer,
                              options=opts, address=args.ray_address,
                              num_cpus=args.ray_num_cpus)
    else:
        summary = convert(args.inputs, args.output, tokenizer=args.tokenizer, options=opts)
    print(json.dumps(asdict(summary), indent=2) if args.json else summary.describe())
    return 0


def run_export(args: argparse.Namespace) -> int:
    from ndp.convert.export_llmc import export_llmc

    version = args.version if args.version == "auto" else int(args.version)
    summary = export_llmc(args.data, args.output, version=version,
                          storage_options=args.storage_options, cache_dir=args.cache_dir,
                          shard_tokens=args.shard_tokens, overwrite=args.overwrite,
                          progress=not args.no_progress and not args.json)
    if args.json:
        print(json.dumps(asdict(summary), indent=2))
        return 0
    print(summary.describe())
    for path in summary.files:
        print(f"  {path}")
    return 0


def _build_index(shard):
    """Scan ``shard`` (one blocked read: ``ndp.store.framing``, so a shard cut meanwhile is a
    ``ShardChangedError``, never a SIGBUS) and write its sidecar index; the index and the
    corrupt regions the scan stepped over."""
    from ndp.store.framing import scan_blocks
    from ndp.store.index import Corruption, Index, write_index
    from ndp.wire.format import DropReason

    entries, corrupt, crc = scan_blocks(shard)  # crc32: the file's own, from the same read
    index = Index(entries, shard.size, crc, shard.header.data_offset)
    write_index(shard.index_path, index.entries, index.shard_size, index.shard_crc32,
                index.data_offset)
    return index, [Corruption(o, n, DropReason(r)) for o, n, r in corrupt]


def run_index(args: argparse.Namespace) -> int:
    from ndp.errors import ConfigError
    from ndp.store.manifest import shard_entry, write_manifest
    from ndp.store.shard import Shard

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
        try:
            index, corrupt = _build_index(shard)
        finally:
            shard.close()
        built[path] = shard_entry(path, shard.size, len(index), index.shard_crc32)
        say(f"{path}: {len(index)} packets indexed -> {shard.index_path}")
        report["shards"].append({"path": str(path), "packets": len(index),
                                 "index": str(shard.index_path),
                                 "corrupt": [c.describe() for c in corrupt]})
        for c in corrupt:
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
    from ndp.store.manifest import read_manifest

    try:
        return read_manifest(directory)
    except NDPError:
        return None


def _print_report(report) -> None:
    print(f"{report.path}: {report.size:,} bytes, format version {report.version or 'none (headerless)'}")
    print(f"  packets {report.packets:,}  tokens {report.tokens:,}  index {report.index.split(':')[0]}")
    if report.continued:
        print(f"  split documents: {report.continued:,} packets continue the one before them")
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


def run_inspect(args: argparse.Namespace) -> int:
    from ndp.cli.inspect import inspect_shard

    reports = [inspect_shard(p) for p in _shard_paths(args.shards, args)]
    if args.json:
        print(json.dumps([asdict(r) for r in reports], indent=2))
    else:
        for r in reports:
            _print_report(r)
    return 0 if all(r.ok for r in reports) else 1  # a check failed, as verify says


def _manifest_problems(directory: Path, no_manifest: bool) -> tuple[list[str], dict]:
    """Why ``directory`` is not the whole dataset its manifest lists (one line each), and its
    entries by shard name (to compare each shard's size and crc32 with)."""
    from ndp.errors import ManifestError
    from ndp.store.manifest import entries_by_name, listed_shards

    if no_manifest:
        return [], {}
    try:
        _, record = listed_shards(directory)
    except ManifestError as exc:
        record = read_manifest_or_none(directory)
        return [str(exc)], entries_by_name(record) if record else {}
    return [], entries_by_name(record)


def run_verify(args: argparse.Namespace) -> int:
    from ndp.errors import RemoteError
    from ndp.cli.inspect import inspect_shard
    from ndp.store.remote import is_url

    failed = 0
    say = (lambda *a: None) if args.json else print
    results: list[dict] = []
    paths: list[Path] = []
    entries: dict[Path, dict] = {}
    for url in (p for p in args.shards if is_url(p)):  # each shard checked as it is fetched
        dataset = _remote(url, args)
        for entry, shard in zip(dataset.entries, dataset.shards):
            try:
                paths.append(dataset.fetch(entry))
            except RemoteError as exc:
                failed += 1
                results.append({"path": shard.url, "kind": "shard", "ok": False,
                                "problems": [str(exc)]})
                say(f"FAIL  {exc}")
    paths += _shard_paths([p for p in args.shards if not is_url(p)])
    for directory in (Path(p) for p in args.shards if not is_url(p) and Path(p).is_dir()):
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
            elif report.crc32 is not None and report.crc32 != entry["crc32"]:
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


def run_demo(args: argparse.Namespace) -> int:
    from ndp.cli.demo import run_demo

    run_demo(args.workdir, max_files=args.max_files, vocab_size=args.vocab_size,
             progress=not args.no_progress)
    return 0
