"""How well each loader shuffles a pretraining corpus: ndp's window shuffle against MosaicML
streaming's ``py1e`` and litdata's ``FullShuffle``, on the same documents, one rank.

    python benchmarks/plan/shuffle_quality.py                 # 4 M documents of 2 KB (8 GB), ~1 min
    python benchmarks/plan/shuffle_quality.py --smoke         # tiny, ndp only (the test suite)
    python benchmarks/plan/shuffle_quality.py --out benchmarks/results  # to the project's record

No loader reads any data: each loader's order is a pure function of its shard sizes, seed and
epoch, and this script computes it with the loader's own code. ndp's from
``ndp.loader.ordering.order``; the
peers' from their published wheels (``pip download --no-deps`` into ``benchmarks/.peers/``,
pinned below), whose shuffle modules are loaded from the unpacked files without installing the
packages (MosaicML streaming pins numpy<2.2 and imports torchvision on import): MosaicML's
``get_shuffle_py1e`` itself; litdata's ``_block_shuffle`` (its in-chunk item order) inside
``FullShuffle``'s single-worker schedule (chunks in a ``RandomState([seed, epoch])``
permutation, each chunk's items block-shuffled with ``RandomState([seed, n_chunks, epoch,
chunk])``), written out here from ``litdata/streaming/shuffle.py``.

Each loader shards the same corpus (documents of ``--doc-bytes``, in corpus order) its own
default way: ndp 256 MiB shards (``ndp convert``'s default), MosaicML 64 MiB
(``MDSWriter``'s ``size_limit``), litdata 64 MB chunks (``optimize``'s ``chunk_bytes``), with
their default shuffle settings (MosaicML: one canonical node, ``shuffle_block_size`` 4,000,000
samples; litdata: ``item_shuffle_window`` 256). Figures, over two consecutive epochs' orders:

* ``adjacent_kept``: share of neighbouring documents in epoch 1 that were neighbours in epoch 0
  (a rotation keeps ~all; a uniform shuffle ~2/N);
* ``position_corr``: correlation of each document's position in epoch 0 and epoch 1 (0 ideal);
* ``regions_per_8_batches``: distinct 256 MiB regions of the corpus (its original order, as
  written) among 8 consecutive batches of 64 documents; a uniform shuffle draws from ~all;
* ``mean_displacement``: mean |position in epoch 1 - position in corpus| / N (1/3 for a uniform
  shuffle, 0 without shuffling).

Writes ``shuffle-<time>.json`` into ``--out`` (default ``$NDP_RESULTS_DIR``, else
``./ndp-results``) and prints a table.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import importlib.util
import platform
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import HERE, add_out_argument, command, report_path, write_report  # noqa: E402

PEERS = HERE / ".peers"  # benchmarks/.peers, ignored by git
WHEELS = {"mosaicml-streaming": "0.13.0", "litdata": "0.2.76"}
MIB = 1 << 20


# ------------------------------------------------------------------------------------- orders
def ndp_order(sizes: np.ndarray, shard_bytes: np.ndarray, seed: int, epoch: int,
              window: int | str | None) -> np.ndarray:
    """ndp's order (``window``: bytes, "all", or None for the Loader's default)."""
    from ndp.loader.ordering.order import WINDOW_BYTES, check_window, epoch_order

    base = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return epoch_order(base, seed=seed, epoch=epoch, shuffle=True, shard_bytes=shard_bytes,
                       window_bytes=check_window(WINDOW_BYTES if window is None else window))


def ndp_rotation_order(sizes: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """ndp's order before the window shuffle (state version 3 and earlier): shards permuted,
    each read from a random phase (``git show 9efc374:ndp/loader/ordering/order.py``)."""
    rng = np.random.Generator(np.random.PCG64([seed, epoch, 0x0D3E]))
    base = np.concatenate([[0], np.cumsum(sizes)])
    parts = []
    for s in rng.permutation(sizes.shape[0]):
        n = int(sizes[s])
        parts.append(base[s] + np.roll(np.arange(n), -int(rng.integers(n))))
    return np.concatenate(parts).astype(np.int64)


def fetch_peers() -> Path | None:
    """The peers' wheels, unpacked under benchmarks/.peers (None if pip cannot get them)."""
    PEERS.mkdir(exist_ok=True)
    for name, version in WHEELS.items():
        if not list(PEERS.glob(f"{name.replace('-', '_')}-{version}-*.whl")):
            r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                                "-d", str(PEERS), f"{name}=={version}"], capture_output=True)
            if r.returncode:
                print(f"cannot download {name}=={version}: {r.stderr.decode()[-300:]}")
                return None
    for wheel in PEERS.glob("*.whl"):
        target = PEERS / wheel.stem
        if not target.exists():
            with zipfile.ZipFile(wheel) as z:
                z.extractall(target)
    return PEERS


