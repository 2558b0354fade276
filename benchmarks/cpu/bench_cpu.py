"""CPU decode, converter and loader throughput, written as JSON.

    python benchmarks/cpu/bench_cpu.py                 # full grid (a few minutes on 2 cores)
    python benchmarks/cpu/bench_cpu.py --quick         # smaller data, for a smoke run
    python benchmarks/cpu/bench_cpu.py --only loader   # one section (decode, crc, convert, loader)
    python benchmarks/cpu/bench_cpu.py --out benchmarks/results   # adds to the project's record

``cpu-<time>.json`` goes to ``--out`` (default ``$NDP_RESULTS_DIR``, else ``./ndp-results``;
see ``harness.py``); an ``--out`` ending in ``.json`` names the file itself.

Decode is timed on synthetic shards of full-length packets (every row holds ``seq`` real
tokens, so tokens/s counts only real tokens), with CRC validation on, reusing output buffers the
way a training loop does. Each figure is the best of ``--repeats`` passes over the whole shard
after one warm-up pass (Numba compile and page faults excluded). The crc section times the
host's CRC loop (``crc16_update_host``) against its slice-by-16 table loop alone on one thread,
over ranges of each length walking a 64 KiB buffer, in a compiled loop. The converter is timed on the
standard library corpus of ``ndp demo`` with its trained tokenizer. The loader is timed end to
end: ``ndp.Loader`` over shard files on disk (page cache warm), CPU backend, torch tensors out,
one epoch per mode after a warm-up epoch, with the consumer's ``next()`` timed on its own.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ndp.engine.reference import PaddedBuffers, decode_packed, decode_padded, validate
from ndp.kernels._jit import cpu_kernel
from ndp.kernels.clmul import HAS_CLMUL
from ndp.kernels.crc16 import CRC16_TABLES, crc16_update_host, crc16_update_tables
from ndp.wire.packet import encode_tokens

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import OUT_HELP, add_out_argument, command, machine, write_report  # noqa: E402


def synthetic_shard(n_packets: int, seq: int, width: int, masked: bool, seed: int = 0):
    """A shard of ``n_packets`` packets of ``seq`` random tokens; returns (bytes, offsets)."""
    rng = np.random.default_rng(seed)
    high = 50_000 if width == 2 else 150_000
    proto = []
    for _ in range(64):  # 64 distinct packets repeated: enough variety, fast to build
        mask = (np.arange(seq) >= seq // 4) if masked else None
        proto.append(encode_tokens(rng.integers(0, high, seq), width=width, mask=mask))
    packets = [proto[i % 64] for i in range(n_packets)]
    data = np.frombuffer(b"".join(packets), dtype=np.uint8)
    sizes = np.array([len(p) for p in packets], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return data, offsets


@cpu_kernel
def _crc_bytewise(data, offsets, tables):  # the per-byte table CRC, for comparison
    acc = 0
    for k in range(offsets.shape[0]):
        off = offsets[k]
        n = (np.int64(data[off + 4]) << 8) | np.int64(data[off + 5])
        crc = np.uint32(0xFFFF)
        for i in range(off, off + 6 + n):
            crc = ((crc << np.uint32(8)) & np.uint32(0xFFFF)) ^ tables[
                0, ((crc >> np.uint32(8)) ^ np.uint32(data[i])) & np.uint32(0xFF)]
        acc ^= crc
    return acc


@cpu_kernel
def _crc_ranges_host(buf, n, reps, tables):  # pragma: no cover - compiled
    acc = np.uint32(0)
    for r in range(reps):
        off = (r * 64) % (buf.shape[0] - n)
        acc ^= crc16_update_host(np.uint32(0xFFFF), buf, off, off + n, tables)
    return acc


@cpu_kernel
def _crc_ranges_tables(buf, n, reps, tables):  # pragma: no cover - compiled
    acc = np.uint32(0)
    for r in range(reps):
        off = (r * 64) % (buf.shape[0] - n)
        acc ^= crc16_update_tables(np.uint32(0xFFFF), buf, off, off + n, tables)
    return acc


def bench_crc(repeats: int) -> dict:
    buf = np.random.default_rng(0).integers(0, 256, 1 << 16, dtype=np.uint8)
    rows = []
    for n in (64, 128, 256, 512, 1024, 2048, 4096, 8192):
        reps = max(1000, (50 << 20) // n)
        table_s = best_of(lambda: _crc_ranges_tables(buf, n, reps, CRC16_TABLES), repeats)
        host_s = best_of(lambda: _crc_ranges_host(buf, n, reps, CRC16_TABLES), repeats)
        rows.append({"range_bytes": n, "tables_gb_per_s": reps * n / table_s / 1e9,
                     "host_gb_per_s": reps * n / host_s / 1e9})
        print(f"crc over {n:5d} B ranges: slice-by-16 {rows[-1]['tables_gb_per_s']:5.2f} GB/s  "
              f"host loop {rows[-1]['host_gb_per_s']:5.2f} GB/s", flush=True)
    return {"clmul": HAS_CLMUL, "threads": 1, "ranges": rows}


def best_of(fn, repeats: int) -> float:
    fn()  # warm-up: compile, fault in pages
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def bench_decode(n_packets: int, seq: int, batch: int, repeats: int) -> list[dict]:
    rows = []
    for width in (2, 4):
        for masked in (False, True):
            data, offsets = synthetic_shard(n_packets, seq, width, masked)
            tokens = n_packets * seq
            status = np.empty(n_packets, np.uint8)
            crc_s = best_of(lambda: validate(data, offsets, out=status), repeats)
            assert (status == 0).all()
            buffers = PaddedBuffers.allocate(batch, seq)

            def padded():
                for i in range(0, n_packets, batch):
                    decode_padded(data, offsets[i: i + batch], seq_len=seq, out=buffers)

            pad_s = best_of(padded, repeats)
            x = np.empty((batch, seq), np.int64)
            y = np.empty((batch, seq), np.int64)
            chunk = batch + 1  # packets per call: enough tokens for `batch` windows + 1

            def packed():
                for i in range(0, n_packets - chunk + 1, batch):
                    decode_packed(data, offsets[i: i + chunk], batch_size=batch, seq_len=seq,
                                  out=(x, y))

            pk_s = best_of(packed, repeats)
            pk_tokens = len(range(0, n_packets - chunk + 1, batch)) * batch * seq
            row = {
                "token_width": width, "masked": masked, "packets": n_packets, "seq": seq,
                "batch": batch, "shard_bytes": int(data.size),
                "validate_tokens_per_s": tokens / crc_s,
                "validate_gb_per_s": data.size / crc_s / 1e9,
                "padded_tokens_per_s": tokens / pad_s,
                "packed_tokens_per_s": pk_tokens / pk_s,
            }
            if width == 4 and not masked:
                bw_s = best_of(lambda: _crc_bytewise(data, offsets, CRC16_TABLES), repeats)
                row["bytewise_crc_tokens_per_s"] = tokens / bw_s
            rows.append(row)
            print(f"width {width} masked {masked!s:5}: validate {row['validate_tokens_per_s'] / 1e6:7.0f} M tok/s "
                  f"({row['validate_gb_per_s']:.2f} GB/s)  padded {row['padded_tokens_per_s'] / 1e6:6.0f} M tok/s  "
                  f"packed {row['packed_tokens_per_s'] / 1e6:6.0f} M tok/s"
                  + (f"  [per-byte CRC {row['bytewise_crc_tokens_per_s'] / 1e6:.0f} M tok/s]"
                     if "bytewise_crc_tokens_per_s" in row else ""), flush=True)
    return rows


def bench_convert(max_files: int | None) -> dict:
    from ndp.convert import ConvertOptions, convert
    from ndp.cli.demo import build_corpus, stdlib_files, train_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        files = stdlib_files(max_files)
        code, sft, nbytes = build_corpus(tmp, files)
        texts = [json.loads(line)["text"] for line in open(code)][:200]
        tok_dir = train_tokenizer(texts, tmp / "tok")
        out = {}
        for name, path, opts in (
            ("code", code, ConvertOptions(max_tokens=2048, overflow="split", progress=False)),
            ("sft", sft, ConvertOptions(max_tokens=1024, progress=False)),
        ):
            s = convert([path], tmp / name, tokenizer=str(tok_dir), options=opts)
            out[name] = {"input_mb": s.input_bytes / 1e6, "examples": s.examples,
                         "tokens": s.tokens, "seconds": s.seconds,
                         "tokens_per_s": s.tokens / s.seconds,
                         "examples_per_s": s.examples / s.seconds,
                         "input_mb_per_s": s.input_bytes / 1e6 / s.seconds}
            print(f"convert {name}: {s.examples:,} examples, {s.tokens:,} tokens in {s.seconds:.1f} s "
                  f"= {out[name]['tokens_per_s'] / 1e6:.2f} M tok/s, {out[name]['input_mb_per_s']:.1f} MB/s",
                  flush=True)
        return out


def bench_loader(n_packets: int, seq: int, batch: int) -> list[dict]:
    """``ndp.Loader`` end to end: tokens/s delivered as torch tensors and next() latency."""
    from ndp.loader.loader import Loader
    from ndp.store.writer import ShardWriter

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(0)
        proto = [encode_tokens(rng.integers(0, 150_000, seq), width=4) for _ in range(64)]
        with ShardWriter(tmp, max_shard_bytes=64 << 20) as writer:
            for i in range(n_packets):
                writer.write(proto[i % 64])
        for mode, seq_len in (("padded", seq), ("packed", seq), ("packing", seq)):
            loader = Loader(tmp, mode=mode, batch_size=batch, seq_len=seq_len, backend="cpu",
                            seed=0)
            for _ in loader:  # warm-up epoch: compile, page in
                pass
            before = loader.stats.tokens
            latencies = []
            cpu0, t0 = time.process_time(), time.perf_counter()
            it = iter(loader)
            while True:
                t = time.perf_counter()
                try:
                    batch_out = next(it)
                except StopIteration:
                    break
                latencies.append(time.perf_counter() - t)
                del batch_out
            wall = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
            tokens = loader.stats.tokens - before  # the timed epoch's
            loader.close()
            lat = np.array(latencies) * 1e6
            row = {"mode": mode, "packets": n_packets, "seq_len": seq_len, "batch": batch,
                   "prefetch": loader.prefetch, "chunk_batches": loader.chunk_batches,
                   "batches": len(latencies), "tokens": tokens,
                   "tokens_per_s": tokens / wall, "next_p50_us": float(np.percentile(lat, 50)),
                   "next_p99_us": float(np.percentile(lat, 99)),
                   "host_cpu_s_per_billion_tokens": cpu / tokens * 1e9}
            rows.append(row)
            print(f"loader {mode:8s}: {row['tokens_per_s'] / 1e6:7.0f} M tok/s  next() p50 "
                  f"{row['next_p50_us']:8.1f} us  p99 {row['next_p99_us']:8.1f} us", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--repeats", type=int, default=3)
    add_out_argument(parser, OUT_HELP + "; a path ending in .json names the file")
    parser.add_argument("--only", choices=("decode", "crc", "convert", "loader"), action="append",
                        help="run only these sections (repeatable)")
    args = parser.parse_args(argv)
    sections = args.only or ["decode", "crc", "convert", "loader"]
    n_packets, seq, batch = (2048, 512, 32) if args.quick else (32768, 1024, 64)
    result = {
        "benchmark": "cpu_decode_convert_loader",
        "command": command(__file__, argv),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
    }
    if "decode" in sections:
        result["decode"] = bench_decode(n_packets, seq, batch, args.repeats)
    if "crc" in sections:
        result["crc"] = bench_crc(args.repeats)
    if "convert" in sections:
        result["convert"] = bench_convert(60 if args.quick else None)
    if "loader" in sections:
        result["loader"] = bench_loader(n_packets, seq, batch)
    tag = "cpu" if len(sections) == 4 else "cpu-" + "-".join(sections)
    write_report(args.out, tag, result, path=args.out if args.out.suffix == ".json" else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
