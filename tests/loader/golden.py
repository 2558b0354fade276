"""Digests of every batch and state of an epoch, per configuration, as the code gave them when
they were written (issue 37: the compiled plan must change no batch, state or stat).

    python tests/loader/golden.py            # compare with tests/loader/golden_digests.json
    python tests/loader/golden.py --write    # write them anew: only for a change meant to move
                                             # batches, said in its commit message

Each configuration reads a dataset built here the same way every time (ramp-like packets of
1-60 tokens, mixed widths and masks, 7 of them with a flipped byte, in three shards; a second
dataset for mixing) and runs one Loader on it for a whole epoch: each mode, CRC-Drop and the
damage in every run, two ranks of two, a mix of two sources, and an elastic resume (a state saved
after 3 batches on 2 ranks, loaded into rank 0 of 3). What is digested: each batch's arrays
(name, dtype, shape, bytes), the state after each batch (JSON, keys sorted) and the stats at the
epoch's end (less ``wait_seconds``, the one clock). ``tests/loader/test_golden.py`` checks the
CPU backend and the CUDA one (the simulator without a GPU) against the same file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DIGESTS = HERE / "golden_digests.json"
MODES = ("padded", "packed", "packing")
SHAPES = {"padded": dict(batch_size=4, seq_len=32), "packed": dict(batch_size=2, seq_len=16),
          "packing": dict(batch_size=2, seq_len=48)}
#: (name, what it runs): every configuration of every mode
RUNS = ("rank0of2", "rank1of2", "mix", "elastic3")


def write_datasets(root: Path) -> dict[str, Path]:
    """The two datasets, byte for byte the same on every call."""
    from ndp.store.writer import ShardWriter
    from ndp.wire.packet import encode_tokens

    out = {}
    for name, n_packets, seed in (("main", 420, 11), ("extra", 150, 12)):
        rng = np.random.default_rng(seed)
        folder = root / name
        with ShardWriter(folder, max_shard_bytes=70_000) as writer:
            for k in range(n_packets):
                n = int(rng.integers(1, 61))
                width = 2 if k % 3 else 4
                mask = (np.arange(n) % 4 != 0) if k % 5 == 2 else None
                packet = bytearray(encode_tokens((k * 1000 + np.arange(n)) % 60000,
                                                 width=width, mask=mask))
                if name == "main" and k % 60 == 7:
                    packet[int(rng.integers(6, len(packet)))] ^= 0x20  # payload or CRC
                writer.write(bytes(packet))
        out[name] = folder
    return out


def _digest_batches(loader, into: "hashlib._Hash", states: "hashlib._Hash") -> int:
    n = 0
    for batch in loader:
        for name in sorted(batch):
            value = batch[name]
            array = value if isinstance(value, np.ndarray) else value.copy_to_host()
            array = np.ascontiguousarray(array)
            into.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
            into.update(array.tobytes())
        states.update(json.dumps(loader.state_dict(), sort_keys=True).encode())
        n += 1
    return n


def run(datasets: dict[str, Path], mode: str, name: str, backend: str,
        overlap: bool | None = None) -> dict:
    """One configuration's digests: batches, states, stats, and the number of batches.
    ``overlap``: stage each chunk ahead of the one before's layout (``ndp.loader.pipeline.ahead``),
    or
    not; by default as the backend does."""
    import ndp

    kw = dict(mode=mode, seed=7, crc_drop_rate=0.1, backend=backend, output="arrays",
              **SHAPES[mode])
    batches, states = hashlib.sha256(), hashlib.sha256()
    if name == "mix":
        loader = ndp.Loader({"main": str(datasets["main"]), "extra": str(datasets["extra"])},
                            mix={"main": 0.7, "extra": 0.3}, **kw)
    elif name == "elastic3":
        olds = [ndp.Loader(datasets["main"], rank=r, world_size=2, **kw) for r in range(2)]
        saved = []
        for old in olds:
            it = iter(old)
            for _ in range(3):
                next(it)
            saved.append(json.loads(json.dumps(old.state_dict())))
            old.close()
        loader = ndp.Loader(datasets["main"], rank=0, world_size=3, **kw)
        loader.load_state_dict(saved)
    else:
        rank = int(name[4])
        loader = ndp.Loader(datasets["main"], rank=rank, world_size=2, **kw)
    if overlap is not None:
        loader._producer.set_overlap(overlap)
    with loader, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # padded rows cut at seq_len: counted
        n = _digest_batches(loader, batches, states)
        stats = loader.stats.as_dict()
    stats.pop("wait_seconds", None)
    return {"batches": n, "batch_digest": batches.hexdigest()[:32],
            "state_digest": states.hexdigest()[:32],
            "stats_digest": hashlib.sha256(json.dumps(stats, sort_keys=True).encode())
            .hexdigest()[:32]}


def all_runs(backend: str, modes=MODES, runs=RUNS) -> dict:
    with tempfile.TemporaryDirectory(prefix="ndp-golden-") as tmp:
        datasets = write_datasets(Path(tmp))
        return {f"{mode}/{name}": run(datasets, mode, name, backend)
                for mode in modes for name in runs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="write the digests anew")
    ap.add_argument("--backend", default="cpu")
    args = ap.parse_args(argv)
    got = all_runs(args.backend)
    if args.write:
        from ndp.store.atomic import atomic_write

        atomic_write(DIGESTS, json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {DIGESTS} ({len(got)} configurations)")
        return 0
    want = json.loads(DIGESTS.read_text())
    moved = sorted(k for k in want if got.get(k) != want[k])
    print("all equal" if not moved else f"moved: {', '.join(moved)}")
    return 1 if moved else 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parents[1]))
    sys.exit(main())
