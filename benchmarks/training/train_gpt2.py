"""Training A/B at real model size: a GPT-2-small-sized model pretrained on packed windows fed
by ndp and by the fastest peers (issue 14 item 4; ``train_ab.py`` is the small-model A/B whose
two runs see the very same tokens).

    python benchmarks/training/train_gpt2.py                     # on a GPU: ~6 minutes on an H100
    python benchmarks/training/train_gpt2.py --quick         # a tiny model, a few steps (CPU smoke)
    python benchmarks/training/train_gpt2.py --feeds ndp-cpu-packed torchdata-0w
    python benchmarks/training/train_gpt2.py --out benchmarks/results  # to the project's record

On the lent device machine, which reaches no package index, the peers' environments cannot be
built: carry the peers' wheels (torchdata, litdata and theirs) and install them first, or run
``--feeds ndp-gpu-packed ndp-cpu-packed threaded-numpy`` (no peer) in a device call of its own.

The model: a decoder-only transformer in plain torch, 12 layers, d=768, 12 heads, T=1024, a
vocabulary of 50,304 (GPT-2 small's shape; 163 M parameters, as the output head is not tied to
the embedding as GPT-2's is; the ids of the benchmark's 8,192-id BPE
use the first rows), AdamW, bf16 autocast and ``torch.compile`` on a GPU (``compiled`` says
whether it worked). Each feed trains from the same initial weights in a process of its own (the
peers in their environments), on the documents of ``bench_loaders.py`` as packed windows of
T+1 tokens, batch 16: ``ndp-gpu-packed`` (where a GPU is), ``ndp-cpu-packed``, and by default
the two fastest peers of ``bench_loaders.py`` (torchdata's ``StatefulDataLoader`` and litdata,
0 workers; their batches go to the device with pinned memory and ``non_blocking`` copies).
Each feed reads its own order of the windows, so loss curves differ; the step times are what is
compared. After ``--warmup`` steps (compilation), ``--steps`` are timed: step time mean / p50 /
p99, time waiting for the next batch, tokens/s, host CPU seconds per 1e9 tokens (the process
and its children). JSON into ``--out`` (default ``$NDP_RESULTS_DIR``, else
``./ndp-results``): ``train-gpt2-<time>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import add_out_argument, command, machine, write_report  # noqa: E402

#: GPT-2 small, and the tiny model of --quick
MODELS = {"gpt2-small": dict(d=768, layers=12, heads=12, vocab=50304),
          "tiny": dict(d=64, layers=2, heads=4, vocab=8192)}
DEFAULT_FEEDS = ["ndp-cpu-packed", "torchdata-0w", "litdata-0w"]


def build_model(cfg: dict, device: str):
    import torch
    from torch import nn

    spec = MODELS[cfg["model"]]
    d, T = spec["d"], cfg["T"]

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(spec["vocab"], d)
            self.pos = nn.Embedding(T, d)
            block = nn.TransformerEncoderLayer(d, spec["heads"], 4 * d, dropout=0.0,
                                               batch_first=True, norm_first=True,
                                               activation="gelu")
            self.blocks = nn.TransformerEncoder(block, spec["layers"],
                                                enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, spec["vocab"], bias=False)

        def forward(self, ids):
            t = ids.shape[1]
            h = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
            causal = nn.Transformer.generate_square_subsequent_mask(t, device=ids.device)
            return self.head(self.norm(self.blocks(h, mask=causal, is_causal=True)))

    torch.manual_seed(0)
    return GPT().to(device)


def train_one(name: str, root: Path, cfg: dict) -> dict:
    """One feed's run, in this process (see the module docstring)."""
    import torch
    from torch import nn

    from loaders.bench_loaders import make_pipeline

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build_model(cfg, device)
    params = sum(p.numel() for p in model.parameters())
    step_model, compiled = model, False
    if device == "cuda":
        try:
            step_model, compiled = torch.compile(model), True
        except Exception:  # noqa: BLE001 - recorded: the run goes on uncompiled
            pass
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device == "cuda")
    vocab = MODELS[cfg["model"]]["vocab"]
    it = iter(make_pipeline(name, root, cfg))
    step_s, wait_s, losses = [], [], []
    tokens = 0
    cpu0 = None
    for step in range(cfg["warmup"] + cfg["steps"]):
        if step == cfg["warmup"]:
            if device == "cuda":
                torch.cuda.synchronize()
            cpu0, t_start = time.process_time(), time.perf_counter()
        t0 = time.perf_counter()
        batch = next(it)
        x, y = batch["x"], batch["y"]
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        t1 = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = step_model(x)
            loss = nn.functional.cross_entropy(logits.float().reshape(-1, vocab),
                                               y.reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # synchronises: the step is over
        if step >= cfg["warmup"]:
            step_s.append(time.perf_counter() - t0)
            wait_s.append(t1 - t0)
            tokens += x.numel()
    wall = time.perf_counter() - t_start
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() - cpu0 + children.ru_utime + children.ru_stime
    ms = np.array(step_s) * 1e3
    out = {"device": device, "parameters": params, "compiled": compiled,
           "steps": len(step_s), "tokens": tokens, "tokens_per_s": tokens / wall,
           "step_ms_mean": float(ms.mean()), "step_ms_p50": float(np.percentile(ms, 50)),
           "step_ms_p99": float(np.percentile(ms, 99)),
           "wait_ms_mean": float(np.mean(wait_s) * 1e3),
           "wait_fraction": float(np.sum(wait_s) / np.sum(step_s)),
           "host_cpu_s_per_billion_tokens": cpu / tokens * 1e9,
           "loss_first": losses[0], "loss_last": losses[-1]}
    if device == "cuda":
        out["peak_device_mb"] = torch.cuda.max_memory_allocated() / 2**20
        out["device_name"] = torch.cuda.get_device_name()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, few steps, small data")
    ap.add_argument("--feeds", nargs="+", default=None, metavar="NAME",
                    help=f"pipelines of bench_loaders.py (default {' '.join(DEFAULT_FEEDS)}, "
                         f"and ndp-gpu-packed first on a GPU)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    add_out_argument(ap)
    ap.add_argument("--run-one", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--cfg", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run_one:
        print(json.dumps(train_one(args.run_one, Path(args.root), json.loads(args.cfg))))
        import os

        os._exit(0)  # daemon producer threads: leave at once
    from loaders import bench_loaders
    from loaders import peers
    from ndp.engine.backend import cuda_unavailable_reason, simulated

    has_gpu = cuda_unavailable_reason() is None and not simulated()
    feeds = args.feeds or ((["ndp-gpu-packed"] if has_gpu else []) + DEFAULT_FEEDS)
    cfg = {"model": "tiny" if args.quick else "gpt2-small", "B": 4 if args.quick else 16,
           "T": 128 if args.quick else 1024, "steps": args.steps or (5 if args.quick else 300),
           "warmup": args.warmup or (1 if args.quick else 20)}
    rows = []
    with tempfile.TemporaryDirectory(prefix="ndp-gpt2-") as tmp:
        work = Path(tmp)
        data = bench_loaders.prepare(work, max_files=30 if args.quick else None,
                                     large_tokens=0)
        cfg.update({k: data[k] for k in ("pad", "eos", "tokenizer")})
        peers.convert(feeds, work, cfg)
        for name in feeds:
            exe = str(peers.python_for(name)) if name in peers.PIPELINES else sys.executable
            proc = subprocess.run([exe, __file__, "--run-one", name, "--root", str(work),
                                   "--cfg", json.dumps(cfg)], capture_output=True, text=True,
                                  timeout=1800)
            if proc.returncode:
                raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
            row = {"name": name, **json.loads(proc.stdout.strip().splitlines()[-1])}
            rows.append(row)
            print(f"{name:16s} step {row['step_ms_mean']:8.1f} ms (p50 {row['step_ms_p50']:.1f},"
                  f" p99 {row['step_ms_p99']:.1f})  waiting {row['wait_fraction'] * 100:5.1f}%"
                  f"  {row['tokens_per_s'] / 1e3:8.1f} k tokens/s  CPU "
                  f"{row['host_cpu_s_per_billion_tokens']:8.0f} s/Gtok", flush=True)
        peers.finish(feeds)
    report = {"benchmark": "train_gpt2",
              "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": command(__file__, argv),
              "machine": machine(), "config": {k: v for k, v in cfg.items() if k != "tokenizer"},
              "model": MODELS[cfg["model"]], "rows": rows}

    write_report(args.out, "train-gpt2", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
