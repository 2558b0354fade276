"""Training A/B: a small GPT fed by ndp and by the JSONL baseline, same examples, same order.

    python benchmarks/training/train_ab.py             # GPU if present (the intended run), else CPU
    python benchmarks/training/train_ab.py --quick      # a few steps, for a smoke run
    python benchmarks/training/train_ab.py --out benchmarks/results   # adds to the project's record

Both runs start from the same initial weights and see the same documents (the standard library
corpus of ``bench_loaders.py``) in the same order, one document per row cut at T: ndp through
``ndp.Loader(mode="padded", shuffle=False)`` over NDP shards, the baseline through a JSONL
``Dataset`` that tokenizes on the fly with ``DataLoader(num_workers=2)``. Reported per run:
step time, the fraction of it spent waiting for the next batch (both over the steps after
the first 5, which also set up the model's own GPU work), and the loss at every step;
the two loss curves must coincide (the same tokens go in). JSON and a PNG of both curves go to
``train-ab-<time>.*`` in ``--out`` (default ``$NDP_RESULTS_DIR``, else ``./ndp-results``).
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
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import add_out_argument, command, machine, report_path, write_report  # noqa: E402
from loaders.bench_loaders import documents  # noqa: E402


class GPT(nn.Module):
    """A small decoder-only transformer in plain torch."""

    def __init__(self, vocab: int, T: int, d: int = 128, layers: int = 2, heads: int = 4):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(T, d)
        block = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        h = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        causal = nn.Transformer.generate_square_subsequent_mask(t, device=ids.device)
        return self.head(self.norm(self.blocks(h, mask=causal, is_causal=True)))


def prepare(work: Path, max_files: int | None) -> dict:
    from ndp.cli.demo import train_tokenizer
    from ndp.wire.packet import encode_tokens
    from ndp.store.writer import ShardWriter
    from transformers import AutoTokenizer

    docs = documents(max_files)
    tok_dir = train_tokenizer(docs[:2000], work / "tokenizer")
    tok = AutoTokenizer.from_pretrained(tok_dir)
    ids = tok(docs, add_special_tokens=False)["input_ids"]
    with open(work / "docs.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    with ShardWriter(work / "ndp") as w:
        for x in ids:
            w.write(encode_tokens(np.asarray(x + [tok.eos_token_id]), width=2))
    return {"tokenizer": str(tok_dir), "vocab": len(tok), "pad": tok.pad_token_id,
            "documents": len(docs)}


def feed_ndp(work: Path, cfg: dict):
    import ndp

    loader = ndp.Loader(work / "ndp", mode="padded", batch_size=cfg["B"], seq_len=cfg["T"],
                        pad_token_id=cfg["pad"], shuffle=False, prefetch=2)
    while True:
        for batch in loader:
            yield batch["input_ids"], batch["labels"]


def feed_jsonl(work: Path, cfg: dict):
    from transformers import AutoTokenizer

    T, pad = cfg["T"], cfg["pad"]

    class Docs(torch.utils.data.Dataset):
        def __init__(self):
            self.lines = (work / "docs.jsonl").read_text().splitlines()
            self.tok = AutoTokenizer.from_pretrained(cfg["tokenizer"])

        def __len__(self):
            return len(self.lines)

        def __getitem__(self, i):
            ids = self.tok(json.loads(self.lines[i])["text"], add_special_tokens=False)["input_ids"]
            return torch.tensor((ids + [self.tok.eos_token_id])[:T])

    def collate(rows):
        ids = torch.full((len(rows), T), pad, dtype=torch.int64)
        labels = torch.full((len(rows), T), -100, dtype=torch.int64)
        for r, row in enumerate(rows):
            ids[r, : len(row)] = row
            labels[r, : len(row)] = row
        return ids, labels

    while True:
        yield from torch.utils.data.DataLoader(Docs(), batch_size=cfg["B"], shuffle=False,
                                               num_workers=2, collate_fn=collate)


def train(feed, cfg: dict, device: str) -> dict:
    torch.manual_seed(0)
    model = GPT(cfg["vocab"], cfg["T"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    losses, step_s, wait_s = [], [], []
    it = iter(feed)
    next(it)  # warm-up: start the workers / producer, compile; not a training step
    for step in range(cfg["steps"]):
        t0 = time.perf_counter()
        ids, labels = next(it)
        ids, labels = ids.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        t1 = time.perf_counter()
        logits = model(ids)[:, :-1]
        loss = nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab"]),
                                           labels[:, 1:].reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # synchronises, so the step is over
        t2 = time.perf_counter()
        if step >= cfg.get("warmup", 0):  # the model's own first steps (cuBLAS set-up,
            wait_s.append(t1 - t0)        # the allocator) would be charged to the feed run first
            step_s.append(t2 - t0)
    del it
    return {"loss": losses, "step_s_mean": float(np.mean(step_s)),
            "step_s_p50": float(np.median(step_s)),
            "wait_fraction": float(np.sum(wait_s) / np.sum(step_s)),
            "wait_s_p50": float(np.median(wait_s))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    add_out_argument(ap)
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    steps = args.steps or (5 if args.quick else 150)
    with tempfile.TemporaryDirectory(prefix="ndp-ab-") as tmp:
        work = Path(tmp)
        data = prepare(work, max_files=30 if args.quick else 400)
        cfg = {"B": args.batch, "T": args.seq, "steps": steps, "warmup": min(5, steps - 1),
               **data}
        runs = {"ndp": train(feed_ndp(work, cfg), cfg, device),
                "jsonl-tokenize": train(feed_jsonl(work, cfg), cfg, device)}
    a, b = np.array(runs["ndp"]["loss"]), np.array(runs["jsonl-tokenize"]["loss"])
    report = {
        "benchmark": "train_ab",
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command(__file__, argv),
        "machine": machine(), "device": device,
        "config": {k: v for k, v in cfg.items() if k != "tokenizer"},
        "runs": runs,
        "max_abs_loss_difference": float(np.abs(a - b).max()),
    }
    for name, run in runs.items():
        print(f"{name:15s} step {run['step_s_mean'] * 1e3:8.1f} ms  waiting for data "
              f"{run['wait_fraction'] * 100:5.1f}% of it  final loss {run['loss'][-1]:.4f}")
    print(f"largest loss difference between the runs over {steps} steps: "
          f"{report['max_abs_loss_difference']:.3g}")
    path = report_path(args.out, "train-ab")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(a, label="ndp", lw=2)
    ax.plot(b, label="JSONL + tokenize", lw=1, ls="--")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"same examples, same order ({device}); largest difference "
                 f"{report['max_abs_loss_difference']:.2g}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=110)
    report["figure"] = path.with_suffix(".png").name
    write_report(None, "train-ab", report, path=path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
