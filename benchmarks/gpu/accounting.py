"""What the CUDA Loader does per batch, counted (no clock): launches, copies, host waits, exports.

    NUMBA_ENABLE_CUDASIM=1 python benchmarks/gpu/accounting.py     # anywhere (the counts are the
    python benchmarks/gpu/accounting.py                            #  same on a device)
    python benchmarks/gpu/accounting.py --out benchmarks/results   # adds to the project's record

A corpus of 900 short ramp packets in 3 shards; for each mode, from host memory and resident, a
Loader at its default chunk size runs one warm-up epoch, is closed (its producer restarts, so
the ramp of small first chunks is counted too), then two more epochs; ``loader.counters`` over
those two, per batch the producer made. ``tests/engine/test_counters.py`` bounds the same counts. JSON
into ``--out`` (default ``$NDP_RESULTS_DIR``, else ``./ndp-results``):
``{sim-,}accounting-<time>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import add_out_argument, command, machine, write_report  # noqa: E402

from ndp.engine.backend import simulated  # noqa: E402
from ndp.loader.loader import Loader  # noqa: E402
from ndp.wire.packet import encode_tokens  # noqa: E402
from ndp.store.writer import ShardWriter  # noqa: E402

CASES = [("padded", 2, 8), ("packed", 2, 6), ("packing", 2, 16)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out_argument(ap)
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="ndp-accounting-") as tmp:
        lengths = np.random.default_rng(9).integers(1, 12, 900)
        for i in range(0, 900, 300):
            with ShardWriter(tmp, prefix=f"s{i}") as writer:
                for k in range(i, i + 300):
                    writer.write(encode_tokens(k * 1000 + np.arange(int(lengths[k]))))
        for mode, batch, seq in CASES:
            for resident in (False, True):
                loader = Loader(tmp, mode=mode, batch_size=batch, seq_len=seq, backend="cuda",
                                resident=resident, seed=1)
                sum(1 for _ in loader)
                loader.close()
                before = loader.counters.as_dict()
                for _ in range(2):
                    sum(1 for _ in loader)
                loader.close()
                done = loader.counters.since(before)
                made = done.pop("batches")
                row = {"mode": mode, "resident": resident, "batch": batch, "seq_len": seq,
                       "chunk_batches": loader.chunk_batches, "batches": made,
                       "per_batch": {k: v / made for k, v in done.items()}}
                rows.append(row)
                p = row["per_batch"]
                print(f"{mode:8s} resident={resident!s:5s} {made:5d} batches: "
                      f"{p['launches']:.3f} launches, {p['host_waits']:.3f} host waits, "
                      f"{p['d2h_copies']:.3f} D2H, {p['h2d_copies']:.3f} H2D, "
                      f"{p['dlpack_exports']:.3f} DLPack exports per batch", flush=True)
    report = {"benchmark": "accounting", "simulated": simulated(),
              "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "command": command(__file__, argv), "machine": machine(),
              "accounting": rows}
    write_report(args.out, "sim-accounting" if simulated() else "accounting", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