def _load(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def mosaic_py1e() -> object:
    root = next(p for p in PEERS.glob(f"mosaicml_streaming-{WHEELS['mosaicml-streaming']}-*")
                if p.is_dir())
    base = root / "streaming" / "base" / "shuffle"
    for pkg in ("streaming", "streaming.base", "streaming.base.shuffle"):  # no package imports
        sys.modules.setdefault(pkg, types.ModuleType(pkg))
    _load(base / "py1s.py", "streaming.base.shuffle.py1s")
    return _load(base / "py1e.py", "streaming.base.shuffle.py1e").get_shuffle_py1e


def litdata_block_shuffle() -> object:
    root = next(p for p in PEERS.glob(f"litdata-{WHEELS['litdata']}-*") if p.is_dir())
    source = (root / "litdata" / "utilities" / "shuffle.py").read_text()
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_block_shuffle")
    namespace: dict = {"np": np, "Any": object}
    exec(compile(ast.Module([fn], []), "litdata/utilities/shuffle.py", "exec"), namespace)
    return namespace["_block_shuffle"]


def litdata_order(sizes: np.ndarray, seed: int, epoch: int, block_shuffle) -> np.ndarray:
    """One worker's items of litdata's FullShuffle (see the module docstring)."""
    base = np.concatenate([[0], np.cumsum(sizes)])
    n_chunks = sizes.shape[0]
    chunks = np.random.RandomState([seed, epoch]).permutation(n_chunks)
    parts = []
    for c in chunks.tolist():
        rng = np.random.RandomState([seed, n_chunks, epoch, c])
        items = block_shuffle(list(range(int(sizes[c]))), 256, rng)
        parts.append(base[c] + np.asarray(items, np.int64))
    return np.concatenate(parts)


# ------------------------------------------------------------------------------------ figures
def figures(order0: np.ndarray, order1: np.ndarray, region_docs: int) -> dict:
    n = order0.shape[0]
    pos0 = np.empty(n, np.int64)
    pos0[order0] = np.arange(n)
    pos1 = np.empty(n, np.int64)
    pos1[order1] = np.arange(n)
    a, b = order1[:-1], order1[1:]
    adjacent = np.abs(pos0[a] - pos0[b]) == 1
    window = 8 * 64
    regions = order1[: (n // window) * window].reshape(-1, window) // region_docs
    distinct = np.array([np.unique(r).shape[0] for r in regions[:: max(1, regions.shape[0] // 2000)]])
    return {
        "adjacent_kept": float(adjacent.mean()),
        "position_corr": float(np.corrcoef(pos0, pos1)[0, 1]),
        "regions_per_8_batches": float(distinct.mean()),
        "regions_in_corpus": int(-(-n // region_docs)),
        "mean_displacement": float(np.abs(pos1 - np.arange(n)).mean() / n),
    }


def sizes_for(n_docs: int, doc_bytes: int, shard_bytes: int) -> np.ndarray:
    per = max(1, shard_bytes // doc_bytes)
    sizes = np.full(n_docs // per, per, np.int64)
    if n_docs % per:
        sizes = np.append(sizes, n_docs % per)
    return sizes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=4_000_000)
    ap.add_argument("--doc-bytes", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0, help="the first seed")
    ap.add_argument("--seeds", type=int, default=5, help="figures averaged over this many")
    ap.add_argument("--smoke", action="store_true", help="tiny, ndp only, one seed")
    add_out_argument(ap)
    args = ap.parse_args(argv)
    if args.smoke:
        args.docs, args.doc_bytes, args.seeds = 20_000, 64 << 10, 1
    n, db = args.docs, args.doc_bytes
    region_docs = max(1, (256 * MIB) // db)
    rows = {}

    def run(name: str, make) -> None:
        """Figures of epochs 0 -> 1 for each of ``--seeds`` seeds, averaged (``position_corr``:
        the mean of its absolute value: a sign is chance)."""
        each = [figures(make(seed, 0), make(seed, 1), region_docs)
                for seed in range(args.seed, args.seed + args.seeds)]
        rows[name] = {k: float(np.mean([abs(f[k]) if k == "position_corr" else f[k]
                                         for f in each])) for k in each[0]}
        print(f"{name:32s} " + "  ".join(f"{k} {v:.4g}" for k, v in rows[name].items()),
              flush=True)

    ndp_sizes = sizes_for(n, db, 256 * MIB)
    ndp_bytes = ndp_sizes * db
    run("ndp, window 1 GiB (default)",
        lambda s, e: ndp_order(ndp_sizes, ndp_bytes, s, e, None))
    if not args.smoke:
        for w in (512 * MIB, 4096 * MIB, "all"):
            label = w if w == "all" else f"{w // MIB} MiB"
            run(f"ndp, window {label}",
                lambda s, e, w=w: ndp_order(ndp_sizes, ndp_bytes, s, e, w))
    run("ndp before (rotation)", lambda s, e: ndp_rotation_order(ndp_sizes, s, e))
    run("uniform permutation", lambda s, e: np.random.default_rng([s, e]).permutation(n))
    if not args.smoke and fetch_peers() is not None:
        py1e = mosaic_py1e()
        mds_sizes = sizes_for(n, db, 1 << 26)  # MDSWriter size_limit 67,108,864 bytes
        run("MosaicML streaming py1e", lambda s, e: py1e(mds_sizes, 1, s, e, 4_000_000))
        block = litdata_block_shuffle()
        lit_sizes = sizes_for(n, db, 64_000_000)  # optimize(chunk_bytes="64MB")
        run("litdata FullShuffle", lambda s, e: litdata_order(lit_sizes, s, e, block))
    result = {
        "benchmark": "shuffle_quality",
        "command": command(__file__, argv),
        "time": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": platform.platform(), "python": platform.python_version(),
        "numpy": np.__version__, "peers": WHEELS,
        "docs": n, "doc_bytes": db, "region_bytes": 256 * MIB, "rows": rows,
    }
    write_report(None, "shuffle", result,
                 path=report_path(args.out, "shuffle", tag="-smoke" if args.smoke else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
