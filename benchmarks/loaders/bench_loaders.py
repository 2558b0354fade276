"""ndp against the loaders people use today: same tokens, same batch shape, same machine, one run.

    pip install -e ".[dev]"                        # or ".[tokenize,torch,bench]"
    python benchmarks/loaders/bench_loaders.py           # ~4 minutes on 2 cores (1B-token data set)
    python benchmarks/loaders/bench_loaders.py --quick     # small data, for a smoke run
    python benchmarks/loaders/bench_loaders.py --out benchmarks/results  # to the project's record

Data: the Python standard library's source, cut at line boundaries into documents of about
3,000 characters, tokenized once with a byte-level BPE trained on it (offline, as ``ndp demo``
does), EOS after each document. Every pipeline reads the same documents in its own format:

* ``ndp-cpu-padded`` / ``ndp-cpu-packed`` (and ``ndp-gpu-*`` where a GPU is present):
  ``ndp.Loader`` over NDP shards;
* ``jsonl-tokenize``: the original tool's "traditional" baseline, a map-style ``Dataset`` over a
  JSONL file that tokenizes each text on the fly, ``DataLoader`` with 2 workers, padding collate;
* ``memmap-get-batch``: nanoGPT's ``get_batch``: random offsets into an ``np.memmap`` of uint16
  tokens, a fresh memmap per batch;
* ``threaded-numpy``: a shuffled-sequence loader in the style of the training-speed contest
  record: per-rank files, a seeded PCG64 generator, a random phase per shard each epoch,
  sequences drawn across shards in proportion to what each has left, windows of T+1 tokens,
  NumPy host logic, one ``torch.from_numpy`` per batch, a producer thread with a bounded queue
  (pinned memory and upload when CUDA is present);
* ``hf-datasets``: a Hugging Face ``datasets`` Arrow data set (memory-mapped from disk), the
  ``transformers`` padding collator, ``DataLoader`` with 2 workers.
* the peers (``peers.py``, ``peers_mosaicml.py``, ``peers_dali.py``; ``--no-peers`` leaves them
  out): torchdata's ``StatefulDataLoader``, litdata, MosaicML streaming and NVIDIA DALI's numpy
  reader on the CPU, each the way its documentation recommends, installed on first use in
  environments of their own under ``benchmarks/.peers/``; their conversion's time and size are
  recorded beside their rows.

Padded pipelines (``ndp-*-padded``, ``jsonl-tokenize``, ``hf-datasets``) deliver one document
per row, cut at T; windowed ones deliver (x, y) windows of T+1 tokens. ``tokens_per_s`` counts
real tokens (padding excluded), ``samples_per_s`` rows. Every pipeline runs in its own process
(so peak RSS and CPU time are its own; CPU time includes DataLoader workers, whose largest peak
RSS is reported apart as ``worker_peak_rss_mb``) for a time budget
after one warm-up batch, then its time to the first batch is measured again on a generated data
set of at least 1 billion tokens (the same documents repeated) in a fresh process.

``--rounds N`` runs the list N times over, in turns (the order reversed every other round), so
that each pipeline meets the VM's slow and fast minutes alike: each row's figures are then the
median of its rounds (``rounds`` holds them all) and ``paired`` holds, round by round, the
fastest-to-the-CPU peer's host CPU per token divided by ndp's CPU Loader's, for SFT rows and for
windows, with their median. On this shared VM the speed of one pipeline differs by 2x between
hours; a ratio taken within a round is what holds still.

Writes a table to stdout, JSON to ``loaders-<time>.json`` in ``--out`` (default
``$NDP_RESULTS_DIR``, else ``./ndp-results``) and PNG figures beside it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import queue
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loaders import peers  # noqa: E402  (bench_cpu, which imports ndp, in main: MosaicML runs this file without)
from loaders.loaders_report import figures, paired, summarize  # noqa: E402
from harness import (add_out_argument, command, fresh_counts, machine, report_path,  # noqa: E402
                     write_report)

PIPELINES = ["ndp-cpu-padded", "ndp-cpu-packed", "jsonl-tokenize", "memmap-get-batch",
             "threaded-numpy", "hf-datasets"]
GPU_PIPELINES = ["ndp-gpu-padded", "ndp-gpu-packed"]
#: how each pipeline cuts the data into training rows (its window semantics)
SEMANTICS = {
    "ndp": "padded: one document per row; packed: the token stream of a document order "
           "shuffled in 1 GiB windows of shards, cut into consecutive windows of T+1",
    "jsonl": "one document per row, tokenized on the fly",
    "memmap": "random offsets into the token stream, with replacement",
    "threaded": "per-file random phase, windows drawn across files in proportion to what is left",
    "hf": "one document per row",
    **peers.SEMANTICS,
}
#: the ``ndp.Loader`` backend of each ``ndp-<kind>-<mode>`` pipeline
NDP_BACKENDS = {"cpu": "cpu", "gpu": "cuda"}


# --- data -----------------------------------------------------------------------------------
def documents(max_files: int | None) -> list[str]:
    """Standard-library source cut at line boundaries into ~3,000-character documents."""
    from ndp.cli.demo import _read, stdlib_files

    docs = []
    for path in stdlib_files(max_files):
        text = _read(path)
        if not text:
            continue
        piece: list[str] = []
        size = 0
        for line in text.splitlines(keepends=True):
            piece.append(line)
            size += len(line)
            if size >= 3000:
                docs.append("".join(piece))
                piece, size = [], 0
        if piece and "".join(piece).strip():
            docs.append("".join(piece))
    return docs


def prepare(work: Path, *, max_files: int | None, large_tokens: int) -> dict:
    """Write every pipeline's input under ``work``; return their paths and sizes."""
    from ndp.cli.demo import train_tokenizer
    from ndp.wire.packet import encode_tokens
    from ndp.store.writer import ShardWriter

    docs = documents(max_files)
    tok_dir = train_tokenizer(docs[:2000], work / "tokenizer")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_dir)
    ids = tok(docs, add_special_tokens=False)["input_ids"]
    eos = tok.eos_token_id
    token_docs = [np.asarray(x + [eos], np.uint16) for x in ids]
    n_tokens = int(sum(d.shape[0] for d in token_docs))

    with open(work / "docs.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    packets = [encode_tokens(d, width=2) for d in token_docs]
    with ShardWriter(work / "ndp", max_shard_bytes=64 << 20) as w:
        for p in packets:
            w.write(p)
    stream = np.concatenate(token_docs)
    (work / "bin").mkdir()
    for i, part in enumerate(np.array_split(stream, 4)):  # per-rank style files
        part.tofile(work / "bin" / f"train_{i:03d}.bin")
    stream.tofile(work / "all.bin")
    try:
        import datasets
    except ImportError:  # a machine without it (the lent GPU): every pipeline but hf-datasets
        datasets = None
        print("datasets is not installed: no Arrow copy, so the hf-datasets pipeline cannot run",
              flush=True)
    else:
        datasets.disable_progress_bars()
        datasets.Dataset.from_dict({"input_ids": [d.tolist() for d in token_docs]}).save_to_disk(
            str(work / "arrow"))

    # the large set: the same documents repeated to >= large_tokens tokens
    reps = max(1, -(-large_tokens // n_tokens))
    big = work / "large"
    (big / "bin").mkdir(parents=True)
    with ShardWriter(big / "ndp", max_shard_bytes=256 << 20) as w:
        for _ in range(reps):
            for p in packets:
                w.write(p)
    with open(big / "all.bin", "wb") as f:
        for _ in range(reps):
            stream.tofile(f)
    for i in range(4):
        with open(big / "bin" / f"train_{i:03d}.bin", "wb") as f:
            part = np.array_split(stream, 4)[i]
            for _ in range(reps):
                part.tofile(f)
    with open(big / "docs.jsonl", "w") as f:
        lines = "".join(json.dumps({"text": d}) + "\n" for d in docs)
        for _ in range(reps):
            f.write(lines)
    if datasets is not None:
        small = datasets.load_from_disk(str(work / "arrow"))
        datasets.concatenate_datasets([small] * reps).save_to_disk(str(big / "arrow"))
    return {"tokenizer": str(tok_dir), "documents": len(docs), "tokens": n_tokens,
            "large_tokens": n_tokens * reps, "large_repeats": reps, "eos": int(eos),
            "pad": int(tok.pad_token_id)}


# --- the pipelines (each yields dicts of int64 tensors) ---------------------------------------
def pipe_ndp(root: Path, cfg: dict, *, mode: str, backend: str):
    import ndp

    loader = ndp.Loader(root / "ndp", mode=mode, batch_size=cfg["B"], seq_len=cfg["T"],
                        pad_token_id=cfg["pad"], seed=0, backend=backend)
    while True:
        yield from loader


def pipe_jsonl(root: Path, cfg: dict):
    import torch
    from transformers import AutoTokenizer

    class JsonlTokenizing(torch.utils.data.Dataset):
        def __init__(self, path: Path, tokenizer_dir: str, T: int):
            self.path, self.T = path, T
            self.offsets = []
            with open(path, "rb") as f:  # an offset per line, so items can be read at random
                pos = 0
                for line in f:
                    self.offsets.append(pos)
                    pos += len(line)
            self.tok = AutoTokenizer.from_pretrained(tokenizer_dir)
            self.f = None

        def __len__(self):
            return len(self.offsets)

        def __getitem__(self, i):
            if self.f is None:
                self.f = open(self.path, "rb")
            self.f.seek(self.offsets[i])
            text = json.loads(self.f.readline())["text"]
            ids = self.tok(text, add_special_tokens=False)["input_ids"]
            ids = (ids + [self.tok.eos_token_id])[: self.T]
            return torch.tensor(ids, dtype=torch.int64)

    T, pad = cfg["T"], cfg["pad"]

    def collate(rows):
        ids = torch.full((len(rows), T), pad, dtype=torch.int64)
        labels = torch.full((len(rows), T), -100, dtype=torch.int64)
        mask = torch.zeros((len(rows), T), dtype=torch.int64)
        for r, row in enumerate(rows):
            ids[r, : len(row)] = row
            labels[r, : len(row)] = row
            mask[r, : len(row)] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    ds = JsonlTokenizing(root / "docs.jsonl", cfg["tokenizer"], T)
    while True:
        yield from torch.utils.data.DataLoader(ds, batch_size=cfg["B"], shuffle=True,
                                               num_workers=2, collate_fn=collate,
                                               persistent_workers=False)


def pipe_memmap(root: Path, cfg: dict):
    import torch

    B, T = cfg["B"], cfg["T"]
    path = root / "all.bin"
    while True:
        data = np.memmap(path, dtype=np.uint16, mode="r")  # nanoGPT: a new memmap per batch
        ix = torch.randint(len(data) - T, (B,))
        x = torch.stack([torch.from_numpy(data[i: i + T].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1: i + 1 + T].astype(np.int64)) for i in ix])
        yield {"x": x, "y": y}


class ThreadedSequenceLoader:
    """Windows of T+1 tokens drawn across per-rank shard files in proportion to what each has
    left, with a random phase per shard each epoch, built in NumPy by a producer thread."""

    def __init__(self, files: list[Path], B: int, T: int, *, rank: int = 0, world: int = 1,
                 seed: int = 0, depth: int = 2):
        import torch

        self.torch = torch
        self.files = files[rank::world]
        self.B, self.T = B, T
        self.rng = np.random.Generator(np.random.PCG64([seed, rank]))
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.cuda = torch.cuda.is_available()
        threading.Thread(target=self._produce, daemon=True).start()

    def _epoch(self):
        shards = [np.memmap(f, dtype=np.uint16, mode="r") for f in self.files]
        n_seq = [(len(s) - 1) // self.T for s in shards]
        phase = [int(self.rng.integers(self.T)) if n else 0 for n in n_seq]
        n_seq = [max(0, (len(s) - 1 - p) // self.T) for s, p in zip(shards, phase)]
        order = [self.rng.permutation(n) for n in n_seq]
        left = np.array(n_seq, np.float64)
        taken = [0] * len(shards)
        while left.sum() >= self.B:
            picks = self.rng.choice(len(shards), size=self.B, p=left / left.sum())
            x = np.empty((self.B, self.T), np.int64)
            y = np.empty((self.B, self.T), np.int64)
            for b, s in enumerate(picks):
                if left[s] < 1:
                    s = int(np.argmax(left))
                k = order[s][taken[s]]
                taken[s] += 1
                left[s] -= 1
                start = phase[s] + k * self.T
                window = shards[s][start: start + self.T + 1].astype(np.int64)
                x[b], y[b] = window[:-1], window[1:]
            yield x, y

    def _produce(self):
        torch = self.torch
        while True:
            for x, y in self._epoch():
                xt, yt = torch.from_numpy(x), torch.from_numpy(y)
                if self.cuda:
                    xt = xt.pin_memory().to("cuda", non_blocking=True)
                    yt = yt.pin_memory().to("cuda", non_blocking=True)
                self.q.put({"x": xt, "y": yt})

    def __iter__(self):
        while True:
            yield self.q.get()


def pipe_threaded(root: Path, cfg: dict):
    files = sorted((root / "bin").glob("*.bin"))
    yield from ThreadedSequenceLoader(files, cfg["B"], cfg["T"])


def pipe_hf(root: Path, cfg: dict):
    import datasets
    import torch
    from transformers import AutoTokenizer, DataCollatorWithPadding

    ds = datasets.load_from_disk(str(root / "arrow"))
    T = cfg["T"]
    ds = ds.with_transform(lambda b: {"input_ids": [x[:T] for x in b["input_ids"]]})
    tok = AutoTokenizer.from_pretrained(cfg["tokenizer"])
    collator = DataCollatorWithPadding(tok, padding="max_length", max_length=T,
                                       return_tensors="pt")
    while True:
        yield from torch.utils.data.DataLoader(ds, batch_size=cfg["B"], shuffle=True,
                                               num_workers=2, collate_fn=collator)


def make_pipeline(name: str, root: Path, cfg: dict):
    if name in peers.PIPELINES:
        return peers.make(name, root, cfg)
    if name.startswith("ndp-"):
        _, kind, mode = name.split("-")
        return pipe_ndp(root, cfg, mode=mode, backend=NDP_BACKENDS[kind])
    return {"jsonl-tokenize": pipe_jsonl, "memmap-get-batch": pipe_memmap,
            "threaded-numpy": pipe_threaded, "hf-datasets": pipe_hf}[name](root, cfg)


def real_tokens(batch: dict) -> tuple[int, int]:
    """(real tokens, rows) of a batch: padding excluded. A mask on the host is summed with
    NumPy: ``torch.sum`` over 64 x 1024 elements runs on torch's OpenMP threads, which spin
    after each call, and the measuring loop's own spinning was charged to the pipeline (B=64
    SFT rows cost twice the CPU per token of B=16 for ndp and torchdata alike)."""
    if "x" in batch:
        return int(batch["x"].numel()), int(batch["x"].shape[0])
    mask = batch["attention_mask"]
    if getattr(mask, "device", None) is None or mask.device.type == "cpu":
        return int(np.asarray(mask).sum()), int(mask.shape[0])
    return int(mask.sum()), int(mask.shape[0])


# --- measuring one pipeline in its own process ------------------------------------------------
def run_one(name: str, root: Path, cfg: dict, *, seconds: float, first_only: bool) -> dict:
    import torch

    t0 = time.perf_counter()
    it = iter(make_pipeline(name, root, cfg))
    first = next(it)
    ttfb = time.perf_counter() - t0
    shape = list((first.get("x") if "x" in first else first["input_ids"]).shape)
    if first_only:
        return {"time_to_first_batch_s": ttfb, "shape": shape}
    cpu0 = time.process_time()
    lat, tokens, rows = [], 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        batch = next(it)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        lat.append(time.perf_counter() - t)
        n, r = real_tokens(batch)
        tokens += n
        rows += r
    wall = time.perf_counter() - start
    del it  # DataLoader workers exit: their CPU time shows in RUSAGE_CHILDREN
    import gc

    gc.collect()
    cpu = time.process_time() - cpu0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu += children.ru_utime + children.ru_stime
    # VmHWM: this process's peak resident set since exec (ru_maxrss would carry the parent's
    # over from fork); DataLoader workers are reported apart, as the largest one's peak
    rss = _vm_hwm_kb()
    worker_rss = children.ru_maxrss
    ms = np.array(lat) * 1e6
    return {"batches": len(lat), "tokens": tokens, "rows": rows, "seconds": wall,
            "tokens_per_s": tokens / wall, "samples_per_s": rows / wall,
            "next_p50_us": float(np.percentile(ms, 50)), "next_p99_us": float(np.percentile(ms, 99)),
            "host_cpu_s_per_billion_tokens": cpu / tokens * 1e9,
            "peak_rss_mb": rss / 1024, "worker_peak_rss_mb": worker_rss / 1024,
            "warm_time_to_first_batch_s": ttfb, "shape": shape}


def _vm_hwm_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def child(name: str, root: str, cfg: dict, seconds: float, first_only: bool) -> dict:
    exe = str(peers.python_for(name)) if name in peers.PIPELINES else sys.executable
    cmd = [exe, __file__, "--run-one", name, "--root", root, "--cfg", json.dumps(cfg),
           "--seconds", str(seconds)] + (["--first-only"] if first_only else [])

    with fresh_counts():  # ndp's run counts its epochs, as a first run on the data does
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small data, short runs")
    ap.add_argument("--smoke", action="store_true", help="tiny data, for the test suite")
    add_out_argument(ap)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=None, help="time budget per pipeline")
    ap.add_argument("--large-tokens", type=int, default=None,
                    help="tokens in the data set for time to first batch (default 1e9)")
    ap.add_argument("--pipelines", nargs="+", default=None, metavar="NAME",
                    help=f"run only these (of {', '.join(GPU_PIPELINES + PIPELINES)}; the "
                         f"ndp-gpu-* rows need a GPU)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the pipelines this many times in turns; rows are the medians")
    ap.add_argument("--no-peers", action="store_true",
                    help=f"leave out the peers ({', '.join(peers.PIPELINES)}; installed in "
                         f"benchmarks/.peers/env, MosaicML in benchmarks/.peers/mosaicml-env, "
                         f"on first use)")
    ap.add_argument("--run-one", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--cfg", help=argparse.SUPPRESS)
    ap.add_argument("--first-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run_one:
        res = run_one(args.run_one, Path(args.root), json.loads(args.cfg), seconds=args.seconds,
                      first_only=args.first_only)
        print(json.dumps(res))
        os._exit(0)  # daemon producer threads and memmaps: leave at once

    small = args.quick or args.smoke
    seconds = args.seconds or (0.5 if args.smoke else 2.0 if args.quick else 20.0)
    large = args.large_tokens or (
        300_000 if args.smoke else 2_000_000 if args.quick else 1_000_000_000)
    pipelines = list(PIPELINES) + ([] if args.smoke or args.no_peers else peers.PIPELINES)
    from ndp.engine.backend import cuda_unavailable_reason, simulated

    has_gpu = cuda_unavailable_reason() is None and not simulated()
    if has_gpu:
        pipelines = GPU_PIPELINES + pipelines
    if args.pipelines:
        unknown = sorted(set(args.pipelines) - set(GPU_PIPELINES + PIPELINES + peers.PIPELINES))
        if unknown:
            ap.error(f"unknown pipelines {unknown}")
        if not has_gpu and set(args.pipelines) & set(GPU_PIPELINES):
            ap.error(f"{sorted(set(args.pipelines) & set(GPU_PIPELINES))} need a CUDA GPU: "
                     f"{cuda_unavailable_reason() or 'running under the simulator'}")
        pipelines = [p for p in GPU_PIPELINES + PIPELINES + peers.PIPELINES
                     if p in args.pipelines]
    with tempfile.TemporaryDirectory(prefix="ndp-bench-") as tmp:
        work = Path(tmp)
        t = time.perf_counter()
        data = prepare(work, max_files=(15 if args.smoke else 60) if small else None,
                       large_tokens=large)
        print(f"data: {data['documents']} documents, {data['tokens']:,} tokens; large set "
              f"{data['large_tokens']:,} tokens ({time.perf_counter() - t:.0f} s to prepare)",
              flush=True)
        cfg = {"B": args.batch, "T": args.seq, "pad": data["pad"], "eos": data["eos"],
               "tokenizer": data["tokenizer"]}
        conversions = peers.convert(pipelines, work, cfg)
        for kind, conversion in conversions.items():
            print(f"{kind} conversion: {conversion['convert_seconds']:.2f} s, "
                  f"{conversion['converted_bytes'] / 1e6:.1f} MB", flush=True)
        if args.rounds < 1:
            ap.error("--rounds must be 1 or more")
        rounds: list[dict] = []
        for r in range(args.rounds):
            rounds.append({})
            for name in (pipelines if r % 2 == 0 else pipelines[::-1]):
                res = child(name, str(work), cfg, seconds, first_only=False)
                rounds[-1][name] = res
                print(f"{name:18s} {res['tokens_per_s'] / 1e6:9.2f} M tok/s "
                      f"{res['samples_per_s']:10.0f} rows/s  next p50 {res['next_p50_us']:9.0f} us"
                      f" p99 {res['next_p99_us']:9.0f} us  CPU "
                      f"{res['host_cpu_s_per_billion_tokens']:8.1f} s/Gtok  RSS "
                      f"{res['peak_rss_mb']:6.0f} MB" + (f"  (round {r + 1})" if args.rounds > 1
                                                         else ""), flush=True)
        rows = []
        for name in pipelines:
            res = summarize([rd[name] for rd in rounds])
            res["time_to_first_batch_s"] = child(name, str(work / "large"), cfg, 0,
                                                 first_only=True)["time_to_first_batch_s"]
            res["name"] = name
            kind = peers.kind(name) if name in peers.PIPELINES else name.split("-")[0]
            res["semantics"] = SEMANTICS[kind]
            if kind in conversions:
                res["conversion"] = conversions[kind]
            rows.append(res)
            print(f"{name:18s} {res['tokens_per_s'] / 1e6:9.2f} M tok/s {res['samples_per_s']:10.0f}"
                  f" rows/s  next p50 {res['next_p50_us']:9.0f} us p99 {res['next_p99_us']:9.0f} us"
                  f"  CPU {res['host_cpu_s_per_billion_tokens']:8.1f} s/Gtok  RSS "
                  f"{res['peak_rss_mb']:6.0f} MB  first batch (1B) "
                  f"{res['time_to_first_batch_s']:6.2f} s", flush=True)
        pairs = paired(pipelines, rounds)
        for shape, pair in pairs.items():
            print(f"{shape}: best peer's CPU per token / {pair['ndp']}'s, by round: "
                  + ", ".join(f"{p['ratio']:.2f} ({p['peer']})" for p in pair["per_round"])
                  + f"; median {pair['median']:.2f}", flush=True)
        peers.finish(pipelines)
    report = {
        "benchmark": "loaders",
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command(__file__, argv),
        "machine": machine(),
        "config": {**{k: v for k, v in cfg.items() if k != "tokenizer"}, "seconds": seconds,
                   **{k: v for k, v in data.items() if k != "tokenizer"}},
        "rounds": args.rounds,
        "pipelines": rows,
        "paired": pairs,
    }
    path = report_path(args.out, "loaders")
    report["figures"] = figures(report, path.with_suffix(""))
    write_report(None, "loaders", report, path=path)
    print(f"and {len(report['figures'])} figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
