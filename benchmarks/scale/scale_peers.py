"""The peers in ``bench_scale.py --peers torchdata,litdata``: the same documents as ndp's scale
datasets, read by torchdata's ``StatefulDataLoader`` and by litdata, measured the way
``scale_worker.py`` measures ndp (each in a fresh process: open, first batch, peak RSS, ``next()``
across an epoch boundary), at world size 1 (rank 0) only.

**Data.** Per size, ``all.bin`` in ``<data>/peers-<size>``: document ``d`` of the ndp dataset
(``scale_data.py``: the ramp ``(16 d + j) % vocab``, j < 16) followed by EOS (token ``vocab``,
above every ramp token), as uint16: the stream ``peers.py`` converts (``bench_loaders.py``'s
``all.bin``), N x 17 tokens where ndp's packed mode reads N x 16 (ndp's documents hold no EOS).
Written once (``write_stream``, timed) and reused while its marker matches. Each peer's
conversion, once per size and timed like ``ndp index``: torchdata reads the stream itself
(``np.memmap``; its conversion is writing ``all.bin``); litdata's is ``peers.prepare_litdata``
(``optimize`` with ``TokensLoader``: int32 tokens in 64 MB chunks, 2 workers), in a process of
its own. A conversion made by an earlier run is reused, its figures with it (``reused``).

**Pipelines** (``peers.py``'s packed-window ones, constructed here to reach their state):
torchdata: ``StatefulDataLoader`` over ``peers._Windows`` (fixed windows of T+1 tokens of the
memmap), ``shuffle=True``, ``drop_last=True``, ``peers._collate``; litdata: ``StreamingDataset
(TokensLoader(block_size=T+1), shuffle=True, drop_last=True)`` + ``StreamingDataLoader``.
Both with ``num_workers=0`` (each loader's default), batches of B x T (16 x 1024), in
``peers.python()``'s environment; ``torch.manual_seed(0)`` first (torchdata draws its sampler's
seed from torch's).

**Across the epoch boundary.** Both loaders can resume inside an epoch: ``state_dict()`` after
the first batch, its counts of batches and samples set to batch ``len(loader) - boundary - 8``
(``state_at``), ``load_state_dict``; where an epoch has at most ``CHECK_STATES_BATCHES``
batches a second loader checks that iterating there gives the same state. Then 8 untimed
batches and every ``next()`` to the end of epoch 0 and through the first ``boundary`` batches of
epoch 1, the step across (StopIteration, ``iter()``, first ``next()``) as one wait. A resume
that does not end epoch 0 within ``4 x (boundary + 8)`` batches is recorded as not measured.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loaders import peers  # noqa: E402  (NumPy only at import)
from scale.scale_worker import CHECK_STATES_BATCHES, _hwm_mb, _reset_hwm  # noqa: E402

PEERS = ("torchdata", "litdata")
STREAM_VERSION = 1
MARKER = ".bench-scale-peers.json"
PIPELINE = {"torchdata": "StatefulDataLoader(peers._Windows: fixed windows of T+1 tokens of "
                         "np.memmap(all.bin)), shuffle=True, drop_last=True, num_workers=0",
            "litdata": "StreamingDataset(item_loader=TokensLoader(block_size=T+1), shuffle=True,"
                       " drop_last=True) + StreamingDataLoader, num_workers=0"}
METHOD = ("the same documents as ndp's (EOS after each: N x 17 uint16 tokens), converted once "
          "per size into each peer's format (timed); each peer in a fresh process in its own "
          "environment (benchmarks/.peers/env), rank 0 of 1, num_workers=0 (each loader's "
          "default): import, open (dataset + loader constructed), first batch, peak RSS (VmHWM, "
          "reset after the resume), next() across the end of epoch 0 reached by load_state_dict "
          "of a state_dict() with its counts set near the epoch's end (scale_peers.py)")


def stream_spec(n: int, doc_tokens: int, vocab: int) -> dict:
    if vocab > 0xFFFF:
        raise SystemExit(f"--vocab {vocab}: the peers' stream needs EOS = vocab to fit uint16")
    return {"documents": n, "doc_tokens": doc_tokens, "vocab": vocab, "eos": vocab,
            "token_width": 2, "stream": STREAM_VERSION}


def write_stream(path: Path, spec: dict, chunk_docs: int = 1 << 18) -> dict:
    """``spec``'s documents, EOS after each, as uint16 into ``path`` (through ``atomic_file``,
    ``chunk_docs`` documents a write); the time and bytes."""
    from ndp.store.atomic import atomic_file

    k, vocab, n = spec["doc_tokens"], spec["vocab"], spec["documents"]
    period = vocab // math.gcd(vocab, k)  # documents after which the ramp repeats
    block = np.empty((period, k + 1), np.uint16)
    block[:, :k] = (np.arange(period * k, dtype=np.int64) % vocab).reshape(period, k)
    block[:, k] = spec["eos"]
    t0 = time.perf_counter()
    with atomic_file(path) as f:
        for d in range(0, n, chunk_docs):
            f.write(block[np.arange(d, min(n, d + chunk_docs)) % period].data)
    return {"seconds": time.perf_counter() - t0, "bytes": n * (k + 1) * 2}


def _convert_litdata(root: Path, spec: dict, block: int) -> dict:
    """``peers.prepare_litdata`` on ``root/all.bin`` in a process of its own (peers' env)."""
    t0 = time.perf_counter()
    proc = subprocess.run([str(peers.python()), __file__, "--prepare-litdata", str(root),
                           str(spec["eos"]), str(block)], capture_output=True, text=True,
                          check=False)
    if proc.returncode:
        raise SystemExit(f"litdata's conversion of {root} failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**out, "wall_s": time.perf_counter() - t0}


def ensure_data(folder: Path, spec: dict, peer_list: list[str], block: int) -> list[dict]:
    """The stream and each peer's conversion of it in ``folder`` (made or reused): a record
    per peer of what its data cost."""
    from ndp.store.atomic import atomic_write

    folder.mkdir(parents=True, exist_ok=True)
    stream = folder / "all.bin"
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        marker = {}
    size = spec["documents"] * (spec["doc_tokens"] + 1) * 2
    if marker.get("spec") != spec or not stream.is_file() or stream.stat().st_size != size:
        marker = {"spec": spec, "stream": {**write_stream(stream, spec),
                                           "date": dt.datetime.now().isoformat("T", "seconds")}}
        marker["stream"]["reused"] = False
        atomic_write(folder / MARKER, json.dumps(marker, indent=1))
    else:
        marker["stream"]["reused"] = True
    out = []
    for peer in peer_list:
        rec = {"documents": spec["documents"], "which": peer, "tokens": size // 2,
               "stream_seconds": marker["stream"]["seconds"], "stream_bytes": size,
               "stream_reused": marker["stream"]["reused"]}
        if peer == "torchdata":
            out.append({**rec, "format": "all.bin itself (np.memmap): writing it",
                        "convert_seconds": marker["stream"]["seconds"],
                        "converted_bytes": size, "reused": marker["stream"]["reused"]})
            continue
        done = marker.get("litdata")
        if not (done and done.get("block") == block and (folder / "litdata" / "index.json")
                .is_file()):
            done = {**_convert_litdata(folder, spec, block), "block": block,
                    "date": dt.datetime.now().isoformat("T", "seconds")}
            marker["litdata"] = done
            atomic_write(folder / MARKER, json.dumps(marker, indent=1))
            done = {**done, "reused": False}
        else:
            done = {**done, "reused": True}
        out.append({**rec, "format": "peers.prepare_litdata: optimize(TokensLoader), int32 "
                                     "tokens, 64 MB chunks, 2 workers", **done})
    return out


def run_worker(spec: dict, cwd: Path) -> dict:
    """``scale_peers.py --worker SPEC`` in the peers' environment, a fresh process."""
    proc = subprocess.run([str(peers.python()), __file__, "--worker", json.dumps(spec)],
                          cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"{spec['peer']} on {spec['root']}: the worker failed "
                         f"({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(n: int, data: Path, args, report: dict, peer_list: list[str]) -> None:
    """``bench_scale.py``'s peer rows for ``n`` documents: data, conversions, one worker each;
    records, conversions and skips added to ``report``."""
    from scale.scale_data import size_name

    spec = stream_spec(n, args.doc_tokens, args.vocab)
    folder = data / f"peers-{size_name(n)}"
    for conv in ensure_data(folder, spec, peer_list, args.seq + 1):
        report.setdefault("peer_conversions", []).append(conv)
        print(f"  {conv['which']:9s} data: {conv['format']}: "
              f"{conv['convert_seconds']:.1f} s, {conv['converted_bytes'] / 1e9:.2f} GB"
              + (" (reused)" if conv["reused"] else ""), flush=True)
    for peer in peer_list:
        res = run_worker({"peer": peer, "root": str(folder), "B": args.batch, "T": args.seq,
                          "boundary": args.boundary, "check_state": args.check_states}, data)
        rec = {"documents": n, "mode": "packed", "world": 1, "which": peer,
               "pipeline": PIPELINE[peer], "num_workers": 0, **res}
        rec["open_plus_first_s"] = rec["open_s"] + rec["first_batch_s"]
        rec["peak_rss_growth_mb"] = rec["peak_rss_mb"] - rec["rss_after_import_mb"]
        report["records"].append(rec)
        if "boundary_skipped" in rec:
            report["skipped"].append({"documents": n, "mode": "packed", "world": 1, "which": peer,
                                      "reason": "next() across the epoch boundary: "
                                                + rec["boundary_skipped"]})
        print(f"  {peer:9s} rank 0 of 1: open {rec['open_s']:6.2f} s  first batch "
              f"{rec['first_batch_s']:6.2f} s  peak RSS {rec['peak_rss_mb']:7.0f} MB  next() "
              f"p99 {rec.get('next_p99_ms', float('nan')):8.2f} ms  boundary step "
              f"{rec.get('boundary_step_ms', float('nan')):8.1f} ms  "
              f"({rec['batches_per_epoch']:,} batches)", flush=True)


def warm_up(data: Path, args, peer_list: list[str], report: dict) -> None:
    """Each peer once on 4,096 documents, untimed: its environment made, its files cached;
    the peers and their method noted in ``report``."""
    report["config"]["peers"] = peer_list
    report["method"]["peers"] = METHOD
    spec = stream_spec(4096, args.doc_tokens, args.vocab)
    folder = data / "peers-warmup"
    ensure_data(folder, spec, peer_list, args.seq + 1)
    for peer in peer_list:
        run_worker({"peer": peer, "root": str(folder), "B": args.batch, "T": args.seq,
                    "boundary": 2, "check_state": "no"}, data)


# --- in the peers' environment -----------------------------------------------------------------
def _open(peer: str, root: Path, B: int, T: int):
    if peer == "torchdata":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(peers._Windows(root / "all.bin", T), batch_size=B,
                                  shuffle=True, num_workers=0, collate_fn=peers._collate,
                                  drop_last=True)
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    ds = StreamingDataset(input_dir=str(root / "litdata"),
                          item_loader=TokensLoader(block_size=T + 1), shuffle=True,
                          drop_last=True)
    return StreamingDataLoader(ds, batch_size=B, num_workers=0)


def _windows(peer: str, batch):
    """A batch as the peer's pipeline in ``peers.py`` delivers it: (x, y) int64."""
    if peer == "torchdata":
        return batch
    w = batch.long()
    return w[:, :-1], w[:, 1:]


def state_at(peer: str, loader, state: dict, batch: int) -> dict:
    """``state`` (a ``state_dict()`` of epoch 0) with its counts set to after ``batch`` batches."""
    s = copy.deepcopy(state)
    samples = batch * loader.batch_size
    if peer == "torchdata":
        s["_num_yielded"] = s["_sampler_iter_yielded"] = batch
        it = s["_sampler_iter_state"]
        it["samples_yielded"] = samples
        it["sampler_iter_state"]["yielded"] = samples
    else:
        s["num_samples_yielded"] = s["dataset"]["num_samples_yielded"] = samples
        s["dataset"]["sample_in_epoch"] = samples
        s["latest_worker_idx"] = 0
    return s


def _same(a, b) -> bool:
    import torch

    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


def check_state(peer: str, root: Path, B: int, T: int, first: dict, built: dict,
                batch: int) -> bool:
    """A second loader resumed from ``first`` (the real state after batch 1) and iterated to
    ``batch``: its ``state_dict()`` is ``built``."""
    other = _open(peer, root, B, T)
    other.load_state_dict(copy.deepcopy(first))
    it = iter(other)
    for _ in range(batch - 1):
        next(it)
    real = other.state_dict()
    if not _same(real, built):
        raise SystemExit(f"{peer}: the state built for batch {batch} is not the one iterating "
                         f"gives:\n{built}\n{real}")
    return True


def _rss_split() -> dict:
    """RSS now, anonymous and file-backed (a memmap's pages of the page cache count in VmHWM)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("RssAnon", "RssFile"):
                out[f"{key[3:].lower()}_rss_mb_at_end"] = int(line.split()[1]) / 1024
    return out


def worker(spec: dict) -> dict:
    peer, root, B, T = spec["peer"], Path(spec["root"]), spec["B"], spec["T"]
    t0 = time.perf_counter()
    import torch

    if peer == "torchdata":
        import torchdata.stateful_dataloader  # noqa: F401
    else:
        import litdata  # noqa: F401
    import_s = time.perf_counter() - t0
    rss_import = _hwm_mb()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    loader = _open(peer, root, B, T)
    open_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    it = iter(loader)
    x, _ = _windows(peer, next(it))
    first_s = time.perf_counter() - t0
    assert tuple(x.shape) == (B, T), x.shape
    rss_first = _hwm_mb()
    n = len(loader)
    from importlib.metadata import version

    out = {"import_s": import_s, "open_s": open_s, "first_batch_s": first_s,
           "rss_after_import_mb": rss_import, "rss_after_first_batch_mb": rss_first,
           "batches_per_epoch": n, "versions": {p: version(p) for p in ("torch", peer)}}
    first = loader.state_dict()
    k, warm = spec["boundary"], 8
    before = min(k, n - 1)
    start = max(1, n - before - warm)
    warm = n - before - start
    t0 = time.perf_counter()
    state = state_at(peer, loader, first, start)
    del it
    loader.load_state_dict(copy.deepcopy(state))
    it = iter(loader)
    out.update({"resume_batch": start, "resume_state_s": time.perf_counter() - t0,
                "resume_peak_rss_mb": _hwm_mb(), "hwm_reset_after_resume": _reset_hwm()})
    waits, got = [], 0
    limit = 4 * (k + 8)
    t_step = None
    while got < limit:
        t = time.perf_counter()
        try:
            _windows(peer, next(it))
        except StopIteration:
            t_step = t
            break
        got += 1
        if got > warm:
            waits.append(time.perf_counter() - t)
    out["epoch0_batches_after_resume"] = got
    if t_step is None:
        out["boundary_skipped"] = (f"the resume at batch {start} of {n} did not end epoch 0 "
                                   f"within {limit} batches")
        out["peak_rss_mb"] = max(rss_first, _hwm_mb())
        return out
    it = iter(loader)
    _windows(peer, next(it))
    step = time.perf_counter() - t_step
    timed_before = len(waits)
    waits.append(step)
    after = min(k, n)
    for _ in range(after - 1):
        t = time.perf_counter()
        _windows(peer, next(it))
        waits.append(time.perf_counter() - t)
    ms = np.array(waits) * 1e3
    out.update({"timed_before": timed_before, "timed_after": after, "next_samples": len(waits),
                "next_p50_ms": float(np.percentile(ms, 50)),
                "next_p99_ms": float(np.percentile(ms, 99)), "next_max_ms": float(ms.max()),
                "boundary_step_ms": step * 1e3, "boundary_peak_rss_mb": _hwm_mb(),
                "epoch0_batches_as_expected": got == n - start})
    out["peak_rss_mb"] = max(rss_first, out["boundary_peak_rss_mb"])
    out.update(_rss_split())
    check = spec.get("check_state", "auto")
    if check == "yes" or (check == "auto" and n <= CHECK_STATES_BATCHES):
        out["state_checked_by_iterating"] = check_state(peer, root, B, T, first, state, start)
    return out


def _prepare_litdata(root: Path, eos: int, block: int) -> dict:
    out = peers.prepare_litdata(root, eos, block)
    return {**out, "peak_rss_mb": _hwm_mb(), "peak_rss_of": "the converting process, not its "
            "2 optimize workers"}


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        print(json.dumps(worker(json.loads(sys.argv[2]))), flush=True)
    elif sys.argv[1] == "--prepare-litdata":
        print(json.dumps(_prepare_litdata(Path(sys.argv[2]), int(sys.argv[3]),
                                          int(sys.argv[4]))), flush=True)
    else:
        raise SystemExit(f"unknown command {sys.argv[1:]}")
